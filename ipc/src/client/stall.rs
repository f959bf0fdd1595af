//! The data stall as the client measures it: time blocked in `next_batch` (wait) and time
//! between its calls (compute), reported to the daemon every [`STATS_EVERY`].

use std::time::{Duration, Instant};

use crate::protocol::{Message, Stats};

/// How often a client reports its data stall to the daemon (at most; a loop that never calls
/// `next_batch` reports nothing until it does).
pub(super) const STATS_EVERY: Duration = Duration::from_millis(500);

/// Where a training loop's time went, as measured by the client: the totals since the attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StallStats {
    /// Time spent inside `next_batch` waiting for a batch (or the end of the data).
    pub wait: Duration,
    /// Time between a `next_batch` returning and the following call.
    pub compute: Duration,
    /// Batches received.
    pub batches: u64,
    /// Samples of those batches the daemon replaced (unreadable or corrupt: status not OK).
    pub bad_samples: u64,
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

    pub(super) fn message(&self) -> Message {
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
pub(super) struct StallClock {
    pub(super) totals: StallStats,
    /// When the last call returned (None before the first call).
    returned: Option<Instant>,
    /// When the totals were last sent.
    sent: Instant,
}

impl StallClock {
    pub(super) fn new() -> StallClock {
        StallClock {
            totals: StallStats::default(),
            returned: None,
            sent: Instant::now(),
        }
    }

    /// A call begins: the time since the previous one returned was the loop's own work.
    pub(super) fn enter(&mut self) -> Instant {
        let now = Instant::now();
        if let Some(r) = self.returned {
            self.totals.compute += now - r;
        }
        now
    }

    /// The call that began at `entered` returns, with a batch or not.
    pub(super) fn leave(&mut self, entered: Instant, got_batch: bool) {
        let now = Instant::now();
        self.totals.wait += now - entered;
        self.totals.batches += u64::from(got_batch);
        self.returned = Some(now);
    }

    /// Whether the totals are due to be sent, and if so marks them sent.
    pub(super) fn due(&mut self) -> bool {
        if self.sent.elapsed() >= STATS_EVERY {
            self.sent = Instant::now();
            true
        } else {
            false
        }
    }
}
