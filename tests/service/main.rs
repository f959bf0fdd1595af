//! The service: the real `stokerd` driven as systemd drives it (a notification socket, the
//! watchdog, socket activation on fd 3, SIGTERM, SIGHUP), its Prometheus endpoint,
//! `stoker status`, `systemd-analyze verify` over the units in deploy/, the example config,
//! logs for the journal; and `stokerd --detach` as the Python package starts a per-user daemon.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod detach;
mod metrics;
mod notify;
mod signals;
mod units;

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use stoker::protocol::ErrorCode;
use stoker::socket::SeqPacketListener;
use stoker::{AttachOptions, Client, ClientError, DType, PipelineSpec};
use stoker_testkit::{stokerd_path, write_image_folder, Daemon};

/// u8 output keeps the rings small.
fn spec(batch: u32, epochs: Option<u32>) -> PipelineSpec {
    PipelineSpec {
        dtype: DType::U8,
        epochs,
        ..PipelineSpec::train(batch, 16)
    }
}

fn options(dataset: &str, job: &str, epochs: Option<u32>) -> AttachOptions {
    AttachOptions {
        seed: 99,
        ..AttachOptions::new(job, dataset, spec(4, epochs))
    }
}

fn dataset(dir: &Path, name: &str, n: u32) -> PathBuf {
    let data = dir.join(name);
    write_image_folder(&data, 2, n, 24);
    data
}

/// Room for any pid in `LISTEN_PID=`; the child writes its own pid over it before exec.
const PID_PLACEHOLDER: &str = "00000000000000000000";

/// Writes `pid` in decimal at `value`, NUL-terminated. No allocation: callable after fork.
///
/// # Safety
/// `value` must be valid for writes of 21 bytes.
unsafe fn write_pid(value: *mut u8, pid: u64) {
    let mut digits = [0u8; 20];
    let mut n = 0;
    let mut v = pid;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    // SAFETY: n <= 20 digits and a NUL fit in the 21 bytes the caller vouches for.
    unsafe {
        for i in 0..n {
            *value.add(i) = digits[n - 1 - i];
        }
        *value.add(n) = 0;
    }
}

/// The environment stokerd gets: ours, less systemd's variables, plus `envs`.
fn child_env(dir: &Path, envs: &[(&str, &str)]) -> Vec<(String, String)> {
    let drop = [
        "NOTIFY_SOCKET",
        "LISTEN_FDS",
        "LISTEN_PID",
        "LISTEN_FDNAMES",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        "JOURNAL_STREAM",
        "RUST_LOG",
        "XDG_CACHE_HOME",
    ];
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| !drop.contains(&k.as_str()))
        .collect();
    env.push(("RUST_LOG".into(), "info".into()));
    env.push((
        "XDG_CACHE_HOME".into(),
        dir.join("cache").to_str().unwrap().into(),
    ));
    env.extend(envs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// Starts stokerd with `args` and `envs`; with `listen`, passes it as fd 3 with
/// LISTEN_FDS=1 and LISTEN_PID set to the child's own pid (socket activation), as systemd
/// does: a pre_exec hook moves the fd to 3, writes the child's pid into the prepared
/// environment and execs with it.
/// `stokerd` with `args` in the plain environment of [`spawn`], once it is ready to serve.
fn spawn_ready(dir: &Path, args: &[&str]) -> Daemon {
    let mut d = spawn(dir, args, &[], None);
    d.wait_ready();
    d
}

fn spawn(dir: &Path, args: &[&str], envs: &[(&str, &str)], listen: Option<OwnedFd>) -> Daemon {
    use std::ffi::CString;
    let program = stokerd_path();
    let mut cmd = Command::new(&program);
    cmd.args(args).env_clear().stdin(Stdio::null());
    let mut env = child_env(dir, envs);
    let Some(fd) = listen else {
        cmd.envs(env);
        return Daemon::adopt(cmd.spawn().expect("spawn stokerd"), socket_arg(dir, args));
    };
    env.push(("LISTEN_FDS".into(), "1".into()));
    env.push(("LISTEN_FDNAMES".into(), "stokerd.socket".into()));
    // Everything exec needs is built here, before fork: the hook only writes and execs.
    let c_program = CString::new(program.to_str().unwrap()).unwrap();
    let c_args: Vec<CString> = std::iter::once(c_program.clone())
        .chain(args.iter().map(|a| CString::new(*a).unwrap()))
        .collect();
    let mut c_env: Vec<CString> = env
        .iter()
        .map(|(k, v)| CString::new(format!("{k}={v}")).unwrap())
        .collect();
    c_env.push(CString::new(format!("LISTEN_PID={PID_PLACEHOLDER}")).unwrap());
    let pid_value = c_env.last().unwrap().as_ptr() as usize + "LISTEN_PID=".len();
    let argv: Vec<usize> = c_args
        .iter()
        .map(|a| a.as_ptr() as usize)
        .chain([0])
        .collect();
    let envp: Vec<usize> = c_env
        .iter()
        .map(|e| e.as_ptr() as usize)
        .chain([0])
        .collect();
    let raw: RawFd = fd.as_raw_fd();
    // SAFETY: the hook calls only async-signal-safe functions (dup2, fcntl, getpid, execve)
    // and writes into the child's copy of a buffer the parent prepared (`c_env`, which the
    // closure keeps alive).
    unsafe {
        cmd.pre_exec(move || {
            let _keep = (&c_program, &c_args, &c_env);
            if raw == 3 {
                let flags = libc::fcntl(3, libc::F_GETFD);
                libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            } else if libc::dup2(raw, 3) != 3 {
                return Err(std::io::Error::last_os_error());
            }
            write_pid(pid_value as *mut u8, libc::getpid() as u64);
            libc::execve(
                c_program.as_ptr(),
                argv.as_ptr() as *const *const libc::c_char,
                envp.as_ptr() as *const *const libc::c_char,
            );
            Err(std::io::Error::last_os_error())
        });
    }
    let child = cmd.spawn().expect("spawn stokerd");
    drop(fd);
    Daemon::adopt(child, socket_arg(dir, args))
}

/// The socket named by `--socket` in `args`, else `dir/stoker.sock`.
fn socket_arg(dir: &Path, args: &[&str]) -> PathBuf {
    let named = args.windows(2).find(|w| w[0] == "--socket").map(|w| w[1]);
    named.map_or_else(|| dir.join("stoker.sock"), PathBuf::from)
}

/// A fresh folder with a small dataset, and a stokerd (2 threads) listening on a socket there.
fn serving() -> (tempfile::TempDir, PathBuf, PathBuf, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), "data", 4);
    let socket = dir.path().join("stoker.sock");
    let d = spawn_ready(
        dir.path(),
        &["--socket", socket.to_str().unwrap(), "--threads", "2"],
    );
    (dir, data, socket, d)
}
