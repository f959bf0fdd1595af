//! The split decode past the engines (issue 40 item 1) on the real `stokerd --backend cuda`
//! and the emulated GPU: the share of each batch past `cuda.hw_decode_share`, progressive
//! files and other images the engines refuse go to the pool of decode threads
//! (`engine/cuda/backend/pool.rs`), each with its own nvJPEG decoupled decoders, two pinned
//! buffers in turn and its own stream, while the engines decode the rest. Every stream
//! operation takes 20 ms, so a pinned buffer written before its transfer ran (emulator rule
//! 79), a state used by two threads (rule 70) or pixels read before the pool's event would show;
//! the samples must be the CPU backend's (PSNR >= 40 dB per batch, the same statuses).

use std::path::Path;
use std::time::Duration;

use stoker::{AttachOptions, Client, DType, Layout, PipelineSpec};
use stoker_pipeline::transform::decode::{EncodeOptions, JpegEncoder, Subsampling};
use stoker_testkit::batches::drain_copies;
use stoker_testkit::device_batches::{assert_matches_cpu, HostBatch};
use stoker_testkit::edge_manifest::edge_dir;
use stoker_testkit::{emulator, synthetic_rgb};

/// A folder of 24 same-sized 4:4:4 photos of different content (no chroma upsampling tells
/// the decoders apart), every `progressive_every`-th one progressive (0: none).
fn photos(data: &Path, progressive_every: u32) {
    let mut enc = JpegEncoder::new().unwrap();
    stoker_testkit::images::write_folder_of(data, 2, 12, |c, i| {
        let n = c * 12 + i;
        let opts = EncodeOptions {
            subsampling: Subsampling::S444,
            progressive: progressive_every > 0 && n % progressive_every == 0,
            ..EncodeOptions::default()
        };
        let rgb = synthetic_rgb(80, 64, 40 + c * 100 + i);
        enc.encode_rgb(&rgb, 80, 64, &opts).unwrap()
    });
}

/// What one epoch served from the CUDA daemon and from the CPU daemon, the CUDA daemon's log
/// (its stderr too: the emulators' lines) and its decode mix (hardware, hybrid, cpu).
struct Served {
    spec: PipelineSpec,
    got: Vec<HostBatch>,
    want: Vec<HostBatch>,
    log: String,
    mix: (u64, u64, u64),
}

/// Serves one epoch of `data` in batches of 4 from `stokerd --backend cuda` on the emulated GPU
/// (20 ms per stream operation, `config` as its stoker.toml) and from the CPU backend; `None`
/// without NVRTC.
fn serve(test: &str, data: &Path, config: &str) -> Option<Served> {
    emulator::use_emulator();
    emulator::nvrtc(test)?;
    let dir = tempfile::tempdir().unwrap();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel-cache");
    let toml = dir.path().join("stoker.toml");
    std::fs::write(&toml, config).unwrap();
    let env = [
        ("RUST_LOG", "info"),
        ("NO_COLOR", "1"),
        ("STOKER_EMU_OP_DELAY_US", "20000"),
    ];
    let flags = ["--config", toml.to_str().unwrap()];
    let (gpu, cpu) = emulator::gpu_and_cpu_daemons_with(dir.path(), &cache, &flags, &env);
    let spec = PipelineSpec {
        dtype: DType::U8,
        layout: Layout::Nhwc,
        epochs: Some(1),
        ..PipelineSpec::train(4, 64)
    };
    let mut opts = AttachOptions::new("split", data.to_str().unwrap(), spec.clone());
    opts.seed = 5;
    opts.device = emulator::UUIDS[0].parse().unwrap();
    opts.connect_timeout = Duration::from_secs(10);
    let got = drain_copies(&mut Client::attach(gpu.socket(), opts.clone()).unwrap());
    opts.device = "cpu".parse().unwrap();
    let want = drain_copies(&mut Client::attach(cpu.socket(), opts).unwrap());
    let status = stoker_tool::cli::status::query(gpu.socket()).unwrap();
    let mix = status.gpus.iter().fold((0, 0, 0), |m, g| {
        (
            m.0 + g.decoded_hardware,
            m.1 + g.decoded_hybrid,
            m.2 + g.decoded_cpu,
        )
    });
    drop(gpu);
    Some(Served {
        spec,
        got,
        want,
        log: std::fs::read_to_string(dir.path().join("stokerd.log")).unwrap(),
        mix,
    })
}

/// The CPU backend's batches: the same indices and statuses, each batch within nvJPEG's
/// tolerance (PSNR >= 40 dB); and no emulator saw a misuse.
fn assert_the_cpu_backends(served: &Served, what: &str) {
    for line in ["undefined on a real library", "changed between the call"] {
        assert!(!served.log.contains(line), "{what}: {line}\n{}", served.log);
    }
    assert_matches_cpu(what, &served.spec, &served.got, &served.want, 40.0);
}

/// At share 1.0 (the default) the engines decode every image; at 0.65 the pool decodes the
/// rest of each batch, and at 0 all of it, with three threads per worker and two workers with
/// two batches in flight each: every batch is the CPU backend's.
#[test]
fn the_pool_decodes_each_share_within_nvjpegs_tolerance() {
    let test = "the_pool_decodes_each_share_within_nvjpegs_tolerance";
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    photos(&data, 0);
    let Some(engines) = serve(test, &data, "") else {
        return;
    };
    assert_the_cpu_backends(&engines, "share 1.0");
    // The daemon may decode ahead into the next epoch: counts of at least one epoch.
    let (hardware, hybrid, cpu) = engines.mix;
    assert!(
        hardware >= 24 && (hybrid, cpu) == (0, 0),
        "share 1.0: every image on the engines: {:?}",
        engines.mix
    );
    for share in ["0.65", "0.0"] {
        let config = format!("[cuda]\nhw_decode_share = {share}\nhybrid_threads = 3\n");
        let split = serve(test, &data, &config).unwrap();
        let what = format!("share {share}");
        assert_the_cpu_backends(&split, &what);
        let (hardware, hybrid, cpu) = split.mix;
        assert!(
            hardware + hybrid >= 24 && cpu == 0,
            "{what}: {:?}",
            split.mix
        );
        if share == "0.0" {
            assert_eq!(hardware, 0, "{what}: every image on the pool");
        } else {
            // ceil(0.65 * 4) = 3 of each batch of 4 on the engines, 1 on the pool.
            assert_eq!(hardware, 3 * hybrid, "{what}: {:?}", split.mix);
        }
    }
}

/// Progressive files go through the pool, on the host-Huffman decoder whatever their size
/// (threshold 0 sends every other image to the GPU-Huffman one, which the emulated nvJPEG,
/// as the documented GPU-hybrid decoder, refuses for progressive files): all of them decoded
/// there, none by the CPU.
#[test]
fn progressive_files_go_through_the_pool_on_the_host_huffman_decoder() {
    let test = "progressive_files_go_through_the_pool_on_the_host_huffman_decoder";
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    photos(&data, 3);
    for config in [
        "",
        "[cuda]\nhw_decode_share = 0.5\nhybrid_huffman_threshold = 0\n",
    ] {
        let Some(served) = serve(test, &data, config) else {
            return;
        };
        assert_the_cpu_backends(&served, config);
        let (hardware, hybrid, cpu) = served.mix;
        assert_eq!(cpu, 0, "{config}: {:?}", served.mix);
        assert!(hardware + hybrid >= 24, "{config}: {:?}", served.mix);
        assert!(
            hybrid >= 8,
            "{config}: 8 progressive files: {:?}",
            served.mix
        );
    }
}

/// A corrupt file in the pool's share (share 0: every image there) fails its own sample only,
/// as the CPU backend fails it, with a log line naming it; the other images are decoded by
/// the pool and the rank goes on.
#[test]
fn a_corrupt_file_in_the_pool_share_fails_only_its_sample_by_name() {
    let test = "a_corrupt_file_in_the_pool_share_fails_only_its_sample_by_name";
    let Some(edge) = edge_dir(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    photos(&data, 0);
    let name = "corrupt__broken_entropy_658x97.jpg";
    std::fs::copy(edge.join(name), data.join("c0").join(name)).unwrap();
    let config = "[cuda]\nhw_decode_share = 0.0\nhybrid_threads = 2\n";
    let Some(served) = serve(test, &data, config) else {
        return;
    };
    assert_the_cpu_backends(&served, "share 0");
    let bad: usize = (served.got.iter())
        // Replaced (1) or failed (2), by the policy; padding of the last batch is 3.
        .map(|b| b.status.iter().filter(|&&s| matches!(s, 1 | 2)).count())
        .sum();
    assert_eq!(bad, 1, "one bad sample, the corrupt file's");
    assert!(
        served.log.contains("bad sample") && served.log.contains(name),
        "{}",
        served.log
    );
    let (hardware, hybrid, _) = served.mix;
    assert!(
        hardware == 0 && hybrid >= 24,
        "the good images on the pool: {:?}",
        served.mix
    );
}
