//! The units in deploy/, the example config, logs for the journal.

use super::*;

#[test]
fn systemd_analyze_verifies_the_units() {
    let analyze = Command::new("systemd-analyze").arg("--version").output();
    if analyze.is_err() {
        let installed = Command::new("apt-get")
            .args(["install", "-y", "systemd"])
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            eprintln!(
                "SKIPPED systemd_analyze_verifies_the_units: systemd-analyze is missing and \
                 `apt-get install systemd` failed"
            );
            return;
        }
    }
    // verify checks that ExecStart's binary exists: run it in a temp root holding a stub
    // /usr/bin/stokerd, the system's own units (targets the socket and service name), and
    // ours in /etc/systemd/system.
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("usr/bin")).unwrap();
    std::fs::create_dir_all(r.join("bin")).unwrap();
    std::fs::create_dir_all(r.join("etc/systemd/system")).unwrap();
    std::fs::create_dir_all(r.join("usr/lib/systemd")).unwrap();
    std::fs::write(r.join("usr/bin/stokerd"), "#!/bin/sh\n").unwrap();
    std::fs::copy("/bin/kill", r.join("bin/kill")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        let stub = r.join("usr/bin/stokerd");
        std::fs::set_permissions(stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let system = ["/usr/lib/systemd/system", "/lib/systemd/system"]
        .into_iter()
        .find(|p| Path::new(p).is_dir())
        .expect("the system's unit folder");
    let cp = Command::new("cp")
        .args(["-r", system])
        .arg(r.join("usr/lib/systemd/system"))
        .status()
        .unwrap();
    assert!(cp.success());
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let mut units = Vec::new();
    for unit in [
        "stokerd.service",
        "stokerd.socket",
        "stokerd-worker.service",
    ] {
        let dst = r.join("etc/systemd/system").join(unit);
        std::fs::copy(deploy.join(unit), &dst).unwrap();
        units.push(dst);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", r.display()))
        .arg("--man=no")
        .args(&units)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{stderr}"
    );
    // Unknown keys are only warnings to verify; they are errors here.
    assert!(
        !stderr.contains("Unknown") && !stderr.contains("ignoring"),
        "systemd-analyze verify warned:\n{stderr}"
    );
    let service = std::fs::read_to_string(deploy.join("stokerd.service")).unwrap();
    for line in [
        "Type=notify",
        "ExecStart=/usr/bin/stokerd --config /etc/stoker/stoker.toml",
        "LimitMEMLOCK=infinity",
        "CacheDirectory=stoker",
        "User=stoker",
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=/dev/nvidia-uvm rw",
    ] {
        assert_line(&service, "stokerd.service", line);
    }
    // The socket unit owns /run/stoker: a RuntimeDirectory= there would be chowned to the
    // service's User=/Group= at every start, socket included (systemd issue #8635).
    assert!(
        !service.lines().any(|l| l.starts_with("RuntimeDirectory")),
        "stokerd.service sets RuntimeDirectory*: it would take the socket's group away"
    );
    // systemd must not restart a configuration error: the code the daemon exits with for one.
    let prevent = format!(
        "RestartPreventExitStatus={}",
        stoker_wire::exit::Exit::Config.code()
    );
    assert!(
        service.lines().any(|l| l == prevent),
        "stokerd.service lacks {prevent} (Exit::Config)"
    );
    assert!(service.lines().any(|l| l.starts_with("WatchdogSec=")));
    let socket = std::fs::read_to_string(deploy.join("stokerd.socket")).unwrap();
    for line in [
        "ListenSequentialPacket=/run/stoker/stoker.sock",
        "SocketMode=0660",
        "SocketGroup=stoker-clients",
    ] {
        assert_line(&socket, "stokerd.socket", line);
    }
}

/// The remote worker's unit runs the worker's example config as shipped: the socket it names
/// lies in the unit's own runtime folder, it decodes on the CPU with no capability or device,
/// and a config error is not restarted. (`systemd_analyze_verifies_the_units` verifies it.)
#[test]
fn the_worker_unit_runs_the_worker_example_config() {
    use stoker_daemon::service::config::Config;
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let unit = std::fs::read_to_string(deploy.join("stokerd-worker.service")).unwrap();
    let name = "stokerd-worker.service";
    let config = Config::load(&deploy.join("stoker-worker.toml.example")).unwrap();
    // Issue 43 item 6: /metrics has no authentication: the shipped config binds it locally,
    // as docs/operations.md says (it bound 0.0.0.0:9464).
    let metrics = config.metrics.listen.as_deref().unwrap_or("");
    assert!(metrics.starts_with("127.0.0.1:"), "metrics on {metrics}");
    assert_line(
        &unit,
        name,
        "ExecStart=/usr/bin/stokerd --config /etc/stoker/worker.toml",
    );
    let runtime = unit
        .lines()
        .find_map(|l| l.strip_prefix("RuntimeDirectory="))
        .expect("stokerd-worker.service sets RuntimeDirectory=");
    let socket = config
        .server
        .socket
        .as_ref()
        .expect("the example names its socket");
    assert_eq!(
        socket.parent().unwrap(),
        Path::new("/run").join(runtime),
        "the worker's socket is not in the unit's runtime folder"
    );
    assert_eq!(config.worker.listen.as_deref(), Some("0.0.0.0:7411"));
    assert!(config.worker.secret_file.is_some());
    assert_eq!(
        config.pipeline.backend,
        stoker_pipeline::engine::choice::BackendChoice::Cpu
    );
    let code = stoker_wire::exit::Exit::Config.code();
    for line in [
        "Type=notify".to_string(),
        format!("RestartPreventExitStatus={code}"),
        "CapabilityBoundingSet=".into(),
        "PrivateDevices=yes".into(),
        "User=stoker".into(),
    ] {
        assert_line(&unit, name, &line);
    }
    assert!(
        !unit.contains("DeviceAllow"),
        "a worker needs no GPU device"
    );
}

/// Every key of the config reference parses: the example file is a valid config, and every
/// value it sets but those marked as examples is the default. It lets the clients' group in.
#[test]
fn the_example_config_parses() {
    use stoker_daemon::service::config::{Config, GroupRef};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/stoker.toml.example");
    let mut c = Config::load(&path).unwrap();
    assert_eq!(c.metrics.listen.as_deref(), Some("127.0.0.1:9464"));
    let clients = GroupRef::Name("stoker-clients".into());
    assert_eq!(c.access.allowed_gids, [clients]);
    assert_eq!(c.server.socket_group.as_deref(), Some("stoker-clients"));
    c.metrics.listen = None;
    c.server.socket = None;
    c.server.socket_group = None;
    c.access.allowed_gids.clear();
    assert_eq!(
        c,
        Config::default(),
        "deploy/stoker.toml.example sets a value off its default"
    );
}

/// Under systemd ($JOURNAL_STREAM) log lines carry no timestamp; piped, they carry no colour.
#[test]
fn logs_suit_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("stoker.toml");
    std::fs::write(&config, "[server]\nslots = 3\n").unwrap();
    let run = |journal: bool| {
        let mut cmd = Command::new(stokerd_path());
        cmd.args(["--config", config.to_str().unwrap()])
            .env_remove("JOURNAL_STREAM")
            .env("RUST_LOG", "info");
        if journal {
            cmd.env("JOURNAL_STREAM", "8:12345");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(78));
        String::from_utf8(out.stderr).unwrap()
    };
    let journal = run(true);
    // The first line is the version (INFO), then the refusal: each opens with its level.
    let first = journal.lines().next().unwrap().trim_start();
    assert!(
        first.starts_with("INFO") && first.contains("version"),
        "{journal}"
    );
    let error = journal.lines().find(|l| l.contains("stopped")).unwrap();
    assert!(error.trim_start().starts_with("ERROR"), "{journal}");
    assert!(error.contains("slots"), "{journal}");
    assert!(
        !journal.contains('\x1b'),
        "colour codes in piped logs: {journal:?}"
    );
    let plain = run(false);
    let first = plain.lines().next().unwrap();
    assert!(
        first.starts_with(|c: char| c.is_ascii_digit()),
        "no timestamp outside systemd: {plain}"
    );
    assert!(!plain.contains('\x1b'), "{plain:?}");
}

/// Fails unless `text` (the unit `unit`) has `line` as one of its lines.
#[track_caller]
fn assert_line(text: &str, unit: &str, line: &str) {
    assert!(text.lines().any(|l| l == line), "{unit} lacks {line}");
}
