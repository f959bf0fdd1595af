//! The data stall of every attached rank, as its client reports it: how long the training
//! loop waited inside `next()` and how long it worked between calls. Shown per job and rank by
//! `stoker status` and as Prometheus series.
//!
//! # Design
//! - The client measures (it is where the waiting happens) and sends totals since its attach
//!   in STATS messages; the daemon only keeps the last two reports of each rank. The wait
//!   fraction shown is over the interval between those two reports, so it follows what the
//!   loop does now, not its warm-up an hour ago; until a second report it is the fraction of
//!   the first.
//! - A rank's entry lives as long as its connection: [`RankStallEntry`] removes it on drop, so
//!   a detached rank leaves no stale series behind. The Prometheus lines are rendered from the
//!   board at scrape time for the same reason (the `metrics` facade cannot forget a series).
//!
//! # Limitations
//! - Reports are trusted as sent: a client can claim any figures about its own loop (it can
//!   only mislead its own owner's dashboards). Totals that go backwards reset the window and
//!   count as the client's count starting again: the `_total` counters never go down.
//! - A rank that never calls `next()` again reports nothing; its last figure stays until it
//!   detaches.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use stoker_wire::protocol::{RankStall, Stats};

use super::key::JobKey;
use stoker_pipeline::metrics::catalogue::{
    self, CLIENT_COMPUTE_SECONDS_TOTAL as COMPUTE_SECONDS, CLIENT_WAIT_FRACTION as WAIT_FRACTION,
    CLIENT_WAIT_SECONDS_TOTAL as WAIT_SECONDS,
};

/// Which rank of which job.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RankKey {
    job: JobKey,
    rank: u32,
}

/// The last two reports of one rank, and the totals shown for it.
#[derive(Debug, Clone, Copy, Default)]
struct Reports {
    last: Stats,
    before: Option<Stats>,
    /// Nanoseconds waited and computed as the `_total` counters show them: they only grow
    /// (a report below the previous one counts as the client's count starting again).
    wait_total_ns: u64,
    compute_total_ns: u64,
}

impl Reports {
    fn wait_fraction(&self) -> f64 {
        let base = self.before.unwrap_or_default();
        let wait = self.last.wait_ns.saturating_sub(base.wait_ns) as f64;
        let compute = self.last.compute_ns.saturating_sub(base.compute_ns) as f64;
        if wait + compute > 0.0 {
            wait / (wait + compute)
        } else {
            0.0
        }
    }

    fn shown(&self, rank: u32) -> RankStall {
        RankStall {
            rank,
            wait_fraction: self.wait_fraction(),
            wait_s: self.wait_total_ns as f64 / 1e9,
            compute_s: self.compute_total_ns as f64 / 1e9,
            batches: self.last.batches,
        }
    }
}

/// Every attached rank's latest reports.
#[derive(Debug, Default)]
pub(crate) struct StallBoard {
    ranks: Mutex<BTreeMap<RankKey, Reports>>,
    /// Whether `/metrics` shows job keys whole (`metrics.show_paths`), dataset paths in them
    /// included; else from its first `/` on a key is shown as a hash.
    show_paths: AtomicBool,
}

impl StallBoard {
    /// Shows job keys whole on `/metrics` (`metrics.show_paths`), or not.
    pub(crate) fn set_show_paths(&self, on: bool) {
        self.show_paths.store(on, Ordering::Relaxed);
    }

    /// A place for `rank` of `job` to report into, for as long as the returned entry lives.
    pub(crate) fn entry(self: &Arc<Self>, job: &JobKey, rank: u32) -> RankStallEntry {
        RankStallEntry {
            board: Arc::clone(self),
            key: RankKey {
                job: job.clone(),
                rank,
            },
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<RankKey, Reports>> {
        self.ranks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ranks of `job` that reported, by rank.
    pub(crate) fn of_job(&self, job: &JobKey) -> Vec<RankStall> {
        self.lock()
            .iter()
            .filter(|(k, _)| &k.job == job)
            .map(|(k, r)| r.shown(k.rank))
            .collect()
    }

    /// Prometheus text for every rank that reported (HELP and TYPE lines always, so the
    /// series are documented before the first report).
    pub(crate) fn prometheus_text(&self) -> String {
        let ranks = self.lock();
        let whole = self.show_paths.load(Ordering::Relaxed);
        let mut out = String::new();
        // Names, kinds and help text from the catalogue.
        let families = [WAIT_FRACTION, WAIT_SECONDS, COMPUTE_SECONDS].map(catalogue::find);
        for series in families.into_iter().flatten() {
            let (name, kind, help) = (series.name, series.kind.name(), series.help);
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (k, r) in ranks.iter() {
                let shown = r.shown(k.rank);
                let value = match name {
                    WAIT_FRACTION => shown.wait_fraction,
                    WAIT_SECONDS => shown.wait_s,
                    _ => shown.compute_s,
                };
                let _ = writeln!(
                    out,
                    "{name}{{job=\"{}\",rank=\"{}\",uid=\"{}\"}} {value}",
                    label_value(&shown_key(&k.job.name, whole)),
                    k.rank,
                    k.job.owner
                );
            }
        }
        out
    }
}

/// A job key as `/metrics` shows it: whole when the operator asked (`metrics.show_paths`),
/// else with everything from its first `/` replaced by `/#` and a hash of it: torchrun's keys
/// carry the dataset's path (`torchrun-<run>/<path>`), which the page, open to whoever reaches
/// its port, must not show (`stoker status` shows a user only their own jobs). The hash keeps
/// two jobs of one run apart.
fn shown_key(key: &str, whole: bool) -> String {
    match key.split_once('/') {
        Some((run, rest)) if !whole => {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in rest.bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
            format!("{run}/#{h:016x}")
        }
        _ => key.to_owned(),
    }
}

/// Escapes a Prometheus label value (backslash, double quote, newline).
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One attached rank's place on the board; dropping it removes the rank.
#[derive(Debug)]
pub(crate) struct RankStallEntry {
    board: Arc<StallBoard>,
    key: RankKey,
}

impl RankStallEntry {
    /// Takes a STATS report.
    pub(crate) fn record(&self, stats: Stats) {
        let mut ranks = self.board.lock();
        let r = ranks.entry(self.key.clone()).or_default();
        let backwards = stats.wait_ns < r.last.wait_ns || stats.compute_ns < r.last.compute_ns;
        // What the report adds: its growth, or all of it when the count started again.
        let base = if backwards { Stats::default() } else { r.last };
        *r = Reports {
            before: if backwards { None } else { Some(r.last) },
            last: stats,
            wait_total_ns: (r.wait_total_ns)
                .saturating_add(stats.wait_ns.saturating_sub(base.wait_ns)),
            compute_total_ns: (r.compute_total_ns)
                .saturating_add(stats.compute_ns.saturating_sub(base.compute_ns)),
        };
    }
}

impl Drop for RankStallEntry {
    fn drop(&mut self) {
        self.board.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(owner: u32, name: &str) -> JobKey {
        JobKey {
            owner,
            name: name.to_owned(),
        }
    }

    fn stats(wait_ms: u64, compute_ms: u64, batches: u64) -> Stats {
        Stats {
            wait_ns: wait_ms * 1_000_000,
            compute_ns: compute_ms * 1_000_000,
            batches,
        }
    }

    #[test]
    fn the_fraction_follows_the_last_interval() {
        let board = Arc::new(StallBoard::default());
        let e = board.entry(&key(7, "job \"a\""), 3);
        e.record(stats(900, 100, 1));
        let s = &board.of_job(&key(7, "job \"a\""))[0];
        assert_eq!((s.rank, s.batches), (3, 1));
        assert!((s.wait_fraction - 0.9).abs() < 1e-9, "{s:?}");
        // Since then: 100 ms waited, 900 ms computed.
        e.record(stats(1000, 1000, 10));
        let s = &board.of_job(&key(7, "job \"a\""))[0];
        assert!((s.wait_fraction - 0.1).abs() < 1e-9, "{s:?}");
        assert_eq!((s.wait_s, s.compute_s, s.batches), (1.0, 1.0, 10));
        assert!(board.of_job(&key(7, "other")).is_empty());
        assert!(
            board.of_job(&key(8, "job \"a\"")).is_empty(),
            "another uid's job of the same key"
        );
        let text = board.prometheus_text();
        assert!(
            text.contains(
                "stoker_client_wait_fraction{job=\"job \\\"a\\\"\",rank=\"3\",uid=\"7\"} 0.1"
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE stoker_client_wait_seconds_total counter"));
        drop(e);
        assert!(board.of_job(&key(7, "job \"a\"")).is_empty());
        assert!(!board.prometheus_text().contains("rank=\"3\""));
    }

    #[test]
    fn totals_that_go_backwards_restart_the_window() {
        let board = Arc::new(StallBoard::default());
        let e = board.entry(&key(0, "j"), 0);
        e.record(stats(500, 500, 5));
        e.record(stats(100, 300, 1));
        let s = &board.of_job(&key(0, "j"))[0];
        assert!((s.wait_fraction - 0.25).abs() < 1e-9, "{s:?}");
        // The totals never go down: the second report counts as a count started again.
        assert!(
            (s.wait_s - 0.6).abs() < 1e-9 && (s.compute_s - 0.8).abs() < 1e-9,
            "{s:?}"
        );
    }
}
