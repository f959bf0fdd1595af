//! The root package: integration tests (`tests/`) and benchmarks (`benches/`) live here, and
//! this library holds what they share (fixture builders, process helpers).
//!
//! - [`write_jpeg`] / [`write_image_folder`]: small real JPEG datasets in temp dirs.
//! - [`stokerd_path`] and [`Daemon`]: the real `stokerd` binary on a temp socket, killed on drop.
//! - [`batches`]: batches reduced to what identifies them ([`batches::Got`]), a config file.

pub mod batches;
pub mod daemon_proc;
pub mod device_batches;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Encodes `rgb` (packed, `width * height * 3` bytes) as a baseline 4:2:0 JPEG.
pub fn encode_jpeg(rgb: &[u8], width: u32, height: u32, quality: i32) -> Vec<u8> {
    use stoker_daemon::decode::{EncodeOptions, JpegEncoder};
    let opts = EncodeOptions {
        quality: quality.clamp(1, 100) as u8,
        ..EncodeOptions::default()
    };
    JpegEncoder::new()
        .and_then(|mut e| e.encode_rgb(rgb, width, height, &opts))
        .expect("encode a test JPEG")
}

/// A smooth synthetic image whose colours depend on `seed`, so samples differ.
pub fn synthetic_rgb(width: u32, height: u32, seed: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(width as usize * height as usize * 3);
    for y in 0..height {
        for x in 0..width {
            v.push(((x * 255 / width.max(1)) as u8).wrapping_add((seed * 37) as u8));
            v.push(((y * 255 / height.max(1)) as u8).wrapping_add((seed * 91) as u8));
            v.push((((x + y) * 4) as u8).wrapping_add((seed * 13) as u8));
        }
    }
    v
}

/// Writes one synthetic JPEG.
pub fn write_jpeg(path: &Path, width: u32, height: u32, seed: u32) {
    let jpeg = encode_jpeg(&synthetic_rgb(width, height, seed), width, height, 90);
    std::fs::write(path, jpeg).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// An ImageFolder dataset under `root`: `classes` subfolders `c0..`, `per_class` JPEGs each,
/// of varying sizes around `side`. Returns the number of samples.
pub fn write_image_folder(root: &Path, classes: u32, per_class: u32, side: u32) -> usize {
    let mut n = 0;
    for c in 0..classes {
        let dir = root.join(format!("c{c}"));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..per_class {
            let seed = c * 1000 + i;
            let (w, h) = (side + (seed % 7) * 3, side + (seed % 5) * 4);
            write_jpeg(&dir.join(format!("img{i:03}.jpg")), w, h, seed);
            n += 1;
        }
    }
    n
}

/// The `stokerd` binary of this build (`$STOKERD` if set), built if missing.
pub fn stokerd_path() -> PathBuf {
    daemon_proc::stokerd_path().unwrap_or_else(|e| panic!("no stokerd: {e}"))
}

/// A running `stokerd` on a socket in a temp dir; killed (SIGKILL) and reaped on drop.
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
        let mut d = Daemon { child, socket };
        d.wait_ready(Duration::from_secs(30));
        d
    }

    fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("stokerd exited before serving: {status}");
            }
            if stoker::sock::SeqPacket::connect(&self.socket).is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "stokerd did not listen in time");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

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

/// FNV-1a over byte slices: a stable hash for comparing batches across runs and processes.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
