//! The Kubernetes config map and the Slurm node script.

use super::*;

/// The `stoker.toml` the Kubernetes ConfigMap gives every node's daemon is one stokerd
/// accepts, and agrees with the DaemonSet: the socket in the hostPath folder, metrics on the
/// port the scrape annotation names. (scripts/k8s-validate checks the manifests themselves
/// against the Kubernetes schemas.)
#[test]
fn the_kubernetes_config_map_holds_a_valid_config() {
    let (_, config) = stoker_testkit::manifest_config("configmap.yaml", "[server]");
    assert_eq!(
        config.server.socket.as_deref(),
        Some(Path::new("/run/stoker/stoker.sock"))
    );
    assert_eq!(config.metrics.listen.as_deref(), Some("0.0.0.0:9464"));
    let deploy = stoker_testkit::repo_root().join("deploy/kubernetes");
    let daemonset = std::fs::read_to_string(deploy.join("daemonset.yaml")).unwrap();
    assert!(daemonset.contains("prometheus.io/port: \"9464\""));
    assert!(daemonset.contains("mountPath: /run/stoker\n"));
    assert!(daemonset.contains("value: compute,utility,video"));
}

/// The Slurm recipe's node script (`deploy/slurm/stokerd-job.sh`, what `srun
/// --ntasks-per-node=1` runs on every node) starts a daemon on the job's own socket, which a
/// rank started before it listens reaches; when Slurm ends the step (SIGTERM) the daemon drains
/// and the job's folder is gone.
#[test]
fn the_slurm_node_script_serves_the_job_on_its_own_socket_and_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let n = write_image_folder(&data, 2, 4, 24);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm/stokerd-job.sh");
    let job = |cmd: &mut Command| {
        cmd.env("SLURM_JOB_ID", "777")
            .env("TMPDIR", tmp.path())
            .env("STOKERD", stoker_testkit::stokerd_path());
    };
    let mut print = Command::new("bash");
    print.arg(&script).arg("--print-socket");
    job(&mut print);
    let out = print.output().unwrap();
    assert!(out.status.success());
    let socket = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let folder = tmp.path().join("stoker-job-777");
    assert_eq!(socket, folder.join("stoker.sock"));

    let mut step = Command::new("bash");
    step.arg(&script).stderr(Stdio::null());
    job(&mut step);
    let mut step = step.spawn().unwrap();
    // A rank may start first: attach retries until the daemon listens.
    let opts = AttachOptions {
        connect_timeout: PATIENCE,
        ..AttachOptions::new("slurm", data.to_str().unwrap(), spec(2, 1))
    };
    let mut client = Client::attach(&socket, opts).unwrap();
    let mut samples = 0;
    while let Some(b) = client.next_batch().unwrap() {
        samples += b.n();
    }
    assert_eq!(samples, n);
    drop(client);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&folder).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "the job's folder is private");

    // Slurm ends the step.
    let pid = step.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child's pid.
    let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(sent, 0);
    let status = step.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!folder.exists(), "the job's folder is removed");
}
