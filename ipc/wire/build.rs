//! Sets `STOKER_VERSION`, the version every stoker program reports (`stoker --version`,
//! `stokerd --version`, ATTACH/ATTACHED, `stoker status`, `stoker.__version__`):
//!
//! 1. `$STOKER_VERSION` at build time, when a packager sets it;
//! 2. else `git describe` of this source tree: `0.2.0+14.g1a2b3c4d5e` 14 commits after a tag
//!    `v0.2.0` (`git describe`'s `0.2.0-14-g1a2b3c4d5e` in PEP 440's form, so the wheel has
//!    the same version), `0.2.0` at the tag,
//!    `0.1.0+g1a2b3c4d5e` (the crate version and the commit) where no tag exists;
//! 3. else (a source tarball, no git) the crate version.
//!
//! Git is asked only when the work tree holding it is this workspace, so a tarball unpacked
//! inside another repository does not report that repository's commit. Nothing here puts a
//! path into the version: the paths below are only told to cargo, to rebuild on a new commit.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=STOKER_VERSION");
    println!("cargo:rerun-if-changed=build.rs");
    let crate_version = std::env::var("CARGO_PKG_VERSION").unwrap_or_else(|_| "0.0.0".into());
    let (version, source) = match std::env::var("STOKER_VERSION") {
        Ok(v) if !v.trim().is_empty() => (v.trim().to_owned(), "env"),
        _ => match git_version(&crate_version) {
            Some(v) => (v, "git"),
            None => (crate_version, "crate"),
        },
    };
    println!("cargo:rustc-env=STOKER_VERSION={version}");
    // Where the version came from (env, git or crate), for the test that a build in the work
    // tree names its commit.
    println!("cargo:rustc-env=STOKER_VERSION_SOURCE={source}");
}

/// Runs git in the crate's folder; its trimmed stdout when it succeeds.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.trim().to_owned()).filter(|t| !t.is_empty())
}

/// `0.2.0-14-g1a2b3c4d5e` (14 commits after the tag) as `0.2.0+14.g1a2b3c4d5e`: a version
/// PEP 440 takes as it is (a local version) and semver reads as build metadata, so the Python
/// wheel's version is this string unchanged (python/setup.py). A bare tag stays as it is.
fn pep440(described: &str) -> String {
    let mut parts = described.rsplitn(3, '-');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(hash), Some(count), Some(tag))
            if hash.starts_with('g') && count.bytes().all(|b| b.is_ascii_digit()) =>
        {
            format!("{tag}+{count}.{hash}")
        }
        _ => described.to_owned(),
    }
}

/// The version `git describe` gives, when this crate sits in a git work tree whose top is the
/// workspace (two folders up: ipc/wire).
fn git_version(crate_version: &str) -> Option<String> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let top = PathBuf::from(git(&["rev-parse", "--show-toplevel"])?);
    let workspace = manifest.parent()?.parent()?;
    if !same_dir(&top, workspace) {
        return None;
    }
    rerun_on_new_commit();
    let described = git(&["describe", "--tags", "--match", "v[0-9]*", "--abbrev=10"]);
    match described {
        Some(tag) => Some(pep440(tag.trim_start_matches('v'))),
        None => {
            let commit = git(&["rev-parse", "--short=10", "HEAD"])?;
            Some(format!("{crate_version}+g{commit}"))
        }
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Tells cargo to run this script again when HEAD moves: HEAD itself, the branch it names and
/// the packed refs (only those that exist: a missing path would rerun it on every build).
fn rerun_on_new_commit() {
    let mut paths = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        paths.push(branch);
    }
    for p in paths {
        if let Some(path) = git(&["rev-parse", "--git-path", &p]) {
            let path = match std::env::var_os("CARGO_MANIFEST_DIR") {
                Some(dir) => PathBuf::from(dir).join(path),
                None => PathBuf::from(path),
            };
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
}
