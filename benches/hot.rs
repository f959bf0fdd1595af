//! Criterion micro-benchmarks of stoker's hot pieces: the sampler, io_uring batch reads
//! (beside the pread fallback), JPEG decode by image size (stoker synth images), the fused
//! crop-resize (by source size) and normalise-convert (by output dtype; u8 skips the
//! normalisation, so f16/f32 minus u8 is its cost).
//!
//! `cargo bench --bench hot`; `cargo bench --no-run` keeps them compiling in CI.

use std::hint::black_box;

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use stoker::spec::{DType, PipelineSpec};
use stoker_kernels::reference::{CropBox, RgbImage};
use stoker_pipeline::source::local::reader::{ReadRequest, Reader, ReaderKind};
use stoker_pipeline::transform::augment::Augmenter;
use stoker_pipeline::transform::decode::{
    CpuDecoder, EncodeOptions, JpegEncoder, Limits, Subsampling,
};
use stoker_pipeline::transform::sampler::{permutation_into, Sampler};
use stoker_tool::synth::{image_pixels, SynthOptions};

fn sampler(c: &mut Criterion) {
    let mut g = c.benchmark_group("sampler");
    let len = 1_281_167u64; // ImageNet train
    g.throughput(Throughput::Elements(len));
    g.bench_function("permutation_imagenet", |b| {
        let mut out = Vec::new();
        let mut epoch = 0;
        b.iter(|| {
            epoch += 1;
            permutation_into(len, 7, epoch, &mut out);
            black_box(out.len())
        })
    });
    g.throughput(Throughput::Elements(256));
    g.bench_function("batch_indices_256_rank3_of_8", |b| {
        let mut s = Sampler::new(len, 7, 3, 8, 256, true).unwrap();
        let steps = s.steps_per_epoch();
        let mut out = Vec::new();
        let mut step = 0;
        b.iter(|| {
            s.batch_indices_into(0, step % steps, &mut out);
            step += 1;
            black_box(out.len())
        })
    });
    g.finish();
}

fn jpeg(scale: f64) -> (u32, u32, Vec<u8>) {
    let opts = SynthOptions {
        size_scale: scale,
        ..SynthOptions::default()
    };
    let (w, h, px) = image_pixels(&opts, 0);
    let mut enc = JpegEncoder::new().unwrap();
    let jpeg = enc
        .encode_rgb(
            &px,
            w,
            h,
            &EncodeOptions {
                quality: 90,
                subsampling: Subsampling::S420,
                progressive: false,
                restart_rows: 0,
                arithmetic: false,
            },
        )
        .unwrap();
    (w, h, jpeg)
}

fn batch_read(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, data) = jpeg(1.0);
    let files: Vec<_> = (0..64)
        .map(|i| {
            let p = dir.path().join(format!("{i}.jpg"));
            std::fs::write(&p, &data).unwrap();
            p
        })
        .collect();
    let reqs: Vec<ReadRequest<'_>> = files
        .iter()
        .map(|p| ReadRequest {
            path: p,
            offset: 0,
            len: data.len() as u64,
            object: None,
        })
        .collect();
    let mut g = c.benchmark_group("batch_read_64_warm");
    g.throughput(Throughput::Bytes(data.len() as u64 * 64));
    for (name, kind) in [
        ("io_uring", ReaderKind::IoUring),
        ("pread", ReaderKind::Pread),
    ] {
        let Ok(mut reader) = Reader::new(kind, 64) else {
            eprintln!("batch_read: {name} unavailable here, skipped");
            continue;
        };
        let mut bufs: Vec<Vec<u8>> = (0..64).map(|_| Vec::new()).collect();
        g.bench_function(name, |b| {
            b.iter(|| {
                let r = reader.read_batch(&reqs, &mut bufs);
                assert!(r.iter().all(Result::is_ok));
            })
        });
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_full");
    let mut dec = CpuDecoder::new(Limits::default()).unwrap();
    let mut img = RgbImage::default();
    for scale in [0.25, 0.5, 1.0, 2.0] {
        let (w, h, data) = jpeg(scale);
        g.throughput(Throughput::Elements(u64::from(w) * u64::from(h)));
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{w}x{h}")),
            &data,
            |b, d| b.iter(|| dec.decode_full(d, &mut img).unwrap()),
        );
    }
    g.finish();
}

fn source(scale: f64) -> RgbImage {
    let (w, h, px) = image_pixels(
        &SynthOptions {
            size_scale: scale,
            ..SynthOptions::default()
        },
        0,
    );
    RgbImage {
        width: w,
        height: h,
        data: px,
    }
}

fn resize(c: &mut Criterion) {
    let mut g = c.benchmark_group("resize_to_224_u8");
    let spec = PipelineSpec {
        dtype: DType::U8,
        ..PipelineSpec::train(1, 224)
    };
    let mut aug = Augmenter::new();
    let mut out = vec![0u8; spec.image_bytes()];
    for scale in [0.5, 1.0, 2.0] {
        let img = source(scale);
        let crop = CropBox::full(img.width, img.height);
        g.bench_function(
            BenchmarkId::from_parameter(format!("{}x{}", img.width, img.height)),
            |b| b.iter(|| aug.augment_into(&img, crop, true, &spec, &mut out)),
        );
    }
    g.finish();
}

fn normalize(c: &mut Criterion) {
    let mut g = c.benchmark_group("resize_normalize_224");
    let img = source(1.0);
    let crop = CropBox::full(img.width, img.height);
    let mut aug = Augmenter::new();
    for dtype in [DType::U8, DType::F16, DType::Bf16, DType::F32] {
        let spec = PipelineSpec {
            dtype,
            ..PipelineSpec::train(1, 224)
        };
        let mut out = vec![0u8; spec.image_bytes()];
        g.bench_function(format!("{dtype:?}").to_lowercase(), |b| {
            b.iter(|| aug.augment_into(&img, crop, false, &spec, &mut out))
        });
    }
    g.finish();
}

/// Every benchmark above, on one `Criterion` configured from the command line: what
/// `criterion_group!` expands to, written out because the macro's `pub fn` cannot carry a doc
/// comment (`missing_docs`).
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    sampler(&mut c);
    batch_read(&mut c);
    decode(&mut c);
    resize(&mut c);
    normalize(&mut c);
}

criterion_main!(benches);
