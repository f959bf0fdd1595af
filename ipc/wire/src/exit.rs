//! The exit codes of `stokerd` and the `stoker` tool: one table, documented in
//! docs/operations.md (Exit codes). systemd's `RestartPreventExitStatus=` in
//! `deploy/stokerd.service` names [`Exit::Config`] (78) so a broken config does not restart in
//! a loop.

#![forbid(unsafe_code)]

/// A process exit code of `stokerd` or `stoker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: success (the daemon stopped cleanly; the command found nothing wrong).
    Ok,
    /// 1: a failure at run time, or a command that ran and found failures (undecodable
    /// samples, a file that fails).
    Failure,
    /// 2: bad arguments to the tool (clap uses 2 for usage errors too).
    Usage,
    /// 3: `stoker status` found no daemon answering.
    NoDaemon,
    /// 75 (EX_TEMPFAIL from sysexits.h): `stokerd` drained and exited after a sticky CUDA
    /// error, which NVIDIA says only a new process recovers from; systemd's
    /// `Restart=on-failure` and the clients of the auto-started per-user daemon start it
    /// again, and the ranks resume at their position.
    GpuRestart,
    /// 78 (EX_CONFIG from sysexits.h): a configuration error (the config file, a flag, the
    /// backend choice, the socket or metrics address).
    Config,
}

impl Exit {
    /// The number the process exits with.
    pub const fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failure => 1,
            Exit::Usage => 2,
            Exit::NoDaemon => 3,
            Exit::GpuRestart => 75,
            Exit::Config => 78,
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e.code())
    }
}

#[cfg(test)]
mod tests {
    use super::Exit;

    #[test]
    fn codes_are_distinct_and_config_is_ex_config() {
        let all = [
            Exit::Ok,
            Exit::Failure,
            Exit::Usage,
            Exit::NoDaemon,
            Exit::GpuRestart,
            Exit::Config,
        ];
        let mut codes: Vec<u8> = all.iter().map(|e| e.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        assert_eq!(Exit::Config.code(), 78);
        assert_eq!(Exit::GpuRestart.code(), 75);
        assert_eq!(Exit::Ok.code(), 0);
    }
}
