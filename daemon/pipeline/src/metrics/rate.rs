//! A count's rate per second (images delivered, images a worker filled), recomputed from the
//! count when the last figure is at least half a second old, so status polls that come close
//! together do not divide by a tiny interval.

#![forbid(unsafe_code)]

use std::sync::Mutex;
use std::time::Instant;

use crate::sync::lock;

/// The most recent figure of a count per second.
#[derive(Debug)]
pub struct Throughput {
    last: Mutex<Figure>,
}

#[derive(Debug, Clone, Copy)]
struct Figure {
    /// When it was computed.
    at: Instant,
    /// The count then.
    count: u64,
    per_s: f64,
}

impl Default for Throughput {
    fn default() -> Throughput {
        Throughput {
            last: Mutex::new(Figure {
                at: Instant::now(),
                count: 0,
                per_s: 0.0,
            }),
        }
    }
}

impl Throughput {
    /// The count per second since the last figure, from `count` now, when that figure is at
    /// least half a second old; else the last figure.
    pub fn update(&self, count: u64) -> f64 {
        let mut last = lock(&self.last);
        let dt = last.at.elapsed().as_secs_f64();
        if dt >= 0.5 {
            *last = Figure {
                at: Instant::now(),
                count,
                per_s: count.saturating_sub(last.count) as f64 / dt,
            };
        }
        last.per_s
    }

    /// The last figure.
    pub fn last(&self) -> f64 {
        lock(&self.last).per_s
    }
}
