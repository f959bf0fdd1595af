//! A job with torchvision's per-sample operations and RandomErasing (issue 39) gets the same
//! batches bit for bit from a home daemon with a worker as from a local-only daemon: the
//! worker draws and applies the operations with the local code.

use stoker::spec::{Erasing, ErasingValue, Interpolation, Op, RandomWord};
use stoker::{Client, PipelineSpec};
use stoker_testkit::attach::rank_options;
use stoker_testkit::batches::{drain, Got};

use super::{remote_units, World, SEED};

fn recipe_spec() -> PipelineSpec {
    PipelineSpec {
        ops: vec![
            Op::RandAugment {
                num_ops: 2,
                magnitude: 9,
                num_magnitude_bins: 31,
                interpolation: Interpolation::Bilinear,
                fill: [0.0; 3],
            },
            Op::ColorJitter {
                brightness: Some([0.6, 1.4]),
                contrast: None,
                saturation: Some([0.6, 1.4]),
                hue: Some([-0.1, 0.1]),
            },
        ],
        erasing: Some(Erasing {
            p: 0.5,
            scale: [0.02, 0.33],
            ratio: [0.3, 3.3],
            value: ErasingValue::Random(RandomWord::Random),
        }),
        epochs: Some(1),
        ..PipelineSpec::train(4, 32)
    }
}

fn serve(home: &std::path::Path, world: &World) -> Vec<Got> {
    let o = rank_options(
        world.data.to_str().unwrap(),
        "recipe",
        (0, 1),
        SEED,
        recipe_spec(),
    );
    let mut c = Client::attach(home, o).unwrap();
    drain(&mut c)
}

#[test]
fn a_worker_serves_the_operations_bit_for_bit() {
    let world = World::new();
    let (local, _, _) = world.home("local", &[]);
    let expected = serve(local.socket(), &world);
    drop(local);
    let (_worker, _, addr) = world.worker("worker");
    let (home, _, metrics) = world.home("home", &[&addr]);
    let got = serve(home.socket(), &world);
    let text = stoker_testkit::prometheus::http_get(&metrics, "/metrics").1;
    assert!(remote_units(&text, &addr, "done") > 0.0, "{text}");
    assert_eq!(got, expected);
}
