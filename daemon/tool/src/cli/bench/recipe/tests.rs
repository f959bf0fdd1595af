//! Tests of the recipes' specs and the row's helpers.

use super::*;

#[test]
fn the_reference_is_rrc_176_flip_trivial_augment_and_erasing() {
    let spec = recipe_spec(Recipe::TorchvisionReference, PipelineSpec::train(32, 224));
    spec.validate().unwrap();
    assert_eq!(spec.view_count(), 1);
    assert_eq!(spec.crop, Crop::random_resized(176));
    assert_eq!(spec.flip_prob, 0.5);
    assert!(matches!(
        spec.ops[..],
        [Op::TrivialAugmentWide {
            num_magnitude_bins: 31,
            interpolation: Interpolation::Bilinear,
            ..
        }]
    ));
    assert_eq!(spec.erasing.as_ref().map(|e| e.p), Some(0.1));
    assert_eq!(spec.batch_size, 32);
    assert_eq!(spec.soft_labels(), Some(1000));
    assert_eq!(spec.batch_mix, Some(mix_up_or_cut_mix(1000)));
    let plain = without_ops(&spec);
    plain.validate().unwrap();
    assert!(plain.ops.is_empty() && plain.erasing.is_none() && plain.batch_mix.is_none());
    assert_eq!(plain.crop, spec.crop);
    assert_eq!(op_kinds(&spec), ["TrivialAugmentWide", "RandomErasing"]);
    let no_erasing = without_kind(&spec, "RandomErasing");
    assert!(no_erasing.erasing.is_none() && no_erasing.ops == spec.ops);
}

#[test]
fn dino_is_eight_views_with_dinos_colour_operations() {
    let spec = recipe_spec(Recipe::Dino, PipelineSpec::train(32, 224));
    spec.validate().unwrap();
    assert_eq!(spec.view_count(), 8);
    let views: Vec<PipelineSpec> = (0..8).map(|v| spec.view_spec(v)).collect();
    let sides: Vec<(u32, u32)> = views.iter().map(|v| v.crop.output_size()).collect();
    assert_eq!(sides[..2], [(224, 224); 2]);
    assert_eq!(sides[2..], [(96, 96); 6]);
    let names = |v: &PipelineSpec| v.ops.iter().map(Op::name).collect::<Vec<_>>();
    assert_eq!(
        names(&views[0]),
        ["RandomApply", "RandomGrayscale", "GaussianBlur"]
    );
    assert_eq!(
        names(&views[1]),
        [
            "RandomApply",
            "RandomGrayscale",
            "RandomApply",
            "RandomSolarize"
        ]
    );
    for v in &views[2..] {
        assert_eq!(names(v), ["RandomApply", "RandomGrayscale", "RandomApply"]);
        let Op::RandomApply { ops, p } = &v.ops[2] else {
            panic!("a local view's blur is a RandomApply");
        };
        assert_eq!(*p, 0.5);
        assert!(matches!(
            ops[..],
            [Op::GaussianBlur {
                kernel_size: [9, 9],
                ..
            }]
        ));
    }
    let Op::RandomApply { ops, p } = &views[0].ops[0] else {
        panic!("the colour jitter is a RandomApply");
    };
    assert_eq!(*p, 0.8);
    assert!(matches!(
        ops[..],
        [Op::ColorJitter {
            hue: Some([-0.1, 0.1]),
            ..
        }]
    ));
    let Crop::RandomResized { scale, .. } = views[5].crop else {
        panic!("a local view is a random resized crop");
    };
    assert_eq!(scale, [0.05, 0.4]);
    let plain = without_ops(&spec);
    plain.validate().unwrap();
    assert_eq!(plain.view_count(), 8);
    assert!((0..8).all(|v| plain.view_spec(v).ops.is_empty()));
    assert_eq!(
        op_kinds(&spec),
        [
            "ColorJitter",
            "RandomGrayscale",
            "GaussianBlur",
            "RandomSolarize"
        ]
    );
    let no_blur = without_kind(&spec, "GaussianBlur");
    no_blur.validate().unwrap();
    assert_eq!(
        names(&no_blur.view_spec(1)),
        ["RandomApply", "RandomGrayscale", "RandomSolarize"]
    );
    assert_eq!(
        names(&no_blur.view_spec(7)),
        ["RandomApply", "RandomGrayscale"]
    );
}

#[test]
fn median_of_odd_and_even_counts() {
    assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(vec![4.0, 1.0]), 2.5);
    assert_eq!(median(Vec::new()), 0.0);
}

/// The end-to-end run hands the whole recipe to its client process as JSON: the client
/// attaches with exactly the recipe's spec (views, operations, erasing, batch mix).
#[test]
fn the_client_process_attaches_with_the_whole_recipe() {
    use crate::cli::bench_client::{client_spec, BenchClientArgs};
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        client: BenchClientArgs,
    }
    let parse = |json: &str| {
        <Cli as clap::Parser>::try_parse_from([
            "bench-client",
            "--socket",
            "/s",
            "--data",
            "/d",
            "--job",
            "j",
            "--warmup",
            "1",
            "--epochs",
            "2",
            "--spec-json",
            json,
        ])
        .unwrap()
        .client
    };
    for recipe in [Recipe::TorchvisionReference, Recipe::Dino] {
        let spec = recipe_spec(recipe, PipelineSpec::train(16, 224));
        let got = client_spec(&parse(&serde_json::to_string(&spec).unwrap())).unwrap();
        assert_eq!(
            got,
            PipelineSpec {
                epochs: Some(3),
                ..spec
            }
        );
    }
    let bad = client_spec(&parse("{\"batch_size\": \"many\"}")).unwrap_err();
    assert!(bad.to_string().contains("--spec-json"), "{bad}");
}
