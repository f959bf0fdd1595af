//! The Slurm heterogeneous-job recipe (deploy/slurm/train-workers.sbatch): its scripts run as
//! Slurm would run them, on loopback.

use std::process::{Child, Command, Stdio};

use super::*;

/// `stoker-workers.sh setup` makes the job's private folder, secret and configs;
/// `stoker-workers.sh worker` (the CPU component's step) and `stokerd-job.sh` with the home
/// config (the GPU component's step) then serve the local-only batches, with units done on
/// the worker; SIGTERM ends both steps and removes their folders, and `cleanup` the job's.
#[test]
fn the_slurm_hetjob_scripts_serve_the_local_batches_through_a_worker() {
    use std::os::unix::fs::PermissionsExt;
    let world = World::new();
    let expected = reference(&world);
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm");
    let tmp = world.tmp.path();
    let shared = tmp.join("shared");
    let port = free_port();
    let job = |cmd: &mut Command, node: &str| {
        let node = tmp.join(node);
        std::fs::create_dir_all(&node).unwrap();
        cmd.env("SLURM_JOB_ID", "555")
            .env("STOKER_SHARED_DIR", &shared)
            .env("STOKER_WORKER_HOSTS", "127.0.0.1")
            .env("STOKER_WORKER_PORT", port.to_string())
            .env("STOKER_DATASET_ROOTS", tmp)
            .env("TMPDIR", node)
            .env("STOKERD", stoker_testkit::stokerd_path())
            .env("RUST_LOG", "info")
            .env_remove("STOKER_CONFIG");
    };
    let mut setup = Command::new("bash");
    setup.arg(deploy.join("stoker-workers.sh")).arg("setup");
    job(&mut setup, "batch");
    let out = setup.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let home_config = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert_eq!(home_config, shared.join("home.toml"));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&shared), 0o700);
    assert_eq!(mode(&shared.join("worker.secret")), 0o600);

    let worker_log = tmp.join("worker.log");
    let mut worker = Command::new("bash");
    worker
        .arg(deploy.join("stoker-workers.sh"))
        .args(["worker", "--threads", "1"]);
    job(&mut worker, "cpu-node");
    let worker = step(worker, &worker_log);
    let mut home = Command::new("bash");
    home.arg(deploy.join("stokerd-job.sh"))
        .args(["--threads", "1"]);
    job(&mut home, "gpu-node");
    home.env("STOKER_CONFIG", &home_config);
    let home = step(home, &tmp.join("home.log"));
    let socket = tmp.join("gpu-node/stoker-job-555/stoker.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "no home daemon at {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let batches = serve_job(&socket, &world.data, 0, || {});
    assert_eq!(batches, expected);

    end_step(home);
    assert!(units_done(&worker_log) > 0, "{}", read_log(&worker_log));
    end_step(worker);
    assert!(!tmp.join("cpu-node/stoker-worker-555").exists());
    let mut cleanup = Command::new("bash");
    cleanup.arg(deploy.join("stoker-workers.sh")).arg("cleanup");
    job(&mut cleanup, "batch");
    assert!(cleanup.status().unwrap().success());
    assert!(!shared.exists(), "cleanup leaves the job's shared folder");
}

/// A job step: `cmd` in a process group of its own, its stderr in `log`. Dropped before
/// [`end_step`] (a failed assertion), the whole group is killed.
struct Step(Option<Child>);

impl Drop for Step {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            // SAFETY: kill(2) on the process group of our own child.
            unsafe { libc::kill(-child.id().cast_signed(), libc::SIGKILL) };
            let _ = child.wait();
        }
    }
}

fn step(mut cmd: Command, log: &Path) -> Step {
    use std::os::unix::process::CommandExt;
    let log = std::fs::File::create(log).unwrap();
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Step(Some(child))
}

/// Slurm ends a step: SIGTERM, and it exits 0.
fn end_step(mut step: Step) {
    let mut child = step.0.take().unwrap();
    // SAFETY: kill(2) on our own child's pid.
    let sent = unsafe { libc::kill(child.id().cast_signed(), libc::SIGTERM) };
    assert_eq!(sent, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}
