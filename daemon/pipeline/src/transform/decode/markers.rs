//! The one walk over a JPEG's marker segments, from just after SOI to the first scan header:
//! every reader of JPEG headers in the decode stage (the frame check and the end-of-image check
//! of `sniff`, the EXIF orientation, the restart and entry-point frames, the header the
//! nvJPEG routing reads) takes its segments from [`Markers`], so what counts as a marker, a segment's
//! length and the start of the entropy-coded data is decided once.
//!
//! # Design
//! - A marker is one or more 0xFF bytes (the extra ones are fill, ITU T.81 B.1.1.2) and a code.
//!   Codes 0x01 (TEM) and 0xD0..=0xD9 (RSTn, SOI, EOI) stand alone; every other marker is
//!   followed by a two-byte big-endian length that counts itself and the parameters.
//! - The walk ends after SOS (what follows is entropy-coded data), at the end of the bytes,
//!   at a length under 2, and at anything other than 0xFF where a marker should start;
//!   [`Markers::skipping_garbage`] instead skips such bytes up to the next 0xFF, as libjpeg
//!   does (with a warning) and as nvJPEG's header reading is modelled on it.
//! - A segment whose length is missing, under 2, or past the end of the bytes is given as it
//!   is, marked [`Segment::broken`], and ends the walk: a reader that needs the whole segment
//!   checks it ([`Segment::whole`]); one that needs only its code (a scan before any frame) or
//!   its first bytes (the frame size) may still read them.
//!
//! # Limitations
//! - The walk reads headers only: markers inside the entropy-coded data (RSTn, a second SOS
//!   after the first scan) are each reader's own business.

#![forbid(unsafe_code)]

/// SOF0: the frame header of a baseline sequential Huffman JPEG.
pub(crate) const SOF0: u8 = 0xC0;
/// SOF1: extended sequential Huffman.
pub(crate) const SOF1: u8 = 0xC1;
/// DHT: Huffman tables.
pub(crate) const DHT: u8 = 0xC4;
/// EOI: the end of the image.
pub(crate) const EOI: u8 = 0xD9;
/// SOS: a scan header; its entropy-coded data follows.
pub(crate) const SOS: u8 = 0xDA;
/// DRI: the restart interval.
pub(crate) const DRI: u8 = 0xDD;
/// APP1: where EXIF data lives.
pub(crate) const APP1: u8 = 0xE1;

/// Whether a marker with this code has no length and no parameters (TEM, RSTn, SOI, EOI).
pub(crate) fn stands_alone(code: u8) -> bool {
    code == 0x01 || (0xD0..=0xD9).contains(&code)
}

/// One marker and its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment<'a> {
    /// The marker's code: the byte after its 0xFF.
    pub(crate) code: u8,
    /// Offset of the 0xFF just before the code (after any fill bytes).
    pub(crate) at: usize,
    /// The parameters after the length field; empty for a marker that stands alone, and
    /// what there is of them when [`Segment::broken`].
    pub(crate) body: &'a [u8],
    /// Offset just past the segment (as its length says; past the end of the bytes when
    /// broken).
    pub(crate) end: usize,
    /// The length field is missing or under 2, or the bytes end before the segment does.
    pub(crate) broken: bool,
}

impl<'a> Segment<'a> {
    /// The whole parameters, or `None` when the segment is broken.
    pub(crate) fn whole(&self) -> Option<&'a [u8]> {
        (!self.broken).then_some(self.body)
    }
}

/// The marker segments of a JPEG stream, in order, from just after SOI (see the module).
#[derive(Debug, Clone)]
pub(crate) struct Markers<'a> {
    bytes: &'a [u8],
    pos: usize,
    skip_garbage: bool,
    done: bool,
}

impl<'a> Markers<'a> {
    /// The segments of `bytes` after its first two bytes (SOI, not checked here).
    pub(crate) fn after_soi(bytes: &'a [u8]) -> Markers<'a> {
        Markers {
            bytes,
            pos: 2,
            skip_garbage: false,
            done: false,
        }
    }

    /// The segments of `bytes` from offset `pos` on (where a marker should start).
    pub(crate) fn from_offset(bytes: &'a [u8], pos: usize) -> Markers<'a> {
        Markers {
            pos,
            ..Markers::after_soi(bytes)
        }
    }

    /// The same walk, skipping bytes other than 0xFF before a marker instead of stopping.
    pub(crate) fn skipping_garbage(mut self) -> Markers<'a> {
        self.skip_garbage = true;
        self
    }

    fn stop(&mut self) -> Option<Segment<'a>> {
        self.done = true;
        None
    }
}

impl<'a> Iterator for Markers<'a> {
    type Item = Segment<'a>;

    fn next(&mut self) -> Option<Segment<'a>> {
        let b = self.bytes;
        if self.done {
            return None;
        }
        if self.skip_garbage {
            match b
                .get(self.pos..)
                .and_then(|rest| rest.iter().position(|&x| x == 0xFF))
            {
                Some(skip) => self.pos += skip,
                None => return self.stop(),
            }
        }
        if b.get(self.pos) != Some(&0xFF) {
            return self.stop();
        }
        while b.get(self.pos) == Some(&0xFF) {
            self.pos += 1;
        }
        let Some(&code) = b.get(self.pos) else {
            return self.stop();
        };
        let at = self.pos - 1;
        self.pos += 1;
        if stands_alone(code) {
            return Some(Segment {
                code,
                at,
                body: &[],
                end: self.pos,
                broken: false,
            });
        }
        let len = match (b.get(self.pos), b.get(self.pos + 1)) {
            (Some(&hi), Some(&lo)) => usize::from(u16::from_be_bytes([hi, lo])),
            _ => 0,
        };
        let end = self.pos + len.max(2);
        let body = &b[(self.pos + 2).min(b.len())..end.min(b.len())];
        let broken = len < 2 || end > b.len();
        self.pos = end;
        self.done = broken || code == SOS;
        Some(Segment {
            code,
            at,
            body,
            end,
            broken,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(b: &[u8]) -> Vec<(u8, usize, usize, bool)> {
        Markers::after_soi(b)
            .map(|s| (s.code, s.at, s.body.len(), s.broken))
            .collect()
    }

    #[test]
    fn walks_fill_bytes_standalone_markers_and_stops_after_the_scan_header() {
        let b = [
            0xFF, 0xD8, // SOI
            0xFF, 0xFF, 0xE0, 0x00, 0x04, 1, 2, // APP0 after a fill byte
            0xFF, 0xD0, // RST0 stands alone
            0xFF, 0xDA, 0x00, 0x03, 9, // SOS
            0xFF, 0xC4, 0x00, 0x02, // past the scan header: not walked
        ];
        assert_eq!(
            codes(&b),
            [
                (0xE0, 3, 2, false),
                (0xD0, 9, 0, false),
                (SOS, 11, 1, false)
            ]
        );
    }

    #[test]
    fn stops_at_garbage_or_the_end_unless_told_to_skip_it() {
        let garbage = [0xFF, 0xD8, 0x12, 0x34, 0xFF, 0xD9];
        assert_eq!(codes(&garbage), []);
        let skipped: Vec<u8> = Markers::after_soi(&garbage)
            .skipping_garbage()
            .map(|s| s.code)
            .collect();
        assert_eq!(skipped, [EOI]);
        assert_eq!(codes(&[0xFF, 0xD8, 0xFF]), []);
    }

    #[test]
    fn a_broken_segment_is_given_as_it_is_and_ends_the_walk() {
        let b = [
            0xFF, 0xD8, 0xFF, SOF0, 0x00, 0x11, 8, 0, 16, 0, 32, 0xFF, 0xD9,
        ];
        let segs: Vec<Segment<'_>> = Markers::after_soi(&b).collect();
        assert_eq!(segs.len(), 1);
        assert!(segs[0].broken);
        assert_eq!(segs[0].body, &b[6..]);
        assert_eq!(segs[0].whole(), None);
        let short = [0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x01, 0xFF, 0xD9];
        assert_eq!(codes(&short), [(0xE0, 2, 0, true)]);
        assert_eq!(codes(&[0xFF, 0xD8, 0xFF, SOS]), [(SOS, 2, 0, true)]);
    }
}
