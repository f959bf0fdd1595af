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
//! - Standard input, output and error are whatever the starter gave (the Python package
//!   passes /dev/null and the daemon's log file); the working directory is kept, so relative
//!   paths in flags mean what the starter meant.
//!
//! # Limitations
//! - Linux only (pipe2, fork, setsid), like the rest of the daemon.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
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
    /// fork failed (no child was made).
    #[error("cannot fork: {0}")]
    Fork(std::io::Error),
}

/// Forks: the parent waits until the child serves or exits; the child leads a new session.
///
/// Call it before any thread is started.
pub fn detach() -> Result<Role, DetachError> {
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
            Ok(Role::Daemon(ReadyNotice(Some(std::fs::File::from(
                write_end,
            )))))
        }
        child => {
            drop(write_end);
            // fork returned a positive pid here.
            let child = Pid::from_raw(child).expect("fork returns a positive pid to the parent");
            Ok(Role::Parent(wait_ready(read_end, child)))
        }
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
