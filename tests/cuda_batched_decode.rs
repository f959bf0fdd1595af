//! nvJPEG's batched decode on the real `stokerd --backend cuda`, with the emulated GPU
//! reading each batch's bitstreams when its stream runs the decode (issue 22 item 2): every
//! batch a worker has in flight keeps its own read buffers and nvJPEG state until its decode
//! has run, so the batches are the CPU backend's.

use std::path::Path;
use std::time::Duration;

use stoker::{AttachOptions, Client, DType, Layout, PipelineSpec};
use stoker_pipeline::transform::decode::{EncodeOptions, JpegEncoder, Subsampling};
use stoker_testkit::emulator;
use stoker_testkit::{synthetic_rgb, Daemon};

/// Every u8 image byte of every batch of epoch 0, one vector per batch, with its indices.
fn drain(client: &mut Client) -> Vec<(Vec<u64>, Vec<f64>)> {
    let mut out = Vec::new();
    while let Some(batch) = client.next_batch().unwrap() {
        if batch.epoch() > 0 {
            break;
        }
        // Host or device images alike.
        let mut host = vec![0u8; batch.images_len()];
        batch.copy_images_to_host(&mut host).unwrap();
        out.push((
            batch.indices().to_vec(),
            host.into_iter().map(f64::from).collect(),
        ));
    }
    out
}

fn psnr(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mse = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>() / a.len() as f64;
    10.0 * (255.0f64.powi(2) / mse).log10()
}

/// What one epoch served: each batch's indices and pixels from the CUDA daemon and from the
/// CPU daemon, the CUDA daemon's log, and the emulated nvJPEG's record of how many batched
/// decodes one stream had pending at once.
struct Served {
    got: Vec<(Vec<u64>, Vec<f64>)>,
    want: Vec<(Vec<u64>, Vec<f64>)>,
    log: String,
    pending_max: u64,
    /// The emulated driver's `primary_ctx_flags` of each device, as the daemon left them.
    ctx_flags: Vec<u64>,
    /// Images the daemon decoded with nvJPEG's GPU-hybrid decoder (its status).
    hybrid: u64,
}

/// Serves epoch 0 of 24 same-sized photos of different content, in batches of 4, from
/// `stokerd --backend cuda` on the emulated GPU with 20 ms per stream operation (and `config`
/// as its stoker.toml), and from the CPU backend; `None` without NVRTC.
fn serve_slowly(test: &str, config: &str) -> Option<Served> {
    emulator::use_emulator();
    emulator::nvrtc(test)?;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Same-sized photos of different content, so a decode of another batch's bytes fits the
    // output and differs only in its pixels; 4:4:4, so no chroma upsampling tells the
    // decoders apart.
    let mut enc = JpegEncoder::new().unwrap();
    let s444 = EncodeOptions {
        subsampling: Subsampling::S444,
        ..EncodeOptions::default()
    };
    stoker_testkit::images::write_folder_of(&data, 2, 24, |c, i| {
        let rgb = synthetic_rgb(80, 64, 40 + c * 100 + i);
        enc.encode_rgb(&rgb, 80, 64, &s444).unwrap()
    });
    let log = dir.path().join("stokerd.log");
    let (gpu_dir, cpu_dir) = (dir.path().join("gpu"), dir.path().join("cpu"));
    let stats = dir.path().join("stats");
    for d in [&gpu_dir, &cpu_dir, &stats] {
        std::fs::create_dir_all(d).unwrap();
    }
    let wheels = stoker_nvidia::loader::wheel_dir().expect("wheel dir");
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel-cache");
    let toml = dir.path().join("stoker.toml");
    std::fs::write(&toml, config).unwrap();
    let toml = toml.to_str().unwrap();
    let flags = ["--backend", "cuda", "--config", toml];
    let gpu = Daemon::start_logged_with(&gpu_dir, &flags, &log, |cmd| {
        cmd.env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env("STOKER_EMU_OP_DELAY_US", "20000")
            .env("STOKER_EMU_STATS_DIR", &stats)
            .env("STOKER_NVIDIA_DIR", wheels)
            .env("STOKER_CACHE_DIR", cache);
    });
    let cpu = Daemon::start(&cpu_dir, &["--backend", "cpu"]);
    let spec = PipelineSpec {
        dtype: DType::U8,
        layout: Layout::Nhwc,
        // Crops of these photos are never twice the output: the CPU decodes at full scale too.
        ..PipelineSpec::train(4, 64)
    };
    let mut opts = AttachOptions::new("inflight", data.to_str().unwrap(), spec);
    opts.seed = 7;
    opts.device = emulator::UUIDS[0].parse().unwrap();
    opts.connect_timeout = Duration::from_secs(10);
    let got = drain(&mut Client::attach(gpu.socket(), opts.clone()).unwrap());
    opts.device = "cpu".parse().unwrap();
    let want = drain(&mut Client::attach(cpu.socket(), opts).unwrap());
    let pid = gpu.pid();
    let status = stoker_tool::cli::status::query(gpu.socket()).unwrap();
    let hybrid = status.gpus.iter().map(|g| g.decoded_hybrid).sum();
    let driver = std::fs::read_to_string(stats.join(format!("{pid}.json"))).unwrap_or_default();
    let ctx_flags = serde_json::from_str::<serde_json::Value>(&driver)
        .ok()
        .and_then(|v| v["primary_ctx_flags"].as_array().cloned())
        .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
        .unwrap_or_default();
    drop(gpu);
    let record = stats.join(format!("{pid}.nvjpeg.json"));
    let record = std::fs::read_to_string(&record).unwrap_or_default();
    let pending_max = serde_json::from_str::<serde_json::Value>(&record)
        .ok()
        .and_then(|v| v["batched_pending_on_one_stream_max"].as_u64())
        .unwrap_or(0);
    Some(Served {
        got,
        want,
        log: std::fs::read_to_string(&log).unwrap(),
        pending_max,
        ctx_flags,
        hybrid,
    })
}

/// Every batch equals the CPU backend's (PSNR at least 40 dB), and nvJPEG never found a
/// bitstream changed between its call and its decode on the stream.
fn assert_the_cpu_backends(served: &Served) {
    assert!(
        !served.log.contains("changed between the call"),
        "{}",
        served.log
    );
    assert_eq!(served.got.len(), 12, "batches");
    assert_within_tolerance(&served.got, &served.want);
}

/// The same batches (indices), each within nvJPEG's tolerance of the other (PSNR >= 40 dB).
fn assert_within_tolerance(got: &[(Vec<u64>, Vec<f64>)], want: &[(Vec<u64>, Vec<f64>)]) {
    assert_eq!(got.len(), want.len(), "batches");
    let low: Vec<String> = (got.iter().zip(want).enumerate())
        .filter_map(|(step, (g, w))| {
            assert_eq!(g.0, w.0, "batch {step}: indices");
            let p = psnr(&g.1, &w.1);
            (p < 40.0).then(|| format!("batch {step}: PSNR {p:.1} dB"))
        })
        .collect();
    assert!(low.is_empty(), "{low:?}");
}

/// nvJPEG's batched decode is asynchronous to the host: the emulated one reads each batch's
/// bitstreams when its stream runs the decode (here 20 ms after every stream operation is
/// enqueued), and refuses a JPEG state whose last decode has not run yet; its hardware engines
/// write a batch's images without waiting for the kernels queued before them (rule 76). A
/// worker that reads its next batch into the buffers of a batch still being decoded, decodes
/// with that batch's state, or decodes into a scratch a kernel still reads, serves the wrong
/// pixels or fails the rank; the batches must be the CPU backend's, every one of them.
#[test]
fn each_batch_decodes_the_bytes_it_read_while_later_batches_are_read() {
    let test = "each_batch_decodes_the_bytes_it_read_while_later_batches_are_read";
    let Some(served) = serve_slowly(test, "") else {
        return;
    };
    assert_the_cpu_backends(&served);
}

/// A worker keeps two batches in flight on its stream: the next batch's hardware decode is
/// enqueued while the last one's is still waiting for the stream (20 ms per operation), each
/// on its own nvJPEG state and scratch, instead of after a synchronisation of the whole
/// stream. The emulated nvJPEG records the most batched decodes pending on one stream.
#[test]
fn a_worker_enqueues_its_next_batch_while_the_last_is_still_on_the_stream() {
    let test = "a_worker_enqueues_its_next_batch_while_the_last_is_still_on_the_stream";
    let Some(served) = serve_slowly(test, "") else {
        return;
    };
    assert_eq!(served.got.len(), 12, "batches");
    assert_eq!(
        served.pending_max, 2,
        "batched decodes pending on one stream at once, the most (one per batch in flight)"
    );
    // Without `cuda.blocking_sync` the primary contexts keep the driver's default scheduling.
    assert_eq!(served.ctx_flags, vec![0, 0]);
}

/// With `[cuda] blocking_sync` the daemon sets `CU_CTX_SCHED_BLOCKING_SYNC` (4) on the primary
/// context before it retains it, and with `pinned_inputs` the engines read each batch's
/// bitstreams from the slot's pinned copy, which must stay unchanged until that batch's decode
/// has run on the stream: the batches are still the CPU backend's.
#[test]
fn blocking_sync_and_pinned_inputs_serve_the_cpu_backends_batches() {
    let test = "blocking_sync_and_pinned_inputs_serve_the_cpu_backends_batches";
    let config = "[cuda]\nblocking_sync = true\npinned_inputs = true\n";
    let Some(served) = serve_slowly(test, config) else {
        return;
    };
    assert_the_cpu_backends(&served);
    assert_eq!(served.ctx_flags.first(), Some(&4), "{:?}", served.ctx_flags);
}

/// `cuda.hw_decode_share` splits each batch between the hardware engines and nvJPEG's GPU-hybrid
/// decoder: at 0.5 and at 0 the hybrid decoder takes images, and every sample stays within
/// nvJPEG's documented tolerance (PSNR >= 40 dB) of the CPU backend's and of the engines-only
/// run's (share 1.0, the default, which sends none to the hybrid decoder).
#[test]
fn the_split_decode_keeps_every_sample_within_nvjpegs_tolerance() {
    let test = "the_split_decode_keeps_every_sample_within_nvjpegs_tolerance";
    let Some(engines) = serve_slowly(test, "") else {
        return;
    };
    assert_the_cpu_backends(&engines);
    assert_eq!(engines.hybrid, 0, "share 1.0: every image on the engines");
    for share in ["0.5", "0.0"] {
        let config = format!("[cuda]\nhw_decode_share = {share}\n");
        let split = serve_slowly(test, &config).unwrap();
        assert_the_cpu_backends(&split);
        assert!(
            split.hybrid > 0,
            "share {share}: no image took the hybrid decoder"
        );
        assert_within_tolerance(&split.got, &engines.got);
    }
}
