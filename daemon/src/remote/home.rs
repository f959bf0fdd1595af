//! The home daemon's side: one [`RemoteBackend`] per connection to a worker, run by an engine
//! thread of its own ([`stoker_pipeline::engine::ExtraWorkers`]), taking units from the same scheduler
//! as the local decode threads.
//!
//! # Design
//! - `fill` sends the unit (opening its job on this connection first), reads the worker's
//!   answer by the unit's deadline and its pixels straight into the slot. Every answer is
//!   checked: the unit's id, one result per sample, exactly the unit's image bytes, and
//!   fates the engine could have reached (Ok is the sample itself; a replacement is one of
//!   [`replacement_candidates`] under `skip`). Then it reports the outcomes as the CPU
//!   backend would, and `fill_sample` answers the engine's replacement tries from the
//!   worker's decisions (the pixels are already in place).
//! - Anything else (a timeout, a closed or cut connection, a malformed answer) drops the
//!   connection and fills the unit locally with this thread's own [`CpuBackend`], so the
//!   batch is the same; the worker is tried again after a backoff ([`MIN_BACKOFF`] doubling
//!   to [`MAX_BACKOFF`]). A job or unit the worker refuses is filled locally too; a refused
//!   job is not offered to that connection again.
//!
//! - A worker entry's name is resolved every `[remote] resolve_interval_s`
//!   ([`super::resolve`]); each connection sits at its place among the addresses and moves,
//!   between two units, when its address vanishes or its place goes to a new one, so a
//!   Kubernetes headless Service's pods share the connections (`remote.connections` should
//!   be at least the pods' count). With `[remote] tls_ca` the link is TLS ([`super::tls`]).
//!
//! # Limitations
//! - The local fill after a fault runs on this thread, beside the decode threads.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use stoker_wire::ring::{ImageMemory, SlotLayout};

use super::auth::{self, Secret};
use super::board::{frame_bytes, thread_cpu_ns, UnitEnd, UnitTiming, WorkerBoard};
use super::resolve::{keeps, ResolveError, Resolver};
use super::seal::Session;
use super::tls::{HandshakeError, HomeTls, Link};
use super::unit::fingerprint;
use super::wire::{tune, SampleResult, WireError};
use super::wire::{Message, OpenJob, SampleFate};
use super::worker::WorkerError;
use crate::remote::config::RemoteConfig;
use stoker_pipeline::engine::backend::BackendKind;
use stoker_pipeline::engine::{
    replacement_candidates, Backend, BackendFactory, BadSamplePolicy, Completion, CpuBackend,
    EngineConfig, Job, PipelineError, SampleOutcome, SampleWork, SlotImages, UnitSize, UnitWork,
    CPU_UNIT_SAMPLES,
};
use stoker_pipeline::metrics as m;
use stoker_pipeline::source::index::Dataset;
use stoker_pipeline::sync::lock;
use stoker_pipeline::transform::badsample::{BadSample, REASONS};

/// The first wait before a worker that failed is tried again.
pub(crate) const MIN_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait before a worker that keeps failing is tried again.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long connecting and the handshake may take at most.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What every connection of a home daemon shares.
struct HomeShared {
    secret: Option<Secret>,
    tls: Option<HomeTls>,
    timeout: Duration,
    /// Fingerprints of the datasets seen, by identity (computed once per dataset).
    fingerprints: Mutex<Vec<(Weak<Dataset>, String)>>,
}

impl HomeShared {
    fn fingerprint(&self, dataset: &Arc<Dataset>) -> String {
        let mut known = lock(&self.fingerprints);
        known.retain(|(d, _)| d.strong_count() > 0);
        if let Some((_, f)) = known
            .iter()
            .find(|(d, _)| d.upgrade().is_some_and(|d| Arc::ptr_eq(&d, dataset)))
        {
            return f.clone();
        }
        let f = fingerprint(dataset);
        known.push((Arc::downgrade(dataset), f.clone()));
        f
    }
}

/// Makes the backends of one worker's connections.
pub(crate) struct RemoteFactory {
    addr: String,
    names: Arc<Resolver>,
    connections: usize,
    shared: Arc<HomeShared>,
    /// Backends made so far: the next one's place among the addresses the name resolves to.
    made: AtomicUsize,
    board: Arc<WorkerBoard>,
}

/// One factory per worker of `[remote] workers`.
pub(crate) fn factories(config: &RemoteConfig) -> Result<Vec<RemoteFactory>, WorkerError> {
    if config.workers.is_empty() {
        return Ok(Vec::new());
    }
    let tls = match (&config.tls_ca, &config.tls_cert, &config.tls_key) {
        (Some(ca), Some(cert), Some(key)) => Some(HomeTls::load(ca, Some((cert, key)))?),
        (Some(ca), _, _) => Some(HomeTls::load(ca, None)?),
        _ => None,
    };
    let shared = Arc::new(HomeShared {
        secret: config
            .secret_file
            .as_deref()
            .map(Secret::load)
            .transpose()?,
        tls,
        timeout: Duration::from_millis(config.unit_timeout_ms),
        fingerprints: Mutex::default(),
    });
    Ok(config
        .workers
        .iter()
        .map(|addr| RemoteFactory {
            addr: addr.clone(),
            names: Arc::new(Resolver::new(
                addr,
                Duration::from_secs(config.resolve_interval_s),
            )),
            connections: config.connections,
            shared: Arc::clone(&shared),
            made: AtomicUsize::new(0),
            board: Arc::new(WorkerBoard::new(addr)),
        })
        .collect())
}

impl RemoteFactory {
    /// The worker's address as configured.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }
    /// Connections (engine threads) to this worker.
    pub(crate) fn connections(&self) -> usize {
        self.connections
    }
    /// What its connections record, for status and metrics.
    pub(crate) fn board(&self) -> Arc<WorkerBoard> {
        Arc::clone(&self.board)
    }
}

impl BackendFactory for RemoteFactory {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn unit_size(&self) -> UnitSize {
        UnitSize::Samples(CPU_UNIT_SAMPLES)
    }
    fn image_memory(&self) -> ImageMemory {
        ImageMemory::Host
    }
    fn make(&self, config: &EngineConfig) -> Result<Box<dyn Backend>, PipelineError> {
        Ok(Box::new(RemoteBackend {
            addr: self.addr.clone(),
            names: Arc::clone(&self.names),
            shared: Arc::clone(&self.shared),
            config: config.clone(),
            local: CpuBackend::new(config)?,
            conn: None,
            place: self.made.fetch_add(1, Ordering::Relaxed),
            retry_at: Instant::now(),
            backoff: MIN_BACKOFF,
            last: Last::Local,
            next_unit: 0,
            board: Arc::clone(&self.board),
            in_flight: None,
        }))
    }
}

/// One connection to a worker, and what it has opened.
struct Conn {
    stream: Link,
    /// MACs what is sent and checks what is read ([`super::seal`]).
    session: Session,
    /// The address it is to, and the generation of the name's answer it was made under.
    peer: SocketAddr,
    made: u64,
    /// Jobs opened (their key, their id here) and refused (id `None`).
    jobs: Vec<(String, Option<u32>)>,
    /// The id the next job opened gets.
    next_job: u32,
}

/// Who filled the last unit, for the engine's replacement tries.
enum Last {
    Local,
    Remote {
        start: usize,
        samples: Vec<SampleResult>,
    },
}

/// Why a unit was not filled remotely.
enum Fault {
    /// No connection now (waiting out a backoff).
    Down,
    /// The worker refused the job or the unit (the connection stays).
    Refused(String),
    /// The connection is broken or the worker misbehaved: dropped.
    Broken(String),
    /// The worker closed the connection (dropped too; a reused one is tried once afresh).
    Closed(String),
}

impl From<WireError> for Fault {
    fn from(e: WireError) -> Fault {
        match e {
            WireError::Closed => Fault::Closed(e.to_string()),
            e => Fault::Broken(e.to_string()),
        }
    }
}

/// An engine thread's backend that sends its units to one worker.
pub(crate) struct RemoteBackend {
    addr: String,
    names: Arc<Resolver>,
    shared: Arc<HomeShared>,
    config: EngineConfig,
    /// Fills units the worker does not (faults, refusals).
    local: CpuBackend,
    conn: Option<Conn>,
    /// This connection's place among the addresses the worker's name resolves to.
    place: usize,
    retry_at: Instant,
    backoff: Duration,
    last: Last,
    next_unit: u64,
    board: Arc<WorkerBoard>,
    /// The unit written to the worker and not settled yet.
    in_flight: Option<UnitTiming>,
}

impl Backend for RemoteBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn fill(&mut self, unit: &UnitWork<'_>, outcomes: &mut Vec<SampleOutcome>) -> Completion {
        // A worker reads as itself: a job read with its client's credentials stays here, so
        // that client is served only what it could read (docs/design.md, security). A job of
        // several views stays here too: a worker returns one image per sample.
        let result = if unit.job.open_policy().credentials.is_some() || unit.layout.views > 1 {
            Err(Fault::Down)
        } else {
            self.remote_fill_afresh(unit, outcomes)
        };
        let worker = self.addr.clone();
        let count = |result: &'static str| {
            metrics::counter!(m::REMOTE_UNITS_TOTAL, "worker" => worker.clone(), "result" => result)
                .increment(1);
        };
        let end = match &result {
            Ok(()) => Some(UnitEnd::Done(unit.indices.len() as u64)),
            Err(Fault::Down) => None,
            Err(Fault::Refused(_)) => Some(UnitEnd::Refused),
            Err(Fault::Broken(_) | Fault::Closed(_)) => Some(UnitEnd::Reissued),
        };
        let timing = self.in_flight.take();
        if let Some(end) = end {
            self.board.settle(timing, end);
        }
        match result {
            Ok(()) => {
                count("done");
                metrics::counter!(m::REMOTE_IMAGES_TOTAL, "worker" => worker.clone())
                    .increment(unit.indices.len() as u64);
                return Completion::Done;
            }
            Err(Fault::Down) => {}
            Err(Fault::Refused(reason)) => {
                count("refused");
                tracing::warn!(worker = %self.addr, reason, "worker refused: filling locally");
            }
            Err(Fault::Broken(reason) | Fault::Closed(reason)) => {
                count("reissued");
                let peer = self.conn.as_ref().map(|c| c.peer.to_string());
                tracing::warn!(
                    worker = %self.addr,
                    peer,
                    reason,
                    "dropping the worker's connection; its unit is filled locally"
                );
                self.disconnect();
            }
        }
        outcomes.clear();
        self.last = Last::Local;
        self.local.fill(unit, outcomes)
    }

    fn fill_sample(&mut self, work: &SampleWork<'_>) -> SampleOutcome {
        let Last::Remote { start, samples } = &self.last else {
            return self.local.fill_sample(work);
        };
        let chosen = work
            .at
            .checked_sub(*start)
            .and_then(|k| samples.get(k))
            .is_some_and(|s| s.status == SampleFate::Replaced && s.delivered == work.index);
        if chosen {
            Ok(())
        } else {
            Err(BadSample {
                reason: "other",
                detail: format!("not the replacement worker {} delivered", self.addr),
            })
        }
    }

    fn clear_sample(&mut self, images: SlotImages, layout: &SlotLayout, at: usize) {
        self.local.clear_sample(images, layout, at);
    }
}

impl RemoteBackend {
    /// As [`RemoteBackend::remote_fill`]; a connection used before that turns out closed
    /// (the worker's `idle_timeout_ms`, a restarted worker) is made again at once and the
    /// unit sent once more (a worker that got it did nothing another may not redo: the
    /// same unit gives the same bytes), before the unit is filled here.
    fn remote_fill_afresh(
        &mut self,
        unit: &UnitWork<'_>,
        outcomes: &mut Vec<SampleOutcome>,
    ) -> Result<(), Fault> {
        self.follow_name();
        let reused = self.conn.is_some();
        match self.remote_fill(unit, outcomes) {
            Err(Fault::Closed(reason)) if reused => {
                tracing::info!(worker = %self.addr, reason, "the worker closed an idle \
                    connection: connecting again");
                self.conn = None;
                outcomes.clear();
                if let Some(t) = self.in_flight.take() {
                    self.board.resent(t);
                }
                match self.remote_fill(unit, outcomes) {
                    Err(Fault::Down) => Err(Fault::Closed(reason)),
                    other => other,
                }
            }
            other => other,
        }
    }

    /// Closes the connection (between two units) when the worker's name no longer leads
    /// to its address, or leads this connection's place elsewhere ([`keeps`]).
    fn follow_name(&mut self) {
        let Some(conn) = &self.conn else {
            return;
        };
        let Ok(now) = self.names.answer() else {
            return;
        };
        if !keeps(conn.peer, conn.made, self.place, &now) {
            tracing::info!(worker = %self.addr, peer = %conn.peer, "the worker's name leads \
                this connection elsewhere now: closing it between two units");
            self.conn = None;
        }
    }

    /// Has the worker fill the unit; the pixels land in the slot.
    fn remote_fill(
        &mut self,
        unit: &UnitWork<'_>,
        outcomes: &mut Vec<SampleOutcome>,
    ) -> Result<(), Fault> {
        let deadline = Instant::now() + self.shared.timeout;
        self.ensure_connected()?;
        let job = self.ensure_job(unit.job, deadline)?;
        let id = self.next_unit;
        self.next_unit += 1;
        let conn = self.conn.as_mut().ok_or(Fault::Down)?;
        let ask = Message::Unit {
            id,
            job,
            epoch: unit.pos.epoch,
            indices: unit.indices.to_vec(),
        };
        conn.session.write(&mut conn.stream, &ask, &[])?;
        self.in_flight = Some(self.board.sent(frame_bytes(&ask)));
        let cpu0 = thread_cpu_ns();
        let answer = conn.session.read(&mut conn.stream, Some(deadline))?;
        self.board.received(frame_bytes(&answer), 0);
        let (samples, bytes) = match answer {
            Message::Done {
                id: got,
                samples,
                bytes,
            } if got == id => (samples, bytes),
            Message::Refused {
                unit: Some(got),
                reason,
                ..
            } if got == id => return Err(Fault::Refused(reason)),
            other => return Err(Fault::Broken(format!("answered unit {id} with {other:?}"))),
        };
        check_answer(unit, &self.config, &samples, bytes)
            .map_err(|e| Fault::Broken(e.to_string()))?;
        // SAFETY: this thread holds the unit (the engine handed it to this worker), and no
        // other reference to its images lives while the pixels are read into them.
        let images = unsafe { unit.host_images() };
        // Checked against its MAC before the unit is reported done; on a mismatch the local
        // fill overwrites what landed.
        conn.session
            .read_into(&mut conn.stream, images, Some(deadline))?;
        self.board
            .received(bytes, thread_cpu_ns().saturating_sub(cpu0));
        outcomes.extend(samples.iter().map(outcome));
        self.last = Last::Remote {
            start: unit.start,
            samples,
        };
        Ok(())
    }

    fn ensure_connected(&mut self) -> Result<(), Fault> {
        if self.conn.is_some() {
            return Ok(());
        }
        if Instant::now() < self.retry_at {
            return Err(Fault::Down);
        }
        match connect(&self.names, self.place, &self.shared) {
            Ok((stream, session, peer, made)) => {
                tracing::info!(worker = %self.addr, %peer, "connected to a remote worker");
                self.backoff = MIN_BACKOFF;
                self.conn = Some(Conn {
                    stream,
                    session,
                    peer,
                    made,
                    jobs: Vec::new(),
                    next_job: 0,
                });
                Ok(())
            }
            Err(e) => {
                // As text, so the log line reads as it always has (a quoted string).
                let reason = e.to_string();
                tracing::warn!(worker = %self.addr, reason, retry_in = ?self.backoff,
                    "cannot reach the worker: filling locally");
                self.disconnect();
                Err(Fault::Down)
            }
        }
    }

    fn disconnect(&mut self) {
        self.conn = None;
        self.retry_at = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// The id of `job` on this connection, opening it first if need be.
    fn ensure_job(&mut self, job: &Job, deadline: Instant) -> Result<u32, Fault> {
        let open = self.open_of(job)?;
        let key = serde_json::to_string(&open).map_err(|e| Fault::Refused(e.to_string()))?;
        let conn = self.conn.as_mut().ok_or(Fault::Down)?;
        match conn.jobs.iter().find(|(k, _)| *k == key) {
            Some((_, Some(id))) => return Ok(*id),
            Some((_, None)) => return Err(Fault::Down),
            None => {}
        }
        let id = conn.next_job;
        conn.next_job = id.checked_add(1).ok_or(Fault::Down)?;
        let message = Message::Open(Box::new(OpenJob { job: id, ..open }));
        conn.session.write(&mut conn.stream, &message, &[])?;
        let answer = conn.session.read(&mut conn.stream, Some(deadline))?;
        self.board
            .control(frame_bytes(&message), frame_bytes(&answer));
        match answer {
            Message::Opened { job, closed } if job == id => {
                // Jobs the worker let go are opened again when next needed.
                conn.jobs
                    .retain(|(_, j)| j.is_none_or(|j| !closed.contains(&j)));
                conn.jobs.push((key, Some(id)));
                Ok(id)
            }
            Message::Refused {
                job: Some(job),
                reason,
                ..
            } if job == id => {
                conn.jobs.push((key, None));
                Err(Fault::Refused(reason))
            }
            other => Err(Fault::Broken(format!("answered open {id} with {other:?}"))),
        }
    }

    /// What the worker needs to open `job` (its id left 0).
    fn open_of(&self, job: &Job) -> Result<OpenJob, Fault> {
        let dataset = job
            .dataset
            .root()
            .to_str()
            .ok_or_else(|| Fault::Refused("the dataset's path is not UTF-8".into()))?;
        Ok(OpenJob {
            job: 0,
            dataset: dataset.to_owned(),
            fingerprint: self.shared.fingerprint(&job.dataset),
            spec: job.spec.clone(),
            seed: job.seed,
            policy: self.config.policy,
            max_pixels: self.config.limits.max_pixels,
            max_file_bytes: self.config.limits.max_file_bytes,
        })
    }
}

/// Why no connection to a worker entry could be made.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    /// The entry's name has no address now.
    #[error("{0}")]
    Resolve(#[from] ResolveError),
    /// The last address tried (every one was) refused the TCP connection or timed out.
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The TLS handshake with `addr` failed.
    #[error("with {addr}: {source}")]
    Tls {
        addr: SocketAddr,
        source: HandshakeError,
    },
    /// The shared-secret handshake with `addr` failed.
    #[error("handshake with {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        source: auth::AuthError,
    },
}

/// Why a worker's answer is not one the local engine could have given.
#[derive(Debug, thiserror::Error)]
enum AnswerError {
    /// Another number of results or of pixel bytes than the unit needs.
    #[error("{results} results and {bytes} bytes for a unit of {samples} samples ({want} bytes)")]
    Shape {
        results: usize,
        bytes: u64,
        samples: usize,
        want: u64,
    },
    /// A sample's result no rule of the engine allows (a replacement not among its
    /// candidates, a failure without a reason, ...).
    #[error("sample {index}: an impossible result {result:?}")]
    Impossible { index: u64, result: SampleResult },
}

/// Connects to the worker entry `names` (its current answer) and passes the handshakes
/// (TLS if configured, then the secret's). The address at `place` is tried first, then the
/// others, so the connections of one entry spread over a headless Service's pods. The
/// link, its session, the address and the answer's generation.
fn connect(
    names: &Resolver,
    place: usize,
    shared: &HomeShared,
) -> Result<(Link, Session, SocketAddr, u64), ConnectError> {
    let wait = shared.timeout.min(CONNECT_TIMEOUT);
    let answer = names.answer()?;
    let mut addrs = answer.addrs.clone();
    let n = addrs.len();
    addrs.rotate_left(place % n.max(1));
    let host = names
        .name()
        .rsplit_once(':')
        .map_or(names.name(), |(h, _)| h);
    let mut last = ConnectError::Resolve(ResolveError::Empty {
        name: names.name().to_owned(),
    });
    for a in addrs {
        let stream = match TcpStream::connect_timeout(&a, wait) {
            Ok(s) => s,
            Err(source) => {
                last = ConnectError::Connect { addr: a, source };
                continue;
            }
        };
        if let Err(e) = tune(&stream) {
            tracing::warn!(worker = %a, error = %e, "cannot set TCP options");
        }
        let deadline = Instant::now() + wait;
        let mut link = match &shared.tls {
            None => Link::Plain(stream),
            Some(tls) => tls
                .connect(stream, host, deadline)
                .map_err(|source| ConnectError::Tls { addr: a, source })?,
        };
        return auth::connect(&mut link, shared.secret.as_ref(), deadline)
            .map(|session| (link, session, a, answer.generation))
            .map_err(|source| ConnectError::Handshake { addr: a, source });
    }
    Err(last)
}

/// Whether the worker's answer is one the local engine could have given for `unit`.
fn check_answer(
    unit: &UnitWork<'_>,
    config: &EngineConfig,
    samples: &[SampleResult],
    bytes: u64,
) -> Result<(), AnswerError> {
    let n = unit.indices.len();
    let want = (n * unit.layout.image_bytes) as u64;
    if samples.len() != n || bytes != want {
        return Err(AnswerError::Shape {
            results: samples.len(),
            bytes,
            samples: n,
            want,
        });
    }
    let len = unit.job.dataset.len() as u64;
    for (s, &index) in samples.iter().zip(unit.indices) {
        let plausible = match s.status {
            SampleFate::Ok => s.delivered == index && s.bad.is_none(),
            SampleFate::Failed => s.delivered == index && s.bad.is_some(),
            SampleFate::Replaced => {
                config.policy == BadSamplePolicy::Skip
                    && s.bad.is_some()
                    && replacement_candidates(unit.job.seed, unit.pos.epoch, index, len)
                        .any(|c| c == s.delivered)
            }
        };
        if !plausible {
            return Err(AnswerError::Impossible {
                index,
                result: s.clone(),
            });
        }
    }
    Ok(())
}

/// The outcome the CPU backend would have reported for a sample with this result.
fn outcome(s: &SampleResult) -> SampleOutcome {
    match &s.bad {
        None => Ok(()),
        Some((reason, detail)) => Err(BadSample {
            reason: REASONS
                .iter()
                .find(|r| **r == reason.as_str())
                .copied()
                .unwrap_or("other"),
            detail: detail.clone(),
        }),
    }
}
