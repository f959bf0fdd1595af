//! Logging set-up for the daemon, journald-friendly: under systemd (`$JOURNAL_STREAM` set)
//! lines carry no timestamp (the journal adds its own); colours only when stderr is a
//! terminal. Per-sample lines are rate-limited where they are made (`crate::badsample`).

use std::io::IsTerminal;

/// Sets up `tracing` for `stokerd`: `$RUST_LOG` filter (default `info`), stderr.
pub fn init_daemon() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        builder.without_time().init();
    } else {
        builder.init();
    }
}
