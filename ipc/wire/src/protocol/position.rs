//! Where a job's stream of batches is: one [`Position`] for the client (where to start or
//! resume), the wire (ATTACH's start) and the daemon's engine (which batch comes next), and
//! the arithmetic on it that every side shares (the C ABI exports it to the Python package).
//!
//! # Design
//! - A [`Position`] is `(epoch, step)`: batch `step` of epoch `epoch`, the same for every rank
//!   of a job. Positions order by epoch, then step.
//! - An elastic resume (see `docs/multi-host.md`) continues an epoch after an [`EpochOffset`]:
//!   that epoch covers only its permutation after the first `consumed` samples, split over the
//!   new world size, and its steps count from 0 in that reduced epoch ([`ResumedEpoch`]). The
//!   offset belongs to the job (like the seed), not to a position, so it travels beside one;
//!   ATTACH still nests it inside its `start` object on the wire (see [`super::Attach`]).
//! - Which batches exist is [`EpochSteps`]: the daemon's job and the client (from ATTACHED)
//!   build the same one, so [`Position::settle`] and [`Position::next`] agree on both sides.
//!
//! # Limitations
//! - Exact inside an epoch only: padding and `drop_last` change nothing but an epoch's last
//!   step, so [`Position::consumed`] of the position after an epoch's end is that of the next
//!   epoch's start.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

/// The last epoch a job may start (or resume an elastic offset) at: every JSON reader holds
/// it exactly (2^53 - 1, the largest integer a double holds), and a stream started there
/// would need 2^64 - 2^53 epochs to reach the end of `u64`, so [`Position::settle`] never
/// overflows. ATTACH refuses a start or offset epoch above it.
pub const MAX_EPOCH: u64 = (1 << 53) - 1;

/// A place in a job's stream of batches: batch `step` of epoch `epoch`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(deny_unknown_fields)]
pub struct Position {
    /// The epoch, from 0 (at most [`MAX_EPOCH`] where a job starts).
    pub epoch: u64,
    /// The batch within the epoch, from 0; the same step for every rank of a job.
    pub step: u64,
}

/// An elastic resume point: the first `consumed` samples of epoch `epoch`'s permutation were
/// served (at whatever world size); the rest of that epoch is still to come.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochOffset {
    /// The epoch resumed part way.
    pub epoch: u64,
    /// Samples of that epoch's permutation already served, by all ranks together.
    pub consumed: u64,
}

impl std::fmt::Display for EpochOffset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "epoch {} after {} samples", self.epoch, self.consumed)
    }
}

/// The epoch an elastic offset resumes, and how many batches each rank gets in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResumedEpoch {
    /// The epoch the offset names.
    pub epoch: u64,
    /// Batches each rank receives in it (may be 0).
    pub steps: u64,
}

/// How many batches each rank receives in each epoch: `per_epoch`, except in the epoch an
/// elastic offset resumed (which may have fewer, even none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EpochSteps {
    /// Batches each rank receives in a whole epoch (ATTACHED's `steps_per_epoch`).
    pub per_epoch: u64,
    /// The epoch an elastic offset resumed; `None` when the job has no offset.
    pub resumed: Option<ResumedEpoch>,
}

impl EpochSteps {
    /// Batches each rank receives in `epoch`.
    pub fn steps_in(&self, epoch: u64) -> u64 {
        match self.resumed {
            Some(r) if r.epoch == epoch => r.steps,
            _ => self.per_epoch,
        }
    }
}

impl Position {
    /// Batch `step` of `epoch`.
    pub fn at(epoch: u64, step: u64) -> Position {
        Position { epoch, step }
    }

    /// The first batch at or after this one that exists: past the end of an epoch (or in a
    /// resumed epoch with nothing left) is the start of the next. Unchanged when no epoch has
    /// any batch.
    pub fn settle(self, steps: &EpochSteps) -> Position {
        let mut pos = self;
        // Only the resumed epoch may have fewer steps than `per_epoch`, so this ends. A job
        // starts at most at MAX_EPOCH, so the epoch never reaches the end of `u64`; saturating
        // keeps it from wrapping to 0 even so.
        while pos.step >= steps.steps_in(pos.epoch) && steps.per_epoch > 0 {
            pos = Position::at(pos.epoch.saturating_add(1), 0);
        }
        pos
    }

    /// The batch after this one.
    pub fn next(self, steps: &EpochSteps) -> Position {
        Position::at(self.epoch, self.step + 1).settle(steps)
    }

    /// The elastic checkpoint of this position in a job resumed after `offset` (if any), of
    /// `world_size` ranks and batches of `batch_size`: samples of the epoch's permutation
    /// every rank together consumed before it (`offset.consumed` if this is the offset's
    /// epoch, plus `step * batch_size * world_size`).
    pub fn consumed(
        self,
        offset: Option<EpochOffset>,
        world_size: u32,
        batch_size: u32,
    ) -> EpochOffset {
        let base = offset
            .filter(|o| o.epoch == self.epoch)
            .map_or(0, |o| o.consumed);
        EpochOffset {
            epoch: self.epoch,
            consumed: base + self.step * u64::from(batch_size) * u64::from(world_size),
        }
    }
}

impl EpochOffset {
    /// Where a job resumed at this checkpoint starts: step 0 of its epoch, and the offset the
    /// job carries (none when nothing of the epoch was consumed).
    pub fn resume(self) -> (Position, Option<EpochOffset>) {
        (
            Position::at(self.epoch, 0),
            (self.consumed > 0).then_some(self),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resumed(epoch: u64, steps: u64) -> EpochSteps {
        EpochSteps {
            per_epoch: 3,
            resumed: Some(ResumedEpoch { epoch, steps }),
        }
    }

    #[test]
    fn positions_order_by_epoch_then_step() {
        assert!(Position::at(0, 9) < Position::at(1, 0));
        assert!(Position::at(1, 2) < Position::at(1, 3));
    }

    #[test]
    fn next_rolls_over_at_the_end_of_each_epoch() {
        let plain = EpochSteps {
            per_epoch: 3,
            resumed: None,
        };
        assert_eq!(Position::at(0, 0).next(&plain), Position::at(0, 1));
        assert_eq!(Position::at(0, 2).next(&plain), Position::at(1, 0));
        // The resumed epoch is shorter; the others are not.
        assert_eq!(Position::at(2, 0).next(&resumed(2, 1)), Position::at(3, 0));
        assert_eq!(Position::at(3, 1).next(&resumed(2, 1)), Position::at(3, 2));
        // A resumed epoch with nothing left is skipped, wherever it comes.
        assert_eq!(Position::at(1, 2).next(&resumed(2, 0)), Position::at(3, 0));
    }

    #[test]
    fn settle_skips_only_batches_that_do_not_exist() {
        assert_eq!(
            Position::at(4, 0).settle(&resumed(4, 0)),
            Position::at(5, 0)
        );
        assert_eq!(
            Position::at(4, 0).settle(&resumed(4, 2)),
            Position::at(4, 0)
        );
        assert_eq!(
            Position::at(1, 7).settle(&resumed(4, 0)),
            Position::at(2, 0)
        );
        // No batches at all: nothing to settle on, and no endless loop.
        let empty = EpochSteps::default();
        assert_eq!(Position::at(1, 0).settle(&empty), Position::at(1, 0));
    }

    #[test]
    fn consumed_counts_every_rank_and_the_offset_of_its_own_epoch_only() {
        let o = Some(EpochOffset {
            epoch: 2,
            consumed: 100,
        });
        assert_eq!(
            Position::at(2, 3).consumed(o, 4, 8),
            EpochOffset {
                epoch: 2,
                consumed: 100 + 3 * 4 * 8
            }
        );
        assert_eq!(Position::at(3, 3).consumed(o, 4, 8).consumed, 3 * 4 * 8);
        assert_eq!(Position::at(2, 0).consumed(None, 4, 8).consumed, 0);
    }

    #[test]
    fn resume_keeps_only_an_offset_of_something() {
        let o = EpochOffset {
            epoch: 2,
            consumed: 100,
        };
        assert_eq!(o.resume(), (Position::at(2, 0), Some(o)));
        let nothing = EpochOffset {
            epoch: 2,
            consumed: 0,
        };
        assert_eq!(nothing.resume(), (Position::at(2, 0), None));
    }
}
