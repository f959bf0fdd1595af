//! Recognising a file by its first bytes, never by its name: [`ImageFormat::detect`] is the one
//! rule saying which decoder a file goes to (JPEG, PNG, WebP, BMP, TIFF or PPM/PGM).

#![forbid(unsafe_code)]

/// The three bytes every JPEG stream starts with: SOI (`FF D8`) and the `FF` of the next marker.
pub(crate) const JPEG_MAGIC: [u8; 3] = [0xFF, 0xD8, 0xFF];

/// The signature every PNG file starts with.
const PNG_MAGIC: &[u8; 8] = b"\x89PNG\r\n\x1a\n";

/// An image format stoker decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// Decoded by libjpeg-turbo (CPU) or nvJPEG (CUDA).
    Jpeg,
    /// Decoded on the CPU by the `png` crate, on both backends.
    Png,
    /// Decoded on the CPU by the `image-webp` crate, on both backends.
    WebP,
    /// Windows bitmap; decoded on the CPU by the `image` crate, on both backends.
    Bmp,
    /// TIFF (8- and 16-bit samples); decoded on the CPU by the `image` crate (`tiff`).
    Tiff,
    /// Netpbm: PBM, PGM and PPM (`P1` to `P6`); decoded on the CPU by the `image` crate.
    Pnm,
}

impl ImageFormat {
    /// The format of `bytes` by their first bytes; `None` for anything else. JPEG is claimed
    /// by its SOI marker alone (`FF D8`), so that a stream broken right after it is reported
    /// as a corrupt JPEG.
    pub fn detect(bytes: &[u8]) -> Option<ImageFormat> {
        if bytes.starts_with(&JPEG_MAGIC[..2]) {
            Some(ImageFormat::Jpeg)
        } else if bytes.starts_with(PNG_MAGIC) {
            Some(ImageFormat::Png)
        } else if bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP") {
            Some(ImageFormat::WebP)
        } else if bytes.starts_with(b"BM") && bytes.len() >= 14 {
            Some(ImageFormat::Bmp)
        } else if bytes.starts_with(b"II*\0") || bytes.starts_with(b"MM\0*") {
            Some(ImageFormat::Tiff)
        } else if is_netpbm(bytes) {
            Some(ImageFormat::Pnm)
        } else {
            None
        }
    }

    /// The format's name as messages give it (`JPEG`, `PNG`, `WebP`).
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "JPEG",
            ImageFormat::Png => "PNG",
            ImageFormat::WebP => "WebP",
            ImageFormat::Bmp => "BMP",
            ImageFormat::Tiff => "TIFF",
            ImageFormat::Pnm => "PPM/PGM",
        }
    }
}

/// `P1` to `P6` and whitespace: a Netpbm header, as Pillow's PPM plugin reads them.
fn is_netpbm(bytes: &[u8]) -> bool {
    matches!(bytes, [b'P', b'1'..=b'6', w, ..] if w.is_ascii_whitespace())
}

impl std::fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_the_decoded_formats_by_content() {
        let detect = ImageFormat::detect;
        assert_eq!(detect(b"\x89PNG\r\n\x1a\n0000"), Some(ImageFormat::Png));
        assert_eq!(detect(b"RIFF\0\0\0\0WEBPVP8 "), Some(ImageFormat::WebP));
        assert_eq!(detect(&[0xFF, 0xD8, 0xFF, 0xE0]), Some(ImageFormat::Jpeg));
        assert_eq!(detect(b"\x89PNG\r\n\x1a"), None, "a cut signature");
        assert_eq!(detect(b"RIFF\0\0\0\0WAVEfmt "), None);
        assert_eq!(detect(b"GIF89a...."), None);
        assert_eq!(
            detect(b"BM\0\0\0\0\0\0\0\0\x36\0\0\0"),
            Some(ImageFormat::Bmp)
        );
        assert_eq!(detect(b"BM"), None, "too short for a BMP header");
        assert_eq!(detect(b"II*\0\x08\0\0\0"), Some(ImageFormat::Tiff));
        assert_eq!(detect(b"MM\0*\0\0\0\x08"), Some(ImageFormat::Tiff));
        assert_eq!(detect(b"P6\n4 4\n255\n"), Some(ImageFormat::Pnm));
        assert_eq!(detect(b"P5 4 4 255 "), Some(ImageFormat::Pnm));
        assert_eq!(
            detect(b"P7\nWIDTH 4"),
            None,
            "PAM: Pillow reads no P7 either"
        );
        assert_eq!(detect(b"Plain text"), None);
    }
}
