//! The facts of a JPEG's header that decide which decoder may take it: how the frame is coded,
//! its precision and size, each component's id and sampling factors, and the colour space the
//! file declares (JFIF, Adobe APP14 transform, component ids). Read by [`super::route`] (what
//! the CUDA engine and the tools send to the CPU) and by the emulated nvJPEG
//! (tests/gpu-emulator/nvjpeg: what the stand-in library decides). Its segments come from the
//! decode stage's one marker walk (`decode::markers`), skipping garbage before a marker as
//! libjpeg does.
//!
//! # Design
//! - The walk reads the first frame header (SOF), recording APP0 (JFIF) and APP14 (Adobe)
//!   segments before it, then goes on over the tables to the first scan header (SOS) to count
//!   its components: a sequential file whose first scan holds fewer components than the frame
//!   has one scan per component (non-interleaved), which nvJPEG's hardware backend does not
//!   take (nvjpeg.h: "supports baseline JPEG bitstream with single scan"). No entropy-coded
//!   data is read.
//! - The colour space of a 3-component file is libjpeg's rule (`jdapimin.c:
//!   default_decompress_parms`): a JFIF marker means YCbCr; else an Adobe marker's transform
//!   (0: RGB, otherwise YCbCr); else component ids `R`, `G`, `B` mean RGB; else YCbCr.
//!
//! # Limitations
//! A header that cannot be read (not a JPEG, cut short, a scan before any frame, sampling
//! factors outside 1..=4) is `None`; callers decide what that means (nvJPEG says
//! `NVJPEG_STATUS_BAD_JPEG`, the router asks nvJPEG and lets the CPU decoder give the reason).

#![forbid(unsafe_code)]

use crate::transform::decode::markers::{stands_alone, Markers, EOI, SOS};

/// `nvjpegChromaSubsampling_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subsampling {
    /// 4:4:4.
    Css444 = 0,
    /// 4:2:2 (chroma at half the width).
    Css422 = 1,
    /// 4:2:0 (chroma at half the width and height).
    Css420 = 2,
    /// 4:4:0 (chroma at half the height).
    Css440 = 3,
    /// 4:1:1 (chroma at a quarter of the width).
    Css411 = 4,
    /// 4:1:0 (a quarter of the width, half the height).
    Css410 = 5,
    /// One component.
    Gray = 6,
    /// 4:1:0 with the factors the other way (half the width, a quarter of the height).
    Css410V = 7,
    /// Anything else (unequal chroma, four components).
    Unknown = -1,
}

/// How the frame is coded (the SOF marker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// SOF0: baseline sequential Huffman.
    Baseline,
    /// SOF1 (extended sequential Huffman), or a hierarchical sequential frame (SOF5, SOF6).
    Extended,
    /// SOF2: progressive Huffman.
    Progressive,
    /// A lossless frame (SOF3, SOF7, SOF11, SOF15).
    Lossless,
    /// Arithmetic coding (SOF9, SOF10, SOF13, SOF14).
    Arithmetic,
}

/// The colour space a file declares for its components (libjpeg's reading of the markers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColourSpace {
    /// One component.
    Gray,
    /// Three components to convert from YCbCr.
    YCbCr,
    /// Three components stored as R, G, B: no YCbCr conversion is to be applied.
    Rgb,
    /// Four components (CMYK or YCCK) or another count.
    Other,
}

/// What [`parse`] reads of a JPEG's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// How the frame is coded.
    pub coding: Coding,
    /// Bits per sample.
    pub precision: u8,
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
    /// (horizontal, vertical) sampling factor of each component.
    pub sampling: Vec<(u8, u8)>,
    /// Each component's identifier, in frame order.
    pub ids: Vec<u8>,
    /// Whether an APP0 JFIF segment precedes the frame.
    pub jfif: bool,
    /// The Adobe APP14 segment's transform byte, when there is one before the frame.
    pub adobe_transform: Option<u8>,
    /// Components of the first scan (SOS); `None` when the bytes end before one.
    pub first_scan_components: Option<u8>,
}

impl Header {
    /// The chroma subsampling as nvJPEG names it (`nvjpegGetImageInfo`).
    pub fn subsampling(&self) -> Subsampling {
        let s = &self.sampling;
        if s.len() == 1 {
            return Subsampling::Gray;
        }
        if s.len() != 3 || s[1] != s[2] || s[1] != (1, 1) {
            return Subsampling::Unknown;
        }
        match s[0] {
            (1, 1) => Subsampling::Css444,
            (2, 1) => Subsampling::Css422,
            (2, 2) => Subsampling::Css420,
            (1, 2) => Subsampling::Css440,
            (4, 1) => Subsampling::Css411,
            (4, 2) => Subsampling::Css410,
            (2, 4) => Subsampling::Css410V,
            _ => Subsampling::Unknown,
        }
    }

    /// Width and height of component `c` (nvjpegGetImageInfo's per-component sizes).
    pub fn component_size(&self, c: usize) -> (u32, u32) {
        let hmax = self.sampling.iter().map(|s| s.0).max().unwrap_or(1).max(1);
        let vmax = self.sampling.iter().map(|s| s.1).max().unwrap_or(1).max(1);
        let (h, v) = self.sampling[c];
        (
            (self.width * u32::from(h)).div_ceil(u32::from(hmax)),
            (self.height * u32::from(v)).div_ceil(u32::from(vmax)),
        )
    }

    /// The colour space libjpeg decodes the components as.
    pub fn colour_space(&self) -> ColourSpace {
        match self.sampling.len() {
            1 => ColourSpace::Gray,
            3 if self.jfif => ColourSpace::YCbCr,
            3 => match self.adobe_transform {
                Some(0) => ColourSpace::Rgb,
                Some(_) => ColourSpace::YCbCr,
                None if self.ids == [b'R', b'G', b'B'] => ColourSpace::Rgb,
                None => ColourSpace::YCbCr,
            },
            _ => ColourSpace::Other,
        }
    }

    /// A one-component image whose frame declares sampling factors other than 1x1 (legal:
    /// the factors of a single component mean nothing, T.81 A.2).
    pub fn gray_with_sampling(&self) -> bool {
        self.sampling.len() == 1 && self.sampling[0] != (1, 1)
    }

    /// A sequential (baseline or extended) file with more than one scan: its first scan holds
    /// fewer components than the frame (one scan per component). Progressive files always
    /// have several scans and are not counted here.
    pub fn multi_scan_sequential(&self) -> bool {
        matches!(self.coding, Coding::Baseline | Coding::Extended)
            && self
                .first_scan_components
                .is_some_and(|n| usize::from(n) < self.sampling.len())
    }

    /// A 3-component image whose two chroma components are sampled differently, or any
    /// component with a sampling factor of 3 (legal, rare: `subsamp__2x2-2x1-1x1`,
    /// `subsamp__1x3` of the edge corpus).
    pub fn unusual_sampling(&self) -> bool {
        let s = &self.sampling;
        let three = s.iter().any(|&(h, v)| h == 3 || v == 3);
        three || (s.len() == 3 && s[1] != s[2])
    }
}

/// Reads the header (up to the first SOF). `None`: not a JPEG, truncated or malformed.
pub fn parse(b: &[u8]) -> Option<Header> {
    if b.get(..2)? != [0xff, 0xd8] {
        return None;
    }
    let (mut jfif, mut adobe_transform) = (false, None);
    // Bytes other than 0xFF before a marker are skipped, as libjpeg does.
    for seg in Markers::after_soi(b).skipping_garbage() {
        if stands_alone(seg.code) {
            if seg.code == EOI {
                return None;
            }
            continue;
        }
        let body = seg.whole()?;
        match seg.code {
            0xe0 if body.starts_with(b"JFIF\0") => jfif = true,
            // "Adobe", version (2), flags0 (2), flags1 (2), transform (1).
            0xee if body.starts_with(b"Adobe") && body.len() >= 12 => {
                adobe_transform = Some(body[11]);
            }
            SOS => return None, // a scan before a frame header
            _ => {}
        }
        if let Some(coding) = coding(seg.code) {
            let mut h = frame(coding, body)?;
            (h.jfif, h.adobe_transform) = (jfif, adobe_transform);
            h.first_scan_components = first_scan_components(b, seg.end);
            return Some(h);
        }
    }
    None
}

/// The component count of the first scan header at or after `at` (tables, restart intervals
/// and application segments are skipped); `None` when the bytes end or break before one.
fn first_scan_components(b: &[u8], at: usize) -> Option<u8> {
    for seg in Markers::from_offset(b, at) {
        match seg.code {
            SOS => return seg.body.first().copied(),
            0xd0..=0xd9 => return None,
            _ => {}
        }
    }
    None
}

fn coding(marker: u8) -> Option<Coding> {
    match marker {
        0xc0 => Some(Coding::Baseline),
        0xc1 | 0xc5 | 0xc6 => Some(Coding::Extended),
        0xc2 => Some(Coding::Progressive),
        0xc3 | 0xc7 | 0xcb | 0xcf => Some(Coding::Lossless),
        0xc9 | 0xca | 0xcd | 0xce => Some(Coding::Arithmetic),
        _ => None,
    }
}

fn frame(coding: Coding, seg: &[u8]) -> Option<Header> {
    let precision = *seg.first()?;
    let height = u32::from(u16::from_be_bytes([*seg.get(1)?, *seg.get(2)?]));
    let width = u32::from(u16::from_be_bytes([*seg.get(3)?, *seg.get(4)?]));
    let n = usize::from(*seg.get(5)?);
    if n == 0 || width == 0 || height == 0 || seg.len() < 6 + 3 * n {
        return None;
    }
    let comp = |i: usize| &seg[6 + 3 * i..9 + 3 * i];
    let sampling = (0..n)
        .map(|i| (comp(i)[1] >> 4, comp(i)[1] & 0xf))
        .collect::<Vec<_>>();
    if sampling
        .iter()
        .any(|&(h, v)| h == 0 || v == 0 || h > 4 || v > 4)
    {
        return None;
    }
    Some(Header {
        coding,
        precision,
        width,
        height,
        sampling,
        ids: (0..n).map(|i| comp(i)[0]).collect(),
        jfif: false,
        adobe_transform: None,
        first_scan_components: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header-only JPEG: SOI, `app` segments, then a frame of 24x16 with `comps` as
    /// (id, h, v).
    fn jpeg(app: &[(u8, &[u8])], sof: u8, comps: &[(u8, u8, u8)]) -> Vec<u8> {
        let mut b = vec![0xff, 0xd8];
        let n = u8::try_from(comps.len()).unwrap();
        let mut seg = vec![8, 0, 16, 0, 24, n];
        for &(id, h, v) in comps {
            seg.extend([id, (h << 4) | v, 0]);
        }
        for (marker, body) in app.iter().copied().chain([(sof, seg.as_slice())]) {
            b.extend([0xff, marker]);
            b.extend(u16::try_from(body.len() + 2).unwrap().to_be_bytes());
            b.extend(body);
        }
        b
    }

    const YCC: [(u8, u8, u8); 3] = [(1, 2, 2), (2, 1, 1), (3, 1, 1)];
    const RGB: [(u8, u8, u8); 3] = [(b'R', 1, 1), (b'G', 1, 1), (b'B', 1, 1)];
    const JFIF: (u8, &[u8]) = (0xe0, b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0");

    fn adobe(transform: u8) -> Vec<u8> {
        let mut a = b"Adobe\0\x64\0\0\0\0".to_vec();
        a.push(transform);
        a
    }

    #[test]
    fn reads_size_sampling_and_coding() {
        let h = parse(&jpeg(&[JFIF], 0xc0, &YCC)).unwrap();
        assert_eq!((h.width, h.height, h.coding), (24, 16, Coding::Baseline));
        assert_eq!(h.subsampling(), Subsampling::Css420);
        assert_eq!(h.component_size(1), (12, 8));
        assert_eq!(h.ids, [1, 2, 3]);
        let p = parse(&jpeg(&[], 0xc2, &YCC)).unwrap();
        assert_eq!(p.coding, Coding::Progressive);
        assert_eq!(
            parse(&jpeg(&[], 0xc9, &YCC)).unwrap().coding,
            Coding::Arithmetic
        );
        assert!(parse(b"\xff\xd8\xff\xd9").is_none());
        assert!(parse(b"GIF89a").is_none());
        assert!(parse(&jpeg(&[], 0xc0, &[(1, 5, 1)])).is_none(), "factor 5");
    }

    #[test]
    fn the_colour_space_is_libjpegs_reading_of_the_markers() {
        let a0 = adobe(0);
        let a1 = adobe(1);
        type Case<'a> = (&'a [(u8, &'a [u8])], &'a [(u8, u8, u8)], ColourSpace);
        let cases: [Case; 7] = [
            (&[JFIF], &YCC, ColourSpace::YCbCr),
            (&[(0xee, &a0)], &YCC, ColourSpace::Rgb),
            (&[(0xee, &a1)], &RGB, ColourSpace::YCbCr),
            (&[], &RGB, ColourSpace::Rgb),
            (&[JFIF, (0xee, &a0)], &RGB, ColourSpace::YCbCr),
            (&[], &[(1, 2, 2)], ColourSpace::Gray),
            (&[], &[(1, 1, 1); 4], ColourSpace::Other),
        ];
        for (app, comps, want) in cases {
            let h = parse(&jpeg(app, 0xc0, comps)).unwrap();
            assert_eq!(h.colour_space(), want, "{app:?} {comps:?}");
        }
    }

    #[test]
    fn names_the_samplings_the_real_library_failed_on() {
        let s = |comps: &[(u8, u8, u8)]| parse(&jpeg(&[], 0xc0, comps)).unwrap();
        assert!(s(&[(1, 2, 2)]).gray_with_sampling());
        assert!(!s(&[(1, 1, 1)]).gray_with_sampling());
        assert!(s(&[(1, 2, 2), (2, 2, 1), (3, 1, 1)]).unusual_sampling());
        assert!(s(&[(1, 1, 3), (2, 1, 1), (3, 1, 1)]).unusual_sampling());
        assert!(!s(&YCC).unusual_sampling());
        assert!(!s(&[(1, 4, 1), (2, 1, 1), (3, 1, 1)]).unusual_sampling());
    }

    #[test]
    fn counts_the_components_of_the_first_scan() {
        // A DQT, a DRI, then a scan of `n` components.
        let with_scan = |sof: u8, n: u8| {
            let mut b = jpeg(&[], sof, &YCC);
            b.extend([0xff, 0xdb, 0, 3, 0, 0xff, 0xff, 0xdd, 0, 4, 0, 8]);
            b.extend([0xff, 0xda, 0, 6 + 2 * n, n]);
            b
        };
        let interleaved = parse(&with_scan(0xc0, 3)).unwrap();
        assert_eq!(interleaved.first_scan_components, Some(3));
        assert!(!interleaved.multi_scan_sequential());
        let one_per_component = parse(&with_scan(0xc0, 1)).unwrap();
        assert!(one_per_component.multi_scan_sequential());
        assert!(parse(&with_scan(0xc1, 1)).unwrap().multi_scan_sequential());
        // Progressive files are several scans by nature: not counted here.
        assert!(!parse(&with_scan(0xc2, 1)).unwrap().multi_scan_sequential());
        // Cut before the scan: unknown, not multi-scan.
        let cut = parse(&jpeg(&[], 0xc0, &YCC)).unwrap();
        assert_eq!(cut.first_scan_components, None);
        assert!(!cut.multi_scan_sequential());
        let gray = parse(&jpeg(&[], 0xc0, &[(1, 1, 1)])).unwrap();
        assert!(!gray.multi_scan_sequential());
    }
}
