//! `stoker bench DATA --recipe NAME`: a training recipe with its operations (docs/augment.md
//! section 6) measured end to end (a `stokerd` serving a client process) and in process
//! against the PyTorch DataLoader running the same torchvision.transforms.v2 Compose, and for
//! the torchvision reference against DALI's CPU pipeline with `auto_aug.trivial_augment`, in
//! the same run.
//!
//! # Design
//! - `torchvision-reference` is torchvision's classification reference training preset with
//!   `--auto-augment ta_wide --random-erase 0.1 --train-crop-size 176`: RandomResizedCrop 176,
//!   flip 0.5, TrivialAugmentWide (bilinear), normalise, RandomErasing(0.1). `dino` is DINO's
//!   DataAugmentationDINO: 2 global views of 224 and 6 local ones of 96, each with DINO's
//!   colour jitter, grayscale, blur and (global 2) solarisation. Both sides crop with
//!   bilinear antialiased resizes and blur with torchvision's GaussianBlur.
//! - The reference's batch mix (`--mixup-alpha 0.2 --cutmix-alpha 1.0`:
//!   RandomChoice([MixUp, CutMix]) over 1000 classes) is [`batch_mix`], on both sides (the
//!   DataLoader gets `--mix` from the spec; DALI has no such operator and runs without it).
//!   It needs labels: on a dataset with unlabelled samples (a flat folder) the row leaves it
//!   out of both sides and says so.
//! - First the same views without their operations run once (no ops, no erasing, no mix), so
//!   the augment stage's cost with and without the operations shows side by side. Then
//!   `--rounds` rounds alternate stoker in process (the stage times), stoker end to end
//!   (`stokerd` with `threads` threads and one `stoker bench-client` process, which gets the
//!   whole spec as JSON: a recipe has no spec flags), the DataLoader (`torch_recipe.py`,
//!   `threads` workers, torchvision.io decodes) and DALI (`dali_cpu.py --recipe
//!   torchvision-reference`, reference only), so slow drifts of a shared machine hit all
//!   alike; the row gives each side's median and the ratio of the medians. The verdict uses
//!   the end-to-end figure: the peers' figures are also what reaches their training process.
//! - With `--op-costs`, after the rounds: the recipe once without each kind of operation (and
//!   without the batch mix), and
//!   once with a do-nothing operation per view (the 8-bit path's own cost: a view with
//!   operations is cropped to 8 bits, operated on, then normalised, not fused), each right
//!   before the whole recipe again, the two augment times side by side.
//! - Each stoker line shows the stage times (worker ms per image, summed over threads) and the
//!   augment stage's share of read + decode + augment.
//!
//! # Limitations
//! - The end-to-end run has one client process, on the host (CPU backend).
//! - DALI runs from `--dali-python` (else the peers' Python); where it is not installed the
//!   row says so and reports the DataLoader's ratio alone.

#![forbid(unsafe_code)]

use stoker_wire::spec::View;
use stoker_wire::spec::{BatchMix, Erasing, ErasingValue, Interpolation, Op};

use super::workers::median;
use super::*;

/// Which recipe to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Recipe {
    /// torchvision's classification reference: RandomResizedCrop 176, flip, TrivialAugmentWide,
    /// normalise, RandomErasing 0.1.
    TorchvisionReference,
    /// DINO: 2 x 224 + 6 x 96 views with DINO's colour jitter, grayscale, blur, solarisation.
    Dino,
}

impl Recipe {
    fn name(self) -> &'static str {
        match self {
            Recipe::TorchvisionReference => "torchvision-reference",
            Recipe::Dino => "dino",
        }
    }

    /// The targets: stoker over the DataLoader, and over DALI where DALI runs it.
    fn targets(self) -> (f64, Option<f64>) {
        match self {
            Recipe::TorchvisionReference => (2.5, Some(1.5)),
            Recipe::Dino => (3.0, None),
        }
    }
}

/// Whether the reference recipe includes its batch mix (the daemon serves one since the
/// i39-mix merge; `false` measures the recipe without it).
const WITH_BATCH_MIX: bool = true;

/// The reference's `--mixup-alpha 0.2 --cutmix-alpha 1.0` over `classes` (ImageNet's 1000),
/// with [`WITH_BATCH_MIX`].
fn batch_mix(classes: u32) -> Option<BatchMix> {
    WITH_BATCH_MIX.then(|| mix_up_or_cut_mix(classes))
}

/// `RandomChoice([MixUp(0.2), CutMix(1.0)])`, as the reference's train.py builds it.
fn mix_up_or_cut_mix(num_classes: u32) -> BatchMix {
    BatchMix::Choice {
        mixes: vec![
            BatchMix::MixUp {
                alpha: 0.2,
                num_classes,
            },
            BatchMix::CutMix {
                alpha: 1.0,
                num_classes,
            },
        ],
        p: None,
    }
}

fn rrc(side: u32, scale: [f32; 2]) -> Crop {
    Crop::RandomResized {
        size: [side, side],
        scale,
        ratio: [3.0 / 4.0, 4.0 / 3.0],
    }
}

fn blur(kernel: u32) -> Op {
    Op::GaussianBlur {
        kernel_size: [kernel, kernel],
        sigma: [0.1, 2.0],
    }
}

fn random_apply(op: Op, p: f32) -> Op {
    Op::RandomApply { ops: vec![op], p }
}

/// A DINO view: RRC, flip 0.5, RandomApply(ColorJitter(0.4, 0.4, 0.2, 0.1), 0.8),
/// RandomGrayscale(0.2), then `tail`.
fn dino_view(side: u32, scale: [f32; 2], tail: Vec<Op>) -> View {
    let jitter = Op::ColorJitter {
        brightness: Some([0.6, 1.4]),
        contrast: Some([0.6, 1.4]),
        saturation: Some([0.8, 1.2]),
        hue: Some([-0.1, 0.1]),
    };
    let mut ops = vec![random_apply(jitter, 0.8), Op::RandomGrayscale { p: 0.2 }];
    ops.extend(tail);
    View {
        crop: rrc(side, scale),
        flip_prob: 0.5,
        ops,
        erasing: None,
    }
}

/// The spec of `recipe` on top of the spec flags (batch, dtype, layout).
pub(super) fn recipe_spec(recipe: Recipe, base: PipelineSpec) -> PipelineSpec {
    match recipe {
        Recipe::TorchvisionReference => PipelineSpec {
            crop: Crop::random_resized(176),
            flip_prob: 0.5,
            ops: vec![Op::TrivialAugmentWide {
                num_magnitude_bins: 31,
                interpolation: Interpolation::Bilinear,
                fill: [0.0; 3],
            }],
            erasing: Some(Erasing {
                p: 0.1,
                scale: [0.02, 0.33],
                ratio: [0.3, 3.3],
                value: ErasingValue::Fill([0.0; 3]),
            }),
            batch_mix: batch_mix(1000),
            ..base
        },
        Recipe::Dino => {
            let global = [0.4, 1.0];
            let global1 = dino_view(224, global, vec![blur(23)]);
            let global2 = dino_view(
                224,
                global,
                vec![
                    random_apply(blur(23), 0.1),
                    Op::RandomSolarize {
                        threshold: 128.0,
                        p: 0.2,
                    },
                ],
            );
            let local = dino_view(96, [0.05, 0.4], vec![random_apply(blur(9), 0.5)]);
            let mut extra_views = vec![global2];
            extra_views.extend(std::iter::repeat_n(local, 6));
            PipelineSpec {
                crop: global1.crop,
                flip_prob: global1.flip_prob,
                ops: global1.ops,
                erasing: None,
                extra_views,
                ..base
            }
        }
    }
}

/// The same views without their operations, erasing or batch mix.
pub(super) fn without_ops(spec: &PipelineSpec) -> PipelineSpec {
    let extra_views = spec
        .extra_views
        .iter()
        .map(|v| View::new(v.crop, v.flip_prob))
        .collect();
    PipelineSpec {
        ops: Vec::new(),
        erasing: None,
        batch_mix: None,
        extra_views,
        ..spec.clone()
    }
}

/// `spec` without the operations named `name` (torchvision's class name; `RandomErasing` for
/// the erasing) in every view; a RandomApply left empty goes too.
pub(super) fn without_kind(spec: &PipelineSpec, name: &str) -> PipelineSpec {
    fn strip(ops: &[Op], name: &str) -> Vec<Op> {
        ops.iter()
            .filter(|op| op.name() != name)
            .filter_map(|op| match op {
                Op::RandomApply { ops, p } => {
                    let ops = strip(ops, name);
                    (!ops.is_empty()).then_some(Op::RandomApply { ops, p: *p })
                }
                other => Some(other.clone()),
            })
            .collect()
    }
    let erasing = |e: &Option<Erasing>| e.clone().filter(|_| name != "RandomErasing");
    let extra_views = spec
        .extra_views
        .iter()
        .map(|v| View {
            ops: strip(&v.ops, name),
            erasing: erasing(&v.erasing),
            ..v.clone()
        })
        .collect();
    PipelineSpec {
        ops: strip(&spec.ops, name),
        erasing: erasing(&spec.erasing),
        extra_views,
        ..spec.clone()
    }
}

/// The kinds of operation `spec`'s views list (inside RandomApply too), and `RandomErasing`
/// if one has an erasing, in order of first appearance.
pub(super) fn op_kinds(spec: &PipelineSpec) -> Vec<&'static str> {
    fn walk(ops: &[Op], out: &mut Vec<&'static str>) {
        for op in ops {
            match op {
                Op::RandomApply { ops, .. } => walk(ops, out),
                op if !out.contains(&op.name()) => out.push(op.name()),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    let views = std::iter::once((&spec.ops, &spec.erasing))
        .chain(spec.extra_views.iter().map(|v| (&v.ops, &v.erasing)));
    for (ops, erasing) in views {
        walk(ops, &mut out);
        if erasing.is_some() && !out.contains(&"RandomErasing") {
            out.push("RandomErasing");
        }
    }
    out
}

/// With `--op-costs`: the recipe once without each kind of operation, and once with every
/// operation replaced by a RandomInvert(p=0) (the 8-bit path with no work: crop to 8 bits,
/// then normalise), each followed by the whole recipe so that the two are measured under the
/// same load of a shared machine; the difference of their augment times is what the part
/// left out costs.
// String error: a failed run is one message for the user, composed at the CLI edge.
fn op_costs(recipe: Recipe, opts: &BenchOptions) -> Result<(), String> {
    let name = recipe.name();
    let idle = Op::RandomInvert { p: 0.0 };
    let plain = without_ops(&opts.spec);
    let eight_bit = PipelineSpec {
        ops: vec![idle.clone()],
        extra_views: plain
            .extra_views
            .iter()
            .map(|v| View {
                ops: vec![idle.clone()],
                ..v.clone()
            })
            .collect(),
        ..plain
    };
    let mut variants = vec![(
        "the 8-bit path alone (RandomInvert p=0)".to_string(),
        eight_bit,
    )];
    for kind in op_kinds(&opts.spec) {
        variants.push((format!("without {kind}"), without_kind(&opts.spec, kind)));
    }
    if opts.spec.batch_mix.is_some() {
        let spec = PipelineSpec {
            batch_mix: None,
            ..opts.spec.clone()
        };
        variants.push(("without MixUp/CutMix".to_string(), spec));
    }
    for (what, spec) in variants {
        progress(&format!(
            "recipe {name}: stoker, {what}, then the whole recipe"
        ));
        let o = BenchOptions {
            spec,
            ..opts.clone()
        };
        let r = run_in_process(&o).map_err(|e| e.to_string())?;
        stoker_line(&format!("{name} {what}"), &r);
        let full = run_in_process(opts).map_err(|e| e.to_string())?;
        stoker_line(&format!("{name} right after"), &full);
        println!(
            "recipe {name}: {what}: augment {:.2} ms per image against {:.2} for the whole recipe right after ({:+.2} ms); {:.1} against {:.1} img/s",
            r.augment_ms_per_image,
            full.augment_ms_per_image,
            full.augment_ms_per_image - r.augment_ms_per_image,
            r.images_per_s,
            full.images_per_s
        );
    }
    Ok(())
}

/// Whether every sample of `data` has a label (a batch mix needs them); `true` when the
/// dataset cannot be opened here (the run then says why).
fn labelled(data: &Path) -> bool {
    let open = stoker_pipeline::source::index::OpenOptions::default();
    Dataset::open(data, &open).map_or(true, |ds| (0..ds.len()).all(|i| ds.sample(i).label >= 0))
}

/// The augment stage's share of the stage times (read + decode + augment).
fn augment_share(r: &BenchReport) -> f64 {
    let total = r.read_ms_per_image + r.decode_ms_per_image + r.augment_ms_per_image;
    r.augment_ms_per_image / total.max(1e-12)
}

fn stoker_line(what: &str, r: &BenchReport) {
    println!(
        "stoker {what}: {} images in {:.2}s = {:.1} img/s; per image read {:.2} ms, decode {:.2} ms, augment {:.2} ms (augment {:.0}% of the stages), decodes per image {:.3}",
        r.images,
        r.seconds,
        r.images_per_s,
        r.read_ms_per_image,
        r.decode_ms_per_image,
        r.augment_ms_per_image,
        100.0 * augment_share(r),
        r.decodes_per_image
    );
}

/// Runs the row and prints it; the exit code says whether stoker and the DataLoader ran.
pub(super) fn run(args: &BenchArgs, recipe: Recipe) -> Exit {
    let spec = recipe_spec(recipe, args.spec.spec());
    if let Err(e) = spec.validate() {
        eprintln!("stoker bench: {e}");
        return Exit::Usage;
    }
    let threads = effective_threads(args.threads);
    let data = match std::fs::canonicalize(&args.data) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("stoker bench: {}: {e}", args.data.display());
            return Exit::Usage;
        }
    };
    let mut opts = BenchOptions {
        spec,
        seed: args.seed,
        warmup_epochs: args.warmup,
        epochs: args.epochs.max(1),
        ..BenchOptions::standard(&data, threads)
    };
    let name = recipe.name();
    if opts.spec.batch_mix.is_some() && !labelled(&data) {
        println!("recipe {name}: the dataset has unlabelled samples (a flat folder?): MixUp/CutMix left out of both sides; an ImageFolder tree includes them");
        opts.spec.batch_mix = None;
    }
    progress(&format!(
        "recipe {name}: stoker, the same views without operations"
    ));
    let plain = BenchOptions {
        spec: without_ops(&opts.spec),
        ..opts.clone()
    };
    let plain = match run_in_process(&plain) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stoker bench: {e}");
            return Exit::Failure;
        }
    };
    stoker_line(
        &format!("{name} without operations, threads={threads}"),
        &plain,
    );
    match rounds(args, recipe, &opts, &data, threads) {
        Ok(rounds) => {
            summary(recipe, &plain, &rounds);
            if args.op_costs {
                if let Err(e) = op_costs(recipe, &opts) {
                    eprintln!("stoker bench: {e}");
                    return Exit::Failure;
                }
            }
            Exit::Ok
        }
        Err(e) => {
            eprintln!("stoker bench: {e}");
            Exit::Failure
        }
    }
}

/// One round's figures.
#[derive(Debug)]
struct Round {
    /// The engine in process (stage times).
    ours: BenchReport,
    /// End to end: `stokerd` serving one `stoker bench-client` process, images/s.
    served: f64,
    loader: f64,
    /// DALI's rate, or why there is none.
    dali: Option<Result<f64, String>>,
}

/// `--rounds` rounds of stoker, the DataLoader and (reference) DALI, alternated.
// String error: a failed run is one message for the user, composed at the CLI edge.
fn rounds(
    args: &BenchArgs,
    recipe: Recipe,
    opts: &BenchOptions,
    data: &Path,
    threads: usize,
) -> Result<Vec<Round>, String> {
    let name = recipe.name();
    let n = args.remote.rounds.max(1);
    let mut out = Vec::new();
    for round in 1..=n {
        progress(&format!("recipe {name}: stoker, round {round} of {n}"));
        let ours = run_in_process(opts).map_err(|e| e.to_string())?;
        stoker_line(&format!("{name} threads={threads} round {round}"), &ours);
        progress(&format!(
            "recipe {name}: stokerd + 1 client process, round {round} of {n}"
        ));
        let served = end_to_end(args, &opts.spec, data, threads)?;
        println!(
            "stoker {name} end to end (stokerd, {threads} threads, + 1 client process) round {round}: {:.1} img/s, {:.2} CPU-s per 1000 images",
            served.images_per_s,
            served.cpu_s_per_1000.unwrap_or(f64::NAN)
        );
        progress(&format!(
            "recipe {name}: torchvision DataLoader, round {round} of {n}"
        ));
        let peer = loader_peer(args, recipe, opts, data, threads, ours.images_per_s);
        let loader = peer.images_per_s.ok_or_else(|| {
            format!(
                "the DataLoader did not run: {}",
                peer.error.unwrap_or_default()
            )
        })?;
        println!(
            "PyTorch DataLoader + torchvision.io + v2 Compose, {threads} workers, round {round}: {loader:.1} img/s"
        );
        let dali = (recipe == Recipe::TorchvisionReference).then(|| {
            progress(&format!("recipe {name}: DALI CPU, round {round} of {n}"));
            let d = dali_peer(args, data, threads, ours.images_per_s);
            match (d.images_per_s, d.error) {
                (Some(rate), _) => {
                    println!("DALI CPU + auto_aug.trivial_augment, {threads} threads, round {round}: {rate:.1} img/s");
                    Ok(rate)
                }
                (None, e) => {
                    let e = e.unwrap_or_default();
                    let why = if e.contains("No module named 'nvidia") {
                        "not installed".to_string()
                    } else {
                        e
                    };
                    println!("DALI: {why}");
                    Err(why)
                }
            }
        });
        out.push(Round {
            ours,
            served: served.images_per_s,
            loader,
            dali,
        });
    }
    Ok(out)
}

/// The recipe served: a `stokerd` with `threads` threads and one `stoker bench-client`
/// process attached with the whole `spec`, warm page cache.
// String error: a failed run is one message for the user, composed at the CLI edge.
fn end_to_end(
    args: &BenchArgs,
    spec: &PipelineSpec,
    data: &Path,
    threads: usize,
) -> Result<ServedResult, String> {
    let args = BenchArgs {
        spec_override: Some(spec.clone()),
        ..args.clone()
    };
    run_served(&args, data, 1, threads, CacheState::Warm, None)
}

/// The medians, ratios, stage shares and whether the targets are met.
fn summary(recipe: Recipe, plain: &BenchReport, rounds: &[Round]) {
    let name = recipe.name();
    let pick = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let in_process = pick(&|r| r.ours.images_per_s);
    let ours = pick(&|r| r.served);
    let augment = pick(&|r| r.ours.augment_ms_per_image);
    let share = pick(&|r| augment_share(&r.ours));
    let loader = pick(&|r| r.loader);
    let n = rounds.len();
    let (loader_target, dali_target) = recipe.targets();
    let verdict = |ratio: f64, target: f64| {
        if ratio >= target {
            format!("meets the target {target}x")
        } else {
            format!(
                "misses the target {target}x by {:.0}%",
                100.0 * (1.0 - ratio / target)
            )
        }
    };
    println!(
        "recipe {name}: augment {augment:.2} ms per image ({:.0}% of the stages) against {:.2} ms ({:.0}%) without the operations: the operations cost {:.2} ms per image",
        100.0 * share,
        plain.augment_ms_per_image,
        100.0 * augment_share(plain),
        augment - plain.augment_ms_per_image
    );
    let ratio = ours / loader.max(1e-9);
    println!(
        "recipe {name}: stoker end to end {ours:.1} img/s (in process {in_process:.1}), torchvision DataLoader {loader:.1} img/s, ratio {ratio:.2}x ({:.2}x in process), {} (medians of {n} alternated rounds; stoker without the operations {:.1} img/s in process)",
        in_process / loader.max(1e-9),
        verdict(ratio, loader_target),
        plain.images_per_s
    );
    let Some(dali_target) = dali_target else {
        return;
    };
    let rates: Vec<f64> = rounds
        .iter()
        .filter_map(|r| r.dali.as_ref().and_then(|d| d.as_ref().ok()).copied())
        .collect();
    if rates.len() == n {
        let dali = median(rates.clone());
        let ratio = ours / dali.max(1e-9);
        println!(
            "recipe {name}: stoker end to end {ours:.1} img/s, DALI CPU {dali:.1} img/s, ratio {ratio:.2}x ({:.2}x in process), {} (medians of {n} alternated rounds)",
            in_process / dali.max(1e-9),
            verdict(ratio, dali_target)
        );
    } else {
        let why = rounds
            .iter()
            .find_map(|r| r.dali.as_ref().and_then(|d| d.as_ref().err()).cloned())
            .unwrap_or_default();
        println!("recipe {name}: DALI: {why}");
    }
}

/// One run of `torch_recipe.py` with `threads` workers.
fn loader_peer(
    args: &BenchArgs,
    recipe: Recipe,
    opts: &BenchOptions,
    data: &Path,
    threads: usize,
    ours: f64,
) -> PeerResult {
    let name = "PyTorch DataLoader + torchvision, same Compose";
    let (python, dir) = match peer_setup(args, data) {
        Ok(found) => found,
        Err(why) => return failed(name, why),
    };
    let mut flags = vec![
        data.display().to_string(),
        "--recipe".into(),
        recipe.name().into(),
        "--workers".into(),
        threads.to_string(),
    ];
    if let Some(mix) = &opts.spec.batch_mix {
        flags.extend(["--mix".into(), "--classes".into()]);
        flags.push(mix.num_classes().to_string());
    }
    flags.extend(epoch_flags(args));
    run_peer(
        &python,
        &dir.join("torch_recipe.py"),
        &flags,
        name,
        ("stoker", ours),
    )
}

/// One run of `dali_cpu.py --recipe torchvision-reference` with `threads` threads, from
/// `--dali-python` or else the peers' Python.
fn dali_peer(args: &BenchArgs, data: &Path, threads: usize, ours: f64) -> PeerResult {
    let name = "DALI CPU + auto_aug.trivial_augment";
    let (python, dir) = match peer_setup(args, data) {
        Ok(found) => found,
        Err(why) => return failed(name, why),
    };
    let python = args.dali_python.clone().unwrap_or(python);
    let mut flags = vec![
        data.display().to_string(),
        "--recipe".into(),
        "torchvision-reference".into(),
        "--threads".into(),
        threads.to_string(),
    ];
    flags.extend(epoch_flags(args));
    run_peer(
        &python,
        &dir.join("dali_cpu.py"),
        &flags,
        name,
        ("stoker", ours),
    )
}

fn epoch_flags(args: &BenchArgs) -> [String; 6] {
    [
        "--batch".into(),
        args.spec.batch.to_string(),
        "--epochs".into(),
        args.epochs.max(1).to_string(),
        "--warmup".into(),
        args.warmup.to_string(),
    ]
}

#[cfg(test)]
mod tests;
