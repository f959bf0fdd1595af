//! `stoker bench DATA --views dino`: several views of one image (docs/views.md) measured in
//! process against the PyTorch DataLoader doing the same views, in the same run.
//!
//! # Design
//! - `dino` is DINO's multi-crop: 2 global views (RandomResizedCrop 224, scale 0.4-1) and 6
//!   local ones (96, scale 0.05-0.4), each flipped with probability 0.5 and normalised, in the
//!   spec's dtype and layout. The peer (`torch_views.py`) does exactly these 8 transforms with
//!   torchvision on Pillow decodes in a DataLoader of `threads` workers; DINO's colour jitter,
//!   blur and solarisation are left out of both.
//! - The two alternate, twice each (stoker, peer, stoker, peer), so slow drifts of a shared
//!   machine hit both alike; the ratio is stoker's images/s over the peer's, sums over sums.
//! - The row shows stoker's decodes per image (the engine's decode count over the images it
//!   produced): 1, not 8, since each image is decoded once for all its views.
//!
//! # Limitations
//! - In process only (the engine filling a heap ring); the served path is the same engine.

#![forbid(unsafe_code)]

use stoker_wire::spec::{Crop, View};

use super::*;

/// Which views to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ViewsPreset {
    /// 2 global views (224, scale 0.4-1) + 6 local views (96, scale 0.05-0.4).
    Dino,
}

fn rrc(side: u32, scale: [f32; 2]) -> Crop {
    Crop::RandomResized {
        size: [side, side],
        scale,
        ratio: [3.0 / 4.0, 4.0 / 3.0],
    }
}

/// The spec of `preset` on top of the spec flags (batch, dtype, layout).
pub(super) fn preset_spec(preset: ViewsPreset, base: PipelineSpec) -> PipelineSpec {
    match preset {
        ViewsPreset::Dino => {
            let global = View {
                crop: rrc(224, [0.4, 1.0]),
                flip_prob: 0.5,
                ops: Vec::new(),
                erasing: None,
            };
            let local = View {
                crop: rrc(96, [0.05, 0.4]),
                flip_prob: 0.5,
                ops: Vec::new(),
                erasing: None,
            };
            let crop = global.crop;
            let mut extra_views = vec![global];
            extra_views.extend(std::iter::repeat_n(local, 6));
            PipelineSpec {
                crop,
                flip_prob: 0.5,
                extra_views,
                ..base
            }
        }
    }
}

/// Runs the row and prints it; the exit code says whether both sides ran.
pub(super) fn run(args: &BenchArgs, preset: ViewsPreset) -> Exit {
    let spec = preset_spec(preset, args.spec.spec());
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
    let opts = BenchOptions {
        spec,
        seed: args.seed,
        warmup_epochs: args.warmup,
        epochs: args.epochs.max(1),
        ..BenchOptions::standard(&data, threads)
    };
    let (mut ours, mut theirs) = (0.0, 0.0);
    for round in 1..=2 {
        progress(&format!("views {preset:?}: stoker, round {round} of 2"));
        let report = match run_in_process(&opts) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("stoker bench: {e}");
                return Exit::Failure;
            }
        };
        ours += report.images_per_s;
        println!(
            "stoker views={preset:?} ({} views) threads={threads} batch={}: {} images in {:.2}s = {:.1} img/s, decodes per image {:.3}",
            opts.spec.view_count(),
            report.batch_size,
            report.images,
            report.seconds,
            report.images_per_s,
            report.decodes_per_image
        );
        progress(&format!(
            "views {preset:?}: torchvision DataLoader, round {round} of 2"
        ));
        let peer = views_peer(args, &data, threads, ("stoker", report.images_per_s));
        match peer.images_per_s {
            Some(rate) => {
                theirs += rate;
                println!("PyTorch DataLoader + torchvision, same views, {threads} workers: {rate:.1} img/s");
            }
            None => {
                eprintln!(
                    "stoker bench: the peer did not run: {}",
                    peer.error.unwrap_or_default()
                );
                return Exit::Failure;
            }
        }
    }
    println!(
        "views {preset:?}: stoker {:.1} img/s, torchvision DataLoader {:.1} img/s, ratio {:.2}x (2 alternated rounds each)",
        ours / 2.0,
        theirs / 2.0,
        ours / theirs.max(1e-9)
    );
    Exit::Ok
}

/// One run of the peer doing the same views (`torch_views.py`) with `threads` workers.
fn views_peer(args: &BenchArgs, data: &Path, threads: usize, ours: (&str, f64)) -> PeerResult {
    let name = "PyTorch DataLoader + torchvision, same views";
    let (python, dir) = match peer_setup(args, data) {
        Ok(found) => found,
        Err(why) => return failed(name, why),
    };
    let flags = [
        data.display().to_string(),
        "--workers".into(),
        threads.to_string(),
        "--batch".into(),
        args.spec.batch.to_string(),
        "--epochs".into(),
        args.epochs.max(1).to_string(),
        "--warmup".into(),
        args.warmup.to_string(),
    ];
    run_peer(&python, &dir.join("torch_views.py"), &flags, name, ours)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dino_is_two_global_and_six_local_views() {
        let spec = preset_spec(ViewsPreset::Dino, PipelineSpec::train(32, 224));
        spec.validate().unwrap();
        assert_eq!(spec.view_count(), 8);
        let sides: Vec<(u32, u32)> = (0..8)
            .map(|v| spec.view_spec(v).crop.output_size())
            .collect();
        assert_eq!(sides[..2], [(224, 224); 2]);
        assert_eq!(sides[2..], [(96, 96); 6]);
        let Crop::RandomResized { scale, .. } = spec.view_spec(5).crop else {
            panic!("a local view is a random resized crop");
        };
        assert_eq!(scale, [0.05, 0.4]);
        assert_eq!(spec.batch_size, 32);
    }
}
