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
//! - A socket whose permissions refuse this user is [`ClientError::SocketRefused`] at once,
//!   saying which socket, its mode and group, this user's groups and what to do
//!   ([`crate::socket::path::explain_refusal`]).
//! - Before sending anything the client checks whom it connected to
//!   ([`crate::socket::trust`]): a daemon of another uid (a relay another user put where this
//!   user's socket would be) is [`ClientError::Connect`] naming its uid.
//! - When the daemon goes away, [`Client::next_batch`] reports it
//!   ([`ClientError::is_disconnected`]) and the caller attaches again at [`Client::position`];
//!   or, with [`AttachOptions::reattach`] set, it does so itself (`reattach`): same socket,
//!   same position, waiting for the daemon within that bound.
//!
//! - Device rings (the daemon's CUDA backend, `device: "cuda:N"` or a GPU UUID): the images
//!   are a VMM allocation on the client's GPU, imported and mapped once per attach
//!   (`device`); a batch hands out its device address ([`Batch::device_images`]) and
//!   its release is fenced by events on the consumer's streams ([`Batch::record_stream`]),
//!   waited for on a client thread, never on the caller's.
//!
//! - The data stall is measured here, where it happens: [`Client::next_batch`] adds the time
//!   it blocks to `wait` and the time since the previous call returned to `compute`
//!   ([`StallClock`]). [`Client::stall`] returns the totals; every `STATS_EVERY` (500 ms) they go to
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

use crate::protocol::{
    Attach, Attached, BadSamples, Device, EpochOffset, EpochSteps, ErrorCode, Message, Position,
    Ready, ResumedEpoch, MAX_MESSAGE_BYTES,
};
use crate::ring::memfd::{page_size, MemfdRing};
use crate::ring::{ImageMemory, RingLayout};
use crate::socket::path::client_socket_path;
use crate::socket::{SeqPacket, SockError};
use crate::spec::PipelineSpec;
use device::{map_device_ring, send_release, DeviceImages};

/// How long [`Client::attach`] retries while no daemon answers, unless
/// `$STOKER_CONNECT_TIMEOUT` says otherwise.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Environment variable overriding [`DEFAULT_CONNECT_TIMEOUT`], in seconds (`0` disables
/// retrying).
const CONNECT_TIMEOUT_ENV: &str = "STOKER_CONNECT_TIMEOUT";
/// First pause between connection attempts; it doubles up to [`MAX_CONNECT_BACKOFF`].
const FIRST_CONNECT_BACKOFF: Duration = Duration::from_millis(20);
/// Longest pause between connection attempts.
const MAX_CONNECT_BACKOFF: Duration = Duration::from_millis(500);

/// `$STOKER_CONNECT_TIMEOUT` seconds if set and valid, else [`DEFAULT_CONNECT_TIMEOUT`].
fn default_connect_timeout() -> Duration {
    std::env::var(CONNECT_TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
}

/// How long dropping a [`Client`] waits for the daemon to confirm the detach.
const DETACH_WAIT: Duration = Duration::from_secs(1);

/// What a rank asks for when it attaches.
#[derive(Debug, Clone, PartialEq)]
pub struct AttachOptions {
    /// Names the job; every rank of a job uses the same key.
    pub job: String,
    /// This rank, `0..world_size`.
    pub rank: u32,
    /// Ranks of the job; every rank passes the same.
    pub world_size: u32,
    /// `cpu`, a GPU by UUID, or by ordinal under this process's `CUDA_VISIBLE_DEVICES`
    /// (resolved to the UUID before the attach is sent).
    pub device: Device,
    /// What a batch is; every rank of a job passes the same.
    pub spec: PipelineSpec,
    /// A registered dataset name or a path.
    pub dataset: String,
    /// The job's seed for shuffling and augmentation; every rank passes the same.
    pub seed: u64,
    /// First batch to receive.
    pub start: Position,
    /// An elastic resume's offset (see [`crate::protocol::position`]); every rank of a job
    /// passes the same one. [`EpochOffset::resume`] gives the start and offset that resume at
    /// a checkpoint.
    pub offset: Option<EpochOffset>,
    /// How long to keep retrying while no daemon answers (see [`default_connect_timeout`]).
    pub connect_timeout: Duration,
    /// `Some(bound)`: when the daemon goes away (a restart, a crash), `next_batch` attaches
    /// again by itself at [`Client::position`] to the same socket, waiting up to `bound` for
    /// the daemon to come back, and goes on with the batches an uninterrupted run gets (see
    /// `reattach`). `None` (the default): it returns the error.
    pub reattach: Option<Duration>,
}

impl AttachOptions {
    /// Rank 0 of 1, on the CPU, seed 0, from the start.
    pub fn new(job: impl Into<String>, dataset: impl Into<String>, spec: PipelineSpec) -> Self {
        AttachOptions {
            job: job.into(),
            rank: 0,
            world_size: 1,
            device: Device::Cpu,
            spec,
            dataset: dataset.into(),
            seed: 0,
            start: Position::default(),
            offset: None,
            connect_timeout: default_connect_timeout(),
            reattach: None,
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
            Ok(s) => {
                // Nothing is sent to a daemon this user does not trust.
                crate::socket::trust::check_daemon(&s, socket).map_err(|source| {
                    ClientError::Connect {
                        path: socket.to_owned(),
                        source,
                    }
                })?;
                return Ok(s);
            }
            Err(e) if crate::socket::path::is_refusal(e.raw_os_error()) => {
                return Err(ClientError::SocketRefused {
                    path: socket.to_owned(),
                    reason: crate::socket::path::explain_refusal(socket),
                })
            }
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

/// A refusal of this user names the daemon that refused it: a user with several daemons in
/// reach (the system's, one of their own) learns which one said no.
fn naming_socket(e: ClientError, socket: &Path) -> ClientError {
    match e {
        ClientError::Refused {
            code: code @ ErrorCode::PermissionDenied,
            message,
        } => ClientError::Refused {
            code,
            message: format!("{message} (the daemon at {})", socket.display()),
        },
        e => e,
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
    /// The batches received on this connection and not released yet.
    held: HeldLeases,
    /// The spec's field names, in slot order (for the reasons a field is not served).
    field_names: Vec<String>,
}

impl Connection {
    fn new(sock: SeqPacket, ring: MemfdRing, device: Option<DeviceImages>) -> Connection {
        Connection {
            sock,
            ring,
            device,
            held: HeldLeases::default(),
            field_names: Vec::new(),
        }
    }

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
    /// The batch after the last one received.
    position: Position,
    /// The elastic offset the job was attached with.
    offset: Option<EpochOffset>,
    /// Which batches exist, from ATTACHED.
    steps: EpochSteps,
    ended: bool,
    buf: Vec<u8>,
    clock: StallClock,
    /// Whether the wait with every slot held was reported (once per client).
    warned_all_held: bool,
    /// The job's bad samples, as the daemon last told them (BAD_SAMPLES).
    bad: BadSamples,
    /// Where and how it attached: a re-attach (`reattach`) goes there again.
    socket: PathBuf,
    opts: AttachOptions,
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
        let device = device::resolve_device(opts.device)?;
        let again = opts.clone();
        let sock = connect_with_retry(socket, opts.connect_timeout)?;
        let spec = opts.spec.clone();
        let world_size = opts.world_size;
        let attach = Message::Attach(Box::new(Attach {
            job: opts.job,
            rank: opts.rank,
            world_size: opts.world_size,
            device,
            spec: opts.spec,
            dataset: opts.dataset,
            seed: opts.seed,
            start: opts.start,
            offset: opts.offset,
        }));
        let bytes = attach.encode().map_err(ClientError::Encode)?;
        sock.send(&bytes, &[]).map_err(closed_or)?;
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        let (msg, fds) = recv(&sock, &mut buf).map_err(|e| e.with_socket(socket))?;
        let attached = attached(msg).map_err(|e| naming_socket(e, socket))?;
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
        let steps = EpochSteps {
            per_epoch: attached.steps_per_epoch,
            resumed: opts
                .offset
                .zip(attached.offset_epoch_steps)
                .map(|(o, steps)| ResumedEpoch {
                    epoch: o.epoch,
                    steps,
                }),
        };
        // A step beyond its epoch was refused; step 0 of a resumed epoch with nothing left is
        // the next epoch's start, where the daemon starts too.
        let position = if opts.start.step == 0 {
            opts.start.settle(&steps)
        } else {
            opts.start
        };
        Ok(Client {
            conn: Arc::new(Connection {
                field_names: spec.fields.clone(),
                ..Connection::new(sock, ring, device)
            }),
            attached,
            spec,
            world_size,
            position,
            offset: opts.offset,
            steps,
            ended: false,
            buf,
            clock: StallClock::new(),
            warned_all_held: false,
            bad: BadSamples::default(),
            socket: socket.to_owned(),
            opts: again,
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
        let got = self.receive_or_reattach();
        self.clock.leave(entered, matches!(got, Ok(Some(_))));
        if let Ok(Some(b)) = &got {
            self.clock.totals.bad_samples += b.status().iter().filter(|&&s| s != 0).count() as u64;
        }
        if got.is_ok() && self.attached.accepts_stats && self.clock.due() {
            self.send_stats();
        }
        got
    }

    /// Where the training loop's time went since the attach.
    pub fn stall(&self) -> StallStats {
        self.clock.totals
    }

    /// The job's bad samples (all its ranks) as the daemon last told this client, with the
    /// first few files named: told before the batch that holds one.
    pub fn bad_samples(&self) -> &BadSamples {
        &self.bad
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
        self.warn_if_all_held();
        let msg = loop {
            let (msg, fds) = recv(&self.conn.sock, &mut self.buf)?;
            if !fds.is_empty() {
                return Err(ClientError::Protocol(format!(
                    "{:?} carried {} unexpected fds",
                    msg.kind(),
                    fds.len()
                )));
            }
            match msg {
                Message::BadSamples(b) => self.bad = b,
                other => break other,
            }
        };
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

    /// Before a wait: when this client holds every slot of its ring, no batch can come until
    /// one is released; after [`held::ALL_HELD_WARN_AFTER`] of such a wait, says so on stderr,
    /// once, naming the held batches.
    fn warn_if_all_held(&mut self) {
        let slots = self.conn.ring.layout().slots;
        if self.warned_all_held || self.conn.held.count() < slots {
            return;
        }
        if !held::readable_within(&self.conn.sock, held::ALL_HELD_WARN_AFTER) {
            self.warned_all_held = true;
            eprintln!("{}", self.conn.held.warning(slots));
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
        self.position = Position::at(r.epoch, r.step).next(&self.steps);
        self.conn.held.take(r.epoch, r.step);
        Ok(Batch {
            conn: Arc::clone(&self.conn),
            ready: r,
            released: false,
            streams: Mutex::new(Vec::new()),
        })
    }

    /// Where to resume: the batch after the last one received (attach again with it and
    /// [`Client::offset`] to continue at the same world size; [`Client::checkpoint`] resumes
    /// at another).
    pub fn position(&self) -> Position {
        self.position
    }

    /// The elastic offset this client attached with, if any.
    pub fn offset(&self) -> Option<EpochOffset> {
        self.offset
    }

    /// Where to resume at any world size: [`Client::position`] as an elastic resume point
    /// (attach with the start and offset of [`EpochOffset::resume`]).
    pub fn checkpoint(&self) -> EpochOffset {
        self.position
            .consumed(self.offset, self.world_size, self.spec.batch_size)
    }

    /// Ranks in the job this client attached to.
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// Batches of `epoch` for this rank: the daemon's `steps_per_epoch`, or fewer in the
    /// epoch an elastic offset resumed.
    pub fn steps_in(&self, epoch: u64) -> u64 {
        self.steps.steps_in(epoch)
    }

    /// The daemon's answer to the attach: ring size, steps per epoch, dataset size.
    pub fn attached(&self) -> &Attached {
        &self.attached
    }

    /// The spec this client attached with.
    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }

    /// The ring's layout, computed from the spec and checked against ATTACHED.
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

/// The daemon's answer to ATTACH: ATTACHED, or the refusal it sent instead.
fn attached(answer: Message) -> Result<Attached, ClientError> {
    match answer {
        Message::Attached(a) => Ok(a),
        Message::Error(e) => Err(ClientError::Refused {
            code: e.code,
            message: e.message,
        }),
        other => Err(ClientError::Protocol(format!(
            "expected ATTACHED, got {:?}",
            other.kind()
        ))),
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
        Some(r) => Ok((
            Message::decode(&buf[..r.len]).map_err(ClientError::Decode)?,
            r.fds,
        )),
    }
}

/// A lease on one filled slot. Dropping it gives the slot back to the daemon (for device
/// images: once the consumers' GPU work recorded so far completed, see
/// [`Batch::record_stream`]).
mod batch;
/// cbindgen:ignore
mod device;
mod error;
mod held;
mod reattach;
mod stall;
pub use batch::{Batch, DeviceSlice, FieldError};
pub use device::{resolve_device, ConsumerStream};
pub use error::{ClientError, DeviceError, RingMismatch};
use held::HeldLeases;
use stall::StallClock;
pub use stall::StallStats;

#[cfg(test)]
pub(crate) mod tests;
