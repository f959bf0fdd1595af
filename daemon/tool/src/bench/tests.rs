//! Tests of the bench harness on small generated datasets.

use std::time::Duration;

use super::*;
use crate::synth::{generate, SynthOptions};
use stoker_pipeline::engine::Throttle;

/// 48 small generated images in two classes.
fn small_dataset() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    generate(
        dir.path(),
        &SynthOptions {
            images: 48,
            classes: 2,
            size_scale: 0.2,
            threads: 2,
            ..SynthOptions::default()
        },
    )
    .unwrap();
    dir
}

/// Measures the three stages on a small generated dataset with `throttle` and returns the
/// verdict.
fn verdict_with(throttle: Throttle) -> Verdict {
    let dir = small_dataset();
    let objects = stoker_pipeline::source::object::ObjectStore::from_environment();
    let (ds, _) = open_timed(dir.path(), None, &objects).unwrap();
    let engine = EngineConfig {
        threads: 2,
        throttle: Some(throttle),
        ..EngineConfig::default()
    };
    let spec = PipelineSpec::train(16, 64);
    let storage = storage_only(&ds, &engine, 0, CacheState::Warm).unwrap();
    let samples = load_samples(&ds, 48, 0);
    assert_eq!(samples.len(), 48);
    let once = AtLeast {
        images: 48,
        seconds: 0.0,
    };
    let decode = decode_stage(&samples, &spec, &engine, 0, false, once).unwrap();
    let both = decode_stage(&samples, &spec, &engine, 0, true, once).unwrap();
    assert_eq!(storage.images, 48);
    assert!(storage.mb_per_s > 0.0 && decode.images_per_s > 0.0);
    verdict(
        storage.images_per_s,
        decode.images_per_s,
        both.images_per_s,
        None,
        None,
    )
}

#[test]
fn a_slow_reader_is_storage_bound() {
    let v = verdict_with(Throttle {
        read_delay: Duration::from_millis(8),
        decode_delay: Duration::ZERO,
    });
    assert_eq!(v.bottleneck, "storage", "{}", v.line);
    assert!(
        v.line.starts_with("storage-bound: decode could give "),
        "{}",
        v.line
    );
}

#[test]
fn a_slow_decoder_is_decode_bound() {
    let v = verdict_with(Throttle {
        read_delay: Duration::ZERO,
        decode_delay: Duration::from_millis(8),
    });
    assert_eq!(v.bottleneck, "decode", "{}", v.line);
    assert!(
        v.line.starts_with("decode-bound: storage could give "),
        "{}",
        v.line
    );
}

#[test]
fn the_throttled_pipeline_slows_down_by_the_delay() {
    // The hook in the engine itself: 48 images at 8 ms each on 2 threads take >= 192 ms.
    let dir = small_dataset();
    let mut opts = BenchOptions::standard(dir.path(), 2);
    opts.spec = PipelineSpec::train(16, 64);
    opts.warmup_epochs = 0;
    opts.epochs = 1;
    opts.engine.throttle = Some(Throttle {
        read_delay: Duration::from_millis(8),
        decode_delay: Duration::ZERO,
    });
    let r = run_in_process(&opts).unwrap();
    assert_eq!(r.images, 48);
    assert!(r.images_per_s < 48.0 / 0.19, "{}", r.images_per_s);
    assert!(r.read_ms_per_image >= 7.0, "{}", r.read_ms_per_image);
}

#[test]
fn the_verdict_names_the_slowest_part_and_the_headroom_of_the_others() {
    let v = verdict(3100.0, 1000.0, 800.0, Some(790.0), Some(780.0));
    assert_eq!(v.bottleneck, "decode");
    // augment alone: 1 / (1/800 - 1/1000) = 4000 img/s.
    assert_eq!(
        v.line,
        "decode-bound: storage could give 3.1x more, augment could give 4.0x more; \
         end to end delivers 0.99x of the in-process pipeline; to go faster: give the daemon \
         more cores (--threads), let CPU hosts decode for it as remote workers (`stokerd \
         --worker` there, `--remote-worker HOST:PORT` here; docs/multi-host.md, `stoker bench \
         --workers` measures them), or decode on the GPU (the CUDA backend, `--backend cuda`)"
    );
    let v = verdict(3100.0, 1000.0, 800.0, Some(790.0), Some(200.0));
    assert_eq!(v.bottleneck, "delivery", "{}", v.line);
}

/// Issue 43 item 1: where the CPU's decode or augment limits, CPU hosts decoding as remote
/// workers would help, and the verdict says how; not where storage or delivery limits.
#[test]
fn a_cpu_bound_verdict_names_remote_workers() {
    for (rates, bound) in [
        ((3100.0, 1000.0, 800.0), "decode"),
        ((3100.0, 5000.0, 1000.0), "augment"),
    ] {
        let v = verdict(rates.0, rates.1, rates.2, None, None);
        assert_eq!(v.bottleneck, bound, "{}", v.line);
        assert!(
            v.line.contains("remote workers") && v.line.contains("--remote-worker HOST:PORT"),
            "{}",
            v.line
        );
    }
    let v = verdict(500.0, 1000.0, 800.0, None, None);
    assert_eq!(v.bottleneck, "storage");
    assert!(!v.line.contains("remote worker"), "{}", v.line);
}

/// Issue 43 item 1: the timed epochs are bounded by time too: a run asked for up to 10,000
/// epochs stops at the first epoch end past `until_s` (it ran all 10,000 before).
#[test]
fn the_in_process_run_stops_at_an_epoch_end_once_its_time_is_up() {
    let dir = small_dataset();
    let mut opts = BenchOptions::standard(dir.path(), 2);
    opts.spec = PipelineSpec::train(16, 64);
    opts.warmup_epochs = 1;
    opts.epochs = 10_000;
    opts.min_epochs = 2;
    opts.until_s = Some(0.2);
    let r = run_in_process(&opts).unwrap();
    assert!(r.epochs >= 2 && r.epochs < 10_000, "{} epochs", r.epochs);
    assert_eq!(r.images, 48 * r.epochs, "whole epochs only");
}

#[test]
fn the_chart_is_svg_with_one_bar_per_value() {
    let svg = svg_chart(
        "t <1>",
        "verdict",
        &[("g".into(), vec![("a".into(), 10.0), ("b".into(), 20.0)])],
    );
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<rect x=").count(), 2);
    assert!(svg.contains("t &lt;1&gt;"));
}
