//! The clients of the CUDA serving path against the real `stokerd --backend cuda` on the
//! emulated GPU (two devices): a job of 2 ranks, one per GPU, read by Rust clients and by 2
//! separate C client processes, gets batches equal to the CPU backend's for the same (seed,
//! epoch, step) (indices, labels, statuses; pixels at PSNR >= 40 dB) in every dtype and layout;
//! a slot is never reused before the consumer's release event completed (stream operations
//! delayed); SIGKILL of a client or of the daemon leaves no device memory behind, and the
//! resumed client gets the batches an uninterrupted run gets.
//!
//! One daemon per test, every (dtype, layout) a job of its own inside it. The CPU backend's
//! batches come from the same daemon (ATTACH with device "cpu").

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stoker::protocol::Position;
use stoker::{AttachOptions, Client, ConsumerStream, DType, Layout, PipelineSpec};
use stoker_nvidia::cuda::{self, Device};
use stoker_testkit::daemon::build_c_client;
use stoker_testkit::device_batches::{
    all_outputs, assert_matches_cpu, emulator_env, have_nvrtc, write_smooth_folder, HostBatch,
};
use stoker_testkit::Daemon;

/// Samples in the test dataset: 2 classes x 8. With batches of 4 over 2 ranks, 2 steps each.
const CLASSES: u32 = 2;
const PER_CLASS: u32 = 8;
const SEED: u64 = 11;
const MIN_PSNR: f64 = 40.0;
/// Each operation on a stream a client created waits this long (this process only).
const CLIENT_DELAY_US: u64 = 150_000;
/// Names this test binary's child role (the client killed with SIGKILL).
const ROLE_ENV: &str = "STOKER_CUDA_CLIENTS_ROLE";

/// This process runs on the emulated GPU too (its clients import the rings).
fn setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (k, v) in emulator_env() {
            std::env::set_var(k, v);
        }
        std::env::set_var("STOKER_EMU_OP_DELAY_US", CLIENT_DELAY_US.to_string());
        std::env::remove_var("CUDA_VISIBLE_DEVICES");
    });
}

struct Setup {
    dir: tempfile::TempDir,
    data: PathBuf,
    daemon: Daemon,
    stats: PathBuf,
}

/// A dataset and `stokerd --backend cuda` on the emulated GPU, its live device objects
/// reported in `stats/<pid>.json`.
fn start(slots: &str) -> Setup {
    setup();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_smooth_folder(&data, CLASSES, PER_CLASS, 64);
    let stats = dir.path().join("stats");
    std::fs::create_dir_all(&stats).unwrap();
    let daemon = start_daemon(dir.path(), slots, &stats);
    Setup {
        dir,
        data,
        daemon,
        stats,
    }
}

fn start_daemon(dir: &Path, slots: &str, stats: &Path) -> Daemon {
    let args = ["--backend", "cuda", "--threads", "2", "--slots", slots];
    let log = dir.join("stokerd.log");
    Daemon::start_logged_with(dir, &args, &log, |c| {
        c.envs(emulator_env())
            .env("STOKER_EMU_STATS_DIR", stats)
            .env_remove("STOKER_EMU_OP_DELAY_US")
            .env_remove("CUDA_VISIBLE_DEVICES");
    })
}

fn options(s: &Setup, job: &str, rank: u32, device: &str, spec: &PipelineSpec) -> AttachOptions {
    let mut o = AttachOptions::new(job, s.data.to_str().unwrap(), spec.clone());
    o.rank = rank;
    o.world_size = 2;
    o.device = device.parse().unwrap();
    o.seed = SEED;
    o
}

/// Every batch of one rank until the end of the data (or `limit`), copied to the host.
fn collect(client: &mut Client, limit: usize) -> Vec<HostBatch> {
    let mut out = Vec::new();
    while out.len() < limit {
        match client.next_batch().unwrap() {
            Some(b) => out.push(HostBatch::of(&b)),
            None => break,
        }
    }
    out
}

fn read_rank(s: &Setup, job: &str, rank: u32, device: &str, spec: &PipelineSpec) -> Vec<HostBatch> {
    let mut c = Client::attach(s.daemon.socket(), options(s, job, rank, device, spec))
        .unwrap_or_else(|e| panic!("{job} rank {rank} on {device}: {e}"));
    collect(&mut c, usize::MAX)
}

/// The CPU backend's batches of both ranks for `spec`.
fn cpu_reference(s: &Setup, job: &str, spec: &PipelineSpec) -> [Vec<HostBatch>; 2] {
    [0, 1].map(|rank| read_rank(s, job, rank, "cpu", spec))
}

fn name(spec: &PipelineSpec) -> String {
    format!("{:?}-{:?}", spec.dtype, spec.layout).to_lowercase()
}

/// Ranks 0 and 1 of `job` as two C client processes on emulated GPUs 0 and 1.
fn read_with_c(s: &Setup, exe: &Path, job: &str, spec: &PipelineSpec) -> [Vec<HostBatch>; 2] {
    let spec_json = serde_json::to_string(spec).unwrap();
    let children = [0, 1].map(|rank| {
        let dump = s.dir.path().join(format!("{job}-{rank}.bin"));
        let child = Command::new(exe)
            .arg(s.daemon.socket())
            .arg(&s.data)
            .arg(&spec_json)
            .arg(format!("cuda:{rank}"))
            .args([&rank.to_string(), "2", job, &SEED.to_string()])
            .arg(&dump)
            .envs(emulator_env())
            .env_remove("STOKER_EMU_OP_DELAY_US")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        (child, dump)
    });
    children.map(|(child, dump)| {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "C client failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        HostBatch::read_dump(&dump)
    })
}

#[test]
fn rust_and_c_clients_on_two_gpus_get_the_cpu_backends_batches() {
    if !have_nvrtc("rust_and_c_clients_on_two_gpus_get_the_cpu_backends_batches") {
        return;
    }
    let s = start("2");
    let c_exe = build_c_client(s.dir.path(), "cuda_client.c", "the CUDA C client");
    let mut worst = f64::INFINITY;
    for spec in all_outputs(4, 32) {
        let n = name(&spec);
        let cpu = cpu_reference(&s, &format!("cpu-{n}"), &spec);
        assert_eq!(cpu[0].len(), 2, "{n}: steps of rank 0");
        for rank in 0..2u32 {
            let got = read_rank(
                &s,
                &format!("rust-{n}"),
                rank,
                &format!("cuda:{rank}"),
                &spec,
            );
            let what = format!("Rust client, {n}, rank {rank} on cuda:{rank}");
            worst = worst.min(assert_matches_cpu(
                &what,
                &spec,
                &got,
                &cpu[rank as usize],
                MIN_PSNR,
            ));
        }
        // Two C processes, for one float and the u8 output (each a separate job).
        let c_too = matches!(
            (spec.dtype, spec.layout),
            (DType::U8, Layout::Nhwc) | (DType::F32, Layout::Nchw)
        );
        if let (Some(exe), true) = (&c_exe, c_too) {
            let got = read_with_c(&s, exe, &format!("c-{n}"), &spec);
            for rank in 0..2 {
                let what = format!("C client, {n}, rank {rank}");
                worst = worst.min(assert_matches_cpu(
                    &what, &spec, &got[rank], &cpu[rank], MIN_PSNR,
                ));
            }
        }
    }
    eprintln!("lowest PSNR against the CPU backend: {worst:.1} dB");
}

/// The consumer writes a marker into each slot on its own stream (every operation there is
/// delayed), names that stream, and releases the batch at once. Were RELEASE sent before that
/// write ran, the daemon would refill the slot first and the late marker would land in the
/// later batch (read once the stream has drained): every batch must equal the CPU backend's
/// instead.
#[test]
fn a_slot_is_not_reused_before_the_consumers_release_event() {
    if !have_nvrtc("a_slot_is_not_reused_before_the_consumers_release_event") {
        return;
    }
    let s = start("2");
    let spec = PipelineSpec {
        epochs: Some(3),
        ..PipelineSpec::train(4, 32)
    };
    let cpu = {
        let mut c = Client::attach(s.daemon.socket(), options(&s, "cpu", 0, "cpu", &spec)).unwrap();
        collect(&mut c, usize::MAX)
    };
    assert_eq!(cpu.len(), 6);
    let dev = Device::open(cuda::probe().unwrap().devices[0].uuid).unwrap();
    let stream = dev.stream().unwrap();
    // Pinned, so each write stays queued on the delayed stream until it runs (from pageable
    // memory the driver may run it before the call returns).
    let mut marker = cuda::PinnedHostBuffer::new(&dev, spec.image_bytes() * 4).unwrap();
    marker.as_mut_slice().fill(0x7F);
    let mut c = Client::attach(s.daemon.socket(), options(&s, "gpu", 0, "cuda:0", &spec)).unwrap();
    let mut got = Vec::new();
    while let Some(b) = c.next_batch().unwrap() {
        // Every marker write queued so far has landed: in a slot the daemon refilled too
        // early, it would show in this batch.
        stream.synchronize().unwrap();
        got.push(HostBatch::of(&b));
        let slice = b.device_images().unwrap();
        // SAFETY: the slot is mapped and leased while `b` lives; its release waits for this
        // write (the point of the test).
        unsafe {
            cuda::result::memcpy_htod_async(
                cuda::driver().unwrap(),
                slice.ptr,
                &marker.as_slice()[..slice.bytes],
                stream.raw(),
            )
            .unwrap()
        };
        b.record_stream(ConsumerStream(stream.raw() as usize));
        drop(b);
    }
    // The last marker write reads `marker` until it ran: before the pinned memory is freed.
    stream.synchronize().unwrap();
    assert_matches_cpu(
        "batches behind a delayed consumer",
        &spec,
        &got,
        &cpu,
        MIN_PSNR,
    );
}

/// What `stats/<pid>.json` of the daemon says is alive on the emulated GPU.
fn daemon_live(s: &Setup) -> serde_json::Value {
    let path = s.stats.join(format!("{}.json", s.daemon.pid()));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Waits (bounded) until the daemon holds no device ring: no VMM allocation or mapping in its
/// emulator's books and no ring memfd open or mapped.
fn assert_no_device_rings(s: &Setup) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let live = daemon_live(s);
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", s.daemon.pid())).unwrap();
        let fds = stoker_testkit::proc_fd_targets(s.daemon.pid());
        let clean = live["vmm_allocations"] == 0
            && live["vmm_mappings"] == 0
            && !maps.contains("stoker-emu-vmm")
            && !fds.iter().any(|f| f.contains("stoker-emu-vmm"));
        if clean {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "device rings left in the daemon: {live}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The child role of the SIGKILL test: attach rank 0 on cuda:0, take two batches and hold
/// them, say where to resume, wait to be killed.
fn holder() {
    let socket = std::env::var("STOKER_TEST_SOCKET").unwrap();
    let data = std::env::var("STOKER_TEST_DATA").unwrap();
    let spec: PipelineSpec =
        serde_json::from_str(&std::env::var("STOKER_TEST_SPEC").unwrap()).unwrap();
    let mut o = AttachOptions::new("killed", data, spec);
    o.world_size = 2;
    o.device = "cuda:0".parse().unwrap();
    o.seed = SEED;
    let mut c = Client::attach(Path::new(&socket), o).unwrap();
    let held = [
        c.next_batch().unwrap().unwrap(),
        c.next_batch().unwrap().unwrap(),
    ];
    let p = c.position();
    println!("HOLDING {} {} {}", held.len(), p.epoch, p.step);
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn sigkill_of_a_client_then_of_the_daemon_leaves_no_device_memory_and_resumes_exactly() {
    if std::env::var(ROLE_ENV).as_deref() == Ok("holder") {
        return holder();
    }
    let test = "sigkill_of_a_client_then_of_the_daemon_leaves_no_device_memory_and_resumes_exactly";
    if !have_nvrtc(test) {
        return;
    }
    // 4 epochs of 2 steps: with 3 slots, the daemon cannot run ahead to the end of the data.
    let mut s = start("3");
    let spec = PipelineSpec {
        epochs: Some(4),
        ..PipelineSpec::train(4, 32)
    };
    let cpu = cpu_reference(&s, "cpu", &spec)[0].clone();
    assert_eq!(cpu.len(), 8);

    // 1. A client process holding two device batches is killed.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, "holder")
        .env("STOKER_TEST_SOCKET", s.daemon.socket())
        .env("STOKER_TEST_DATA", &s.data)
        .env("STOKER_TEST_SPEC", serde_json::to_string(&spec).unwrap())
        .envs(emulator_env())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // (libtest prints "test NAME ... " without a newline before the test's own output.)
    while !line.contains("HOLDING") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the holder exited early"
        );
    }
    let f: Vec<u64> = line[line.find("HOLDING").unwrap()..]
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(f[0], 2);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_no_device_rings(&s);

    // 2. The rank resumes where the killed client was, and is killed with the daemon.
    let mut o = options(&s, "killed", 0, "cuda:0", &spec);
    o.start = Position::at(f[1], f[2]);
    let mut c = Client::attach(s.daemon.socket(), o).unwrap();
    let mut got = collect(&mut c, 1);
    let held = c.next_batch().unwrap().unwrap();
    got.push(HostBatch::of(&held));
    let resume = c.position();
    let daemon_pid = s.daemon.pid();
    let second = s.dir.path().join("second");
    std::fs::create_dir_all(&second).unwrap();
    // The new daemon listens elsewhere; the old one is killed (SIGKILL) as it is dropped.
    drop(std::mem::replace(
        &mut s.daemon,
        start_daemon(&second, "3", &s.stats),
    ));
    // READY messages already on their way are still read; then the daemon is gone.
    let err = loop {
        match c.next_batch() {
            Ok(Some(b)) => drop(b),
            Ok(None) => panic!("end of data from a killed daemon"),
            Err(e) => break e,
        }
    };
    assert!(err.is_disconnected(), "{err}");
    drop(held);
    drop(c);
    assert_client_released_everything();
    assert!(!Path::new(&format!("/proc/{daemon_pid}")).exists());

    // 3. A new daemon, and the rest of the run.
    let mut o = options(&s, "killed", 0, "cuda:0", &spec);
    o.start = resume;
    let mut c = Client::attach(s.daemon.socket(), o).unwrap();
    got.extend(collect(&mut c, usize::MAX));
    drop(c);
    assert_matches_cpu("killed and resumed", &spec, &got, &cpu[2..], MIN_PSNR);
    assert_no_device_rings(&s);
}

/// Waits (bounded) until this process maps no device ring any more (the release thread lets
/// the mapping go once its pending releases are done).
fn assert_client_released_everything() {
    #[repr(C)]
    #[derive(Default, Debug)]
    struct EmuLive {
        size: u64,
        contexts: u64,
        streams: u64,
        events: u64,
        modules: u64,
        device_allocations: u64,
        device_bytes: u64,
        pinned_allocations: u64,
        pinned_bytes: u64,
        vmm_allocations: u64,
        vmm_bytes: u64,
        vmm_mappings: u64,
        reservations: u64,
    }
    let path = std::env::var("STOKER_LIBCUDA").unwrap();
    // SAFETY: the emulated driver this process already loaded; loading it again only takes a
    // reference.
    let lib = unsafe { libloading::Library::new(path) }.unwrap();
    // SAFETY: `stoker_emu_live` has this signature (tests/gpu-emulator/cuda/src/api/stats.rs).
    let live_fn =
        unsafe { lib.get::<unsafe extern "C" fn(*mut EmuLive) -> i32>(b"stoker_emu_live") }
            .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut live = EmuLive {
            size: std::mem::size_of::<EmuLive>() as u64,
            ..EmuLive::default()
        };
        // SAFETY: `live` is a valid out-parameter with its size set.
        assert_eq!(unsafe { live_fn(&mut live) }, 0);
        if live.vmm_allocations == 0 && live.vmm_mappings == 0 && live.reservations == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the client still maps a ring: {live:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
