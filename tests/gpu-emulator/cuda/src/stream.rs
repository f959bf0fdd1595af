//! What streams and events are: each stream is a worker thread running its operations in
//! order, so an async copy or a launch returns before its work is done, as on a GPU; an event
//! is the place in a stream where it was last recorded. The calls are in
//! [`crate::api::stream`].
//!
//! # Design
//! A [`Worker`] holds a queue of operations and two counters, submitted and completed; a
//! position in the queue (a ticket) is complete when `completed >= ticket`. Threads are woken
//! by condition variables, except a host thread waiting as the driver makes it spin:
//! `cuEventSynchronize` on an event without `CU_EVENT_BLOCKING_SYNC`, and `cuStreamSynchronize`
//! / `cuCtxSynchronize` under the primary context's default scheduling (docs/cuda.md, emulator
//! rule 21), which busy-wait and so cost CPU time as on a GPU. Each operation on a stream the program created waits
//! the configured delay (`STOKER_EMU_OP_DELAY_US`) first, so a host that reads results without synchronising reads
//! stale bytes in tests instead of being lucky. An event records (worker, ticket) of the
//! stream it was recorded on; it completes when that ticket does, so events complete in
//! stream order. An operation that fails (an injected sticky fault, a kernel that failed) goes
//! to the hook the worker was spawned with, which breaks its context
//! ([`crate::state::spawn_worker`]).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::status::{self, CUresult};

pub(crate) type Op = Box<dyn FnOnce() -> Result<(), CUresult> + Send>;

/// What a worker does with the status of an operation that failed, given its device.
pub(crate) type OnFailure = fn(usize, CUresult);

struct Queue {
    ops: VecDeque<Op>,
    submitted: u64,
    completed: u64,
    closing: bool,
}

/// One stream's in-order executor.
pub(crate) struct Worker {
    dev: usize,
    delay: Duration,
    on_failure: OnFailure,
    q: Mutex<Queue>,
    wake: Condvar,
    done: Condvar,
}

impl Worker {
    /// A worker on its own thread for a stream of device `dev`, waiting `delay_us` before each
    /// operation; `on_failure` gets the status of each operation that fails.
    pub(crate) fn spawn(dev: usize, delay_us: u64, on_failure: OnFailure) -> Arc<Worker> {
        let w = Arc::new(Worker {
            dev,
            delay: Duration::from_micros(delay_us),
            on_failure,
            q: Mutex::new(Queue {
                ops: VecDeque::new(),
                submitted: 0,
                completed: 0,
                closing: false,
            }),
            wake: Condvar::new(),
            done: Condvar::new(),
        });
        let run = w.clone();
        thread::Builder::new()
            .name(format!("emu-stream-{dev}"))
            .spawn(move || run.run())
            .expect("spawning a stream worker thread");
        w
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(&self) {
        loop {
            let op = {
                let mut q = self.queue();
                loop {
                    if let Some(op) = q.ops.pop_front() {
                        break op;
                    }
                    if q.closing {
                        return;
                    }
                    q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            if !self.delay.is_zero() {
                thread::sleep(self.delay);
            }
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(op))
                .unwrap_or(Err(status::LAUNCH_FAILED));
            if let Err(code) = r {
                (self.on_failure)(self.dev, code);
            }
            self.queue().completed += 1;
            self.done.notify_all();
        }
    }

    /// Enqueues `op`; returns its ticket.
    pub(crate) fn submit(&self, op: Op) -> u64 {
        let mut q = self.queue();
        q.ops.push_back(op);
        q.submitted += 1;
        self.wake.notify_one();
        q.submitted
    }

    /// The ticket of the last operation submitted so far.
    pub(crate) fn tail(&self) -> u64 {
        self.queue().submitted
    }

    pub(crate) fn is_done(&self, ticket: u64) -> bool {
        self.queue().completed >= ticket
    }

    /// Busy-waits until the operation with `ticket` completed, as the driver does for a thread
    /// not told to block: a waiting thread costs a core for as long as it waits. It yields
    /// between looks, which still counts as CPU time, so the cost shows in a test's CPU clock.
    pub(crate) fn spin(&self, ticket: u64) {
        while !self.is_done(ticket) {
            thread::yield_now();
        }
    }

    /// Blocks until the operation with `ticket` (and all before it) completed.
    pub(crate) fn wait(&self, ticket: u64) {
        let mut q = self.queue();
        while q.completed < ticket {
            q = self.done.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Lets the thread exit once the queue is empty (`cuStreamDestroy` does not wait).
    pub(crate) fn close(&self) {
        self.queue().closing = true;
        self.wake.notify_all();
    }
}

/// Where an event was last recorded.
#[derive(Clone)]
pub(crate) struct Recorded {
    pub(crate) worker: Arc<Worker>,
    pub(crate) ticket: u64,
    /// When the marker ran (timing events).
    pub(crate) at: Arc<Mutex<Option<Instant>>>,
}

pub(crate) struct EventState {
    pub(crate) flags: u32,
    pub(crate) rec: Mutex<Option<Recorded>>,
}

impl EventState {
    /// Where it was last recorded, if it was.
    pub(crate) fn recorded(&self) -> Option<Recorded> {
        self.rec.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The least (numerically largest) and greatest stream priorities of every emulated device;
/// "'0' represents default priority" (`cuStreamCreateWithPriority`), the least one.
pub(crate) const LEAST_PRIORITY: i32 = 0;
pub(crate) const GREATEST_PRIORITY: i32 = -5;

pub(crate) struct StreamEntry {
    pub(crate) dev: usize,
    pub(crate) worker: Arc<Worker>,
    /// Scheduling priority, from [`GREATEST_PRIORITY`] to [`LEAST_PRIORITY`].
    pub(crate) priority: i32,
}
