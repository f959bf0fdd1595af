//! Small real JPEG datasets for tests: synthetic images encoded with the daemon's encoder.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

/// Encodes `rgb` (packed, `width * height * 3` bytes) as a baseline 4:2:0 JPEG.
pub fn encode_jpeg(rgb: &[u8], width: u32, height: u32, quality: i32) -> Vec<u8> {
    use stoker_pipeline::transform::decode::{EncodeOptions, JpegEncoder};
    let opts = EncodeOptions {
        quality: quality.clamp(1, 100) as u8,
        ..EncodeOptions::default()
    };
    JpegEncoder::new()
        .and_then(|mut e| e.encode_rgb(rgb, width, height, &opts))
        .expect("encode a test JPEG")
}

/// A smooth synthetic image whose colours depend on `seed`, so samples differ.
pub fn synthetic_rgb(width: u32, height: u32, seed: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(width as usize * height as usize * 3);
    for y in 0..height {
        for x in 0..width {
            v.push(((x * 255 / width.max(1)) as u8).wrapping_add((seed * 37) as u8));
            v.push(((y * 255 / height.max(1)) as u8).wrapping_add((seed * 91) as u8));
            v.push((((x + y) * 4) as u8).wrapping_add((seed * 13) as u8));
        }
    }
    v
}

/// Writes one synthetic JPEG.
pub fn write_jpeg(path: &Path, width: u32, height: u32, seed: u32) {
    let jpeg = encode_jpeg(&synthetic_rgb(width, height, seed), width, height, 90);
    std::fs::write(path, jpeg).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// An ImageFolder dataset under `root`: `classes` subfolders `c0..`, `per_class` JPEGs each,
/// of varying sizes around `side`. Returns the number of samples.
pub fn write_image_folder(root: &Path, classes: u32, per_class: u32, side: u32) -> usize {
    write_folder_of(root, classes, per_class, |c, i| {
        let seed = c * 1000 + i;
        let (w, h) = (side + (seed % 7) * 3, side + (seed % 5) * 4);
        encode_jpeg(&synthetic_rgb(w, h, seed), w, h, 90)
    })
}

/// An ImageFolder of 4:4:4 JPEGs (quality 95) of about 48 pixels a side under `root`:
/// without chroma upsampling the emulated nvJPEG and the CPU decoder give the same pixels, so
/// what differs between the backends is what comes after the decode.
pub fn write_444_folder(root: &Path, classes: u32, per_class: u32) -> usize {
    use stoker_pipeline::transform::decode::{EncodeOptions, JpegEncoder, Subsampling};
    write_folder_of(root, classes, per_class, |c, i| {
        let seed = c * 1000 + i;
        let (w, h) = (48 + (seed % 7) * 3, 48 + (seed % 5) * 4);
        let opts = EncodeOptions {
            quality: 95,
            subsampling: Subsampling::S444,
            ..EncodeOptions::default()
        };
        let rgb = synthetic_rgb(w, h, seed);
        JpegEncoder::new()
            .and_then(|mut e| e.encode_rgb(&rgb, w, h, &opts))
            .unwrap()
    })
}

/// An ImageFolder under `root`: `classes` subfolders `c0..`, each of `per_class` JPEGs
/// `img000.jpg`, ... whose bytes `jpeg(class, i)` makes. Returns the number of samples.
pub fn write_folder_of(
    root: &Path,
    classes: u32,
    per_class: u32,
    mut jpeg: impl FnMut(u32, u32) -> Vec<u8>,
) -> usize {
    for c in 0..classes {
        let dir = root.join(format!("c{c}"));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..per_class {
            let path = dir.join(format!("img{i:03}.jpg"));
            std::fs::write(&path, jpeg(c, i))
                .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        }
    }
    (classes * per_class) as usize
}

/// A fresh temp dir holding the ImageFolder `data/` of [`write_image_folder`] (JPEGs of about
/// 24 pixels a side); returns the dir, the dataset's path and its number of samples.
pub fn temp_image_folder(classes: u32, per_class: u32) -> (tempfile::TempDir, PathBuf, usize) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let data = dir.path().join("data");
    let n = write_image_folder(&data, classes, per_class, 24);
    (dir, data, n)
}

/// The ImageFolder `dir/data` of [`write_image_folder`] with JPEGs of about 20 pixels a side;
/// returns its path.
pub fn tiny_dataset(dir: &Path, classes: u32, per_class: u32) -> PathBuf {
    let data = dir.join("data");
    write_image_folder(&data, classes, per_class, 20);
    data
}
