//! `stokerd --detach`: the daemon leaves the process that started it, and that process exits
//! once the daemon serves (0) or failed (its exit code). This is how `stoker.Loader` starts a
//! per-user daemon: the starter waits for readiness without polling the socket, learns of a
//! failure at once, and leaves no zombie behind (the daemon is reparented to init).
//!
//! # Design
//! - [`detach`] runs first thing in `main`, while the process has one thread, so `fork` is
//!   safe. The child starts a new session (`setsid`: no controlling terminal, out of the
//!   starter's process group and its signals) and keeps the write end of a pipe; the parent
//!   blocks reading the other end.
//! - [`ReadyNotice::ready`] writes one line and closes the pipe once the socket listens. A
//!   child that exits before that closes the pipe unwritten: the parent then reaps it and
//!   exits with its exit code (78 for a configuration error, as `stokerd` does).
//! - The daemon logs to a named file, not to the starter's terminal (issue 43): standard
//!   input becomes /dev/null and standard output and error the log file (`--log-file`,
//!   default `stokerd.log` beside the socket; the Python package's is the same file). The
//!   file is opened before the fork, so a log that cannot be written is the starter's error;
//!   the starter names it, and prints its last lines when the daemon fails before serving.
//!   The working directory is kept, so relative paths in flags mean what the starter meant.
//!
//! # Limitations
//! - Linux only (pipe2, fork, setsid), like the rest of the daemon.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::ExitCode;

use rustix::process::{Pid, WaitOptions};

/// What [`detach`] leaves each side of the fork.
#[derive(Debug)]
pub enum Role {
    /// The starter: exit with this code.
    Parent(ExitCode),
    /// The daemon: serve, and call [`ReadyNotice::ready`] once the socket listens.
    Daemon(ReadyNotice),
}

/// The daemon's side of the readiness pipe; without `--detach` it does nothing.
#[derive(Debug, Default)]
pub struct ReadyNotice(Option<std::fs::File>);

impl ReadyNotice {
    /// For a daemon that was not detached.
    pub fn none() -> ReadyNotice {
        ReadyNotice(None)
    }

    /// Tells the starter the daemon serves; it exits 0. Only the first call writes.
    pub(crate) fn ready(&mut self) {
        if let Some(mut pipe) = self.0.take() {
            // The starter may have been killed meanwhile; nothing to do about it then.
            let _ = pipe.write_all(b"ready\n");
        }
    }
}

/// Why the daemon could not detach.
#[derive(Debug, thiserror::Error)]
pub enum DetachError {
    /// pipe2 failed.
    #[error("cannot create the readiness pipe: {0}")]
    Pipe(std::io::Error),
    /// The log file could not be opened (before the fork: the starter reports it).
    #[error("cannot open the log file {}: {source}", path.display())]
    Log {
        /// The log file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// fork failed (no child was made).
    #[error("cannot fork: {0}")]
    Fork(std::io::Error),
}

/// Most bytes of the log a failed start prints.
const LOG_TAIL_BYTES: u64 = 2000;

/// Opens (appending, creating mode 0600) the log a detached daemon writes; makes its folder
/// (mode 0700) when only the last part is missing.
fn open_log(log: &Path) -> Result<std::fs::File, DetachError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = log
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.exists())
    {
        let _ = std::fs::DirBuilder::new().mode(0o700).create(dir);
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(log)
        .map_err(|source| DetachError::Log {
            path: log.to_owned(),
            source,
        })
}

/// Forks: the parent waits until the child serves or exits; the child leads a new session,
/// logging to `log`.
///
/// Call it before any thread is started.
pub fn detach(log: &Path) -> Result<Role, DetachError> {
    let file = open_log(log)?;
    let start = file.metadata().map_or(0, |m| m.len());
    let (read_end, write_end) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| DetachError::Pipe(e.into()))?;
    // rustix has no fork outside its experimental `runtime` feature: libc it stays.
    // SAFETY: the caller runs this while the process has a single thread, so the child does
    // not inherit locks held by threads that do not exist in it.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(DetachError::Fork(std::io::Error::last_os_error())),
        0 => {
            drop(read_end);
            // It fails only for a process group leader, which a freshly forked child is not.
            let _ = rustix::process::setsid();
            redirect_output(&file);
            Ok(Role::Daemon(ReadyNotice(Some(std::fs::File::from(
                write_end,
            )))))
        }
        child => {
            drop(write_end);
            // fork returned a positive pid here.
            let child = Pid::from_raw(child).expect("fork returns a positive pid to the parent");
            let code = wait_ready(read_end, child);
            if code != ExitCode::SUCCESS {
                print_tail(log, start);
            }
            Ok(Role::Parent(code))
        }
    }
}

/// Standard input from /dev/null, output and error into `log`. Best effort: a daemon whose
/// descriptors cannot be moved still runs, logging where it did.
fn redirect_output(log: &std::fs::File) {
    use std::os::fd::AsRawFd;
    let null = std::fs::File::open("/dev/null");
    // rustix's dup2 onto the standard descriptors needs its `stdio` feature; libc it stays.
    // SAFETY: dup2 on open descriptors this process owns; the targets 0, 1 and 2 are the
    // standard streams, which nothing else in this single-threaded child uses meanwhile.
    unsafe {
        if let Ok(null) = &null {
            libc::dup2(null.as_raw_fd(), 0);
        }
        libc::dup2(log.as_raw_fd(), 1);
        libc::dup2(log.as_raw_fd(), 2);
    }
}

/// The log's lines written since `start` (its last [`LOG_TAIL_BYTES`]), on stderr.
fn print_tail(log: &Path, start: u64) {
    use std::io::{Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(log) else {
        return;
    };
    let end = f.metadata().map_or(start, |m| m.len());
    let from = start.max(end.saturating_sub(LOG_TAIL_BYTES));
    let mut tail = String::new();
    if f.seek(SeekFrom::Start(from)).is_ok() && f.read_to_string(&mut tail).is_ok() {
        eprintln!(
            "stokerd: its log {} ends with:\n{}",
            log.display(),
            tail.trim_end()
        );
    }
}

/// The starter's side: 0 once the child says it serves, else the child's own exit code.
fn wait_ready(read_end: OwnedFd, child: Pid) -> ExitCode {
    let mut said = Vec::new();
    let _ = std::fs::File::from(read_end).read_to_end(&mut said);
    if said.starts_with(b"ready") {
        return ExitCode::SUCCESS;
    }
    let reaped = rustix::process::waitpid(Some(child), WaitOptions::empty());
    let code = match reaped {
        Ok(Some((pid, status))) if pid == child => status.exit_status(),
        _ => None,
    };
    if let Some(code) = code {
        eprintln!("stokerd: the detached daemon exited with {code} before serving");
        return ExitCode::from(u8::try_from(code).unwrap_or(1).max(1));
    }
    eprintln!("stokerd: the detached daemon died before serving");
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_without_a_pipe_does_nothing() {
        let mut n = ReadyNotice::none();
        n.ready();
        n.ready();
    }
}
