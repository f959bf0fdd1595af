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

/// nvJPEG's batched decode is asynchronous to the host: the emulated one reads each batch's
/// bitstreams when its stream runs the decode (here 20 ms after every stream operation is
/// enqueued), and refuses a JPEG state whose last decode has not run yet. A worker that reads
/// its next batch into the buffers of a batch still being decoded, or decodes with that
/// batch's state, serves the wrong pixels or fails the rank; the batches must be the CPU
/// backend's, every one of them.
#[test]
fn each_batch_decodes_the_bytes_it_read_while_later_batches_are_read() {
    emulator::use_emulator();
    if emulator::nvrtc("each_batch_decodes_the_bytes_it_read_while_later_batches_are_read")
        .is_none()
    {
        return;
    }
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
    std::fs::create_dir_all(&gpu_dir).unwrap();
    std::fs::create_dir_all(&cpu_dir).unwrap();
    let wheels = stoker_nvidia::loader::wheel_dir().expect("wheel dir");
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel-cache");
    let gpu = Daemon::start_logged_with(&gpu_dir, &["--backend", "cuda"], &log, |cmd| {
        cmd.env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env("STOKER_EMU_OP_DELAY_US", "20000")
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
    drop(gpu);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("changed between the call"), "{text}");
    assert_eq!(got.len(), 12, "batches");
    assert_eq!(got.len(), want.len(), "batches");
    let low: Vec<String> = (got.iter().zip(&want).enumerate())
        .filter_map(|(step, (g, w))| {
            assert_eq!(g.0, w.0, "batch {step}: indices");
            let p = psnr(&g.1, &w.1);
            (p < 40.0).then(|| format!("batch {step}: PSNR {p:.1} dB"))
        })
        .collect();
    assert!(low.is_empty(), "{low:?}");
}
