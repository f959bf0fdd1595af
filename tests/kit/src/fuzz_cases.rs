//! How many cases each fuzz property runs: [`DEFAULT_CASES`] in CI, `STOKER_FUZZ_CASES` for
//! long runs. Used by the fuzz tests of the daemon and ipc crates.

#![forbid(unsafe_code)]

/// Cases per property in CI.
pub const DEFAULT_CASES: u32 = 3000;

/// Cases per property for this run: `STOKER_FUZZ_CASES` when set to a number, else
/// [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    std::env::var("STOKER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}
