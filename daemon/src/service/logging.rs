//! Logging set-up for the daemon, journald-friendly: under systemd (`$JOURNAL_STREAM` set)
//! lines carry no timestamp (the journal adds its own). Per-sample lines are rate-limited
//! where they are made (`crate::transform::badsample`).
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

/// `text` with every control character escaped: `\n`, `\r`, `\t`, `\0`, `\e` by name, the
/// others as `\xNN` (C0, DEL) or `\u{NN}` (C1). Other characters are kept as they are.
pub fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            '\u{1b}' => out.push_str("\\e"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// `text` with the control characters of each line escaped ([`escape_controls`]), keeping
/// the newlines that end its lines: for multi-line text clients' strings are part of, such as
/// `stoker status`'s table and the `/metrics` page.
pub fn escape_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        match line.strip_suffix('\n') {
            Some(body) => {
                out.push_str(&escape_controls(body));
                out.push('\n');
            }
            None => out.push_str(&escape_controls(line)),
        }
    }
    out
}

/// Writes each log line (one `write` call per event, as `tracing_subscriber::fmt` does) with
/// its control characters escaped, keeping the final newline.
pub struct EscapingWriter<W: Write>(pub W);

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
    fn control_characters_are_escaped_and_the_line_end_kept() {
        assert_eq!(
            escape_controls("a\u{0}b\nINFO fake\r\t\u{1b}[31m\u{7f}\u{85}é"),
            "a\\0b\\nINFO fake\\r\\t\\e[31m\\x7f\\u{85}é"
        );
        let mut w = EscapingWriter(Vec::new());
        w.write_all(b"job=a\x00b\nINFO fake line\n").unwrap();
        assert_eq!(w.0, b"job=a\\0b\\nINFO fake line\n");
        assert_eq!(escape_lines("a\rb\n\u{1b}[2J\nc"), "a\\rb\n\\e[2J\nc");
    }
}
