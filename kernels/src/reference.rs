//! Straightforward CPU reference implementations of every kernel: the oracle that both the CPU
//! backend's fast code and the GPU kernels are tested against. Written for clarity, not speed.

/// A box in the pixel coordinates of an image. Float so that a region decoded at a reduced DCT
/// scale keeps its exact geometry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CropBox {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

impl CropBox {
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
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

impl RgbImage {
    /// Resizes the buffer for a `width` x `height` image, keeping its capacity.
    pub fn reset(&mut self, width: u32, height: u32) {
        self.width = width;
        self.height = height;
        self.data.resize(width as usize * height as usize * 3, 0);
    }

    #[inline]
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = (y as usize * self.width as usize + x as usize) * 3;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }
}
