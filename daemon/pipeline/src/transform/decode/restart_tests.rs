//! Restart-indexed JPEGs: the rewrite keeps every pixel, and a crop decoded from the restart
//! intervals it touches equals the same crop decoded from the original, bit for bit.

#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::path::{Path, PathBuf};

use stoker_kernels::reference::CropBox;

use super::super::sys::PixelFormat;
use super::super::{plan_region, JpegHeader};
use super::*;

/// A deterministic pseudo-random sequence (xorshift), so failures replay.
pub(in crate::transform::decode) struct Rng(pub(in crate::transform::decode) u64);

impl Rng {
    pub(in crate::transform::decode) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub(in crate::transform::decode) fn unit(&mut self) -> f64 {
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

pub(in crate::transform::decode) fn encode(
    w: u32,
    h: u32,
    subsamp: i32,
    format: PixelFormat,
) -> Vec<u8> {
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
pub(in crate::transform::decode) fn random_crop(
    rng: &mut Rng,
    w: u32,
    h: u32,
) -> (CropBox, (u32, u32)) {
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
        let took_path = plan.crop.is_some_and(|region| {
            partial
                .run_restart_intervals(rewritten, &plan, region, &mut c)
                .unwrap()
        });
        if took_path {
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
    // MCUs 20..24 of 40 (no column margin) lie in interval columns 10..12 of 20 (intervals of
    // 2 MCUs, 32 px): x 320..384; MCU rows 9..15 of 30 (the row above, as the region starts
    // on an MCU row's edge, and the row below): y 144..240.
    assert_eq!(origin, Some((320, 144)));
    let sub = RestartLayout::parse(&p.bytes).expect("the partial stream is restart-indexed");
    assert_eq!(
        (sub.frame.width, sub.frame.height),
        (64, 96),
        "two interval columns, six MCU rows"
    );
    assert_eq!(sub.starts.len(), 12);
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

pub(in crate::transform::decode) fn shared_data(dir: &str) -> Option<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data")
        .join(dir);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        // CI lays ../shared beside the clone: there a missing folder is a wrong path (these
        // tests once skipped silently after a move), not a checkout without the data.
        assert!(
            std::env::var_os("CI").is_none_or(|v| v != "true"),
            "{} is missing under CI",
            dir.display()
        );
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
    let mut out = RgbImage::default();
    let mut planar_path = PlanarPath::default();
    let (mut secs, mut px, mut n) = ([0f64; 3], [0u64; 3], 0u32);
    let rewritten = rewritten_photos(&files);
    for epoch in 0..3 {
        for (index, bytes) in rewritten.iter().enumerate() {
            let Some((_, _, plan, decode)) = todays_decode(&mut rgb, bytes, epoch, index, &mut out)
            else {
                continue;
            };
            secs[0] += decode;
            px[0] += u64::from(out.width) * u64::from(out.height);
            // With the RGB path's margin of one MCU (for libjpeg's fancy upsampling), and
            // without it: a planar resize clamps its taps to the crop, so it needs none, and
            // the stream then ends at the crop's last MCU row.
            for (way, margin) in [(1, MARGIN_MCUS), (2, 0)] {
                let t = Instant::now();
                let (_, pixels) = planar_path.decode(bytes, &plan, margin);
                px[way] += pixels;
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

/// Issue 25 item 3 end to end on restart-indexed files, as a measurement: today's path (the
/// partial stream decoded to cropped RGB, then `Augmenter`) against the colour-at-the-output-
/// size path (the partial stream without margin decoded to YCbCr planes, then
/// `augment::planar_probe`), both to normalised f32 CHW at 224x224 with no flip, timed per
/// stage back to back; and the PSNR of the planar path's image against today's (in 0-255
/// units), the lowest over all photos and the mean. 4:4:4, 4:2:2 and 4:2:0 YCbCr photos.
#[test]
#[ignore = "measurement: cargo test --release -p stoker-daemon --lib planar_path -- --ignored --nocapture"]
fn planar_path_cost_and_psnr_against_todays_path() {
    use super::super::Subsampling;
    use crate::transform::augment::Augmenter;
    use std::time::Instant;
    let Some(files) = shared_data("photos") else {
        return;
    };
    let spec = stoker_wire::spec::PipelineSpec::train(64, 224);
    let mut rgb = CpuDecoder::new(Limits::default()).unwrap();
    let (mut augmenter, mut img) = (Augmenter::new(), RgbImage::default());
    let mut planar_path = PlanarPath::default();
    let mut today = vec![0u8; spec.image_bytes()];
    let mut planar = vec![0f32; spec.image_bytes() / 4];
    // Today's decode and augment, then the planar path's; one PSNR per image.
    let (mut secs, mut n, mut psnrs) = ([0f64; 4], 0u32, Vec::new());
    let rewritten = rewritten_photos(&files);
    for epoch in 0..3 {
        for (index, bytes) in rewritten.iter().enumerate() {
            let Some((h, crop, plan, decode)) =
                todays_decode(&mut rgb, bytes, epoch, index, &mut img)
            else {
                continue;
            };
            let sub = match h.subsampling {
                Subsampling::S444 => (1, 1),
                Subsampling::S422 => (2, 1),
                Subsampling::S420 => (2, 2),
                _ => continue,
            };
            secs[0] += decode;
            let t = Instant::now();
            augmenter.augment_into(&img, plan.box_out, false, &spec, &mut today);
            secs[1] += t.elapsed().as_secs_f64();
            let [d, a] = planar_path.run(bytes, &plan, (crop, sub), &spec, &mut planar);
            secs[2] += d;
            secs[3] += a;
            psnrs.push(psnr_255(&spec, &today, &planar));
            n += 1;
        }
    }
    assert!(n > 0, "no photo took the restart path");
    let per = |s: f64| s / f64::from(n) * 1e3;
    for (name, d, a) in [("today", secs[0], secs[1]), ("planar", secs[2], secs[3])] {
        let (d, a) = (per(d), per(a));
        eprintln!(
            "{name:<7} decode {d:.3} + augment {a:.3} = {:.3} ms/image",
            d + a
        );
    }
    let lowest = psnrs.iter().copied().fold(f64::INFINITY, f64::min);
    let finite: Vec<f64> = psnrs.iter().copied().filter(|p| p.is_finite()).collect();
    let mean = finite.iter().sum::<f64>() / finite.len() as f64;
    let under_40 = psnrs.iter().filter(|&&p| p < 40.0).count();
    eprintln!(
        "PSNR planar vs today over {n} images: lowest {lowest:.1} dB, mean {mean:.1} dB \
         ({} identical, {under_40} under 40 dB)",
        psnrs.len() - finite.len()
    );
}

/// The photos rewritten with restart markers, in order.
/// Today's decode of one restart-indexed photo for the measurements above: its header, the
/// RandomResizedCrop box of (`epoch`, `index`), the region plan, and the seconds the RGB decode
/// of the crop's restart intervals into `out` took. `None` for a photo that is not YCbCr or
/// does not take the restart path.
fn todays_decode(
    rgb: &mut CpuDecoder,
    bytes: &[u8],
    epoch: u64,
    index: usize,
    out: &mut RgbImage,
) -> Option<(JpegHeader, CropBox, RegionPlan, f64)> {
    let h = probe(bytes).unwrap();
    if h.colorspace != ColorSpace::YCbCr {
        return None;
    }
    let crop = super::super::tests::train_crop(&h, epoch, index);
    let plan = plan_region(&h, crop, (224, 224), &rgb.factors).unwrap();
    let t = std::time::Instant::now();
    rgb.run_restart_intervals(bytes, &plan, plan.crop?, out)
        .unwrap()
        .then_some(())?;
    Some((h, crop, plan, t.elapsed().as_secs_f64()))
}

fn rewritten_photos(files: &[PathBuf]) -> Vec<Vec<u8>> {
    files
        .iter()
        .map(|p| add_restart_markers(&std::fs::read(p).unwrap()).unwrap())
        .collect()
}

/// The colour-at-the-output-size path for the measurement: the partial stream without margin
/// decoded to YCbCr planes, then `augment::planar_probe`.
#[derive(Default)]
struct PlanarPath {
    yuv: Option<TjHandle>,
    planes: [Vec<u8>; 3],
    partial: PartialStream,
    probe: crate::transform::augment::planar_probe::PlanarProbe,
}

impl PlanarPath {
    /// Builds the partial stream of `plan`'s region of restart-indexed `bytes` with `margin`
    /// MCUs on every side and decodes it to YCbCr planes at the plan's scale; returns the
    /// stream's origin (scaled pixels) and the luma samples decoded.
    fn decode(&mut self, bytes: &[u8], plan: &RegionPlan, margin: u32) -> ((u32, u32), u64) {
        let frame = Frame::parse(bytes).unwrap();
        let cover = cover_with(&frame, plan.factor, plan.crop.unwrap(), margin);
        let need = cover.last_interval(&frame) + 1;
        let layout = RestartLayout::walk(bytes, frame, need, Vec::new()).unwrap();
        let origin = self
            .partial
            .build(bytes, &layout, cover, plan.factor)
            .unwrap();
        let yuv = self
            .yuv
            .get_or_insert_with(|| super::super::new_handle().unwrap());
        let decode_yuv = super::super::tests::decode_yuv;
        let pixels = decode_yuv(yuv, &self.partial.bytes, plan.factor, &mut self.planes);
        (origin, pixels)
    }

    /// Runs `crop` (full-image pixels; chroma subsampled by `sub`) of restart-indexed `bytes`
    /// through the planar path into `out`; returns the decode's and the augment's seconds.
    fn run(
        &mut self,
        bytes: &[u8],
        plan: &RegionPlan,
        (crop, sub): (CropBox, (u32, u32)),
        spec: &stoker_wire::spec::PipelineSpec,
        out: &mut [f32],
    ) -> [f64; 2] {
        use crate::transform::augment::planar_probe::Plane;
        let t = std::time::Instant::now();
        let (origin, _) = self.decode(bytes, plan, 0);
        let decode = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let ph = probe(&self.partial.bytes).unwrap();
        let (sw, sh) = (plan.factor.scale(ph.width), plan.factor.scale(ph.height));
        let (cw, ch) = (sw.div_ceil(sub.0), sh.div_ceil(sub.1));
        let plane = |c: usize, width: u32, height: u32| Plane {
            data: &self.planes[c],
            width,
            height,
            stride: width as usize,
        };
        let views = [plane(0, sw, sh), plane(1, cw, ch), plane(2, cw, ch)];
        let s = plan.factor.as_f64();
        let at = CropBox::new(
            crop.x * s - f64::from(origin.0),
            crop.y * s - f64::from(origin.1),
            crop.w * s,
            crop.h * s,
        );
        self.probe.augment(&views, sub, at, spec, out);
        [decode, t.elapsed().as_secs_f64()]
    }
}

/// PSNR in 0-255 units between two normalised CHW images: `today` as the native-order f32
/// bytes the augmenter writes, `planar` as f32s.
fn psnr_255(spec: &stoker_wire::spec::PipelineSpec, today: &[u8], planar: &[f32]) -> f64 {
    let plane = planar.len() / 3;
    let mut sum = 0.0f64;
    for (i, (a, &b)) in today.chunks_exact(4).zip(planar).enumerate() {
        let a = f32::from_ne_bytes(a.try_into().unwrap());
        let std = f64::from(spec.std[i / plane]) * 255.0;
        let d = (f64::from(a) - f64::from(b)) * std;
        sum += d * d;
    }
    let mse = sum / planar.len() as f64;
    if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (255.0f64 * 255.0 / mse).log10()
    }
}
