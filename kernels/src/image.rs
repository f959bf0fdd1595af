//! The image types the pipeline's production path and the kernels share: a decoded image
//! ([`RgbImage`]) and a box in its pixel coordinates ([`CropBox`]). The reference oracle
//! (`reference`) computes on them too, and re-exports them for its tests.

#![forbid(unsafe_code)]

/// A box in the pixel coordinates of an image. Float so that a region decoded at a reduced DCT
/// scale keeps its exact geometry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CropBox {
    /// Left edge, pixels from the image's left.
    pub x: f64,
    /// Top edge, pixels from the image's top.
    pub y: f64,
    /// Width in pixels.
    pub w: f64,
    /// Height in pixels.
    pub h: f64,
}

impl CropBox {
    /// The box at (`x`, `y`) of `w` x `h` pixels.
    pub fn new(x: f64, y: f64, w: f64, h: f64) -> CropBox {
        CropBox { x, y, w, h }
    }

    /// The whole of a `width` x `height` image.
    pub fn full(width: u32, height: u32) -> CropBox {
        CropBox::new(0.0, 0.0, width as f64, height as f64)
    }
}

/// Packed 8-bit RGB, row-major, `data.len() == width * height * 3`. Reused between images.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RgbImage {
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
    /// R, G, B of each pixel, row after row.
    pub data: Vec<u8>,
}

impl RgbImage {
    /// Resizes the buffer for a `width` x `height` image, keeping its capacity.
    pub fn reset(&mut self, width: u32, height: u32) {
        self.width = width;
        self.height = height;
        self.data.resize(width as usize * height as usize * 3, 0);
    }

    /// The (R, G, B) at column `x`, row `y`.
    #[inline]
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = (y as usize * self.width as usize + x as usize) * 3;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }
}
