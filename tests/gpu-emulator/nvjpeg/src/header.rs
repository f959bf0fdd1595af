//! What nvJPEG decides from a JPEG's header: size, components, chroma subsampling, coding
//! (baseline / extended / progressive / lossless, Huffman / arithmetic), precision, and from
//! those which decoder takes it.
//!
//! # Design
//! The rules are nvJPEG's documented ones: the hardware engines take baseline (SOF0) Huffman
//! 8-bit JPEGs with 4:4:4, 4:2:2, 4:2:0, 4:4:0 or grayscale sampling; the GPU-hybrid decoder
//! takes Huffman 8-bit JPEGs (baseline, extended or progressive) with 1 or 3 components and any
//! sampling where the first component is full size; nothing here takes arithmetic coding,
//! lossless, 12-bit or 4-component (CMYK) JPEGs, nor chroma sampled finer than luma (whose
//! first component, reported first by `nvjpegGetImageInfo`, is smaller than the image). A header that cannot be read is `NVJPEG_STATUS_BAD_JPEG`.

/// `nvjpegChromaSubsampling_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subsampling {
    Css444 = 0,
    Css422 = 1,
    Css420 = 2,
    Css440 = 3,
    Css411 = 4,
    Css410 = 5,
    Gray = 6,
    Css410V = 7,
    Unknown = -1,
}

/// How the frame is coded (the SOF marker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Baseline,
    Extended,
    Progressive,
    Lossless,
    Arithmetic,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub coding: Coding,
    pub precision: u8,
    pub width: u32,
    pub height: u32,
    /// (horizontal, vertical) sampling factor of each component.
    pub sampling: Vec<(u8, u8)>,
}

/// Which decoder takes an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Hardware = 1,
    Hybrid = 2,
}

impl Header {
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

    /// Whether component 0 has the largest sampling factors, so its size (what
    /// `nvjpegGetImageInfo` reports first, and what callers size outputs by) is the image's.
    fn luma_is_full_size(&self) -> bool {
        let (h0, v0) = self.sampling[0];
        self.sampling.iter().all(|&(h, v)| h <= h0 && v <= v0)
    }

    fn huffman_8bit(&self) -> bool {
        self.precision == 8
            && matches!(
                self.coding,
                Coding::Baseline | Coding::Extended | Coding::Progressive
            )
    }

    /// Whether `path` can decode this image.
    pub fn supported_by(&self, path: Path) -> bool {
        let colour = matches!(self.sampling.len(), 1 | 3);
        match path {
            Path::Hardware => {
                self.coding == Coding::Baseline
                    && self.precision == 8
                    && matches!(
                        self.subsampling(),
                        Subsampling::Css444
                            | Subsampling::Css422
                            | Subsampling::Css420
                            | Subsampling::Css440
                            | Subsampling::Gray
                    )
            }
            Path::Hybrid => self.huffman_8bit() && colour && self.luma_is_full_size(),
        }
    }
}

/// Reads the header (up to the first SOF). `None`: not a JPEG, truncated or malformed.
pub fn parse(b: &[u8]) -> Option<Header> {
    if b.get(..2)? != [0xff, 0xd8] {
        return None;
    }
    let mut at = 2;
    loop {
        while *b.get(at)? != 0xff {
            at += 1;
        }
        while *b.get(at)? == 0xff {
            at += 1;
        }
        let marker = *b.get(at)?;
        at += 1;
        if (0xd0..=0xd9).contains(&marker) || marker == 0x01 {
            if marker == 0xd9 {
                return None;
            }
            continue;
        }
        let len = usize::from(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]));
        let seg = b.get(at + 2..at + len)?;
        if len < 2 {
            return None;
        }
        let coding = match marker {
            0xc0 => Some(Coding::Baseline),
            0xc1 => Some(Coding::Extended),
            0xc2 => Some(Coding::Progressive),
            0xc3 | 0xc7 | 0xcb | 0xcf => Some(Coding::Lossless),
            0xc9 | 0xca | 0xcd | 0xce => Some(Coding::Arithmetic),
            0xc5 | 0xc6 => Some(Coding::Extended),
            _ => None,
        };
        if marker == 0xda {
            return None; // scan before a frame header
        }
        if let Some(coding) = coding {
            return frame(coding, seg);
        }
        at += len;
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
    let sampling = (0..n)
        .map(|i| {
            let f = seg[6 + 3 * i + 1];
            (f >> 4, f & 0xf)
        })
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jpeg(sof: u8, precision: u8, comps: &[(u8, u8)]) -> Vec<u8> {
        let mut seg = vec![precision, 0, 16, 0, 24, comps.len() as u8];
        for (i, &(h, v)) in comps.iter().enumerate() {
            seg.extend([i as u8 + 1, (h << 4) | v, 0]);
        }
        let mut b = vec![0xff, 0xd8, 0xff, 0xe0, 0, 4, 0, 0, 0xff, sof];
        b.extend(((seg.len() + 2) as u16).to_be_bytes());
        b.extend(seg);
        b
    }

    #[test]
    fn the_hardware_takes_baseline_8bit_common_sampling_only() {
        let h = parse(&jpeg(0xc0, 8, &[(2, 2), (1, 1), (1, 1)])).unwrap();
        assert_eq!((h.width, h.height), (24, 16));
        assert_eq!(h.subsampling(), Subsampling::Css420);
        assert_eq!(h.component_size(1), (12, 8));
        assert!(h.supported_by(Path::Hardware) && h.supported_by(Path::Hybrid));
        let p = parse(&jpeg(0xc2, 8, &[(1, 1), (1, 1), (1, 1)])).unwrap();
        assert!(!p.supported_by(Path::Hardware) && p.supported_by(Path::Hybrid));
        let odd = parse(&jpeg(0xc0, 8, &[(4, 1), (2, 1), (2, 2)])).unwrap();
        assert!(!odd.supported_by(Path::Hybrid), "chroma taller than luma");
        let s411 = parse(&jpeg(0xc0, 8, &[(4, 1), (1, 1), (1, 1)])).unwrap();
        assert!(!s411.supported_by(Path::Hardware) && s411.supported_by(Path::Hybrid));
        let cmyk = parse(&jpeg(0xc0, 8, &[(1, 1); 4])).unwrap();
        assert!(!cmyk.supported_by(Path::Hardware) && !cmyk.supported_by(Path::Hybrid));
        let twelve = parse(&jpeg(0xc1, 12, &[(1, 1)])).unwrap();
        assert!(!twelve.supported_by(Path::Hybrid));
        let arith = parse(&jpeg(0xc9, 8, &[(1, 1)])).unwrap();
        assert!(!arith.supported_by(Path::Hybrid));
        assert!(parse(b"\xff\xd8\xff\xd9").is_none());
        assert!(parse(b"GIF89a").is_none());
    }
}
