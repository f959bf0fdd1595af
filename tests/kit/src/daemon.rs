//! The real daemon for tests: the build artefacts they run (`stokerd`, `libstoker.so`, the C
//! test clients), and [`Daemon`], a `stokerd` on a temp socket, killed on drop.
//!
//! Artefacts are looked up in the profile directory of the running test binary
//! (`target/<profile>/`), where `cargo test --workspace` puts them; if absent, the helper runs
//! `$CARGO build` for that one target (the test's cargo has released the build lock).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The `stokerd` binary of this build (`$STOKERD` if set), built if missing.
pub fn stokerd_path() -> PathBuf {
    try_stokerd_path().unwrap_or_else(|e| panic!("no stokerd: {e}"))
}

/// A running `stokerd` on a socket in a temp dir; killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    /// Starts `stokerd --socket <dir>/stoker.sock` with `extra` flags and waits until it
    /// accepts connections.
    pub fn start(dir: &Path, extra: &[&str]) -> Daemon {
        Daemon::start_with(dir, extra, Stdio::inherit(), |_| {})
    }

    /// As [`Daemon::start`], reading the configuration file `config` (`--config`).
    pub fn start_configured(dir: &Path, config: &Path, extra: &[&str]) -> Daemon {
        let config = config.to_str().expect("a UTF-8 config path");
        Daemon::start(dir, &[extra, &["--config", config]].concat())
    }

    /// As [`Daemon::start`], appending the daemon's log (stderr) to `log`.
    pub fn start_logged(dir: &Path, extra: &[&str], log: &Path) -> Daemon {
        Daemon::start_logged_with(dir, extra, log, |_| {})
    }

    /// As [`Daemon::start_logged`], with `setup` applied to the command before it is spawned
    /// (a resource limit set in `pre_exec`, say).
    pub fn start_logged_with(
        dir: &Path,
        extra: &[&str],
        log: &Path,
        setup: impl FnOnce(&mut Command),
    ) -> Daemon {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        Daemon::start_with(dir, extra, Stdio::from(file), setup)
    }

    fn start_with(
        dir: &Path,
        extra: &[&str],
        stderr: Stdio,
        setup: impl FnOnce(&mut Command),
    ) -> Daemon {
        Daemon::start_wrapped_with(dir, &[], extra, stderr, setup)
    }

    /// As [`Daemon::start`], with `stokerd` run by a wrapper command that ends by exec-ing
    /// its arguments (`wrapper` then the daemon's command line), e.g. `unshare --net`: the
    /// process (and [`Daemon::pid`]) is the daemon's own.
    pub fn start_wrapped(dir: &Path, wrapper: &[&str], extra: &[&str], stderr: Stdio) -> Daemon {
        Daemon::start_wrapped_with(dir, wrapper, extra, stderr, |_| {})
    }

    fn start_wrapped_with(
        dir: &Path,
        wrapper: &[&str],
        extra: &[&str],
        stderr: Stdio,
        setup: impl FnOnce(&mut Command),
    ) -> Daemon {
        let socket = dir.join("stoker.sock");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(stokerd_path());
                command
            }
            None => Command::new(stokerd_path()),
        };
        command
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .stdin(Stdio::null())
            .stderr(stderr);
        setup(&mut command);
        let child = command.spawn().expect("spawn stokerd");
        let mut d = Daemon::adopt(child, socket);
        d.wait_ready();
        d
    }

    /// A daemon the caller started itself (a command line of its own, socket activation),
    /// serving on `socket`; not waited for (see [`Daemon::wait_ready`]).
    pub fn adopt(child: Child, socket: PathBuf) -> Daemon {
        Daemon { child, socket }
    }

    /// Waits (30 s at most) until the daemon accepts connections on its socket; panics when it
    /// exits first.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("stokerd exited before serving: {status}");
            }
            if stoker::socket::SeqPacket::connect(&self.socket).is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "stokerd did not listen in time");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends signal `sig` to the daemon.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.pid()).expect("a pid fits pid_t");
        // SAFETY: kill(2) on our own child's pid, which is not reaped while `self` lives.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }

    /// Waits (`timeout` at most) for the daemon to exit, and returns how it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().expect("wait for stokerd") {
                return s;
            }
            assert!(Instant::now() < deadline, "stokerd did not exit in time");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The socket it serves on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the daemon still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Open fds of the daemon (entries of `/proc/<pid>/fd`).
    pub fn fd_count(&self) -> usize {
        proc_fd_targets(self.pid()).len()
    }

    /// Rings the daemon holds open: its fds on a `stoker-ring` memfd.
    pub fn ring_count(&self) -> usize {
        proc_fd_targets(self.pid())
            .iter()
            .filter(|t| t.contains("memfd:stoker-ring"))
            .count()
    }

    /// Resident memory of the daemon in KiB (`VmRSS` of `/proc/<pid>/status`).
    pub fn rss_kib(&self) -> u64 {
        proc_rss_kib(self.pid())
    }
}

/// A daemon log (as [`Daemon::start_logged`] writes it) with ANSI colour codes removed; empty
/// when there is none.
pub fn read_log(path: &Path) -> String {
    let raw = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Where each fd of process `pid` points (`readlink /proc/<pid>/fd/*`).
pub fn proc_fd_targets(pid: u32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|t| t.display().to_string())
        .collect()
}

/// `VmRSS` of process `pid` in KiB, 0 when unknown.
pub fn proc_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workspace root (where `Cargo.toml` and `ipc/` live): two folders above this crate.
pub fn repo_root() -> PathBuf {
    let kit = Path::new(env!("CARGO_MANIFEST_DIR"));
    kit.ancestors()
        .nth(2)
        .expect("tests/kit has a grandparent")
        .to_owned()
}

/// A Kubernetes manifest of `deploy/kubernetes` (its text) and the `stoker.toml` its
/// ConfigMap carries (the block scalar under `stoker.toml: |`, indented by four spaces), loaded
/// with stokerd's own parser; `section` (e.g. `[worker]`) must stand in that block.
pub fn manifest_config(
    manifest: &str,
    section: &str,
) -> (String, stoker_daemon::service::config::Config) {
    let path = repo_root().join("deploy/kubernetes").join(manifest);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let toml: String = text
        .lines()
        .skip_while(|l| l.trim() != "stoker.toml: |")
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
        .collect();
    assert!(
        toml.contains(section),
        "{manifest}: no stoker.toml block with {section}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let config_path = tmp.path().join("stoker.toml");
    std::fs::write(&config_path, &toml).unwrap();
    let config = stoker_daemon::service::config::Config::load(&config_path)
        .unwrap_or_else(|e| panic!("{manifest}'s stoker.toml: {e}"));
    (text, config)
}

/// The cargo profile directory the running test binary was built into (`target/debug`).
pub(crate) fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a directory");
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("deps has a parent").to_owned()
    } else {
        deps.to_owned()
    }
}

/// Why a binary the tests need could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildError {
    /// cargo did not run.
    #[error("running cargo build: {0}")]
    Cargo(std::io::Error),
    /// cargo ran and failed; its stderr.
    #[error("cargo build {args:?} failed:\n{stderr}")]
    Failed { args: Vec<String>, stderr: String },
}

/// Builds what `args` name (`cargo build ARGS`, in the test binary's own profile).
pub(crate) fn build(args: &[&str]) -> Result<(), BuildError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build").args(args).current_dir(repo_root());
    if profile_dir().file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let out = cmd.output().map_err(BuildError::Cargo)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BuildError::Failed {
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Path of `stokerd` (`$STOKERD` if set), building it if missing.
fn try_stokerd_path() -> Result<PathBuf, BuildError> {
    if let Some(p) = std::env::var_os("STOKERD") {
        return Ok(PathBuf::from(p));
    }
    let p = profile_dir().join("stokerd");
    if !p.is_file() {
        build(&["-p", "stoker-daemon", "--bin", "stokerd"])?;
    }
    Ok(p)
}

/// Path of `libstoker.so`, building it if missing.
fn libstoker_path() -> Result<PathBuf, BuildError> {
    let p = profile_dir().join("libstoker.so");
    if !p.is_file() {
        build(&["-p", "stoker-client", "--lib"])?;
    }
    Ok(p)
}

/// Compiles the C test client `tests/c/<source>` against `libstoker.so` (strict C11, warnings
/// as errors) into `dir`; `None`, said loudly for `test`, where there is no C compiler (`cc`).
pub fn build_c_client(dir: &std::path::Path, source: &str, test: &str) -> Option<PathBuf> {
    let have_cc = Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_cc {
        eprintln!("SKIPPED {test}: no C compiler (cc)");
        return None;
    }
    let lib = libstoker_path().unwrap();
    let libdir = lib.parent().unwrap();
    let exe = dir.join(source.trim_end_matches(".c"));
    let root = repo_root();
    let out = Command::new("cc")
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-O1",
        ])
        .arg("-I")
        .arg(root.join("ipc/include"))
        .arg(root.join("tests/c").join(source))
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", libdir.display()))
        .arg("-lstoker")
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compiling tests/c/{source} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}
