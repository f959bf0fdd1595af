//! The Rust client: attach to `stokerd`, receive batches, release them.
//!
//! ```no_run
//! use stoker::{AttachOptions, Client, PipelineSpec};
//! # fn main() -> Result<(), stoker::ClientError> {
//! let opts = AttachOptions::new("run-1", "/data/train", PipelineSpec::train(64, 224));
//! let mut client = Client::attach("/run/stoker/stoker.sock".as_ref(), opts)?;
//! while let Some(batch) = client.next_batch()? {
//!     let (images, labels) = (batch.images(), batch.labels());
//!     // ... use them; dropping `batch` gives its slot back to the daemon.
//! #   let _ = (images, labels);
//! }
//! # Ok(()) }
//! ```
//!
//! # Design
//! - One connection per rank. The ring arrives as a sealed memfd with the ATTACHED answer; the
//!   client recomputes the layout from its own spec and refuses a ring of another size.
//! - A [`Batch`] is a lease on one slot. Several may be held at once (up to the ring's slot
//!   count; holding all of them stops the daemon's producer for this rank). Dropping a batch
//!   sends RELEASE.
//! - [`Client::position`] is where to resume: attach again with it as the start and the
//!   batches continue where they left off.
//! - While no daemon answers (it is starting, or restarting after a crash), attach retries
//!   with exponential backoff for [`AttachOptions::connect_timeout`] (default
//!   [`DEFAULT_CONNECT_TIMEOUT`], or `$STOKER_CONNECT_TIMEOUT` seconds) before it gives up
//!   with [`ClientError::NoDaemon`].
//!
//! - Device rings (the daemon's CUDA backend, `device: "cuda:N"` or a GPU UUID): the images
//!   are a VMM allocation on the client's GPU, imported and mapped once per attach
//!   (`client_device`); a batch hands out its device address ([`Batch::device_images`]) and
//!   its release is fenced by events on the consumer's streams ([`Batch::record_stream`]),
//!   waited for on a client thread, never on the caller's.
//!
//! - The data stall is measured here, where it happens: [`Client::next_batch`] adds the time
//!   it blocks to `wait` and the time since the previous call returned to `compute`
//!   ([`StallClock`]). [`Client::stall`] returns the totals; every [`STATS_EVERY`] they go to
//!   the daemon in a STATS message (piggy-backed on `next_batch`, never a thread of its own),
//!   which shows the wait fraction per rank.
//!
//! # Limitations
//! - The time before the first `next_batch` is neither wait nor compute; a loop that holds
//!   batches across calls is measured the same way (the clock sees only the calls).
//! - Dropping the client detaches; the daemon stops filling the ring. Batches still alive keep
//!   the mapping (their bytes stay readable), but their releases go nowhere.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::client_device::{map_device_ring, resolve_device, send_release, DeviceImages};
pub use crate::client_device::{ConsumerStream, DeviceError};
use crate::memfd::{page_size, MemfdError, MemfdRing};
use crate::protocol::{
    Attach, Attached, DecodeError, EpochOffset, ErrorCode, Message, Ready, StartPosition, Stats,
    MAX_MESSAGE_BYTES,
};
use crate::ring::{ImageMemory, RingLayout, SampleStatus};
use crate::sock::{SeqPacket, SockError};
use crate::spec::{PipelineSpec, SpecError};

/// How long [`Client::attach`] retries while no daemon answers, unless
/// `$STOKER_CONNECT_TIMEOUT` says otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Environment variable overriding [`DEFAULT_CONNECT_TIMEOUT`], in seconds (`0` disables
/// retrying).
pub const CONNECT_TIMEOUT_ENV: &str = "STOKER_CONNECT_TIMEOUT";
/// First pause between connection attempts; it doubles up to [`MAX_CONNECT_BACKOFF`].
const FIRST_CONNECT_BACKOFF: Duration = Duration::from_millis(20);
const MAX_CONNECT_BACKOFF: Duration = Duration::from_millis(500);

/// `$STOKER_CONNECT_TIMEOUT` seconds if set and valid, else [`DEFAULT_CONNECT_TIMEOUT`].
pub fn default_connect_timeout() -> Duration {
    std::env::var(CONNECT_TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
}

/// How often a client reports its data stall to the daemon (at most; a loop that never calls
/// `next_batch` reports nothing until it does).
pub const STATS_EVERY: Duration = Duration::from_millis(500);

/// Where a training loop's time went, as measured by the client: the totals since the attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StallStats {
    /// Time spent inside `next_batch` waiting for a batch (or the end of the data).
    pub wait: Duration,
    /// Time between a `next_batch` returning and the following call.
    pub compute: Duration,
    /// Batches received.
    pub batches: u64,
}

impl StallStats {
    /// Share of the measured time spent waiting for data, 0 when nothing is measured yet.
    pub fn wait_fraction(&self) -> f64 {
        let total = (self.wait + self.compute).as_secs_f64();
        if total > 0.0 {
            self.wait.as_secs_f64() / total
        } else {
            0.0
        }
    }

    fn message(&self) -> Message {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Message::Stats(Stats {
            wait_ns: ns(self.wait),
            compute_ns: ns(self.compute),
            batches: self.batches,
        })
    }
}

/// Times the calls of `next_batch`: what is inside a call is wait, what is between two calls
/// is compute.
#[derive(Debug)]
struct StallClock {
    totals: StallStats,
    /// When the last call returned (None before the first call).
    returned: Option<Instant>,
    /// When the totals were last sent.
    sent: Instant,
}

impl StallClock {
    fn new() -> StallClock {
        StallClock {
            totals: StallStats::default(),
            returned: None,
            sent: Instant::now(),
        }
    }

    /// A call begins: the time since the previous one returned was the loop's own work.
    fn enter(&mut self) -> Instant {
        let now = Instant::now();
        if let Some(r) = self.returned {
            self.totals.compute += now - r;
        }
        now
    }

    /// The call that began at `entered` returns, with a batch or not.
    fn leave(&mut self, entered: Instant, got_batch: bool) {
        let now = Instant::now();
        self.totals.wait += now - entered;
        self.totals.batches += u64::from(got_batch);
        self.returned = Some(now);
    }

    /// Whether the totals are due to be sent, and if so marks them sent.
    fn due(&mut self) -> bool {
        if self.sent.elapsed() >= STATS_EVERY {
            self.sent = Instant::now();
            true
        } else {
            false
        }
    }
}

/// How long dropping a [`Client`] waits for the daemon to confirm the detach.
pub const DETACH_WAIT: Duration = Duration::from_secs(1);

/// Environment variable naming the daemon's socket.
pub const SOCKET_ENV: &str = "STOKER_SOCKET";
/// The system daemon's socket (a daemon running as root, e.g. under systemd).
pub const SYSTEM_SOCKET: &str = "/run/stoker/stoker.sock";

/// The folder of this user's own daemon (socket, start lock, log):
/// `$XDG_RUNTIME_DIR/stoker`, else `/tmp/stoker-<uid>`. Whoever creates it makes it mode 0700.
pub fn user_daemon_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("stoker"),
        None => {
            // SAFETY: getuid has no preconditions and cannot fail.
            let uid = unsafe { libc::getuid() };
            PathBuf::from(format!("/tmp/stoker-{uid}"))
        }
    }
}

/// The socket of this user's own daemon: `stoker.sock` in [`user_daemon_dir`].
pub fn user_socket_path() -> PathBuf {
    user_daemon_dir().join("stoker.sock")
}

/// Where the daemon listens unless told otherwise: `$STOKER_SOCKET` if set; else
/// [`SYSTEM_SOCKET`] for root; else [`user_socket_path`]. The daemon's config
/// (`stoker_daemon::config::default_socket_path`) is this.
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    user_socket_path()
}

/// Where a client connects unless told otherwise: `$STOKER_SOCKET` if set; else
/// [`SYSTEM_SOCKET`] when a daemon answers there (a system daemon serves the whole host);
/// else [`user_socket_path`] (the Python package starts a daemon there when none answers).
pub fn client_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if SeqPacket::connect(Path::new(SYSTEM_SOCKET)).is_ok() {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    user_socket_path()
}

/// What a rank asks for when it attaches.
#[derive(Debug, Clone, PartialEq)]
pub struct AttachOptions {
    /// Names the job; every rank of a job uses the same key.
    pub job: String,
    pub rank: u32,
    pub world_size: u32,
    /// `"cpu"`, a GPU UUID, or `"cuda"` / `"cuda:N"` (ordinal `N` under this process's
    /// `CUDA_VISIBLE_DEVICES`, resolved to the UUID before the attach is sent).
    pub device: String,
    pub spec: PipelineSpec,
    /// A registered dataset name or a path.
    pub dataset: String,
    pub seed: u64,
    /// First batch to receive.
    pub start: StartPosition,
    /// How long to keep retrying while no daemon answers (see [`default_connect_timeout`]).
    pub connect_timeout: Duration,
}

impl AttachOptions {
    /// Rank 0 of 1, on the CPU, seed 0, from the start.
    pub fn new(job: impl Into<String>, dataset: impl Into<String>, spec: PipelineSpec) -> Self {
        AttachOptions {
            job: job.into(),
            rank: 0,
            world_size: 1,
            device: "cpu".into(),
            spec,
            dataset: dataset.into(),
            seed: 0,
            start: StartPosition::default(),
            connect_timeout: default_connect_timeout(),
        }
    }
}

/// Connects to `socket`, retrying with exponential backoff while no daemon listens there,
/// for up to `timeout`.
fn connect_with_retry(socket: &Path, timeout: Duration) -> Result<SeqPacket, ClientError> {
    let deadline = Instant::now() + timeout;
    let mut pause = FIRST_CONNECT_BACKOFF;
    loop {
        match SeqPacket::connect(socket) {
            Ok(s) => return Ok(s),
            Err(e) => match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ECONNREFUSED) | Some(libc::EAGAIN) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(ClientError::NoDaemon(socket.to_owned()));
                    }
                    std::thread::sleep(pause.min(deadline - now));
                    pause = (pause * 2).min(MAX_CONNECT_BACKOFF);
                }
                _ => {
                    return Err(ClientError::Connect {
                        path: socket.to_owned(),
                        source: e,
                    })
                }
            },
        }
    }
}

/// Why the client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no stoker daemon at {}", .0.display())]
    NoDaemon(PathBuf),
    #[error("cannot connect to the stoker daemon at {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: SockError,
    },
    #[error("daemon closed the connection")]
    Closed,
    #[error("daemon refused: {code}: {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("invalid attach: {0}")]
    Invalid(String),
    #[error("invalid spec: {0}")]
    Spec(#[from] SpecError),
    #[error("daemon sent a malformed message: {0}")]
    Decode(#[from] DecodeError),
    #[error("daemon broke the protocol: {0}")]
    Protocol(String),
    #[error("socket: {0}")]
    Socket(#[from] SockError),
    #[error("ring: {0}")]
    Ring(#[from] MemfdError),
    #[error("{0}")]
    Device(#[from] DeviceError),
}

impl ClientError {
    /// True when the daemon is gone (not running, or went away): reconnect and resume.
    pub fn is_disconnected(&self) -> bool {
        match self {
            ClientError::NoDaemon(_) | ClientError::Closed => true,
            ClientError::Socket(e) => matches!(
                e.raw_os_error(),
                Some(libc::EPIPE) | Some(libc::ECONNRESET) | Some(libc::ENOTCONN)
            ),
            _ => false,
        }
    }

    /// The daemon's error code, when it refused something.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// What the socket and the ring are, shared by the client and its outstanding batches.
#[derive(Debug)]
struct Connection {
    sock: SeqPacket,
    /// The memfd: the whole ring for host images, the host part (labels, indices, status)
    /// for device images.
    ring: MemfdRing,
    /// The images' device mapping, when the daemon serves them in device memory.
    device: Option<DeviceImages>,
}

impl Connection {
    /// Gives a slot back: at once for host images; for device images after an event on each
    /// consumer stream completed (waited for by the release thread, not here).
    /// A failed send (host images) is reported; the daemon is then gone and reclaims the
    /// slot itself.
    fn release(&self, ready: &Ready, streams: &[ConsumerStream]) -> Result<(), ClientError> {
        match &self.device {
            None => send_release(&self.sock, ready.slot, ready.generation)?,
            Some(d) => d.release(ready.slot, ready.generation, streams, &self.sock),
        }
        Ok(())
    }
}

/// One attached rank.
#[derive(Debug)]
pub struct Client {
    conn: Arc<Connection>,
    attached: Attached,
    spec: PipelineSpec,
    world_size: u32,
    position: StartPosition,
    ended: bool,
    buf: Vec<u8>,
    clock: StallClock,
}

impl Client {
    /// Connects to the daemon at `socket` and attaches as `opts.rank` of `opts.job`.
    pub fn attach(socket: &Path, opts: AttachOptions) -> Result<Client, ClientError> {
        opts.spec.validate()?;
        if opts.world_size == 0 || opts.rank >= opts.world_size {
            return Err(ClientError::Invalid(format!(
                "rank {} is not within world_size {}",
                opts.rank, opts.world_size
            )));
        }
        let device = resolve_device(&opts.device)?;
        let sock = connect_with_retry(socket, opts.connect_timeout)?;
        let spec = opts.spec.clone();
        let world_size = opts.world_size;
        let attach = Message::Attach(Box::new(Attach {
            job: opts.job,
            rank: opts.rank,
            world_size: opts.world_size,
            device: device.clone(),
            spec: opts.spec,
            dataset: opts.dataset,
            seed: opts.seed,
            start: opts.start,
        }));
        let bytes = attach
            .encode()
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
        sock.send(&bytes, &[]).map_err(closed_or)?;
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        let (msg, fds) = recv(&sock, &mut buf)?;
        let attached = match msg {
            Message::Attached(a) => a,
            Message::Error(e) => {
                return Err(ClientError::Refused {
                    code: e.code,
                    message: e.message,
                })
            }
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected ATTACHED, got {:?}",
                    other.kind()
                )))
            }
        };
        let (ring, device) = if attached.image_memory == ImageMemory::Device {
            let fds = <[OwnedFd; 2]>::try_from(fds).map_err(|fds| {
                ClientError::Protocol(format!(
                    "ATTACHED for a device ring carried {} fds, expected 2 (memfd, VMM fd)",
                    fds.len()
                ))
            })?;
            let (ring, images) = map_device_ring(&spec, &attached, fds, &device, &sock)?;
            (ring, Some(images))
        } else {
            (Client::map_host_ring(&spec, &attached, fds)?, None)
        };
        Ok(Client {
            conn: Arc::new(Connection { sock, ring, device }),
            attached,
            spec,
            world_size,
            position: opts.start,
            ended: false,
            buf,
            clock: StallClock::new(),
        })
    }

    /// Maps a host ring (the CPU backend) from ATTACHED's one fd.
    fn map_host_ring(
        spec: &PipelineSpec,
        attached: &Attached,
        fds: Vec<OwnedFd>,
    ) -> Result<MemfdRing, ClientError> {
        let fd = match <[OwnedFd; 1]>::try_from(fds) {
            Ok([fd]) => fd,
            Err(fds) => {
                return Err(ClientError::Protocol(format!(
                    "ATTACHED carried {} fds, expected 1",
                    fds.len()
                )))
            }
        };
        let layout = RingLayout::new(spec, attached.slots as usize, page_size());
        if attached.slots == 0
            || layout.slot.slot_bytes as u64 != attached.slot_bytes
            || layout.ring_bytes as u64 != attached.ring_bytes
        {
            return Err(ClientError::Protocol(format!(
                "ring of {} slots x {} bytes ({} in all) does not match the spec's layout \
                 ({} bytes per slot, {} in all)",
                attached.slots,
                attached.slot_bytes,
                attached.ring_bytes,
                layout.slot.slot_bytes,
                layout.ring_bytes
            )));
        }
        Ok(MemfdRing::from_fd(fd, layout)?)
    }

    /// Attaches at [`client_socket_path`]: `$STOKER_SOCKET`, else the system daemon when it
    /// answers, else this user's own daemon.
    pub fn attach_default(opts: AttachOptions) -> Result<Client, ClientError> {
        Client::attach(&client_socket_path(), opts)
    }

    /// Waits for the next batch; `None` once the data has ended (the spec's epochs are done).
    /// The time spent here, and between calls, is the data stall ([`Client::stall`]).
    pub fn next_batch(&mut self) -> Result<Option<Batch>, ClientError> {
        let entered = self.clock.enter();
        let got = self.receive();
        self.clock.leave(entered, matches!(got, Ok(Some(_))));
        if got.is_ok() && self.attached.accepts_stats && self.clock.due() {
            self.send_stats();
        }
        got
    }

    /// Where the training loop's time went since the attach.
    pub fn stall(&self) -> StallStats {
        self.clock.totals
    }

    /// Sends the stall totals. A failed send is not reported here: a daemon that is gone
    /// shows on the next receive.
    fn send_stats(&mut self) {
        if let Ok(bytes) = self.clock.totals.message().encode() {
            let _ = self.conn.sock.send(&bytes, &[]);
        }
    }

    fn receive(&mut self) -> Result<Option<Batch>, ClientError> {
        if self.ended {
            return Ok(None);
        }
        let (msg, fds) = recv(&self.conn.sock, &mut self.buf)?;
        if !fds.is_empty() {
            return Err(ClientError::Protocol(format!(
                "{:?} carried {} unexpected fds",
                msg.kind(),
                fds.len()
            )));
        }
        match msg {
            Message::Ready(r) => self.batch(r).map(Some),
            Message::EndOfData => {
                self.ended = true;
                Ok(None)
            }
            Message::Error(e) => Err(ClientError::Refused {
                code: e.code,
                message: e.message,
            }),
            other => Err(ClientError::Protocol(format!(
                "expected READY or END_OF_DATA, got {:?}",
                other.kind()
            ))),
        }
    }

    fn batch(&mut self, r: Ready) -> Result<Batch, ClientError> {
        let layout = self.conn.ring.layout();
        if r.slot as usize >= layout.slots || r.n as usize > layout.slot.batch_size {
            return Err(ClientError::Protocol(format!(
                "READY names slot {} with {} samples; the ring has {} slots of {}",
                r.slot, r.n, layout.slots, layout.slot.batch_size
            )));
        }
        let offset = self.position.offset;
        let mut next = StartPosition {
            epoch: r.epoch,
            step: r.step + 1,
            offset,
        };
        if next.step >= self.steps_in(r.epoch) {
            next = StartPosition {
                epoch: r.epoch + 1,
                step: 0,
                offset,
            };
        }
        self.position = next;
        Ok(Batch {
            conn: Arc::clone(&self.conn),
            ready: r,
            released: false,
            streams: Mutex::new(Vec::new()),
        })
    }

    /// Where to resume: the (epoch, step) of the batch after the last one received, with the
    /// elastic offset this client attached with (attach again with it to continue at the same
    /// world size; [`StartPosition::consumed`] turns it into a point to resume at another).
    pub fn position(&self) -> StartPosition {
        self.position
    }

    /// Where to resume at any world size: [`Client::position`] as an elastic resume point
    /// (attach with `StartPosition::resume(point)`).
    pub fn checkpoint(&self) -> EpochOffset {
        self.position
            .consumed(self.world_size, self.spec.batch_size)
    }

    /// Ranks in the job this client attached to.
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// Batches of `epoch` for this rank: the daemon's `steps_per_epoch`, or fewer in the
    /// epoch an elastic offset resumed.
    pub fn steps_in(&self, epoch: u64) -> u64 {
        match (self.position.offset, self.attached.offset_epoch_steps) {
            (Some(o), Some(steps)) if o.epoch == epoch => steps,
            _ => self.attached.steps_per_epoch,
        }
    }

    /// The daemon's answer to the attach: ring size, steps per epoch, dataset size.
    pub fn attached(&self) -> &Attached {
        &self.attached
    }

    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }

    pub fn layout(&self) -> &RingLayout {
        self.conn.ring.layout()
    }

    /// Where this client's images live: host memory (the CPU backend) or its GPU's.
    pub fn image_memory(&self) -> ImageMemory {
        self.conn.ring.layout().image_memory
    }

    /// The ordinal (under this process's `CUDA_VISIBLE_DEVICES`) of the GPU holding the
    /// images, for device rings.
    pub fn device_ordinal(&self) -> Option<i32> {
        self.conn.device.as_ref().map(DeviceImages::ordinal)
    }

    /// The UUID of the GPU holding the images, for device rings.
    pub fn device_uuid(&self) -> Option<stoker_nvidia::cuda::GpuUuid> {
        self.conn.device.as_ref().map(DeviceImages::uuid)
    }
}

impl Drop for Client {
    /// Sends DETACH and waits (at most [`DETACH_WAIT`]) until the daemon closes the
    /// connection: by then it has freed the rank, so attaching the same rank again right away
    /// is not refused as RANK_TAKEN.
    fn drop(&mut self) {
        let Ok(bytes) = Message::Detach.encode() else {
            return;
        };
        // The daemon treats a vanished client like a detach; nothing to do on failure.
        if self.conn.sock.send(&bytes, &[]).is_err() {
            return;
        }
        let deadline = Instant::now() + DETACH_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.conn.sock.set_read_timeout(Some(left)).is_err() {
                return;
            }
            // READY messages still in flight are skipped; end of file or an error ends it.
            match self.conn.sock.recv(&mut self.buf) {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return,
            }
        }
    }
}

fn closed_or(e: SockError) -> ClientError {
    match e.raw_os_error() {
        Some(libc::EPIPE) | Some(libc::ECONNRESET) => ClientError::Closed,
        _ => ClientError::Socket(e),
    }
}

fn recv(sock: &SeqPacket, buf: &mut [u8]) -> Result<(Message, Vec<OwnedFd>), ClientError> {
    match sock.recv(buf).map_err(closed_or)? {
        None => Err(ClientError::Closed),
        Some(r) => Ok((Message::decode(&buf[..r.len])?, r.fds)),
    }
}

/// A lease on one filled slot. Dropping it gives the slot back to the daemon (for device
/// images: once the consumers' GPU work recorded so far completed, see
/// [`Batch::record_stream`]).
#[derive(Debug)]
pub struct Batch {
    conn: Arc<Connection>,
    ready: Ready,
    released: bool,
    /// The consumer streams to fence the release on (device images only).
    streams: Mutex<Vec<ConsumerStream>>,
}

/// Where a device batch's images are: `bytes` at device address `ptr` on the client's GPU
/// `ordinal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSlice {
    pub ptr: u64,
    pub bytes: usize,
    pub ordinal: i32,
}

impl Batch {
    pub fn epoch(&self) -> u64 {
        self.ready.epoch
    }

    pub fn step(&self) -> u64 {
        self.ready.step
    }

    /// Samples in this batch (the spec's batch size, or fewer for a short last batch).
    pub fn n(&self) -> usize {
        self.ready.n as usize
    }

    pub fn slot(&self) -> usize {
        self.ready.slot as usize
    }

    pub fn generation(&self) -> u64 {
        self.ready.generation
    }

    /// `len` bytes at `offset` in the slot's host part (labels, indices, status).
    fn region(&self, offset: usize, len: usize) -> &[u8] {
        // SAFETY: this batch holds the slot's lease, so the daemon does not write the slot
        // until the RELEASE that `drop` sends, after every borrow of `self` has ended.
        let slot = unsafe { self.conn.ring.host_bytes(self.slot()) };
        &slot[offset..offset + len]
    }

    /// The `n` images, packed in the spec's dtype and layout.
    ///
    /// # Panics
    /// When the images are in device memory ([`Batch::image_memory`]): use
    /// [`Batch::device_images`] or [`Batch::copy_images_to_host`].
    pub fn images(&self) -> &[u8] {
        let s = &self.conn.ring.layout().slot;
        // SAFETY: as in `region`: the lease keeps the daemon from writing the slot.
        let slot = unsafe { self.conn.ring.image_bytes(self.slot()) }.expect(
            "the images are in device memory: use device_images() or copy_images_to_host()",
        );
        &slot[s.images..s.images + self.n() * s.image_bytes]
    }

    /// Where the images live: host memory or the client's GPU.
    pub fn image_memory(&self) -> ImageMemory {
        self.conn.ring.layout().image_memory
    }

    /// Bytes of the `n` images.
    pub fn images_len(&self) -> usize {
        self.n() * self.conn.ring.layout().slot.image_bytes
    }

    /// The images' device address, when they are in device memory. Valid while the batch
    /// (its lease) lives; work a consumer enqueues on it must be fenced with
    /// [`Batch::record_stream`] unless it runs on the legacy default stream.
    pub fn device_images(&self) -> Option<DeviceSlice> {
        let d = self.conn.device.as_ref()?;
        Some(DeviceSlice {
            ptr: d.slot_ptr(self.slot()),
            bytes: self.images_len(),
            ordinal: d.ordinal(),
        })
    }

    /// Copies the `n` images to `out` (exactly [`Batch::images_len`] bytes), from host or
    /// device memory; synchronous, for inspection and tests, not for the training path.
    pub fn copy_images_to_host(&self, out: &mut [u8]) -> Result<(), ClientError> {
        if out.len() != self.images_len() {
            return Err(ClientError::Invalid(format!(
                "copy of the images into {} bytes; they are {} bytes",
                out.len(),
                self.images_len()
            )));
        }
        match &self.conn.device {
            None => out.copy_from_slice(self.images()),
            Some(d) => d.copy_to_host(self.slot(), out).map_err(|source| {
                ClientError::Device(DeviceError::Cuda {
                    device: d.uuid().to_string(),
                    source,
                })
            })?,
        }
        Ok(())
    }

    /// Declares that a consumer used the images on `stream` (a stream of the client GPU's
    /// primary context, or a null-stream handle): the release then waits for the work
    /// enqueued there before the slot goes back. Without any, the release fences the legacy
    /// default stream. Ignored for host images.
    pub fn record_stream(&self, stream: ConsumerStream) {
        if self.conn.device.is_none() {
            return;
        }
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if !streams.contains(&stream) {
            streams.push(stream);
        }
    }

    /// Pointer to the first image (for zero-copy tensor views).
    pub fn images_ptr(&self) -> *const u8 {
        self.images().as_ptr()
    }

    pub fn labels(&self) -> &[i64] {
        let s = &self.conn.ring.layout().slot;
        cast_slice(self.region(s.labels, self.n() * 8))
    }

    /// Global sample indices in the dataset.
    pub fn indices(&self) -> &[u64] {
        let s = &self.conn.ring.layout().slot;
        cast_slice(self.region(s.indices, self.n() * 8))
    }

    /// Per-sample [`SampleStatus`] bytes.
    pub fn status(&self) -> &[u8] {
        let s = &self.conn.ring.layout().slot;
        self.region(s.status, self.n())
    }

    /// Per-sample status, decoded; unknown values read as `Failed`.
    pub fn sample_status(&self, i: usize) -> SampleStatus {
        SampleStatus::from_u8(self.status()[i]).unwrap_or(SampleStatus::Failed)
    }

    /// Releases now and reports a failure to send (drop releases too, silently): host slots
    /// at once, device slots once the consumers' recorded work completed (the send then
    /// happens on the release thread, where a failure means the daemon is gone).
    pub fn release(mut self) -> Result<(), ClientError> {
        self.release_now()
    }

    fn release_now(&mut self) -> Result<(), ClientError> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        let streams = std::mem::take(self.streams.get_mut().unwrap_or_else(|p| p.into_inner()));
        self.conn.release(&self.ready, &streams)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // A failed release means the daemon is gone; it reclaims the slot itself.
        let _ = self.release_now();
    }
}

/// Integer types every bit pattern of which is a valid value.
trait Plain: Copy {}
impl Plain for i64 {}
impl Plain for u64 {}

/// Views aligned bytes as `T` (i64 or u64).
fn cast_slice<T: Plain>(bytes: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert_eq!(bytes.as_ptr().align_offset(std::mem::align_of::<T>()), 0);
    assert_eq!(bytes.len() % size, 0);
    // SAFETY: alignment and length are checked above; T is i64/u64 here, for which every bit
    // pattern is valid (the `Plain` bound); the slice borrows `bytes` so it cannot outlive the memory.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::protocol::Release;

    #[test]
    fn missing_daemon_is_named_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stoker.sock");
        let opts = AttachOptions::new("j", "/nowhere", PipelineSpec::train(2, 8));
        let err = Client::attach(&path, opts).unwrap_err();
        assert!(err.is_disconnected());
        assert_eq!(
            err.to_string(),
            format!("no stoker daemon at {}", path.display())
        );
    }

    #[test]
    fn an_invalid_spec_is_refused_before_connecting() {
        let opts = AttachOptions::new("j", "/nowhere", PipelineSpec::train(0, 8));
        let err = Client::attach(Path::new("/nonexistent/s.sock"), opts).unwrap_err();
        assert!(
            matches!(err, ClientError::Spec(SpecError::BatchSize(0))),
            "{err}"
        );
    }

    /// A daemon stand-in on a real socket at `path`: expects job "job-a" rank 1 of 2 from
    /// (3, 4), answers with a 2-slot ring for `spec`, fills slot 1 with a known batch of 3
    /// (bytes 9, labels 10.., indices 100.., status [0, 0, 1]), sends READY (generation 7)
    /// then END_OF_DATA, and returns what the client sent back until it hung up.
    pub(crate) fn fake_daemon(
        path: &Path,
        spec: PipelineSpec,
    ) -> std::thread::JoinHandle<Vec<Message>> {
        use crate::protocol::Attached;
        use crate::sock::SeqPacketListener;
        use std::os::fd::AsFd;

        let listener = SeqPacketListener::bind(path).unwrap();
        let layout = RingLayout::new(&spec, 2, page_size());
        std::thread::spawn(move || {
            let conn = listener.accept().unwrap();
            let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
            let r = conn.recv(&mut buf).unwrap().unwrap();
            let Message::Attach(a) = Message::decode(&buf[..r.len]).unwrap() else {
                panic!("expected attach")
            };
            assert_eq!((a.job.as_str(), a.rank, a.world_size), ("job-a", 1, 2));
            assert_eq!(a.start, StartPosition::at(3, 4));
            let ring = MemfdRing::create(c"fake", layout).unwrap();
            let s = layout.slot;
            let base = ring.host_ptr(1);
            let images = ring.image_ptr(1).unwrap();
            // SAFETY: slot 1 is inside the ring and nobody else touches it yet.
            unsafe {
                std::ptr::write_bytes(images.add(s.images), 9, 3 * s.image_bytes);
                for i in 0..3 {
                    base.add(s.labels + 8 * i)
                        .cast::<i64>()
                        .write(10 + i as i64);
                    base.add(s.indices + 8 * i)
                        .cast::<u64>()
                        .write(100 + i as u64);
                }
                base.add(s.status + 2).write(SampleStatus::Replaced as u8);
            }
            let attached = Message::Attached(Attached {
                slots: 2,
                slot_bytes: s.slot_bytes as u64,
                ring_bytes: layout.ring_bytes as u64,
                steps_per_epoch: 5,
                offset_epoch_steps: None,
                dataset_len: 19,
                classes: 3,
                ranks_attached: 1,
                created_job: true,
                daemon_version: "test".into(),
                accepts_stats: false,
                ..Attached::default()
            });
            conn.send(&attached.encode().unwrap(), &[ring.as_fd()])
                .unwrap();
            let ready = Message::Ready(Ready {
                slot: 1,
                generation: 7,
                epoch: 3,
                step: 4,
                n: 3,
            });
            conn.send(&ready.encode().unwrap(), &[]).unwrap();
            conn.send(&Message::EndOfData.encode().unwrap(), &[])
                .unwrap();
            let mut got = Vec::new();
            while let Some(r) = conn.recv(&mut buf).unwrap() {
                got.push(Message::decode(&buf[..r.len]).unwrap());
            }
            got
        })
    }

    #[test]
    fn attach_receive_release_against_a_fake_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stoker.sock");
        let spec = PipelineSpec::train(4, 8);
        let daemon = fake_daemon(&path, spec.clone());

        let mut opts = AttachOptions::new("job-a", "/data", spec);
        opts.rank = 1;
        opts.world_size = 2;
        opts.start = StartPosition::at(3, 4);
        let mut client = Client::attach(&path, opts).unwrap();
        assert_eq!(client.attached().steps_per_epoch, 5);
        let batch = client.next_batch().unwrap().unwrap();
        assert_eq!((batch.epoch(), batch.step(), batch.n()), (3, 4, 3));
        assert_eq!(batch.labels(), &[10, 11, 12]);
        assert_eq!(batch.indices(), &[100, 101, 102]);
        assert_eq!(batch.status(), &[0, 0, 1]);
        assert_eq!(batch.sample_status(2), SampleStatus::Replaced);
        assert!(batch.images().iter().all(|&b| b == 9));
        assert_eq!(batch.images().len(), 3 * 8 * 8 * 3 * 4);
        // Step 4 was the epoch's last (5 steps): resume at the next epoch's first.
        assert_eq!(client.position(), StartPosition::at(4, 0));
        assert!(client.next_batch().unwrap().is_none());
        assert!(client.next_batch().unwrap().is_none());
        drop(batch);
        drop(client);
        let got = daemon.join().unwrap();
        assert_eq!(
            got,
            vec![
                Message::Release(Release {
                    slot: 1,
                    generation: 7
                }),
                Message::Detach
            ]
        );
    }

    #[test]
    fn the_stall_clock_splits_wait_from_compute() {
        let mut clock = StallClock::new();
        let t = clock.enter();
        std::thread::sleep(Duration::from_millis(30));
        clock.leave(t, true);
        std::thread::sleep(Duration::from_millis(60));
        let t = clock.enter();
        clock.leave(t, false);
        let s = clock.totals;
        assert_eq!(s.batches, 1);
        assert!(s.wait >= Duration::from_millis(30), "{s:?}");
        assert!(s.compute >= Duration::from_millis(60), "{s:?}");
        assert!(s.wait_fraction() > 0.0 && s.wait_fraction() < 0.5, "{s:?}");
        assert_eq!(StallStats::default().wait_fraction(), 0.0);
        let Message::Stats(m) = s.message() else {
            panic!("a STATS message")
        };
        assert_eq!(m.batches, 1);
        assert_eq!(m.wait_ns, s.wait.as_nanos() as u64);
    }

    #[test]
    fn a_closed_connection_is_reported_as_such() {
        use crate::sock::SeqPacketListener;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stoker.sock");
        let listener = SeqPacketListener::bind(&path).unwrap();
        let daemon = std::thread::spawn(move || {
            let conn = listener.accept().unwrap();
            let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
            conn.recv(&mut buf).unwrap();
            // Hang up without answering.
        });
        let opts = AttachOptions::new("j", "/data", PipelineSpec::train(2, 8));
        let err = Client::attach(&path, opts).unwrap_err();
        daemon.join().unwrap();
        assert!(matches!(err, ClientError::Closed), "{err}");
        assert_eq!(err.to_string(), "daemon closed the connection");
    }
}
