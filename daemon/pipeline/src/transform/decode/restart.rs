//! Restart-indexed JPEGs: a lossless rewrite that puts a restart marker every few MCUs
//! ([`add_restart_markers`], used by `stoker pack --restart`), and the decode-side shortcut that
//! entropy decodes only the restart intervals a crop touches.
//!
//! # Design
//! - The rewrite is `tj3Transform` with no geometric operation: the DCT coefficients are
//!   copied untouched and entropy coded again (optimised Huffman tables, the restart interval
//!   set), so the file decodes to the same pixels. [`add_restart_markers`] proves it per file
//!   by decoding both and comparing every pixel, and refuses the file otherwise.
//! - The interval cuts each MCU row into about [`RESTART_COLUMNS`] intervals (a divisor of the
//!   row's MCU count, so every interval lies in one MCU row and intervals form a grid): a crop
//!   then skips the rows above and below it and most of the columns beside it. Sixteen, not
//!   four, since issue 25 measured it (`docs/datasets.md`).
//! - At decode time the markers are found by walking the scan (a `memchr` for `FF`), only
//!   once the crop is known to skip enough of the file and only as far as the last interval it
//!   needs, so the index needs no per-sample offsets (docs/datasets.md weighs the two) and old
//!   shards, folders and `s3://` shards all work alike.
//! - [`PartialStream`] builds a smaller, valid JPEG from the intervals covering the decode
//!   region, with MCU rows of margin where libjpeg's fancy upsampling reads chroma across
//!   them ([`region_cover`]): the original header segments with a new frame size, the intervals concatenated,
//!   the RST markers renumbered mod 8, EOI. The decode region is shifted by the sub-image's
//!   origin, which lies on the MCU grid, so DCT-scaled decodes land on the same pixels.
//!
//! # Limitations
//! - Only sequential Huffman files with one scan holding every component, and a restart
//!   interval that divides the MCU row, take the shortcut; anything else decodes as before.
//! - APP1-APP13, APP15 and COM segments are left out of the partial stream (the decoder
//!   ignores them: `TJPARAM_SAVEMARKERS = 0`); APP0 (JFIF) and APP14 (Adobe, colour transform)
//!   are kept.

use stoker_kernels::image::RgbImage;

use super::markers::{Markers, DHT, DRI, EOI, SOF0, SOF1, SOS};
use super::sys::{Param, ScalingFactor, TjHandle};
use super::{probe, ColorSpace, CpuDecoder, DecodeError, ImageFormat, Limits, RegionPlan};

/// Restart intervals per MCU row that `stoker pack --restart` aims for.
pub const RESTART_COLUMNS: u32 = 16;

/// MCUs around the region on every side that the ignored planar measurements decoded.
#[cfg(test)]
const MARGIN_MCUS: u32 = 1;

/// The partial stream is used only when it leaves out at least this share of the MCUs.
const MIN_SKIPPED_SHARE: f64 = 0.1;

/// Why [`add_restart_markers`] left a file as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not rewritten with restart markers: {0}")]
pub struct NotRewritten(pub String);

/// Losslessly rewrites `jpeg` with a restart marker every few MCUs (see the module docs), or
/// says why not: not a JPEG, corrupt, progressive, arithmetic coded, CMYK/YCCK, or a rewrite
/// that would not decode to the same pixels.
pub fn add_restart_markers(jpeg: &[u8]) -> Result<Vec<u8>, NotRewritten> {
    let no = |why: String| NotRewritten(why);
    if ImageFormat::detect(jpeg) != Some(ImageFormat::Jpeg) {
        return Err(no("not a JPEG".into()));
    }
    let header = probe(jpeg).map_err(|e| no(e.to_string()))?;
    let limits = Limits::default();
    if !limits.admits(header.width, header.height) || jpeg.len() as u64 > limits.max_file_bytes {
        return Err(no(format!(
            "{}x{}, {} bytes: over the decoder's limits",
            header.width,
            header.height,
            jpeg.len()
        )));
    }
    if header.progressive || header.arithmetic {
        return Err(no("progressive or arithmetic coded".into()));
    }
    if matches!(header.colorspace, ColorSpace::Cmyk | ColorSpace::Ycck) {
        return Err(no("CMYK or YCCK".into()));
    }
    let frame = Frame::parse(jpeg).ok_or_else(|| no("frame header not understood".into()))?;
    let blocks = interval_for(frame.mcus_per_row());
    let mut tj = TjHandle::new_transformer().ok_or_else(|| no("tj3Init failed".into()))?;
    let tj_err = |e: super::sys::TjError| no(e.message);
    tj.set(Param::StopOnWarning, 1).map_err(tj_err)?;
    tj.set(
        Param::MaxPixels,
        i32::try_from(limits.max_pixels).unwrap_or(0),
    )
    .map_err(tj_err)?;
    tj.set(Param::RestartBlocks, i32::try_from(blocks).unwrap_or(0))
        .map_err(tj_err)?;
    let out = tj.transform_recode(jpeg).map_err(tj_err)?;
    if RestartLayout::parse(&out).is_none() {
        return Err(no("the rewrite has no usable restart layout".into()));
    }
    same_pixels(jpeg, &out)?;
    Ok(out)
}

/// The restart interval in MCUs: the divisor of the row's MCU count, at least 2 MCUs (a row of
/// 2 or fewer excepted), that cuts the row into the number of intervals closest to
/// [`RESTART_COLUMNS`] (the fewer on a tie), so intervals form a grid. A row whose only such
/// divisor is itself (a prime count) gets one interval per row: a marker after every MCU
/// would cost more bytes than the columns it lets a crop skip.
fn interval_for(mcus_per_row: u32) -> u32 {
    let mcus = mcus_per_row.max(1);
    let least = if mcus <= 2 { 1 } else { 2 };
    (least..=mcus)
        .filter(|d| mcus.is_multiple_of(*d))
        .min_by_key(|&d| {
            (mcus / d).abs_diff(RESTART_COLUMNS) * 2 + u32::from(mcus / d > RESTART_COLUMNS)
        })
        .unwrap_or(mcus)
}

/// Decodes both files whole and compares every pixel.
fn same_pixels(a: &[u8], b: &[u8]) -> Result<(), NotRewritten> {
    let mut dec = CpuDecoder::new(Limits::default()).map_err(|e| NotRewritten(e.to_string()))?;
    let (mut pa, mut pb) = (RgbImage::default(), RgbImage::default());
    dec.decode_full(a, &mut pa)
        .and_then(|()| dec.decode_full(b, &mut pb))
        .map_err(|e| NotRewritten(e.to_string()))?;
    if (pa.width, pa.height) != (pb.width, pb.height) || pa.data != pb.data {
        return Err(NotRewritten("the rewrite decodes to other pixels".into()));
    }
    Ok(())
}

/// The frame of a sequential Huffman JPEG with one interleaved scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Frame {
    pub(super) width: u32,
    pub(super) height: u32,
    pub(super) mcu_w: u32,
    pub(super) mcu_h: u32,
    /// Offset of the frame header's height field (width follows).
    dims_at: usize,
    /// The restart interval in MCUs (0: none).
    pub(super) interval: u32,
    /// Where the entropy-coded data of the scan starts.
    pub(super) scan_at: usize,
    /// Header segments the partial stream keeps, as (start, end) byte ranges.
    keep: Vec<(usize, usize)>,
}

impl Frame {
    pub(super) fn mcus_per_row(&self) -> u32 {
        self.width.div_ceil(self.mcu_w)
    }

    pub(super) fn mcu_rows(&self) -> u32 {
        self.height.div_ceil(self.mcu_h)
    }

    /// Whether the restart intervals form a grid: an interval that divides the MCU row.
    fn has_grid(&self) -> bool {
        self.interval > 0 && self.mcus_per_row().is_multiple_of(self.interval)
    }

    /// Restart intervals per MCU row (with a grid).
    fn per_row(&self) -> u32 {
        self.mcus_per_row() / self.interval
    }

    /// Walks the marker segments up to the first scan; `None` for anything but a sequential
    /// Huffman frame (SOF0/SOF1) whose first scan holds every component.
    pub(super) fn parse(b: &[u8]) -> Option<Frame> {
        let mut frame: Option<Frame> = None;
        let mut interval = 0;
        let mut keep = Vec::new();
        let mut components = 0u8;
        for seg in Markers::after_soi(b) {
            let body = seg.whole()?;
            match seg.code {
                SOF0 | SOF1 => {
                    components = *body.get(5)?;
                    frame = Some(Frame::from_sof(seg.at + 5, body)?);
                }
                0xC2..=0xCF if !matches!(seg.code, DHT | 0xC8 | 0xCC) => return None,
                DRI => interval = u32::from(u16::from_be_bytes([*body.first()?, *body.get(1)?])),
                SOS => {
                    let mut f = frame?;
                    if *body.first()? != components {
                        return None;
                    }
                    keep.push((seg.at, seg.end));
                    f.interval = interval;
                    f.scan_at = seg.end;
                    f.keep = keep;
                    return Some(f);
                }
                EOI => return None,
                _ => {}
            }
            let dropped = matches!(seg.code, 0xE1..=0xED | 0xEF | 0xFE);
            if !dropped {
                keep.push((seg.at, seg.end));
            }
        }
        None
    }

    /// The frame from a SOF0/SOF1 body; `dims_at` is the offset of its height field.
    fn from_sof(dims_at: usize, body: &[u8]) -> Option<Frame> {
        if *body.first()? != 8 {
            return None;
        }
        let height = u32::from(u16::from_be_bytes([*body.get(1)?, *body.get(2)?]));
        let width = u32::from(u16::from_be_bytes([*body.get(3)?, *body.get(4)?]));
        let n = usize::from(*body.get(5)?);
        let comps = body.get(6..6 + 3 * n)?;
        let (mut hmax, mut vmax) = (1u32, 1u32);
        for c in comps.chunks_exact(3) {
            let (h, v) = (u32::from(c[1] >> 4), u32::from(c[1] & 15));
            if !(1..=4).contains(&h) || !(1..=4).contains(&v) {
                return None;
            }
            hmax = hmax.max(h);
            vmax = vmax.max(v);
        }
        // One component: the scan is not interleaved and an MCU is one 8x8 block.
        let (mcu_w, mcu_h) = if n == 1 { (8, 8) } else { (8 * hmax, 8 * vmax) };
        if width == 0 || height == 0 || n == 0 {
            return None;
        }
        Some(Frame {
            width,
            height,
            mcu_w,
            mcu_h,
            dims_at,
            interval: 0,
            scan_at: 0,
            keep: Vec::new(),
        })
    }
}

impl Frame {
    /// Appends the header segments a partial stream keeps to `out`, with the frame size set
    /// to `width` x `height`; `None` when they do not fit a frame header.
    pub(super) fn write_header(
        &self,
        b: &[u8],
        out: &mut Vec<u8>,
        (width, height): (u32, u32),
    ) -> Option<()> {
        for &(s, e) in &self.keep {
            if (s..e).contains(&self.dims_at) {
                let at = out.len() + (self.dims_at - s);
                out.extend_from_slice(&b[s..e]);
                out[at..at + 2].copy_from_slice(&u16::try_from(height).ok()?.to_be_bytes());
                out[at + 2..at + 4].copy_from_slice(&u16::try_from(width).ok()?.to_be_bytes());
            } else {
                out.extend_from_slice(&b[s..e]);
            }
        }
        Some(())
    }
}

/// Where every restart interval of a restart-indexed JPEG lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RestartLayout {
    frame: Frame,
    /// Where each interval's entropy-coded data starts.
    starts: Vec<usize>,
    /// Where the walk stopped: the scan's EOI marker, or the start of the interval after the
    /// last one asked for.
    end: usize,
}

impl RestartLayout {
    /// The layout of `b`, or `None` when it has no restart interval that divides its MCU
    /// rows, or its markers are not where the interval puts them.
    pub(crate) fn parse(b: &[u8]) -> Option<RestartLayout> {
        Self::walk(b, Frame::parse(b)?, usize::MAX, Vec::new())
    }

    /// Walks the scan of `b` for where its intervals start, up to the start of interval
    /// `need` (every interval, and their count checked, when the walk reaches EOI first);
    /// `starts` is reused. `None` when the markers are not where `frame`'s interval puts them.
    fn walk(b: &[u8], frame: Frame, need: usize, mut starts: Vec<usize>) -> Option<RestartLayout> {
        if !frame.has_grid() {
            return None;
        }
        let count = frame.per_row() as usize * frame.mcu_rows() as usize;
        starts.clear();
        starts.push(frame.scan_at);
        let mut pos = frame.scan_at;
        let end = loop {
            if starts.len() > need {
                break pos;
            }
            pos += memchr::memchr(0xFF, b.get(pos..)?)?;
            match *b.get(pos + 1)? {
                0x00 | 0xFF => pos += 1,
                m @ 0xD0..=0xD7 => {
                    if usize::from(m - 0xD0) != (starts.len() - 1) % 8 {
                        return None;
                    }
                    pos += 2;
                    starts.push(pos);
                }
                0xD9 if starts.len() == count => break pos,
                _ => return None,
            }
        };
        Some(RestartLayout { frame, starts, end })
    }

    /// The entropy-coded bytes of interval `k` (its RST marker excluded).
    fn interval(&self, k: usize) -> (usize, usize) {
        let end = self.starts.get(k + 1).map_or(self.end, |s| s - 2);
        (self.starts[k], end)
    }
}

/// A JPEG made of the restart intervals a region needs, and where it lies in the original.
#[derive(Debug, Default)]
pub(crate) struct PartialStream {
    pub(super) bytes: Vec<u8>,
    /// Interval starts, kept between decodes.
    starts: Vec<usize>,
}

/// The sub-image a partial stream covers: intervals (or groups) `cols` of MCU rows `rows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cover {
    pub(super) cols: (u32, u32),
    pub(super) rows: (u32, u32),
}

impl Cover {
    /// Whether the cover leaves out enough MCUs to be worth a partial stream.
    fn skips_enough(&self, f: &Frame) -> bool {
        let mcus = (self.cols.1 - self.cols.0) * f.interval * (self.rows.1 - self.rows.0);
        let share = f64::from(mcus) / f64::from(f.mcus_per_row() * f.mcu_rows());
        share <= 1.0 - MIN_SKIPPED_SHARE
    }

    /// The last interval the cover holds.
    fn last_interval(&self, f: &Frame) -> usize {
        (self.rows.1 - 1) as usize * f.per_row() as usize + (self.cols.1 - 1) as usize
    }
}

impl PartialStream {
    /// Builds the stream of the intervals `cover` holds; returns the sub-image's origin in
    /// scaled pixels at `factor`, or `None` when its size does not fit a frame header.
    fn build(
        &mut self,
        b: &[u8],
        layout: &RestartLayout,
        cover: Cover,
        factor: ScalingFactor,
    ) -> Option<(u32, u32)> {
        let f = &layout.frame;
        let mcu_cols = (cover.cols.1 - cover.cols.0) * f.interval;
        let x0 = cover.cols.0 * f.interval * f.mcu_w;
        let y0 = cover.rows.0 * f.mcu_h;
        let width = if cover.cols.1 == f.per_row() {
            f.width - x0
        } else {
            mcu_cols * f.mcu_w
        };
        let height = if cover.rows.1 == f.mcu_rows() {
            f.height - y0
        } else {
            (cover.rows.1 - cover.rows.0) * f.mcu_h
        };
        let out = &mut self.bytes;
        out.clear();
        out.extend_from_slice(&[0xFF, 0xD8]);
        f.write_header(b, out, (width, height))?;
        let per_row = f.per_row() as usize;
        // The next RST marker's number (RST0..RST7, in turn); none before the first interval.
        let mut rst: Option<u8> = None;
        for row in cover.rows.0..cover.rows.1 {
            for col in cover.cols.0..cover.cols.1 {
                if let Some(m) = rst {
                    out.extend_from_slice(&[0xFF, 0xD0 + m]);
                }
                rst = Some(rst.map_or(0, |m| (m + 1) % 8));
                let (s, e) = layout.interval(row as usize * per_row + col as usize);
                out.extend_from_slice(&b[s..e]);
            }
        }
        out.extend_from_slice(&[0xFF, 0xD9]);
        // The origin is on the MCU grid (a multiple of 8 pixels): exact at every factor.
        Some((factor.scale(x0), factor.scale(y0)))
    }
}

/// Scaled pixel rows at the top of an MCU row whose chroma upsampling reads the row above.
const EDGE_ROWS: u32 = 2;

/// The interval columns and MCU rows covering the scaled region.
fn cover(f: &Frame, factor: ScalingFactor, region: (u32, u32, u32, u32)) -> Cover {
    region_cover(f, factor, region, f.interval)
}

/// The groups of `group` MCU columns (a restart interval, or a group of entries) and the MCU
/// rows covering the scaled region. No column margin: libjpeg upsamples a cropped row as if
/// its edges were the image's. Libjpeg reads one chroma row across the edge of MCU rows: a
/// region starting in its MCU row's first [`EDGE_ROWS`] rows gets the row above, and every
/// region the row below its last, which libjpeg reads too (so a partial stream meets any
/// damage there as the plain decode does).
pub(super) fn region_cover(
    f: &Frame,
    factor: ScalingFactor,
    region: (u32, u32, u32, u32),
    group: u32,
) -> Cover {
    let groups = Frame {
        interval: group,
        keep: Vec::new(),
        ..*f
    };
    let top = u32::from(region.1 % factor.scale(f.mcu_h) < EDGE_ROWS);
    Cover {
        cols: cover_with(&groups, factor, region, 0).cols,
        rows: (
            cover_with(&groups, factor, region, top).rows.0,
            cover_with(&groups, factor, region, 1).rows.1,
        ),
    }
}

/// The cover of the scaled region with `margin` MCUs on every side.
fn cover_with(
    f: &Frame,
    factor: ScalingFactor,
    region: (u32, u32, u32, u32),
    margin: u32,
) -> Cover {
    let (x, y, w, h) = region;
    // Scaled pixel `s` comes from full pixels [s * d / n, (s + 1) * d / n).
    let full = |s: u32| (u64::from(s) * u64::from(factor.denom)).div_ceil(u64::from(factor.num));
    let lo = |s: u32, mcu: u32| {
        let v = u64::from(s) * u64::from(factor.denom) / u64::from(factor.num);
        u32::try_from(v / u64::from(mcu))
            .unwrap_or(u32::MAX)
            .saturating_sub(margin)
    };
    let hi = |s: u32, mcu: u32, max: u32| {
        u32::try_from(full(s).div_ceil(u64::from(mcu)))
            .unwrap_or(u32::MAX)
            .saturating_add(margin)
            .min(max)
    };
    let interval = f.interval;
    let c0 = lo(x, f.mcu_w) / interval;
    let c1 = hi(x + w, f.mcu_w, f.mcus_per_row()).div_ceil(interval);
    let r0 = lo(y, f.mcu_h);
    let r1 = hi(y + h, f.mcu_h, f.mcu_rows());
    Cover {
        cols: (c0, c1.max(c0 + 1)),
        rows: (r0, r1.max(r0 + 1)),
    }
}

impl CpuDecoder {
    /// Runs `plan` (whose cropping region is `region`) on the restart intervals it touches
    /// when `bytes` is restart-indexed and the region skips enough of it; `Ok(false)` when it is not (the caller decodes as before).
    /// The scan is walked only up to the last interval needed.
    pub(super) fn run_restart_intervals(
        &mut self,
        bytes: &[u8],
        plan: &RegionPlan,
        region: (u32, u32, u32, u32),
        out: &mut RgbImage,
    ) -> Result<bool, DecodeError> {
        let Some(frame) = Frame::parse(bytes).filter(Frame::has_grid) else {
            return Ok(false);
        };
        let cover = cover(&frame, plan.factor, region);
        if !cover.skips_enough(&frame) {
            return Ok(false);
        }
        let need = cover.last_interval(&frame) + 1;
        let mut partial = std::mem::take(&mut self.partial);
        let starts = std::mem::take(&mut partial.starts);
        let result = match RestartLayout::walk(bytes, frame, need, starts) {
            Some(layout) => {
                let built = partial.build(bytes, &layout, cover, plan.factor);
                partial.starts = layout.starts;
                match built {
                    Some(origin) => {
                        let (x, y, w, h) = region;
                        let shifted = (x - origin.0, y - origin.1, w, h);
                        self.run_partial(&partial.bytes, plan, shifted, out)
                    }
                    None => Ok(false),
                }
            }
            None => Ok(false),
        };
        self.partial = partial;
        result
    }

    /// Decodes `plan` from the partial stream `sub`, in which its cropping region lies at
    /// `shifted` (scaled pixels).
    pub(super) fn run_partial(
        &mut self,
        sub: &[u8],
        plan: &RegionPlan,
        shifted: (u32, u32, u32, u32),
        out: &mut RgbImage,
    ) -> Result<bool, DecodeError> {
        let header = self.begin(sub)?;
        let shifted = RegionPlan {
            crop: Some(shifted),
            ..*plan
        };
        self.run(sub, &header, &shifted, out)?;
        Ok(true)
    }
}

#[cfg(test)]
#[path = "restart_tests.rs"]
pub(super) mod tests;
