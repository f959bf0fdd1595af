//! What a file's first bytes say beyond its format ([`ImageFormat::detect`] in `format` is the
//! one rule saying which decoder a file goes to): what any other data most likely is
//! ([`describe_unknown`]: "a GIF image", "text", named in the error), a JPEG's frame size
//! before decoding, and whether its scan is followed by the end of the image.

#![forbid(unsafe_code)]

use super::markers::{Markers, EOI, SOS};
use super::DecodeError;

/// What data of no format stoker decodes looks like, for the error message ("a GIF image",
/// "text", ...).
pub(crate) fn describe_unknown(bytes: &[u8]) -> String {
    let starts = |m: &[u8]| bytes.starts_with(m);
    let at = |off: usize, m: &[u8]| bytes.len() >= off + m.len() && &bytes[off..off + m.len()] == m;
    let name = if bytes.is_empty() {
        "an empty file"
    } else if starts(b"GIF87a") || starts(b"GIF89a") {
        "a GIF image"
    } else if starts(b"BM") && bytes.len() >= 14 {
        "a BMP image"
    } else if starts(b"II*\0") || starts(b"MM\0*") {
        "a TIFF image"
    } else if starts(b"\0\0\0\x0cjP  \r\n\x87\n") || starts(&[0xFF, 0x4F, 0xFF, 0x51]) {
        "a JPEG 2000 image"
    } else if at(4, b"ftypavif") || at(4, b"ftypavis") {
        "an AVIF image"
    } else if at(4, b"ftypheic") || at(4, b"ftypheix") || at(4, b"ftypmif1") {
        "a HEIF image"
    } else if starts(&[0xFF, 0x0A]) {
        "a JPEG XL image"
    } else if starts(b"%PDF") {
        "a PDF document"
    } else if starts(&[0x1F, 0x8B]) {
        "gzip data"
    } else if starts(b"PK\x03\x04") {
        "a zip archive"
    } else if bytes.len() > 262 && at(257, b"ustar") {
        "a tar archive"
    } else if looks_like_text(bytes) {
        "text"
    } else {
        return format!("unknown data starting with {}", hex_prefix(bytes));
    };
    name.to_owned()
}

/// Walks the marker segments of a stream that starts with [`JPEG_MAGIC`](super::format::JPEG_MAGIC) up to its frame
/// header, and rejects what libjpeg would misreport: a tables-only stream (no frame before EOI,
/// which `tj3DecompressHeader` accepts without setting any parameter) and frame types libjpeg
/// does not know (JPEG-LS, hierarchical). Returns the frame's (width, height) when it finds one.
/// Stops without a verdict at anything unexpected (libjpeg
/// then has its say).
pub(crate) fn check_frame(bytes: &[u8]) -> Result<Option<(u32, u32)>, DecodeError> {
    for seg in Markers::after_soi(bytes) {
        match seg.code {
            0xC0..=0xC3 | 0xC9..=0xCB => {
                // Precision (1), height (2), width (2).
                let dims = seg.body.get(1..5).map(|d| {
                    let h = u16::from_be_bytes([d[0], d[1]]) as u32;
                    let w = u16::from_be_bytes([d[2], d[3]]) as u32;
                    (w, h)
                });
                return Ok(dims);
            }
            0xC5..=0xC7 | 0xCD..=0xCF => {
                return Err(DecodeError::Unsupported {
                    what: format!("hierarchical JPEG (SOF{})", seg.code - 0xC0),
                })
            }
            0xF7 | 0xF8 => {
                return Err(DecodeError::Unsupported {
                    what: String::from("JPEG-LS (SOF55)"),
                })
            }
            EOI => {
                return Err(DecodeError::Corrupt {
                    detail: String::from("no image: the stream ends before any frame header"),
                })
            }
            SOS => {
                return Err(DecodeError::Corrupt {
                    detail: String::from("scan data before any frame header"),
                })
            }
            _ => {}
        }
    }
    Ok(None)
}

/// Whether the stream has an EOI marker (`FF D9`) after its first scan header (SOS). A
/// region decode stops at the last row it needs, so libjpeg never sees a file cut short below
/// the region; this catches it. EOIs of embedded thumbnails (in APP segments, before the first
/// SOS) do not count; trailing data after the EOI is allowed. Returns `true` when the marker
/// walk cannot find the first SOS (libjpeg then has its say).
pub(crate) fn has_end_after_scan(bytes: &[u8]) -> bool {
    let Some(sos) = Markers::after_soi(bytes)
        .take_while(|seg| seg.code != EOI)
        .find(|seg| seg.code == SOS)
    else {
        return true;
    };
    // Entropy-coded data stuffs every 0xFF as FF 00, so FF D9 after the SOS is a marker.
    bytes
        .get(sos.at + 2..)
        .is_some_and(|scan| scan.windows(2).rev().any(|w| w == [0xFF, 0xD9]))
}

fn looks_like_text(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(512)];
    match std::str::from_utf8(head) {
        Ok(s) => s.chars().all(|c| !c.is_control() || c.is_whitespace()),
        // A multi-byte character cut at the 512-byte boundary is still text.
        Err(e) => e.valid_up_to() + 4 > head.len() && e.valid_up_to() > 0,
    }
}

fn hex_prefix(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_needs_an_eoi_after_its_first_scan() {
        // SOI, APP1 holding a thumbnail's EOI, SOS, data, EOI, trailing bytes.
        let mut ok = vec![0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x04, 0xFF, 0xD9];
        ok.extend_from_slice(&[0xFF, 0xDA, 0x00, 0x02, 0x12, 0xFF, 0x00, 0x34]);
        let cut = ok.clone();
        ok.extend_from_slice(&[0xFF, 0xD9, 1, 2, 3]);
        assert!(has_end_after_scan(&ok));
        assert!(
            !has_end_after_scan(&cut),
            "the thumbnail's EOI does not count"
        );
        assert!(has_end_after_scan(&[0xFF, 0xD8, 0x00]), "no verdict");
    }

    #[test]
    fn names_common_formats() {
        assert_eq!(describe_unknown(b"GIF89a...."), "a GIF image");
        assert_eq!(describe_unknown(b"hello, world\n"), "text");
        assert_eq!(describe_unknown(b""), "an empty file");
        assert_eq!(
            describe_unknown(&[0x00, 0x01, 0x02, 0x03, 0x04]),
            "unknown data starting with 00 01 02 03"
        );
    }
}
