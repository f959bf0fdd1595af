//! Processes the tests start: the running test binary again (one of its tests, in a role), and
//! processes of another uid.
//!
//! A process of another uid is a real separate user as the daemon sees it (`SO_PEERCRED`):
//! uid and gid [`OTHER_UID`] (nobody), and no supplementary groups (std drops them when a root
//! parent sets the uid). Only root can start one: [`can_run_as_other_uid`] says so and skips.

use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

/// The uid and gid of the processes [`as_other_uid`] makes: nobody.
pub const OTHER_UID: u32 = 65534;

/// Environment variable naming the role of a child started by [`rerun_test`].
const ROLE_ENV: &str = "STOKER_TEST_CHILD_ROLE";

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this process may start processes of another uid (only root may); when not, says
/// `SKIPPED <test>` on stderr.
pub fn can_run_as_other_uid(test: &str) -> bool {
    let root = is_root();
    if !root {
        eprintln!("SKIPPED {test}: needs root to run a process as uid {OTHER_UID}");
    }
    root
}

/// Makes `cmd` run as uid and gid [`OTHER_UID`], with no supplementary groups.
pub fn as_other_uid(cmd: &mut Command) -> &mut Command {
    cmd.uid(OTHER_UID).gid(OTHER_UID)
}

/// Makes `cmd` run as uid and gid [`OTHER_UID`] with exactly the supplementary `groups`
/// (set in the child before it drops root, as a login would).
pub fn as_other_uid_in_groups<'a>(cmd: &'a mut Command, groups: &[u32]) -> &'a mut Command {
    let groups: Vec<libc::gid_t> = groups.to_vec();
    // SAFETY: setgroups, setgid and setuid are async-signal-safe and the closure touches only
    // `groups`, allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let set = [
                libc::setgroups(groups.len(), groups.as_ptr()),
                libc::setgid(OTHER_UID),
                libc::setuid(OTHER_UID),
            ];
            if set.iter().any(|&r| r != 0) {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// The role this process was started in by [`rerun_test`], if it was.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// Runs test `test` of the running test binary again, alone, with `role` in
/// `STOKER_TEST_CHILD_ROLE` and `setup` applied to the command (environment,
/// [`as_other_uid`]). Returns its output; panics with that output when it fails or when the
/// name matched no test (which would run nothing and succeed).
pub fn rerun_test(test: &str, role: &str, setup: impl FnOnce(&mut Command)) -> Output {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role);
    setup(&mut cmd);
    let out = cmd.output().expect("start the test binary again");
    let ran = String::from_utf8_lossy(&out.stdout).contains("1 passed");
    assert!(
        out.status.success() && ran,
        "child {test} ({role}) failed: {:?}\n{}",
        out.status,
        output_text(&out)
    );
    out
}

/// A process's stdout, then its stderr, as text.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd` (stdout and stderr captured) and returns its output, or fails the test when it
/// has not ended within `limit` (it hangs: killed, its stderr in the message, `what` naming it).
pub fn output_within(cmd: &mut Command, limit: std::time::Duration, what: &str) -> Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} has not ended after {limit:?} (killed): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}
