//! Decoder tests on fixtures encoded here with tj3Compress8 from a synthetic smooth image.

#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use super::*;
use stoker_kernels::reference::psnr;

const W: u32 = 203;
const H: u32 = 157;

/// A smooth colour image (low-frequency gradients and waves): JPEG at high quality keeps it
/// well above 40 dB.
fn smooth_rgb(w: u32, h: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(w as usize * h as usize * 3);
    for y in 0..h {
        for x in 0..w {
            let (fx, fy) = (x as f64 / w as f64, y as f64 / h as f64);
            let r = 40.0 + 170.0 * fx;
            let g = 128.0 + 90.0 * (std::f64::consts::PI * 2.0 * fy).sin() * 0.8;
            let b = 60.0 + 120.0 * (fx * fy) + 30.0 * (std::f64::consts::PI * fx).cos();
            v.extend([r, g, b].map(|c| c.round().clamp(0.0, 255.0) as u8));
        }
    }
    v
}

fn to_gray(rgb: &[u8]) -> Vec<u8> {
    rgb.chunks_exact(3)
        .map(|p| (0.299 * p[0] as f64 + 0.587 * p[1] as f64 + 0.114 * p[2] as f64).round() as u8)
        .collect()
}

#[derive(Clone, Copy)]
struct Enc {
    subsamp: i32,
    quality: i32,
    progressive: bool,
    restart_rows: i32,
}

impl Default for Enc {
    fn default() -> Enc {
        Enc {
            subsamp: 0,
            quality: 98,
            progressive: false,
            restart_rows: 0,
        }
    }
}

fn encode(pixels: &[u8], w: u32, h: u32, format: PixelFormat, enc: Enc) -> Vec<u8> {
    let mut tj = TjHandle::new_compressor().expect("tj3Init(compress)");
    tj.set(Param::Quality, enc.quality).unwrap();
    tj.set(Param::Subsamp, enc.subsamp).unwrap();
    tj.set(Param::Progressive, enc.progressive as i32).unwrap();
    tj.set(Param::RestartRows, enc.restart_rows).unwrap();
    tj.compress8(pixels, w, h, format).expect("compress")
}

fn encode_rgb(enc: Enc) -> (Vec<u8>, Vec<u8>) {
    let src = smooth_rgb(W, H);
    let jpeg = encode(&src, W, H, PixelFormat::Rgb, enc);
    (src, jpeg)
}

fn decode(jpeg: &[u8]) -> Result<RgbImage, DecodeError> {
    let mut d = CpuDecoder::new(Limits::default()).unwrap();
    let mut out = RgbImage::default();
    d.decode_full(jpeg, &mut out)?;
    Ok(out)
}

fn assert_decodes_close(enc: Enc, expect: (Subsampling, bool)) {
    let (src, jpeg) = encode_rgb(enc);
    let header = probe(&jpeg).unwrap();
    assert_eq!((header.width, header.height), (W, H));
    assert_eq!((header.subsampling, header.progressive), expect);
    assert_eq!(header.colorspace, ColorSpace::YCbCr);
    let out = decode(&jpeg).unwrap();
    assert_eq!((out.width, out.height), (W, H));
    let p = psnr(&out.data, &src);
    assert!(p >= 40.0, "PSNR {p:.1} dB < 40 dB");
}

#[test]
fn baseline_444_decodes_close_to_source() {
    assert_decodes_close(Enc::default(), (Subsampling::S444, false));
}

#[test]
fn baseline_420_decodes_close_to_source() {
    let enc = Enc {
        subsamp: 2,
        ..Enc::default()
    };
    assert_decodes_close(enc, (Subsampling::S420, false));
}

#[test]
fn baseline_422_decodes_close_to_source() {
    let enc = Enc {
        subsamp: 1,
        ..Enc::default()
    };
    assert_decodes_close(enc, (Subsampling::S422, false));
}

#[test]
fn progressive_decodes_close_to_source() {
    let enc = Enc {
        subsamp: 2,
        progressive: true,
        ..Enc::default()
    };
    assert_decodes_close(enc, (Subsampling::S420, true));
}

#[test]
fn restart_markers_decode_close_to_source() {
    let enc = Enc {
        subsamp: 2,
        restart_rows: 1,
        ..Enc::default()
    };
    let (src, jpeg) = encode_rgb(enc);
    // DRI marker present, and RSTn markers in the scan.
    assert!(jpeg.windows(2).any(|m| m == [0xFF, 0xDD]));
    assert!(jpeg
        .windows(2)
        .any(|m| m[0] == 0xFF && (0xD0..=0xD7).contains(&m[1])));
    let out = decode(&jpeg).unwrap();
    assert!(psnr(&out.data, &src) >= 40.0);
}

#[test]
fn grayscale_decodes_to_equal_rgb_channels() {
    let gray = to_gray(&smooth_rgb(W, H));
    let enc = Enc {
        subsamp: 3,
        ..Enc::default()
    };
    let jpeg = encode(&gray, W, H, PixelFormat::Gray, enc);
    let header = probe(&jpeg).unwrap();
    assert_eq!(header.colorspace, ColorSpace::Gray);
    assert_eq!(header.subsampling, Subsampling::Gray);
    let out = decode(&jpeg).unwrap();
    assert!(out
        .data
        .chunks_exact(3)
        .all(|p| p[0] == p[1] && p[1] == p[2]));
    let luma: Vec<u8> = out.data.chunks_exact(3).map(|p| p[0]).collect();
    assert!(psnr(&luma, &gray) >= 40.0);
}

#[test]
fn cmyk_is_converted_with_the_adobe_convention() {
    // Stored (inverted) CMYK values; expected RGB = C * K / 255.
    let src = smooth_rgb(W, H);
    let cmyk: Vec<u8> = src
        .chunks_exact(3)
        .flat_map(|p| [p[0], p[1], p[2], 230])
        .collect();
    let jpeg = encode(&cmyk, W, H, PixelFormat::Cmyk, Enc::default());
    assert_eq!(probe(&jpeg).unwrap().colorspace, ColorSpace::Ycck);
    let out = decode(&jpeg).unwrap();
    let expect: Vec<u8> = src
        .iter()
        .map(|&c| ((c as u32 * 230 + 127) / 255) as u8)
        .collect();
    let p = psnr(&out.data, &expect);
    assert!(p >= 40.0, "PSNR {p:.1}");
}

#[test]
fn truncated_file_is_rejected_as_truncated() {
    let (_, jpeg) = encode_rgb(Enc::default());
    let cut = &jpeg[..jpeg.len() * 2 / 3];
    let err = decode(cut).unwrap_err();
    assert_eq!(err.reason(), "truncated", "{err}");
    // Cut inside the headers: still an error, never a panic.
    let err = decode(&jpeg[..40]).unwrap_err();
    assert!(matches!(err.reason(), "truncated" | "corrupt"), "{err}");
}

#[test]
fn progressive_truncated_is_rejected() {
    let enc = Enc {
        progressive: true,
        ..Enc::default()
    };
    let (_, jpeg) = encode_rgb(enc);
    let err = decode(&jpeg[..jpeg.len() / 2]).unwrap_err();
    assert_eq!(err.reason(), "truncated", "{err}");
}

#[test]
fn corrupt_scan_data_is_an_error_not_a_grey_image() {
    let enc = Enc {
        subsamp: 2,
        restart_rows: 1,
        ..Enc::default()
    };
    let (_, mut jpeg) = encode_rgb(enc);
    // Overwrite the middle of the scan with a bogus marker sequence.
    let mid = jpeg.len() / 2;
    jpeg[mid..mid + 8].copy_from_slice(&[0xFF, 0xD3, 0x00, 0xFF, 0xD6, 0x12, 0xFF, 0xD1]);
    let err = decode(&jpeg).unwrap_err();
    assert!(
        matches!(err.reason(), "corrupt_warning" | "corrupt"),
        "{err}"
    );
}

#[test]
fn garbage_and_other_formats_are_an_unknown_format() {
    let err = decode(b"GIF89a\x01\x00\x01\x00").unwrap_err();
    assert_eq!(err.reason(), "unknown_format");
    assert!(err.to_string().contains("GIF"), "{err}");
    let garbage: Vec<u8> = (0..1000u32).map(|i| (i * 7919 % 251) as u8).collect();
    assert_eq!(decode(&garbage).unwrap_err().reason(), "unknown_format");
    assert_eq!(decode(&[]).unwrap_err().reason(), "unknown_format");
    // A JPEG start followed by garbage.
    let mut fake = vec![0xFF, 0xD8, 0xFF, 0xE0];
    fake.extend(&garbage);
    assert!(matches!(
        decode(&fake).unwrap_err().reason(),
        "corrupt" | "corrupt_warning" | "truncated"
    ));
}

#[test]
fn limits_reject_before_decoding() {
    let (_, jpeg) = encode_rgb(Enc::default());
    let mut d = CpuDecoder::new(Limits {
        max_pixels: (W * H - 1) as u64,
        ..Limits::default()
    })
    .unwrap();
    let mut out = RgbImage::default();
    let err = d.decode_full(&jpeg, &mut out).unwrap_err();
    assert_eq!(
        err,
        DecodeError::TooLarge {
            w: W,
            h: H,
            limit: (W * H - 1) as u64
        }
    );
    let mut d = CpuDecoder::new(Limits {
        max_file_bytes: 100,
        ..Limits::default()
    })
    .unwrap();
    assert_eq!(
        d.decode_full(&jpeg, &mut out).unwrap_err().reason(),
        "file_too_large"
    );
}

#[test]
fn plan_picks_smallest_power_of_two_scale_covering_output() {
    let header = JpegHeader {
        width: 1600,
        height: 1200,
        subsampling: Subsampling::S420,
        colorspace: ColorSpace::YCbCr,
        progressive: false,
        arithmetic: false,
        lossless: false,
        precision: 8,
    };
    let factors = CpuDecoder::allowed_factors(false);
    let f = |n, d| ScalingFactor { num: n, denom: d };
    assert_eq!(factors, vec![f(1, 1), f(1, 2), f(1, 4), f(1, 8)]);
    // 1000x900 box -> 224: 1/4 gives 250x225 >= 224; 1/8 gives 125 < 224.
    let p = plan_region(
        &header,
        CropBox::new(301.0, 100.5, 1000.0, 900.0),
        (224, 224),
        &factors,
    )
    .unwrap();
    assert_eq!(p.factor, f(1, 4));
    // Scaled x0 = floor(75.25) - 2 (margin) = 73, aligned down to 16/4 = 4 -> 72;
    // y0 = floor(25.125) - 2 = 23; x1 = ceil(325.25) + 2; y1 = ceil(250.125) + 2.
    let (x, y, w, h) = p.crop.unwrap();
    assert_eq!((x, y), (72, 23));
    assert_eq!((w, h), (328 - 72, 253 - 23));
    assert!((p.box_out.x - (75.25 - 72.0)).abs() < 1e-9);
    assert!((p.box_out.y - (25.125 - 23.0)).abs() < 1e-9);
    assert!((p.box_out.w - 250.0).abs() < 1e-9 && (p.box_out.h - 225.0).abs() < 1e-9);
    // A box smaller than the output: never upsample, scale 1.
    let p = plan_region(
        &header,
        CropBox::new(0.0, 0.0, 100.0, 100.0),
        (224, 224),
        &factors,
    )
    .unwrap();
    assert_eq!(p.factor, f(1, 1));
    // Outside the image.
    assert!(plan_region(
        &header,
        CropBox::new(2000.0, 0.0, 10.0, 10.0),
        (8, 8),
        &factors
    )
    .is_err());
}

/// Resamples `img` at the box `b` (in img pixels) to `n x n` by bilinear sampling at cell
/// centres: a crude but decoder-independent way to compare two decodes of the same box.
fn sample_box(img: &RgbImage, b: CropBox, n: u32) -> Vec<u8> {
    let mut v = Vec::new();
    for j in 0..n {
        for i in 0..n {
            let x = b.x + (i as f64 + 0.5) * b.w / n as f64 - 0.5;
            let y = b.y + (j as f64 + 0.5) * b.h / n as f64 - 0.5;
            let x0 = x.floor().clamp(0.0, (img.width - 1) as f64) as u32;
            let y0 = y.floor().clamp(0.0, (img.height - 1) as f64) as u32;
            let x1 = (x0 + 1).min(img.width - 1);
            let y1 = (y0 + 1).min(img.height - 1);
            let (fx, fy) = (
                (x - x0 as f64).clamp(0.0, 1.0),
                (y - y0 as f64).clamp(0.0, 1.0),
            );
            for c in 0..3 {
                let p = |x, y| img.pixel(x, y)[c] as f64;
                let top = p(x0, y0) * (1.0 - fx) + p(x1, y0) * fx;
                let bot = p(x0, y1) * (1.0 - fx) + p(x1, y1) * fx;
                v.push((top * (1.0 - fy) + bot * fy).round() as u8);
            }
        }
    }
    v
}

#[test]
fn decode_for_crop_at_scale_one_matches_decode_full_exactly() {
    for subsamp in [0, 1, 2] {
        let (_, jpeg) = encode_rgb(Enc {
            subsamp,
            ..Enc::default()
        });
        let full = decode(&jpeg).unwrap();
        let mut d = CpuDecoder::new(Limits::default()).unwrap();
        let mut out = RgbImage::default();
        let want = CropBox::new(37.0, 21.0, 120.0, 90.0);
        let b = d.decode_for_crop(&jpeg, want, (90, 120), &mut out).unwrap();
        assert_eq!((b.w, b.h), (120.0, 90.0));
        assert_eq!(b.x.fract(), 0.0);
        assert!(b.x >= 2.0 && b.x < 18.0, "{b:?}");
        assert_eq!(b.y, 2.0);
        // Every pixel of the box equals the full decode's.
        for y in 0..90 {
            for x in 0..120 {
                let got = out.pixel(b.x as u32 + x, b.y as u32 + y);
                let exp = full.pixel(37 + x, 21 + y);
                assert_eq!(got, exp, "subsamp {subsamp} at ({x},{y})");
            }
        }
    }
}

#[test]
fn decode_for_crop_scaled_box_maps_to_the_same_pixels() {
    let (w, h) = (1024, 768);
    let src = smooth_rgb(w, h);
    let jpeg = encode(
        &src,
        w,
        h,
        PixelFormat::Rgb,
        Enc {
            subsamp: 2,
            ..Enc::default()
        },
    );
    let full = decode(&jpeg).unwrap();
    let mut d = CpuDecoder::new(Limits::default()).unwrap();
    let mut out = RgbImage::default();
    let want = CropBox::new(203.3, 151.7, 700.0, 520.0);
    let b = d
        .decode_for_crop(&jpeg, want, (120, 160), &mut out)
        .unwrap();
    // 1/4: 175x130 >= 160x120; 1/8 would be too small.
    assert!(
        (b.w - 175.0).abs() < 1e-9 && (b.h - 130.0).abs() < 1e-9,
        "{b:?}"
    );
    assert!(out.width < 200 && out.height < 140);
    let a = sample_box(&full, want, 32);
    let c = sample_box(&out, b, 32);
    let p = psnr(&a, &c);
    assert!(p >= 35.0, "scaled crop vs full decode: PSNR {p:.1} dB");
}

#[test]
fn decoder_reuses_its_instance_after_errors() {
    let (src, jpeg) = encode_rgb(Enc::default());
    let mut d = CpuDecoder::new(Limits::default()).unwrap();
    let mut out = RgbImage::default();
    assert!(d.decode_full(&jpeg[..jpeg.len() / 2], &mut out).is_err());
    assert!(d.decode_full(b"GIF89a", &mut out).is_err());
    d.decode_for_crop(
        &jpeg,
        CropBox::new(50.0, 50.0, 60.0, 60.0),
        (8, 8),
        &mut out,
    )
    .unwrap();
    d.decode_full(&jpeg, &mut out).unwrap();
    assert!(psnr(&out.data, &src) >= 40.0);
}

#[test]
fn fast_upsample_changes_only_subsampled_chroma_and_survives_a_failed_decode() {
    let decode_with = |d: &mut CpuDecoder, jpeg: &[u8]| {
        let mut out = RgbImage::default();
        d.decode_full(jpeg, &mut out).unwrap();
        out.data
    };
    let mut fancy = CpuDecoder::new(Limits::default()).unwrap();
    let mut plain = CpuDecoder::new(Limits::default()).unwrap();
    plain.set_fast_upsample(true).unwrap();
    // 4:2:0: chroma is upsampled, by a triangle filter or by replication: the pixels differ.
    let (src, s420) = encode_rgb(Enc {
        subsamp: 2,
        ..Enc::default()
    });
    let replicated = decode_with(&mut plain, &s420);
    assert_ne!(replicated, decode_with(&mut fancy, &s420));
    assert!(psnr(&replicated, &src) >= 35.0);
    // The setting outlives the TurboJPEG instance a failed decode replaces.
    let mut out = RgbImage::default();
    assert!(plain
        .decode_full(&s420[..s420.len() / 2], &mut out)
        .is_err());
    assert_eq!(decode_with(&mut plain, &s420), replicated);
    // 4:4:4: nothing to upsample, the same pixels either way.
    let (_, s444) = encode_rgb(Enc::default());
    assert_eq!(
        decode_with(&mut plain, &s444),
        decode_with(&mut fancy, &s444)
    );
}

/// A copy of baseline `jpeg` whose frame header says `height` rows: libjpeg then decodes only
/// those rows (and warns of the scan bytes it skips at the end). `None` without a SOF0/SOF1.
fn with_frame_height(jpeg: &[u8], height: u16) -> Option<Vec<u8>> {
    let mut copy = jpeg.to_vec();
    let mut i = 2;
    while i + 9 < copy.len() && copy[i] == 0xFF {
        let len = u16::from_be_bytes([copy[i + 2], copy[i + 3]]) as usize;
        if matches!(copy[i + 1], 0xC0 | 0xC1) {
            copy[i + 5..i + 7].copy_from_slice(&height.to_be_bytes());
            return Some(copy);
        }
        i += 2 + len;
    }
    None
}

/// Decodes `jpeg` to planar YUV at `factor` with `tj`; returns the luma samples decoded. The
/// warning about the scan bytes left after a shortened frame is expected.
pub(super) fn decode_yuv(
    tj: &mut TjHandle,
    jpeg: &[u8],
    factor: ScalingFactor,
    planes: &mut [Vec<u8>; 3],
) -> u64 {
    let h = read_header(tj, jpeg, u64::MAX).unwrap();
    tj.set_scaling_factor(factor).unwrap();
    let (sw, sh) = (factor.scale(h.width), factor.scale(h.height));
    let (cw, ch) = match h.subsampling {
        Subsampling::S420 => (sw.div_ceil(2), sh.div_ceil(2)),
        Subsampling::S422 => (sw.div_ceil(2), sh),
        _ => (sw, sh),
    };
    let rows = [sh as usize, ch as usize, ch as usize];
    planes[0].resize((sw * sh) as usize, 0);
    for p in &mut planes[1..] {
        p.resize((cw * ch) as usize, 0);
    }
    match tj.decompress_yuv8(jpeg, planes, [sw as i32, cw as i32, cw as i32], rows) {
        Err(e) if !e.message.contains("extraneous bytes") => panic!("{}", e.message),
        _ => {}
    }
    u64::from(sw) * u64::from(sh)
}

/// Issue 25 item 3's first question: is decoding to planar YUV (no upsampling, no colour
/// conversion; TurboJPEG cannot crop it, so full width, at the same DCT scale) cheaper than
/// today's cropped RGB decode? Per photo of ../shared/data/photos (baseline YCbCr ones) and
/// three epochs of RandomResizedCrop boxes, the three decodes run back to back, so machine
/// load hits them alike. Figures and the decision: docs/decisions.md.
#[test]
#[ignore = "measurement: cargo test -p stoker-daemon --lib yuv_decode_cost -- --ignored --nocapture"]
fn yuv_decode_cost_against_the_cropped_rgb_decode() {
    use std::time::Instant;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/photos");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut rgb = CpuDecoder::new(Limits::default()).unwrap();
    let mut yuv = new_handle().unwrap();
    let (mut out, mut planes) = (RgbImage::default(), [vec![], vec![], vec![]]);
    let (mut secs, mut px, mut n) = ([0f64; 3], [0u64; 3], 0u32);
    for epoch in 0..3 {
        for (index, f) in files.iter().enumerate() {
            let bytes = std::fs::read(f).unwrap();
            let Ok(h) = probe(&bytes) else { continue };
            if h.colorspace != ColorSpace::YCbCr
                || h.progressive
                || h.subsampling == Subsampling::Unknown
            {
                continue;
            }
            let crop = train_crop(&h, epoch, index);
            let plan = plan_region(&h, crop, (224, 224), &rgb.factors).unwrap();
            let t = Instant::now();
            rgb.decode_for_crop(&bytes, crop, (224, 224), &mut out)
                .unwrap();
            secs[0] += t.elapsed().as_secs_f64();
            px[0] += u64::from(out.width) * u64::from(out.height);
            let t = Instant::now();
            px[1] += decode_yuv(&mut yuv, &bytes, plan.factor, &mut planes);
            secs[1] += t.elapsed().as_secs_f64();
            // To the crop's last row (plus the region margin), whole iMCU rows.
            let t = Instant::now();
            let bottom = (crop.y + crop.h).ceil() as u32 + REGION_MARGIN * plan.factor.denom;
            let rows = bottom.div_ceil(16).saturating_mul(16).min(h.height);
            let short = with_frame_height(&bytes, rows as u16).unwrap();
            px[2] += decode_yuv(&mut yuv, &short, plan.factor, &mut planes);
            secs[2] += t.elapsed().as_secs_f64();
            yuv = new_handle().unwrap();
            n += 1;
        }
    }
    assert!(n > 0, "no baseline YCbCr photo in {}", dir.display());
    let names = [
        "RGB, cropped (today)",
        "YUV planes, whole",
        "YUV planes, to the crop's last row",
    ];
    print_costs(&names, &secs, &px, n);
}

/// The RandomResizedCrop(224) box of sample `index` in `epoch` (seed 0) for a measurement.
pub(super) fn train_crop(h: &JpegHeader, epoch: u64, index: usize) -> CropBox {
    let spec = stoker_wire::spec::PipelineSpec::train(64, 224);
    let params = crate::transform::augment::sample_params;
    params(&spec, h.width, h.height, 0, epoch, index as u64).0
}

/// Prints a measurement's mean decode time and pixels per image, one line per way.
pub(super) fn print_costs(names: &[&str], secs: &[f64], px: &[u64], n: u32) {
    for ((name, s), p) in names.iter().zip(secs).zip(px) {
        eprintln!(
            "{name:<38} {:.3} ms/image, {:>7} pixels/image",
            s / f64::from(n) * 1e3,
            p / u64::from(n)
        );
    }
}

/// Several views decode once at the scale the most demanding one needs: a large box with a
/// small output alone decodes at 1/4, beside a box needing every pixel at 1; the pixels of
/// each view's box are then a full decode's.
#[test]
fn views_decode_once_at_the_most_demanding_views_scale() {
    let (w, h) = (1024, 768);
    let src = smooth_rgb(w, h);
    let enc = Enc {
        subsamp: 2,
        ..Enc::default()
    };
    let jpeg = encode(&src, w, h, PixelFormat::Rgb, enc);
    let full = decode(&jpeg).unwrap();
    let mut d = CpuDecoder::new(Limits::default()).unwrap();
    let mut out = RgbImage::default();
    let big = (CropBox::new(203.3, 151.7, 700.0, 520.0), (120, 160));
    let small = (CropBox::new(100.0, 96.0, 200.0, 150.0), (150, 200));
    let alone = d.decode_for_views(&jpeg, &[big], &mut out).unwrap();
    assert_eq!(alone.scale, 0.25);
    let region = d.decode_for_views(&jpeg, &[big, small], &mut out).unwrap();
    assert_eq!(region.scale, 1.0);
    // One rectangle covering both boxes, not the whole image.
    assert!(
        out.width < w && out.height < h,
        "{}x{}",
        out.width,
        out.height
    );
    let s = region.place(small.0);
    let (sx, sy) = (s.x as usize, s.y as usize);
    assert_eq!((s.x.fract(), s.y.fract()), (0.0, 0.0));
    let (ow, fw) = (out.width as usize, w as usize);
    for y in 0..150 {
        let got = &out.data[((sy + y) * ow + sx) * 3..][..200 * 3];
        let want = &full.data[((96 + y) * fw + 100) * 3..][..200 * 3];
        assert!(got == want, "row {y} of the small view's box");
    }
    let b = region.place(big.0);
    let p = psnr(&sample_box(&full, big.0, 32), &sample_box(&out, b, 32));
    assert!(
        p >= 45.0,
        "the big view's box vs full decode: PSNR {p:.1} dB"
    );
}
