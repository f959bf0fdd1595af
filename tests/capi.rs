//! A C program linked against libstoker.so reads a whole epoch from the real stokerd.

use std::path::Path;
use std::process::Command;

use stoker::{DType, PipelineSpec};
use stoker_suite::{write_image_folder, Daemon};

#[test]
fn a_c_client_reads_an_epoch_through_dlpack() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = stoker_suite::stokerd_path().parent().unwrap().to_owned();
    let lib = target.join("libstoker.so");
    assert!(
        lib.exists(),
        "no {} (build the workspace first)",
        lib.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("client");
    let compiled = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(root.join("ipc/src"))
        .arg(root.join("tests/c/client.c"))
        .arg("-L")
        .arg(&target)
        .arg(format!("-Wl,-rpath,{}", target.display()))
        .arg("-lstoker")
        .arg("-o")
        .arg(&exe)
        .output();
    let compiled = match compiled {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED a_c_client_reads_an_epoch_through_dlpack: no C compiler: {e}");
            return;
        }
    };
    assert!(
        compiled.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );

    let data = dir.path().join("data");
    let n = write_image_folder(&data, 3, 4, 24) as u64;
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let spec = PipelineSpec {
        dtype: DType::U8,
        epochs: Some(1),
        ..PipelineSpec::train(5, 16)
    };
    let out = Command::new(&exe)
        .arg(daemon.socket())
        .arg(&data)
        .arg(serde_json::to_string(&spec).unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "C client failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every sample once: 12 samples in batches of 5 -> 3 batches, indices summing to 0+..+11.
    assert_eq!(
        stdout.trim(),
        format!("batches 3 samples {n} index_sum {}", n * (n - 1) / 2)
    );
}
