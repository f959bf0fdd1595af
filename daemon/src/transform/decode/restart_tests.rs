//! Restart-indexed JPEGs: the rewrite keeps every pixel, and a crop decoded from the restart
//! intervals it touches equals the same crop decoded from the original, bit for bit.

#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::path::{Path, PathBuf};

use stoker_kernels::reference::CropBox;

use super::super::plan_region;
use super::super::sys::PixelFormat;
use super::*;

/// A deterministic pseudo-random sequence (xorshift), so failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Textured pixels (noise over gradients), so every MCU has AC coefficients.
fn textured(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let mut v = Vec::with_capacity(w as usize * h as usize * 3);
    for y in 0..h {
        for x in 0..w {
            for c in 0..3u32 {
                let base = (x * (c + 1) + y * (3 - c)) % 256;
                v.push((base as u64 + rng.next() % 48) as u8);
            }
        }
    }
    v
}

fn encode(w: u32, h: u32, subsamp: i32, format: PixelFormat) -> Vec<u8> {
    let mut pixels = textured(w, h, u64::from(w * 31 + h));
    if format == PixelFormat::Gray {
        pixels = pixels.chunks_exact(3).map(|p| p[1]).collect();
    }
    let mut tj = TjHandle::new_compressor().expect("tj3Init(compress)");
    tj.set(Param::Quality, 90).unwrap();
    tj.set(Param::Subsamp, subsamp).unwrap();
    tj.compress8(&pixels, w, h, format).expect("compress")
}

/// A random RandomResizedCrop-like box and output size for an image of `w` x `h`.
fn random_crop(rng: &mut Rng, w: u32, h: u32) -> (CropBox, (u32, u32)) {
    let (fw, fh) = (f64::from(w), f64::from(h));
    let bw = (fw * (0.08 + 0.92 * rng.unit())).max(1.0);
    let bh = (fh * (0.08 + 0.92 * rng.unit())).max(1.0);
    let x = (fw - bw) * rng.unit();
    let y = (fh - bh) * rng.unit();
    let side = [224, 112, 64, 16][(rng.next() % 4) as usize];
    (CropBox::new(x, y, bw, bh), (side, side))
}

/// Decodes `crops` random crops of `original` and `rewritten` and asserts equal output; returns
/// how many took the restart-interval path.
fn assert_crops_equal(name: &str, original: &[u8], rewritten: &[u8], crops: usize) -> usize {
    let header = probe(original).unwrap();
    let mut plain = CpuDecoder::new(Limits::default()).unwrap();
    let mut partial = CpuDecoder::new(Limits::default()).unwrap();
    let (mut a, mut b) = (RgbImage::default(), RgbImage::default());
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ original.len() as u64);
    let mut took = 0;
    for i in 0..crops {
        let (want, out) = random_crop(&mut rng, header.width, header.height);
        let box_a = plain.decode_for_crop(original, want, out, &mut a).unwrap();
        let plan = plan_region(&header, want, out, &partial.factors).unwrap();
        let mut c = RgbImage::default();
        if partial
            .run_restart_intervals(rewritten, &plan, &mut c)
            .unwrap()
        {
            took += 1;
            assert!(c == a, "{name} crop {i} {want:?}: restart path differs");
        }
        let box_b = partial
            .decode_for_crop(rewritten, want, out, &mut b)
            .unwrap();
        assert_eq!(box_a, box_b, "{name} crop {i}");
        assert!(a == b, "{name} crop {i} {want:?} -> {out:?}: pixels differ");
    }
    took
}

fn rewrite_checked(name: &str, jpeg: &[u8]) -> Vec<u8> {
    let out = add_restart_markers(jpeg).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(RestartLayout::parse(&out).is_some(), "{name}");
    let full = |b: &[u8]| {
        let mut d = CpuDecoder::new(Limits::default()).unwrap();
        let mut img = RgbImage::default();
        d.decode_full(b, &mut img).unwrap();
        img
    };
    assert!(full(jpeg) == full(&out), "{name}: full decodes differ");
    out
}

#[test]
fn rewritten_files_decode_every_crop_bit_identically() {
    let cases = [
        (203, 157, 0, PixelFormat::Rgb),
        (640, 480, 2, PixelFormat::Rgb),
        (517, 389, 2, PixelFormat::Rgb),
        (498, 333, 1, PixelFormat::Rgb),
        (300, 451, 4, PixelFormat::Rgb),
        (401, 299, 3, PixelFormat::Gray),
    ];
    for (w, h, subsamp, format) in cases {
        let name = format!("{w}x{h} subsamp {subsamp} {format:?}");
        let jpeg = encode(w, h, subsamp, format);
        let out = rewrite_checked(&name, &jpeg);
        let took = assert_crops_equal(&name, &jpeg, &out, 60);
        assert!(
            took >= 20,
            "{name}: only {took} of 60 crops skipped intervals"
        );
    }
}

#[test]
fn the_interval_divides_the_row_into_about_sixteen() {
    assert_eq!(interval_for(32), 2);
    assert_eq!(interval_for(64), 4);
    // 20 intervals (4 from sixteen) rather than 10 (6 from it).
    assert_eq!(interval_for(40), 2);
    assert_eq!(interval_for(30), 2);
    assert_eq!(interval_for(27), 3);
    // 10 intervals of 2 MCUs, not 20 of one.
    assert_eq!(interval_for(20), 2);
    // Prime: one interval per row, not one per MCU.
    for prime in [3, 13, 19, 29, 31, 37] {
        assert_eq!(interval_for(prime), prime);
    }
    assert_eq!(interval_for(1), 1);
    assert_eq!(interval_for(2), 1);
}

#[test]
fn partial_stream_renumbers_markers_and_ends_with_eoi() {
    let jpeg = encode(640, 480, 2, PixelFormat::Rgb);
    let out = add_restart_markers(&jpeg).unwrap();
    let layout = RestartLayout::parse(&out).unwrap();
    let mut p = PartialStream::default();
    let c = cover(&layout.frame, ScalingFactor::ONE, (320, 160, 64, 64));
    assert!(c.skips_enough(&layout.frame));
    let origin = p.build(&out, &layout, c, ScalingFactor::ONE);
    // MCUs 19..25 of 40 (one MCU of margin each side) lie in interval columns 9..13 of 20
    // (intervals of 2 MCUs, 32 px): x 288..416; MCU rows 9..15 of 30: y 144..240.
    assert_eq!(origin, Some((288, 144)));
    let sub = RestartLayout::parse(&p.bytes).expect("the partial stream is restart-indexed");
    assert_eq!(
        (sub.frame.width, sub.frame.height),
        (128, 96),
        "four interval columns, six MCU rows"
    );
    assert_eq!(sub.starts.len(), 24);
    assert!(p.bytes.ends_with(&[0xFF, 0xD9]));
    // The whole image: not worth it.
    let whole = cover(&layout.frame, ScalingFactor::ONE, (0, 0, 640, 480));
    assert!(!whole.skips_enough(&layout.frame));
    // A walk asked for the intervals up to the cover's last stops early, with the same starts.
    let need = c.last_interval(&layout.frame) + 1;
    let short = RestartLayout::walk(&out, layout.frame.clone(), need, Vec::new()).unwrap();
    assert_eq!(short.starts.len(), need + 1);
    assert_eq!(short.starts[..], layout.starts[..=need]);
    assert!(short.end < layout.end);
}

#[test]
fn files_that_cannot_be_rewritten_say_why() {
    let mut tj = TjHandle::new_compressor().unwrap();
    tj.set(Param::Quality, 90).unwrap();
    tj.set(Param::Subsamp, 0).unwrap();
    tj.set(Param::Progressive, 1).unwrap();
    let pixels = textured(64, 48, 7);
    let progressive = tj.compress8(&pixels, 64, 48, PixelFormat::Rgb).unwrap();
    let err = add_restart_markers(&progressive).unwrap_err();
    assert!(err.0.contains("progressive"), "{err}");
    let err = add_restart_markers(b"\x89PNG\r\n\x1a\n....").unwrap_err();
    assert!(err.0.contains("not a JPEG"), "{err}");
    let good = encode(64, 48, 0, PixelFormat::Rgb);
    let cut = &good[..good.len() / 2];
    assert!(add_restart_markers(cut).is_err());
    let mut tj = TjHandle::new_compressor().unwrap();
    tj.set(Param::Quality, 90).unwrap();
    tj.set(Param::Subsamp, 0).unwrap();
    let cmyk: Vec<u8> = textured(32, 32, 3)
        .chunks_exact(3)
        .flat_map(|p| [p[0], p[1], p[2], 200])
        .collect();
    let cmyk = tj.compress8(&cmyk, 32, 32, PixelFormat::Cmyk).unwrap();
    let err = add_restart_markers(&cmyk).unwrap_err();
    assert!(err.0.contains("CMYK"), "{err}");
}

fn shared_data(dir: &str) -> Option<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data")
        .join(dir);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("SKIPPED: {} is missing", dir.display());
        return None;
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e != "tsv" && e != "md"));
    files.sort();
    Some(files)
}

/// Every photo is rewritten (they are all baseline), decodes whole to the same pixels, and
/// random crops from it equal the original's.
#[test]
fn every_shared_photo_rewrites_and_crops_bit_identically() {
    let Some(files) = shared_data("photos") else {
        return;
    };
    assert!(files.len() >= 100, "{} photos", files.len());
    let mut took = 0;
    for path in &files {
        let name = path.display().to_string();
        let jpeg = std::fs::read(path).unwrap();
        assert!(RestartLayout::parse(&jpeg).is_none(), "{name} had markers");
        let out = rewrite_checked(&name, &jpeg);
        took += assert_crops_equal(&name, &jpeg, &out, 4);
    }
    assert!(took >= files.len(), "{took} restart-path crops");
}

/// Edge files: those that decode either rewrite to the same pixels or are kept as they are
/// with a reason; none that fails to decode is rewritten.
#[test]
fn edge_files_rewrite_identically_or_stay_as_they_are() {
    let Some(files) = shared_data("edge") else {
        return;
    };
    let (mut rewritten, mut kept) = (0, 0);
    for path in &files {
        let name = path.display().to_string();
        let jpeg = std::fs::read(path).unwrap();
        let mut d = CpuDecoder::new(Limits::default()).unwrap();
        let mut img = RgbImage::default();
        let decodes = d.decode_full(&jpeg, &mut img).is_ok();
        match add_restart_markers(&jpeg) {
            Ok(out) => {
                assert!(
                    decodes,
                    "{name}: rewritten but the original does not decode"
                );
                let _ = rewrite_checked(&name, &jpeg);
                assert_crops_equal(&name, &jpeg, &out, 8);
                rewritten += 1;
            }
            Err(why) => {
                assert!(!why.0.is_empty());
                kept += 1;
            }
        }
    }
    eprintln!("edge files: {rewritten} rewritten, {kept} kept as they are");
    assert!(rewritten >= 10 && kept >= 10, "{rewritten} / {kept}");
}

/// Issue 25 item 3 on restart-indexed files: TurboJPEG cannot crop a YUV decode, but the
/// partial stream of a restart-indexed file is already about the crop's size. Per photo and
/// three epochs of RandomResizedCrop boxes, today's RGB decode of the partial stream (cropped,
/// upsampled, colour converted) against a planar YUV decode of the same partial stream at the
/// same DCT scale, back to back. Figures: docs/decisions.md, "Colour stays at the decoded size".
#[test]
#[ignore = "measurement: cargo test --release -p stoker-daemon --lib yuv_partial -- --ignored --nocapture"]
fn yuv_partial_decode_cost_against_the_rgb_partial_decode() {
    use super::super::tests as measure;
    use std::time::Instant;
    let Some(files) = shared_data("photos") else {
        return;
    };
    let mut rgb = CpuDecoder::new(Limits::default()).unwrap();
    let mut yuv = super::super::new_handle().unwrap();
    let (mut out, mut planes) = (RgbImage::default(), [vec![], vec![], vec![]]);
    let mut partial = PartialStream::default();
    let (mut secs, mut px, mut n) = ([0f64; 3], [0u64; 3], 0u32);
    let rewritten: Vec<Vec<u8>> = files
        .iter()
        .map(|p| add_restart_markers(&std::fs::read(p).unwrap()).unwrap())
        .collect();
    for epoch in 0..3 {
        for (index, bytes) in rewritten.iter().enumerate() {
            let h = probe(bytes).unwrap();
            if h.colorspace != ColorSpace::YCbCr {
                continue;
            }
            let crop = measure::train_crop(&h, epoch, index);
            let plan = plan_region(&h, crop, (224, 224), &rgb.factors).unwrap();
            let t = Instant::now();
            if !rgb.run_restart_intervals(bytes, &plan, &mut out).unwrap() {
                continue;
            }
            secs[0] += t.elapsed().as_secs_f64();
            px[0] += u64::from(out.width) * u64::from(out.height);
            // With the RGB path's margin of one MCU (for libjpeg's fancy upsampling), and
            // without it: a planar resize clamps its taps to the crop, so it needs none, and
            // the stream then ends at the crop's last MCU row.
            for (way, margin) in [(1, MARGIN_MCUS), (2, 0)] {
                let t = Instant::now();
                let frame = Frame::parse(bytes).unwrap();
                let cover = cover_with(&frame, plan.factor, plan.crop.unwrap(), margin);
                let need = cover.last_interval(&frame) + 1;
                let layout = RestartLayout::walk(bytes, frame, need, Vec::new()).unwrap();
                partial.build(bytes, &layout, cover, plan.factor).unwrap();
                px[way] += measure::decode_yuv(&mut yuv, &partial.bytes, plan.factor, &mut planes);
                secs[way] += t.elapsed().as_secs_f64();
            }
            n += 1;
        }
    }
    assert!(n > 0, "no photo took the restart path");
    let names = [
        "RGB, partial stream, cropped (today)",
        "YUV planes, partial stream",
        "YUV planes, partial stream, no margin",
    ];
    measure::print_costs(&names, &secs, &px, n);
}
