//! A real `stokerd` process for integration tests, on a socket in a private temp directory,
//! killed and cleaned up on drop; and the build artefacts tests need (`stokerd`,
//! `libstoker.so`), built on demand when `cargo test -p stoker-suite` ran without them.
//!
//! # Design
//! - Artefacts are looked up in the profile directory of the running test binary
//!   (`target/<profile>/`), where `cargo test --workspace` puts them; if absent, the helper runs
//!   `$CARGO build` for that one target (the test's cargo has released the build lock).
//! - [`Daemon::start`] waits until the socket accepts a connection; a daemon that exits first
//!   is an error carrying its stderr.
//! - `STOKER_REQUIRE_DAEMON=1` makes [`daemon_unavailable`] fatal: tests that skip when no
//!   working daemon exists fail instead (for CI once the daemon is complete).

use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long [`Daemon::start`] waits for the socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The workspace root (where `Cargo.toml` and `ipc/` live).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The cargo profile directory the running test binary was built into (`target/debug`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a directory");
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("deps has a parent").to_owned()
    } else {
        deps.to_owned()
    }
}

fn build(args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build").args(args).current_dir(repo_root());
    if profile_dir().file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let out = cmd
        .output()
        .map_err(|e| format!("running cargo build: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cargo build {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Path of `stokerd` (`$STOKERD` if set), building it if missing.
pub fn stokerd_path() -> Result<PathBuf, String> {
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
pub fn libstoker_path() -> Result<PathBuf, String> {
    let p = profile_dir().join("libstoker.so");
    if !p.is_file() {
        build(&["-p", "stoker-ipc", "--lib"])?;
    }
    Ok(p)
}

/// Skips (returns) loudly, or panics under `STOKER_REQUIRE_DAEMON=1`.
pub fn daemon_unavailable(test: &str, why: &str) {
    if std::env::var_os("STOKER_REQUIRE_DAEMON").is_some_and(|v| v == "1") {
        panic!("{test}: no working stokerd (STOKER_REQUIRE_DAEMON=1): {why}");
    }
    eprintln!("SKIPPED {test}: no working stokerd: {why}");
}

/// A directory removed (recursively) on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> std::io::Result<TempDir> {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `stokerd`.
#[derive(Debug)]
pub struct Daemon {
    // Drop order is field order: the child is killed (in Drop) before the directory holding
    // its socket goes.
    child: Child,
    socket: PathBuf,
    dir: TempDir,
}

impl Daemon {
    /// Starts `stokerd --socket <tmp>/stoker.sock` plus `extra` flags and waits until it serves.
    pub fn start(extra: &[&str]) -> Result<Daemon, String> {
        let bin = stokerd_path()?;
        let dir = TempDir::new("stokerd-test").map_err(|e| e.to_string())?;
        let socket = dir.path().join("stoker.sock");
        let stderr =
            std::fs::File::create(dir.path().join("stderr.log")).map_err(|e| e.to_string())?;
        let mut child = Command::new(&bin)
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let mut log = String::new();
                if let Ok(mut f) = std::fs::File::open(dir.path().join("stderr.log")) {
                    let _ = f.read_to_string(&mut log);
                }
                return Err(format!(
                    "stokerd exited with {status} before serving:\n{log}"
                ));
            }
            if socket.exists() && connectable(&socket) {
                return Ok(Daemon { child, socket, dir });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("stokerd did not serve within {START_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the daemon has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }
}

/// Whether something accepts SOCK_SEQPACKET connections at `path`.
fn connectable(path: &Path) -> bool {
    // std has no SOCK_SEQPACKET client; a datagram connect to a seqpacket listener fails with
    // EPROTOTYPE when it is listening, and with ECONNREFUSED/ENOENT when not.
    match UnixDatagram::unbound().and_then(|s| s.connect(path)) {
        Ok(()) => true,
        Err(e) => e.raw_os_error() == Some(libc_eprototype()),
    }
}

const fn libc_eprototype() -> i32 {
    // EPROTOTYPE on Linux.
    91
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds an ImageFolder dataset (`classes` folders of `per_class` JPEGs) in `dest` from the
/// real photos in `$STOKER_PHOTOS` or `../shared/data/photos` (the smallest files first).
/// `None` when no photo corpus is present.
pub fn photo_dataset(dest: &Path, classes: usize, per_class: usize) -> Option<PathBuf> {
    let src = std::env::var_os("STOKER_PHOTOS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/data/photos"));
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(&src)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.path()
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("jpeg") || x.eq_ignore_ascii_case("jpg"))
        })
        .filter_map(|e| Some((e.metadata().ok()?.len(), e.path())))
        .collect();
    files.sort();
    if files.len() < classes * per_class {
        return None;
    }
    let root = dest.join("photos");
    for c in 0..classes {
        let dir = root.join(format!("class{c}"));
        std::fs::create_dir_all(&dir).ok()?;
        for i in 0..per_class {
            let (_, f) = &files[c * per_class + i];
            std::fs::copy(f, dir.join(format!("{i:03}.jpg"))).ok()?;
        }
    }
    Some(root)
}
