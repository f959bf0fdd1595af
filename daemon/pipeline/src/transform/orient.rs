//! EXIF orientation in the crop geometry: the crop is drawn on the image as shown (Pillow's
//! `ImageOps.exif_transpose`), mapped back to a box of the stored image, only that region is
//! decoded, and only the region is turned before the resize, never the whole image.
//!
//! # Design
//! - [`Orientation`] is the EXIF value 1..=8. `to_stored` maps a box of the shown image to the
//!   stored one; `to_shown` maps a box of a stored region to the turned region; `turn` writes
//!   the turned region. The box maps are exact (integer flips and transposes), so the pixels
//!   are those of turning the image first and cropping after.
//! - Values as Pillow's `exif_transpose` applies them: 2 mirror, 3 rotate 180, 4 flip, 5
//!   transpose, 6 rotate 90 clockwise, 7 transverse, 8 rotate 90 counter-clockwise.
//!
//! # Limitations
//! - Only JPEG's EXIF is read (decode::exif); PNG `eXIf` and WebP `EXIF` chunks are not.

#![forbid(unsafe_code)]

use stoker_kernels::image::{CropBox, RgbImage};

/// An EXIF orientation, 1 (stored order) to 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Orientation(u8);

impl Orientation {
    /// Stored order: nothing to turn.
    pub const STORED: Orientation = Orientation(1);

    /// The orientation of EXIF value `v`; stored order for a value outside 1..=8.
    pub fn new(v: u8) -> Orientation {
        Orientation(if (1..=8).contains(&v) { v } else { 1 })
    }

    /// The orientation a sample is shown in: its EXIF value `exif` when the spec asks for EXIF
    /// orientation (`on`), else stored order.
    pub fn applied(on: bool, exif: u8) -> Orientation {
        if on {
            Orientation::new(exif)
        } else {
            Orientation::STORED
        }
    }

    /// The EXIF value, 1 (stored order) to 8.
    pub fn value(self) -> u8 {
        self.0
    }

    /// Whether width and height swap (5 to 8).
    pub fn transposes(self) -> bool {
        self.0 >= 5
    }

    /// (mirror x, mirror y) of the shown image against the stored one, after any transpose.
    fn mirrors(self) -> (bool, bool) {
        match self.0 {
            2 => (true, false),
            3 | 7 => (true, true),
            4 => (false, true),
            6 => (true, false),
            8 => (false, true),
            _ => (false, false),
        }
    }

    /// The shown size of a stored `width` x `height` image (also `(h, w)` pairs, swapped alike).
    pub fn shown_size(self, width: u32, height: u32) -> (u32, u32) {
        if self.transposes() {
            (height, width)
        } else {
            (width, height)
        }
    }

    /// The box of the stored `width` x `height` image that box `b` of the shown image covers.
    pub fn to_stored(self, b: CropBox, width: u32, height: u32) -> CropBox {
        let (sw, sh) = self.shown_size(width, height);
        let (mx, my) = self.mirrors();
        // Undo the mirrors in shown coordinates, then the transpose.
        let x = if mx { f64::from(sw) - b.x - b.w } else { b.x };
        let y = if my { f64::from(sh) - b.y - b.h } else { b.y };
        if self.transposes() {
            CropBox::new(y, x, b.h, b.w)
        } else {
            CropBox::new(x, y, b.w, b.h)
        }
    }

    /// Where box `b` of a stored `width` x `height` region lies once the region is turned.
    pub fn to_shown(self, b: CropBox, width: u32, height: u32) -> CropBox {
        let t = if self.transposes() {
            CropBox::new(b.y, b.x, b.h, b.w)
        } else {
            b
        };
        let (sw, sh) = self.shown_size(width, height);
        let (mx, my) = self.mirrors();
        let x = if mx { f64::from(sw) - t.x - t.w } else { t.x };
        let y = if my { f64::from(sh) - t.y - t.h } else { t.y };
        CropBox::new(x, y, t.w, t.h)
    }

    /// Writes `src` (stored order) turned to its shown orientation into `dst`.
    pub fn turn(self, src: &RgbImage, dst: &mut RgbImage) {
        let (w, h) = self.shown_size(src.width, src.height);
        dst.reset(w, h);
        let (mx, my) = self.mirrors();
        let sw = src.width as usize;
        for v in 0..h as usize {
            let row = &mut dst.data[v * w as usize * 3..(v + 1) * w as usize * 3];
            for (u, px) in row.chunks_exact_mut(3).enumerate() {
                // Shown (u, v), un-mirrored, then un-transposed, is stored (x, y).
                let tu = if mx { w as usize - 1 - u } else { u };
                let tv = if my { h as usize - 1 - v } else { v };
                let (x, y) = if self.transposes() {
                    (tv, tu)
                } else {
                    (tu, tv)
                };
                let at = (y * sw + x) * 3;
                px.copy_from_slice(&src.data[at..at + 3]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3 x 2 image whose pixel (x, y) is [x, y, 0].
    fn stored() -> RgbImage {
        let mut img = RgbImage::default();
        img.reset(3, 2);
        for y in 0..2u8 {
            for x in 0..3u8 {
                let at = (usize::from(y) * 3 + usize::from(x)) * 3;
                img.data[at..at + 3].copy_from_slice(&[x, y, 0]);
            }
        }
        img
    }

    /// Pillow's `exif_transpose` of `stored()`, written out by hand: rows of (x, y) pairs.
    fn pillow(o: u8) -> Vec<Vec<(u8, u8)>> {
        let r = |v: &[(u8, u8)]| v.to_vec();
        match o {
            1 => vec![r(&[(0, 0), (1, 0), (2, 0)]), r(&[(0, 1), (1, 1), (2, 1)])],
            2 => vec![r(&[(2, 0), (1, 0), (0, 0)]), r(&[(2, 1), (1, 1), (0, 1)])],
            3 => vec![r(&[(2, 1), (1, 1), (0, 1)]), r(&[(2, 0), (1, 0), (0, 0)])],
            4 => vec![r(&[(0, 1), (1, 1), (2, 1)]), r(&[(0, 0), (1, 0), (2, 0)])],
            5 => vec![
                r(&[(0, 0), (0, 1)]),
                r(&[(1, 0), (1, 1)]),
                r(&[(2, 0), (2, 1)]),
            ],
            6 => vec![
                r(&[(0, 1), (0, 0)]),
                r(&[(1, 1), (1, 0)]),
                r(&[(2, 1), (2, 0)]),
            ],
            7 => vec![
                r(&[(2, 1), (2, 0)]),
                r(&[(1, 1), (1, 0)]),
                r(&[(0, 1), (0, 0)]),
            ],
            _ => vec![
                r(&[(2, 0), (2, 1)]),
                r(&[(1, 0), (1, 1)]),
                r(&[(0, 0), (0, 1)]),
            ],
        }
    }

    #[test]
    fn turn_gives_pillows_exif_transpose_for_every_orientation() {
        for o in 1..=8 {
            let mut out = RgbImage::default();
            Orientation::new(o).turn(&stored(), &mut out);
            let rows: Vec<Vec<(u8, u8)>> = out
                .data
                .chunks_exact(out.width as usize * 3)
                .map(|row| row.chunks_exact(3).map(|p| (p[0], p[1])).collect())
                .collect();
            assert_eq!(rows, pillow(o), "orientation {o}");
        }
    }

    #[test]
    fn boxes_map_to_the_pixels_they_cover_and_back() {
        let img = stored();
        for o in 1..=8 {
            let o = Orientation::new(o);
            let mut shown = RgbImage::default();
            o.turn(&img, &mut shown);
            // Each one-pixel box of the shown image maps to the stored pixel it shows.
            for v in 0..shown.height {
                for u in 0..shown.width {
                    let b = o.to_stored(CropBox::new(f64::from(u), f64::from(v), 1.0, 1.0), 3, 2);
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let (x, y) = (b.x as u32, b.y as u32);
                    assert_eq!(shown.pixel(u, v), img.pixel(x, y), "{o:?} ({u}, {v})");
                    assert_eq!(
                        o.to_shown(b, 3, 2),
                        CropBox::new(f64::from(u), f64::from(v), 1.0, 1.0)
                    );
                }
            }
        }
    }
}
