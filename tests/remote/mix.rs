//! A batch mix (issue 39) with remote workers: the home daemon mixes each batch once its
//! samples are in, whoever filled them, so a job with `batch_mix` served through a worker
//! gets the local-only daemon's batches bit for bit: images, labels and soft labels.

use super::*;
use stoker::spec::{BatchMix, DType};
use stoker::PipelineSpec;

/// (labels, soft labels, images) of every batch of one rank of world size 1, 1 epoch.
type Mixed = Vec<(Vec<i64>, Vec<f32>, Vec<u8>)>;

fn serve_mixed(home: &Path, data: &Path) -> Mixed {
    let spec = PipelineSpec {
        dtype: DType::F32,
        batch_mix: Some(BatchMix::Choice {
            mixes: vec![
                BatchMix::MixUp {
                    alpha: 0.4,
                    num_classes: 4,
                },
                BatchMix::CutMix {
                    alpha: 1.0,
                    num_classes: 4,
                },
            ],
            p: None,
        }),
        ..u8_spec(BATCH, 32, Some(1))
    };
    let opts = rank_options(data.to_str().unwrap(), "mixed", (0, 1), SEED, spec);
    let mut c = Client::attach(home, opts).unwrap();
    let mut out = Vec::new();
    while let Some(b) = c.next_batch().unwrap() {
        let soft = b.soft_labels().expect("soft labels").to_vec();
        out.push((b.labels().to_vec(), soft, b.images().to_vec()));
    }
    out
}

#[test]
fn a_mixed_job_through_a_worker_is_the_local_daemons() {
    let world = World::new();
    let (local, _, _) = world.home("reference-mix", &[]);
    let expected = serve_mixed(local.socket(), &world.data);
    // 65 samples in batches of 4, the last short; every soft row sums to 1.
    assert_eq!(expected.len(), 17);
    for (labels, soft, _) in &expected {
        for row in soft.chunks_exact(4).take(labels.len()) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6, "{row:?}");
        }
    }
    drop(local);
    let (_worker, _, addr) = world.worker("worker-mix");
    let (home, home_log, metrics) = world.home_with("home-mix", &[&addr], 2);
    // The home connects when its first units come: a job this small may end before then, so
    // jobs run until the worker has done units.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(serve_mixed(home.socket(), &world.data) == expected);
        let text = stoker_testkit::prometheus::http_get(&metrics, "/metrics").1;
        if remote_units(&text, &addr, "done") > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker was never used:\n{}",
            read_log(&home_log)
        );
        std::thread::sleep(Duration::from_millis(600));
    }
}
