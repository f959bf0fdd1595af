//! One client connection's state machine: credentials, the opening message (ATTACH or
//! STATUS), the rank's ring and feed, then RELEASE / DETACH in and READY / END_OF_DATA out.
//!
//! # Design
//! - The connection thread reads the socket; a forwarder thread turns feed events into
//!   messages. Either end of the connection stops the feed (its Drop waits until no worker
//!   writes the ring), reclaims every slot the client held and frees the rank.
//!
//! # Limitations
//! - A rank is served from one engine (CPU or its GPU's) for as long as it is attached.

#![forbid(unsafe_code)]

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use stoker_wire::protocol::position::MAX_EPOCH;
use stoker_wire::protocol::{
    Attach, Attached, ErrorCode, Message, Ready as ReadyMsg, CLASS_NAMES_BYTES, MAX_MESSAGE_BYTES,
    SKIPPED_NAMES_BYTES,
};
use stoker_wire::socket::{SeqPacket, SockError};

use crate::serve::access::{Peer, QuotaGrant};
use crate::serve::stall::RankStallEntry;
use stoker_pipeline::engine::{Feed, FeedEvent, PipelineError};
use stoker_pipeline::metrics as m;
use stoker_pipeline::source::index::Asker;

use super::ops::{encode_status, ServerHandle, ServerState};
use super::refusal::{refuse, undecodable, Refusal};
use super::registry::{RankSeat, Seated};
use super::{ATTACH_TIMEOUT, REFUSED_PEER_DRAIN, STOPPING_MESSAGE};
/// One client connection.
pub(super) struct Connection {
    pub(super) id: u64,
    pub(super) handle: ServerHandle,
    pub(super) slots: usize,
}

/// The first message of a connection.
pub(super) enum Opening {
    Attach(Box<Attach>),
    Status,
    /// The peer hung up without a word (a liveness probe, typically).
    Closed,
}

/// Why a connection ended.
#[derive(Debug)]
pub(super) enum End {
    Detached,
    Eof,
    Malformed(String),
    Violation(String),
    Socket(SockError),
}

/// What an accepted attach holds until the rank leaves. Field order is drop order: the feed
/// stops (and waits until no worker writes the ring) before the seat and the quota are freed.
pub(super) struct Started {
    pub(super) feed: Feed,
    pub(super) seat: RankSeat,
    pub(super) grant: QuotaGrant,
    pub(super) ring_bytes: u64,
}

impl Connection {
    /// Serves `sock`, whose peer's credentials `peer` were taken from it at accept.
    pub(super) fn run(self, sock: SeqPacket, peer: Peer) {
        // Nothing a peer sends is parsed before its credentials pass.
        if !self.check_peer(&sock, &peer) {
            return;
        }
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        if let Some(attach) = self.open(&sock, &peer, &mut buf) {
            self.serve_rank(&sock, &attach, &peer, &mut buf);
        }
    }

    /// Whether the access rules let the peer in; else it is told why.
    fn check_peer(&self, sock: &SeqPacket, peer: &Peer) -> bool {
        let id = self.id;
        tracing::debug!(
            conn = id,
            pid = peer.pid,
            uid = peer.uid,
            "client connected"
        );
        if let Err(e) = self.handle.registry.access().check_peer(peer) {
            tracing::warn!(conn = id, reason = %e, "client refused");
            // Take the client's first message off the socket, unread, so that its send does
            // not fail on a closed connection before it can read why.
            let _ = sock.set_read_timeout(Some(REFUSED_PEER_DRAIN));
            let _ = sock.recv(&mut [0u8; 64]);
            send_error(sock, e.into());
            return false;
        }
        true
    }

    /// Reads the opening message: answers a STATUS, refuses what cannot attach, and returns
    /// an ATTACH to serve.
    fn open(&self, sock: &SeqPacket, peer: &Peer, buf: &mut [u8]) -> Option<Box<Attach>> {
        let id = self.id;
        match self.read_attach(sock, buf) {
            Ok(Opening::Attach(_)) if self.handle.is_stopping() => {
                send_error(sock, refuse(ErrorCode::Stopping, STOPPING_MESSAGE));
                None
            }
            Ok(Opening::Attach(a)) => Some(a),
            Ok(Opening::Status) => {
                match encode_status(self.handle.status(peer.uid)) {
                    Ok(bytes) => {
                        let _ = sock.send(&bytes, &[]);
                    }
                    Err(e) => send_error(sock, refuse(ErrorCode::Internal, e.to_string())),
                }
                tracing::debug!(conn = id, "status answered");
                None
            }
            Ok(Opening::Closed) => {
                tracing::debug!(conn = id, "closed before ATTACH");
                None
            }
            Err(r) => {
                tracing::warn!(conn = id, code = %r.code, reason = %r.message, "attach refused");
                send_error(sock, r);
                None
            }
        }
    }

    /// Serves an attached rank until it leaves: READY out (forwarder thread), RELEASE in.
    fn serve_rank(&self, sock: &SeqPacket, attach: &Attach, peer: &Peer, buf: &mut [u8]) {
        let id = self.id;
        let who = format!(
            "job {:?} rank {}/{}",
            attach.job, attach.rank, attach.world_size
        );
        let started = match self.start(sock, attach, peer) {
            Ok(v) => v,
            Err(r) => {
                tracing::warn!(conn = id, %who, code = %r.code, reason = %r.message, "attach refused");
                send_error(sock, r);
                return;
            }
        };
        tracing::info!(
            conn = id,
            %who,
            epoch = attach.start.epoch,
            step = attach.start.step,
            "rank attached"
        );
        let state = Arc::clone(&self.handle.state);
        state.clients.fetch_add(1, Ordering::Relaxed);
        state
            .ring_bytes
            .fetch_add(started.ring_bytes, Ordering::Relaxed);
        let Started {
            feed,
            seat,
            grant,
            ring_bytes,
        } = started;
        let feed = Arc::new(feed);
        let end = self.exchange(sock, &feed, &seat, buf);
        let leased = feed.leased();
        // Drop of the last Arc<Feed> stops it and waits until no worker writes the ring; only
        // then are the seat and the quota grant freed.
        drop(feed);
        ::metrics::gauge!(m::READY_SLOTS).decrement(leased as f64);
        state.clients.fetch_sub(1, Ordering::Relaxed);
        state.ring_bytes.fetch_sub(ring_bytes, Ordering::Relaxed);
        drop(seat);
        drop(grant);
        if state.stopping() {
            tracing::info!(conn = id, %who, reclaimed = leased, "rank told: daemon stopping");
            return;
        }
        log_end(id, &who, leased, &end);
    }

    /// Runs the forwarder thread and reads RELEASE until the connection ends; returns once the
    /// forwarder has ended too.
    fn exchange(&self, sock: &SeqPacket, feed: &Arc<Feed>, seat: &RankSeat, buf: &mut [u8]) -> End {
        let id = self.id;
        let state = &self.handle.state;
        let stop = Arc::new(AtomicBool::new(false));
        let waker = feed.waker();
        state
            .forwarders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, waker.clone());
        let forwarder = match sock.try_clone() {
            Ok(out) => {
                let (feed, stop) = (Arc::clone(feed), Arc::clone(&stop));
                let counts = Delivered {
                    daemon: Arc::clone(state),
                    job: Arc::clone(&seat.delivered),
                };
                std::thread::Builder::new()
                    .name(format!("stoker-fwd-{id}"))
                    .spawn(move || forward(id, &feed, &out, &stop, &counts))
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        let stall = state.stalls.entry(&seat.key, seat.rank);
        let end = match &forwarder {
            Ok(_) => serve_releases(sock, feed, &stall, buf),
            Err(e) => {
                let why = format!("cannot forward: {e}");
                send_error(sock, refuse(ErrorCode::Internal, why.clone()));
                End::Violation(why)
            }
        };
        stop.store(true, Ordering::Release);
        waker.wake();
        if let Ok(handle) = forwarder {
            let _ = handle.join();
        }
        state
            .forwarders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        end
    }

    pub(super) fn read_attach(&self, sock: &SeqPacket, buf: &mut [u8]) -> Result<Opening, Refusal> {
        let _ = sock.set_read_timeout(Some(ATTACH_TIMEOUT));
        let got = sock.recv(buf);
        let _ = sock.set_read_timeout(None);
        let r = match got {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(Opening::Closed),
            Err(e) if e.is_timeout() => {
                return Err(refuse(
                    ErrorCode::BadMessage,
                    "no ATTACH within the timeout",
                ))
            }
            Err(e) => return Err(refuse(ErrorCode::BadMessage, e.to_string())),
        };
        if !r.fds.is_empty() {
            return Err(refuse(ErrorCode::BadMessage, "ATTACH may not carry fds"));
        }
        match Message::decode(&buf[..r.len]) {
            Ok(Message::Attach(a)) => Ok(Opening::Attach(a)),
            Ok(Message::Status) => Ok(Opening::Status),
            Ok(other) => Err(refuse(
                ErrorCode::BadMessage,
                format!("expected ATTACH, got {:?}", other.kind()),
            )),
            Err(e) => Err(undecodable(e)),
        }
    }

    /// Validates the attach, checks the dataset against the access rules, seats the rank,
    /// reserves and makes its ring, starts its feed and answers ATTACHED with the ring's fd.
    pub(super) fn start(
        &self,
        sock: &SeqPacket,
        a: &Attach,
        peer: &Peer,
    ) -> Result<Started, Refusal> {
        check_attach(a)?;
        let admitted = self.handle.registry.access().admit(peer, &a.dataset)?;
        let Seated {
            job,
            seat,
            ranks_attached,
            created_job,
        } = self
            .handle
            .registry
            .seat(a, &admitted, peer.uid, &asker(sock)?)?;
        let steps = job.steps_per_epoch();
        let start_steps = job.steps_in(a.start.epoch);
        if a.start.step > 0 && a.start.step >= start_steps {
            return Err(refuse(
                ErrorCode::InvalidSpec,
                format!(
                    "start step {} is beyond the {start_steps} steps of epoch {}",
                    a.start.step, a.start.epoch
                ),
            ));
        }
        let target = self.handle.engines.target(&a.device)?;
        let layout = target.layout(&a.spec, self.slots)?;
        let ring_bytes = layout.total_bytes() as u64;
        let grant = self.handle.quotas.reserve(&seat.key, ring_bytes)?;
        let ring = target.make_ring(&a.spec, a.rank, layout)?;
        let device_images = target.gpu.is_some();
        let answer = Attached {
            // The ring's slot count comes from the configuration's u32.
            #[allow(clippy::cast_possible_truncation)]
            slots: layout.slots as u32,
            slot_bytes: layout.slot.slot_bytes as u64,
            ring_bytes: layout.ring_bytes as u64,
            image_memory: layout.image_memory,
            image_ring_bytes: if device_images {
                layout.image_ring_bytes as u64
            } else {
                0
            },
            steps_per_epoch: steps,
            offset_epoch_steps: job.offset().map(|o| job.steps_in(o.epoch)),
            dataset_len: job.dataset.len() as u64,
            classes: job.dataset.classes().len() as u64,
            class_names: class_names(job.dataset.classes()),
            skipped: job.dataset.skipped().count,
            skipped_first: skipped_names(&job.dataset.skipped().first),
            ranks_attached,
            created_job,
            daemon_version: stoker_wire::protocol::VERSION.to_owned(),
            accepts_stats: true,
        };
        let bytes = Message::Attached(answer)
            .encode()
            .map_err(|e| refuse(ErrorCode::Internal, e.to_string()))?;
        // Send the answer before the feed starts, so READY never precedes ATTACHED.
        let fds: Vec<_> = ring.fds.iter().map(|f| f.as_fd()).collect();
        sock.send(&bytes, &fds)
            .map_err(|e| refuse(ErrorCode::Internal, format!("cannot answer: {e}")))?;
        drop(fds);
        let feed = target
            .engine
            .start_feed(job, a.rank, ring.memory, a.start)
            .map_err(|e| refuse(ErrorCode::Internal, format!("cannot start the feed: {e}")))?;
        Ok(Started {
            feed,
            seat,
            grant,
            ring_bytes,
        })
    }
}

/// The asker of an attach on `sock`: gone once the client hung up (a listing for it stops).
fn asker(sock: &SeqPacket) -> Result<Asker, Refusal> {
    let sock = sock.try_clone().map_err(|e| {
        refuse(
            ErrorCode::Internal,
            format!("cannot watch the connection: {e}"),
        )
    })?;
    Ok(Asker::new(move || {
        let mut fds = [PollFd::new(&sock, PollFlags::RDHUP)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(0) => false,
            Ok(_) => {
                (fds[0].revents()).intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
            }
            Err(_) => false,
        }
    }))
}

/// The class names ATTACHED carries: all of them when they fit in [`CLASS_NAMES_BYTES`],
/// else none (the count still says how many).
fn class_names(classes: &[String]) -> Vec<String> {
    let bytes: usize = classes.iter().map(|c| c.len() + 3).sum();
    if bytes <= CLASS_NAMES_BYTES {
        classes.to_vec()
    } else {
        Vec::new()
    }
}

/// The skipped files' names ATTACHED carries: the first ones that fit in
/// [`SKIPPED_NAMES_BYTES`] (the count says how many there are).
fn skipped_names(first: &[String]) -> Vec<String> {
    let mut room = SKIPPED_NAMES_BYTES;
    first
        .iter()
        .take_while(|name| {
            let fits = name.len() + 3 <= room;
            room = room.saturating_sub(name.len() + 3);
            fits
        })
        .cloned()
        .collect()
}

/// Checks what an attach asks for on its own, before it meets the job.
pub(super) fn check_attach(a: &Attach) -> Result<(), Refusal> {
    if a.job.is_empty() {
        return Err(refuse(ErrorCode::InvalidSpec, "job key is empty"));
    }
    if a.world_size == 0 || a.rank >= a.world_size {
        return Err(refuse(
            ErrorCode::InvalidSpec,
            format!("rank {} is not within world_size {}", a.rank, a.world_size),
        ));
    }
    let epochs = [Some(a.start.epoch), a.offset.map(|o| o.epoch)];
    if let Some(epoch) = epochs.into_iter().flatten().find(|&e| e > MAX_EPOCH) {
        return Err(refuse(
            ErrorCode::InvalidSpec,
            format!("epoch {epoch} is beyond the last epoch a job may start at ({MAX_EPOCH})"),
        ));
    }
    super::gpus::attached_gpu(&a.device)?;
    a.spec
        .validate()
        .map_err(|e| refuse(ErrorCode::InvalidSpec, e.to_string()))
}

pub(super) fn send_error(sock: &SeqPacket, r: Refusal) {
    let Message::Error(e) = Message::error(r.code, r.message) else {
        return;
    };
    if let Ok(bytes) = e.encode_in_protocol(r.protocol) {
        let _ = sock.send(&bytes, &[]);
    }
}

/// Reads RELEASE (and STATS) messages until the client detaches, hangs up, or breaks the
/// protocol.
pub(super) fn serve_releases(
    sock: &SeqPacket,
    feed: &Feed,
    stall: &RankStallEntry,
    buf: &mut [u8],
) -> End {
    loop {
        let r = match sock.recv(buf) {
            Ok(Some(r)) => r,
            Ok(None) => return End::Eof,
            Err(SockError::Truncated(n, _)) => {
                let why = format!("message of {n} bytes exceeds the limit");
                send_error(sock, refuse(ErrorCode::BadMessage, why.clone()));
                return End::Malformed(why);
            }
            Err(e) if e.raw_os_error() == Some(Errno::CONNRESET.raw_os_error()) => return End::Eof,
            Err(e) => return End::Socket(e),
        };
        if !r.fds.is_empty() {
            let why = "client sent file descriptors".to_owned();
            send_error(sock, refuse(ErrorCode::BadMessage, why.clone()));
            return End::Violation(why);
        }
        match Message::decode(&buf[..r.len]) {
            Ok(Message::Release(rel)) => {
                if let Err(e) = feed.release(rel.slot as usize, rel.generation) {
                    let why = format!("RELEASE of slot {}: {e}", rel.slot);
                    send_error(sock, refuse(ErrorCode::BadMessage, why.clone()));
                    return End::Violation(why);
                }
                ::metrics::gauge!(m::READY_SLOTS).decrement(1.0);
            }
            Ok(Message::Stats(stats)) => stall.record(stats),
            Ok(Message::Detach) => return End::Detached,
            Ok(other) => {
                let why = format!("unexpected {:?} after attach", other.kind());
                send_error(sock, refuse(ErrorCode::BadMessage, why.clone()));
                return End::Violation(why);
            }
            Err(e) => {
                let why = e.to_string();
                send_error(sock, refuse(e.code(), why.clone()));
                return End::Malformed(why);
            }
        }
    }
}

/// Where a forwarder counts the images it delivers.
pub(super) struct Delivered {
    pub(super) daemon: Arc<ServerState>,
    pub(super) job: Arc<AtomicU64>,
}

/// Sends the feed's READY and END_OF_DATA events to the client until `stop` is set, the
/// data ends, or the client is gone. When the daemon drains it sends ERROR(STOPPING) and
/// shuts the socket, which ends the connection thread's read. Whoever sets `stop`, or starts
/// the drain, wakes the feed, so this thread sleeps until there is something to do.
pub(super) fn forward(
    id: u64,
    feed: &Feed,
    sock: &SeqPacket,
    stop: &AtomicBool,
    counts: &Delivered,
) {
    let mut bytes = Vec::with_capacity(64);
    let mut bad_told = 0;
    loop {
        if stop.load(Ordering::Acquire) || told_stopping(Some(feed), sock, counts) {
            return;
        }
        let msg = match feed.recv_wakeable() {
            Ok(None) => continue,
            Ok(Some(FeedEvent::Ready(r))) => Message::Ready(ReadyMsg {
                // Slot and count widen the ring's u32s (slots, batch size).
                #[allow(clippy::cast_possible_truncation)]
                slot: r.slot as u32,
                generation: r.generation,
                epoch: r.epoch,
                step: r.step,
                #[allow(clippy::cast_possible_truncation)]
                n: r.n as u32,
            }),
            Ok(Some(FeedEvent::EndOfData)) => Message::EndOfData,
            Err(PipelineError::Stopped) => return,
            Err(e) => {
                tracing::error!(conn = id, error = %e, "feed failed");
                Message::error(ErrorCode::Internal, format!("feed failed: {e}"))
            }
        };
        if matches!(msg, Message::Ready(_))
            && !tell_bad_samples(feed, sock, &mut bad_told, &mut bytes)
        {
            return;
        }
        if msg.encode_into(&mut bytes).is_err() || sock.send(&bytes, &[]).is_err() {
            // The client is gone; the connection thread sees end of file and cleans up.
            return;
        }
        let Message::Ready(r) = &msg else {
            // Nothing more to send, but a drain must still end this connection: wait for the
            // connection thread to finish, or tell the client the daemon stops.
            while !stop.load(Ordering::Acquire) && !told_stopping(None, sock, counts) {
                feed.wait_woken();
            }
            return;
        };
        let n = u64::from(r.n);
        counts.daemon.delivered.fetch_add(n, Ordering::Relaxed);
        counts.job.fetch_add(n, Ordering::Relaxed);
        ::metrics::gauge!(m::READY_SLOTS).increment(1.0);
    }
}

/// Before a READY: when the job's bad samples grew since this connection was last told,
/// sends BAD_SAMPLES (the count and the first names), so the batch that holds one arrives
/// after its name. Only the job's own connections get it: the names are of files in the
/// dataset the client attached to. False if the client is gone.
fn tell_bad_samples(feed: &Feed, sock: &SeqPacket, told: &mut u64, bytes: &mut Vec<u8>) -> bool {
    let bad = &feed.job().bad;
    if bad.count() == *told {
        return true;
    }
    let names = bad.snapshot();
    *told = names.count;
    // Names are capped far below a message's size; a failed encoding only skips the news.
    match Message::BadSamples(names).encode_into(bytes) {
        Ok(()) => sock.send(bytes, &[]).is_ok(),
        Err(_) => true,
    }
}

/// When the daemon drains: tells the client and shuts the socket; true if it did. A rank
/// whose `feed` failed and was not told yet (a sticky GPU error restarts the daemon) is told
/// that cause first.
fn told_stopping(feed: Option<&Feed>, sock: &SeqPacket, counts: &Delivered) -> bool {
    if !counts.daemon.stopping() {
        return false;
    }
    if let Some(fault) = feed.and_then(Feed::failure) {
        let e = PipelineError::Backend(fault);
        send_error(
            sock,
            refuse(ErrorCode::Internal, format!("feed failed: {e}")),
        );
    }
    send_error(sock, refuse(ErrorCode::Stopping, STOPPING_MESSAGE));
    sock.shutdown();
    true
}

/// Logs how an attached rank's connection ended.
fn log_end(id: u64, who: &str, leased: usize, end: &End) {
    match end {
        End::Detached | End::Eof => {
            tracing::info!(conn = id, %who, reclaimed = leased, how = ?end, "rank detached")
        }
        End::Malformed(why) | End::Violation(why) => {
            tracing::warn!(conn = id, %who, reclaimed = leased, reason = %why, "connection closed")
        }
        End::Socket(e) => {
            tracing::warn!(conn = id, %who, reclaimed = leased, error = %e, "connection failed")
        }
    }
}
