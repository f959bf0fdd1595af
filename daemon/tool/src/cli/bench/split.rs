//! `stoker bench --backend cuda --hw-shares 1,0.65,0`: `stokerd --backend cuda` end to end at
//! each `cuda.hw_decode_share`, so one GPU run says what the split decode pays
//! (docs/cuda.md, "The split decode").
//!
//! # Design
//! - Share 1 is the engines alone, share 0 the pool of decoupled decoders alone (every image
//!   there); with both rates measured, the suggested share is the one at which both finish a
//!   batch together: `engines / (engines + pool)` (each decodes its part at its own rate, at
//!   the same time).
//! - The best share below 1 over share 1 is "the split pays" (> 1) or not.
//!
//! # Limitations
//! - End-to-end rates include the kernels and the client: the suggestion is an estimate that
//!   the best measured share checks.

use serde::Serialize;

use super::BenchArgs;
use crate::cli::gpu::DecodeMix;

/// One share's end-to-end figures, or why there are none.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct ShareRow {
    pub share: f64,
    pub images_per_s: Option<f64>,
    pub reason: Option<String>,
    /// What the daemon decoded on each path.
    pub mix: Option<DecodeMix>,
}

/// Every share measured, and what they say.
#[derive(Debug, Clone, Serialize)]
pub(super) struct SplitReport {
    pub rows: Vec<ShareRow>,
    /// Images/s at share 1 (the engines alone) and at share 0 (the pool alone).
    pub engines_only: Option<f64>,
    pub pool_only: Option<f64>,
    /// `cuda.hw_decode_share` to set, from the two rates.
    pub suggested_share: Option<f64>,
    /// The fastest share below 1 and its rate over share 1's.
    pub best_share: Option<f64>,
    pub best_over_engines_only: Option<f64>,
}

/// Checks `--hw-shares`: each in 0..=1.
// String error: one message for the user at the CLI edge.
pub(super) fn check(shares: &[f64]) -> Result<(), String> {
    match shares.iter().find(|s| !(0.0..=1.0).contains(*s)) {
        Some(s) => Err(format!("--hw-shares: {s} is not between 0 and 1")),
        None => Ok(()),
    }
}

/// The share at which the engines (`engines` images/s alone) and the pool (`pool` alone),
/// decoding at once, finish together.
pub(super) fn suggested_share(engines: f64, pool: f64) -> Option<f64> {
    (engines > 0.0 && pool >= 0.0).then(|| engines / (engines + pool))
}

/// Runs `row` (end to end with the given args, its figures at `share` 0 until set) at each of
/// `args.hw_shares`.
pub(super) fn run(args: &BenchArgs, row: impl Fn(&BenchArgs) -> ShareRow) -> Option<SplitReport> {
    if args.hw_shares.is_empty() {
        return None;
    }
    let rows: Vec<ShareRow> = (args.hw_shares.iter())
        .map(|&share| {
            super::progress(&format!("end to end at cuda.hw_decode_share = {share}"));
            let at = BenchArgs {
                daemon_config: format!("hw_decode_share = {share}\n"),
                ..args.clone()
            };
            ShareRow { share, ..row(&at) }
        })
        .collect();
    let rate = |s: f64| {
        (rows.iter())
            .find(|r| r.share == s)
            .and_then(|r| r.images_per_s)
    };
    let (engines_only, pool_only) = (rate(1.0), rate(0.0));
    let best = (rows.iter())
        .filter(|r| r.share < 1.0)
        .filter_map(|r| r.images_per_s.map(|v| (r.share, v)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    Some(SplitReport {
        suggested_share: engines_only
            .zip(pool_only)
            .and_then(|(e, p)| suggested_share(e, p)),
        best_share: best.map(|b| b.0),
        best_over_engines_only: best.zip(engines_only).map(|(b, e)| b.1 / e.max(1e-9)),
        engines_only,
        pool_only,
        rows,
    })
}

/// The split's lines of the bench's table.
pub(super) fn table(r: &SplitReport) -> String {
    let mut s = String::from("\nsplit decode: stokerd end to end at each cuda.hw_decode_share\n");
    for row in &r.rows {
        let mix = row.mix.map_or("-".to_string(), |m| m.to_string());
        s += &match row.images_per_s {
            Some(v) => format!("  share {:<5} {v:>10.1} images/s  mix {mix}\n", row.share),
            None => format!(
                "  share {:<5} not available: {}\n",
                row.share,
                row.reason.as_deref().unwrap_or("unknown")
            ),
        };
    }
    let f = |v: Option<f64>, p: usize| v.map_or("n/a".to_string(), |v| format!("{v:.p$}"));
    s += &format!(
        "engines only {} images/s, pool only {} images/s: suggested cuda.hw_decode_share {}\n",
        f(r.engines_only, 1),
        f(r.pool_only, 1),
        f(r.suggested_share, 2)
    );
    s += &format!(
        "best share below 1: {} at {}x the engines-only rate (the split pays above 1)\n",
        f(r.best_share, 2),
        f(r.best_over_engines_only, 3)
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suggested_share_makes_both_decoders_finish_together() {
        // Engines 5000/s, pool 2000/s: 5/7 of a batch on the engines.
        let s = suggested_share(5000.0, 2000.0).unwrap();
        assert!((s - 5000.0 / 7000.0).abs() < 1e-12);
        // Both take the same time on their parts: s / 5000 == (1 - s) / 2000.
        assert!((s / 5000.0 - (1.0 - s) / 2000.0).abs() < 1e-12);
        assert_eq!(suggested_share(1000.0, 0.0), Some(1.0));
        assert_eq!(suggested_share(0.0, 1000.0), None);
    }

    #[test]
    fn shares_outside_0_to_1_are_refused_by_name() {
        assert!(check(&[1.0, 0.65, 0.0]).is_ok());
        let e = check(&[1.0, 1.5]).unwrap_err();
        assert!(e.contains("--hw-shares") && e.contains("1.5"), "{e}");
    }
}
