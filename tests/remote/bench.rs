//! `stoker bench DATA --workers` (issue 27 item 8): the bench's workers row against a real
//! worker: both setups measured, the worker filling some images, the wire's bytes per image
//! at least the pixels', and the CPU per GB on both sides read from the daemons' metrics.

use std::process::Command;

use super::observe::worker_with_metrics;
use super::*;

#[test]
fn the_workers_row_measures_home_alone_and_with_a_worker_and_the_wire() {
    let world = World::new();
    let (_worker, addr, metrics) = worker_with_metrics(&world);
    let json = world.tmp.path().join("bench.json");
    let out = Command::new(stoker_testkit::stokerd_path().with_file_name("stoker"))
        .arg("bench")
        .arg(&world.data)
        .args(["--workers", &addr, "--worker-metrics", &metrics])
        .arg("--worker-secret")
        .arg(&world.secret)
        .args([
            "--threads",
            "1",
            "--dtype",
            "u8",
            "--size",
            "32",
            "--batch",
            "8",
        ])
        .args(["--epochs", "2", "--warmup", "1", "--rounds", "2", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("medians: alone "), "{text}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert_eq!(r["rounds"].as_array().unwrap().len(), 4, "{r}");
    assert!(
        f("alone_images_per_s") > 0.0 && f("with_workers_images_per_s") > 0.0,
        "{r}"
    );
    assert!(f("remote_share") > 0.0 && f("remote_share") <= 1.0, "{r}");
    // 32 x 32 x 3 pixels an image, and the frames on top.
    assert!(f("wire_bytes_per_image") > 3072.0, "{r}");
    assert!(f("home_receive_cpu_s_per_gb") > 0.0, "{r}");
    assert!(
        f("worker_cpu_s_per_gb") > f("worker_send_cpu_s_per_gb"),
        "{r}"
    );
    assert!(f("worker_send_cpu_s_per_gb") > 0.0, "{r}");
}
