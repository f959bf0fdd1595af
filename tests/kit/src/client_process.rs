//! Client processes the tests start: the kit's `stoker-test-client` binary, one role per run
//! (see its `main.rs`), so that what a child process does is no test of its own.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::Command;

use crate::child;
use crate::daemon::{build, profile_dir};

/// Path of `stoker-test-client` (`$STOKER_TEST_CLIENT` if set), building it if missing.
pub fn test_client_path() -> PathBuf {
    if let Some(p) = std::env::var_os("STOKER_TEST_CLIENT") {
        return PathBuf::from(p);
    }
    let p = profile_dir().join("stoker-test-client");
    if !p.is_file() {
        build(&["-p", "stoker-testkit", "--bin", "stoker-test-client"])
            .unwrap_or_else(|e| panic!("no stoker-test-client: {e}"));
    }
    p
}

/// `stoker-test-client <role> <args>`, not started.
pub fn test_client(role: &str, args: &[&std::ffi::OsStr]) -> Command {
    let mut cmd = Command::new(test_client_path());
    cmd.arg(role).args(args);
    cmd
}

/// Runs `stoker-test-client <role> <args>` as uid [`child::OTHER_UID`] and returns its output;
/// panics with that output when it fails.
pub fn run_as_other_uid(role: &str, args: &[&std::ffi::OsStr]) -> String {
    let mut cmd = test_client(role, args);
    let out = child::as_other_uid(&mut cmd)
        .output()
        .expect("start stoker-test-client");
    let text = child::output_text(&out);
    assert!(
        out.status.success(),
        "stoker-test-client {role} failed: {text}"
    );
    text
}
