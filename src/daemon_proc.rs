//! The build artefacts integration tests need (`stokerd`, `libstoker.so`), built on demand
//! when `cargo test -p stoker-suite` ran without them.
//!
//! Artefacts are looked up in the profile directory of the running test binary
//! (`target/<profile>/`), where `cargo test --workspace` puts them; if absent, the helper runs
//! `$CARGO build` for that one target (the test's cargo has released the build lock).

use std::path::PathBuf;
use std::process::Command;

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
