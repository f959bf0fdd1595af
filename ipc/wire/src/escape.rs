//! Text another process chose, made safe to print: a client's job key or file name in the
//! daemon's log, the daemon's status table in an operator's terminal. Every control
//! character and every bidi control is escaped, so no such text can forge a line, send
//! terminal escapes or reorder what is shown; on the `/metrics` page they are replaced
//! instead ([`replace_controls`]), as the text format has no escape for them.
//!
//! # Limitations
//! - A backslash is kept as it is, so `\n` in a name and an escaped newline look alike;
//!   either way no line is forged.

#![forbid(unsafe_code)]

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
            c if c.is_control() || is_bidi_control(c) => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// Whether `c` is a bidirectional embedding, override or isolate (U+202A-U+202E,
/// U+2066-U+2069): not a control character to Unicode, but it reorders how a terminal or
/// browser shows the text after it (`"tab\u{202e}gnp.exe"` reads as `tabexe.png`).
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character but the newlines that end its lines, and every bidi
/// control ([`is_bidi_control`]), replaced by U+FFFD: for the Prometheus text format, whose
/// label values know only the escapes `\\`, `\"` and `\n` (any other escape, or a raw tab,
/// makes a parser refuse the whole page).
pub fn replace_controls(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c != '\n' && (c.is_control() || is_bidi_control(c)) {
                '\u{fffd}'
            } else {
                c
            }
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_line_ends_kept_only_by_escape_lines() {
        assert_eq!(
            escape_controls("a\u{0}b\nINFO fake\r\t\u{1b}[31m\u{7f}\u{85}é"),
            "a\\0b\\nINFO fake\\r\\t\\e[31m\\x7f\\u{85}é"
        );
        assert_eq!(escape_lines("a\rb\n\u{1b}[2J\nc"), "a\\rb\n\\e[2J\nc");
        assert_eq!(
            escape_controls("x\u{202e}y\u{2066}"),
            "x\\u{202e}y\\u{2066}"
        );
        assert_eq!(
            replace_controls("a\tb\u{202e}c\\n\n"),
            "a\u{fffd}b\u{fffd}c\\n\n"
        );
    }
}
