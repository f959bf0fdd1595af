//! Logging set-up for the daemon, journald-friendly: under systemd (`$JOURNAL_STREAM` set)
//! lines carry no timestamp (the journal adds its own). Per-sample lines are rate-limited
//! where they are made (`stoker_pipeline::transform::badsample`).
//!
//! # Design
//! Clients control many logged strings (job keys, dataset paths, file names inside datasets,
//! refusal reasons quoting them). Every line the daemon writes passes through one writer,
//! [`EscapingWriter`], which escapes every control character ([`escape_controls`]: C0, DEL,
//! C1) except the newline that ends the line, so no client can forge or break a log line
//! (`"a\0b\nINFO fake"` is written as `a\0b\nINFO fake`, on one line).
//!
//! # Limitations
//! - Colours are off: ESC is a control character, and letting it through would let a client
//!   write terminal escape sequences into an operator's terminal.
//! - A backslash is written as is, so `\n` in a name and an escaped newline look alike;
//!   either way no line is forged.

#![forbid(unsafe_code)]

use std::io::{self, Write};

pub(crate) use stoker_wire::escape::escape_controls;

/// Sets up `tracing` for `stokerd`: `$RUST_LOG` filter (default `info`), stderr, control
/// characters escaped.
pub fn init_daemon() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| EscapingWriter(io::stderr()))
        .with_ansi(false);
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        builder.without_time().init();
    } else {
        builder.init();
    }
}

/// Writes each log line (one `write` call per event, as `tracing_subscriber::fmt` does) with
/// its control characters escaped, keeping the final newline.
pub(crate) struct EscapingWriter<W: Write>(pub(crate) W);

impl<W: Write> Write for EscapingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let (body, end) = match buf.strip_suffix(b"\n") {
            Some(body) => (body, &b"\n"[..]),
            None => (buf, &b""[..]),
        };
        let text = String::from_utf8_lossy(body);
        let mut line = escape_controls(&text).into_bytes();
        line.extend_from_slice(end);
        self.0.write_all(&line)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_escaped_and_their_line_end_kept() {
        let mut w = EscapingWriter(Vec::new());
        w.write_all(b"job=a\x00b\nINFO fake line\n").unwrap();
        assert_eq!(w.0, b"job=a\\0b\\nINFO fake line\n");
    }
}
