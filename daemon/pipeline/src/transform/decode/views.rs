//! One decode for several views of an image: the region covering every view's box, at the
//! DCT scale the most demanding view needs.
//!
//! # Design
//! - The union of the views' boxes is decoded once (region, restart-interval or whole, as
//!   [`CpuDecoder::decode_for_crop`] decides for one box), at the smallest scale that keeps
//!   every view's box at least that view's output size: the view needing the most pixels sets
//!   the scale, and the others are resampled from the same pixels.
//! - [`DecodedRegion`] maps a box of the full image into the decoded pixels, exactly as the
//!   one-box decode maps its box (`box * scale - origin`).
//!
//! # Limitations
//! - Views far apart in a large image decode the pixels between them too (one rectangle).

use stoker_kernels::image::{CropBox, RgbImage};

use super::{
    inside, other_format, plan_region_at, smallest_factor, sniff, CpuDecoder, DecodeError,
};

/// Where a decode's pixels lie in the full image: a box `b` of the full image is
/// `(b.x * scale - x, b.y * scale - y, b.w * scale, b.h * scale)` in the decoded pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodedRegion {
    /// Decoded pixels per full-image pixel (1, or a DCT scaling's 1/2, 1/4, 1/8).
    pub scale: f64,
    /// Left edge of the decoded pixels, in decoded pixels from the full image's left.
    pub x: f64,
    /// Top edge of the decoded pixels, in decoded pixels from the full image's top.
    pub y: f64,
}

impl DecodedRegion {
    /// Where `b` (full-image pixels) lies in the decoded pixels.
    pub fn place(&self, b: CropBox) -> CropBox {
        CropBox::new(
            b.x * self.scale - self.x,
            b.y * self.scale - self.y,
            b.w * self.scale,
            b.h * self.scale,
        )
    }
}

/// The smallest box holding every one of `boxes` (not empty).
fn union(boxes: &[(CropBox, (u32, u32))]) -> CropBox {
    let (mut x0, mut y0) = (f64::INFINITY, f64::INFINITY);
    let (mut x1, mut y1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for (b, _) in boxes {
        x0 = x0.min(b.x);
        y0 = y0.min(b.y);
        x1 = x1.max(b.x + b.w);
        y1 = y1.max(b.y + b.h);
    }
    CropBox::new(x0, y0, x1 - x0, y1 - y0)
}

impl CpuDecoder {
    /// Decodes, once, the part of the image covering every `(box, (out_h, out_w))` of `views`
    /// (full-image pixel coordinates) at the smallest DCT scale that keeps each box at least
    /// its output size. Returns how full-image boxes map into `out`. PNG and WebP images are
    /// decoded whole at full size.
    ///
    /// # Panics
    /// If `views` is empty.
    pub fn decode_for_views(
        &mut self,
        bytes: &[u8],
        views: &[(CropBox, (u32, u32))],
        out: &mut RgbImage,
    ) -> Result<DecodedRegion, DecodeError> {
        assert!(!views.is_empty(), "a decode for no view");
        let want = union(views);
        if let Some(format) = other_format(bytes) {
            self.decode_other_for_crop(format, bytes, want, out)?;
            return Ok(DecodedRegion {
                scale: 1.0,
                x: 0.0,
                y: 0.0,
            });
        }
        let result = self.begin(bytes).and_then(|header| {
            // As in `decode_for_crop`: a region decode must not pass a file cut short below it.
            if !sniff::has_end_after_scan(bytes) {
                return Err(DecodeError::Truncated {
                    detail: String::from("no end-of-image marker after the scan data"),
                });
            }
            for (b, _) in views {
                inside(&header, *b)?;
            }
            let covers = |s: f64| {
                views.iter().all(|(b, (out_h, out_w))| {
                    b.w * s >= f64::from(*out_w) && b.h * s >= f64::from(*out_h)
                })
            };
            let factor = smallest_factor(&self.factors, covers);
            let plan = plan_region_at(&header, want, inside(&header, want)?, factor)?;
            self.run_region(bytes, &header, &plan, out)?;
            let (ox, oy, _, _) = plan.crop.unwrap_or((0, 0, 0, 0));
            Ok(DecodedRegion {
                scale: factor.as_f64(),
                x: f64::from(ox),
                y: f64::from(oy),
            })
        });
        self.recover(result)
    }
}
