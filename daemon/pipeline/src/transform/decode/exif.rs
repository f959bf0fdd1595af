//! The EXIF orientation of a JPEG: tag 0x0112 of IFD0 in the first APP1 `Exif` segment, read
//! by a bounds-checked walk of the markers before the first scan. Anything missing, malformed or
//! out of range reads as 1 (stored order), as Pillow's `exif_transpose` treats it.

#![forbid(unsafe_code)]

use super::markers::{stands_alone, Markers, APP1, EOI, SOS};

/// The EXIF Orientation tag.
const ORIENTATION_TAG: u16 = 0x0112;

/// The orientation (1..=8) `jpeg` declares; 1 when it declares none or a bad one.
pub(crate) fn jpeg_orientation(jpeg: &[u8]) -> u8 {
    exif_segment(jpeg)
        .and_then(tiff_orientation)
        .filter(|o| (1..=8).contains(o))
        .unwrap_or(1)
}

/// The TIFF data of the first APP1 segment holding `Exif\0\0`, before the first scan.
fn exif_segment(jpeg: &[u8]) -> Option<&[u8]> {
    for seg in Markers::after_soi(jpeg) {
        if matches!(seg.code, SOS | EOI) {
            return None;
        }
        if stands_alone(seg.code) {
            continue;
        }
        let body = seg.whole()?;
        if seg.code == APP1 && body.starts_with(b"Exif\0\0") {
            return Some(&body[6..]);
        }
    }
    None
}

/// The orientation in IFD0 of TIFF data (byte order `II` or `MM`).
fn tiff_orientation(tiff: &[u8]) -> Option<u8> {
    let big = match tiff.get(..2)? {
        b"MM" => true,
        b"II" => false,
        _ => return None,
    };
    let u16_at = |at: usize| {
        let b = [*tiff.get(at)?, *tiff.get(at + 1)?];
        Some(if big {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        })
    };
    let u32_at = |at: usize| {
        let b: [u8; 4] = tiff.get(at..at + 4)?.try_into().ok()?;
        Some(if big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    };
    if u16_at(2)? != 42 {
        return None;
    }
    let ifd = usize::try_from(u32_at(4)?).ok()?;
    let entries = usize::from(u16_at(ifd)?);
    (0..entries).find_map(|i| {
        let entry = ifd.checked_add(2 + 12 * i)?;
        // Type 3 (SHORT), count 1: the value sits in the entry's first two value bytes.
        if u16_at(entry)? == ORIENTATION_TAG && u16_at(entry + 2)? == 3 {
            u8::try_from(u16_at(entry + 8)?).ok()
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SOI, an APP1 Exif segment with IFD0 = {Orientation: `o`} in byte order `order`, SOS.
    fn jpeg_with(order: &[u8; 2], o: u16) -> Vec<u8> {
        let big = order == b"MM";
        let w16 = |v: u16| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let w32 = |v: u32| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let mut tiff = order.to_vec();
        tiff.extend(w16(42));
        tiff.extend(w32(8));
        tiff.extend(w16(2));
        // An unrelated tag first (ImageWidth, LONG), then Orientation.
        tiff.extend(w16(0x0100));
        tiff.extend(w16(4));
        tiff.extend(w32(1));
        tiff.extend(w32(640));
        tiff.extend(w16(ORIENTATION_TAG));
        tiff.extend(w16(3));
        tiff.extend(w32(1));
        tiff.extend(w16(o));
        tiff.extend([0, 0]);
        tiff.extend(w32(0));
        let mut body = b"Exif\0\0".to_vec();
        body.extend(tiff);
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0x4A, 0x46, 0xFF, 0xE1];
        jpeg.extend(u16::try_from(body.len() + 2).unwrap().to_be_bytes());
        jpeg.extend(body);
        jpeg.extend([0xFF, 0xDA, 0x00, 0x02]);
        jpeg
    }

    #[test]
    fn reads_the_orientation_in_either_byte_order() {
        for o in 1..=8 {
            assert_eq!(
                jpeg_orientation(&jpeg_with(b"II", o)),
                u8::try_from(o).unwrap()
            );
            assert_eq!(
                jpeg_orientation(&jpeg_with(b"MM", o)),
                u8::try_from(o).unwrap()
            );
        }
    }

    #[test]
    fn missing_bad_or_cut_exif_is_stored_order() {
        assert_eq!(jpeg_orientation(&jpeg_with(b"II", 9)), 1);
        assert_eq!(jpeg_orientation(&jpeg_with(b"II", 0)), 1);
        assert_eq!(jpeg_orientation(&[0xFF, 0xD8, 0xFF, 0xDA, 0, 2]), 1);
        let whole = jpeg_with(b"MM", 6);
        for cut in 0..whole.len() - 4 {
            assert!([1, 6].contains(&jpeg_orientation(&whole[..cut])));
        }
    }
}
