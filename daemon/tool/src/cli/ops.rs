//! `stoker ops`: one view operation by hand, for checking stoker's pixels and draws against
//! torchvision's (python/tests/test_ops_torchvision.py).
//!
//! - `stoker ops apply --step JSON --size HxW`: RGB bytes (H x W x 3, row-major) on stdin,
//!   the step applied with its explicit parameters, the same number of bytes on stdout.
//! - `stoker ops draw --ops JSON --size HxW --seed S --count N`: for samples 0..N of epoch 0,
//!   the steps a view with these operations draws, one JSON list per line.

#![forbid(unsafe_code)]

use std::io::{Read, Write};

use stoker_kernels::image::RgbImage;
use stoker_pipeline::transform::ops::{apply_step, draw_steps, OpScratch, Step};
use stoker_pipeline::transform::rng::{KeyedRng, Stream};
use stoker_wire::spec::Op;

use crate::cli::Exit;

/// Arguments of `stoker ops`.
#[derive(Debug, clap::Args)]
pub struct OpsArgs {
    #[command(subcommand)]
    command: OpsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum OpsCommand {
    /// Apply one step (explicit parameters, JSON) to RGB bytes on stdin; write them to stdout.
    Apply {
        /// The step, e.g. '{"kind": "posterize", "bits": 3}'.
        #[arg(long)]
        step: String,
        /// The image's size, HxW.
        #[arg(long, value_parser = parse_size)]
        size: (u32, u32),
    },
    /// Print the steps drawn for samples 0..COUNT, one JSON list per line.
    Draw {
        /// The view's operations, the spec's `ops` list as JSON.
        #[arg(long)]
        ops: String,
        /// The image's size, HxW.
        #[arg(long, value_parser = parse_size)]
        size: (u32, u32),
        /// The job's seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// How many samples.
        #[arg(long, default_value_t = 1)]
        count: u64,
    },
}

fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (h, w) = s
        .split_once('x')
        .ok_or_else(|| format!("size {s:?}: expected HxW, e.g. 224x224"))?;
    let side = |v: &str| {
        v.parse::<u32>()
            .ok()
            .filter(|&n| (1..=16_384).contains(&n))
            .ok_or_else(|| format!("size {s:?}: each side is 1..=16384"))
    };
    Ok((side(h)?, side(w)?))
}

/// Runs `stoker ops`; returns the exit code.
pub fn run(args: &OpsArgs) -> Exit {
    let result = match &args.command {
        OpsCommand::Apply { step, size } => apply(step, *size),
        OpsCommand::Draw {
            ops,
            size,
            seed,
            count,
        } => draw(ops, *size, *seed, *count),
    };
    match result {
        Ok(()) => Exit::Ok,
        Err(msg) => {
            eprintln!("stoker ops: {msg}");
            Exit::Usage
        }
    }
}

fn apply(step: &str, (h, w): (u32, u32)) -> Result<(), String> {
    let step: Step = serde_json::from_str(step).map_err(|e| format!("--step {step:?}: {e}"))?;
    step.check().map_err(|e| format!("--step: {e}"))?;
    let want = h as usize * w as usize * 3;
    let mut data = Vec::with_capacity(want);
    std::io::stdin()
        .read_to_end(&mut data)
        .map_err(|e| format!("stdin: {e}"))?;
    if data.len() != want {
        return Err(format!(
            "stdin: {} bytes for a {h}x{w} RGB image, which has {want}",
            data.len()
        ));
    }
    let mut img = RgbImage {
        width: w,
        height: h,
        data,
    };
    apply_step(&step, &mut img, &mut OpScratch::new());
    std::io::stdout()
        .write_all(&img.data)
        .map_err(|e| format!("stdout: {e}"))
}

fn draw(ops: &str, (h, w): (u32, u32), seed: u64, count: u64) -> Result<(), String> {
    let ops: Vec<Op> = serde_json::from_str(ops).map_err(|e| format!("--ops {ops:?}: {e}"))?;
    let mut spec = stoker_wire::spec::PipelineSpec::train(1, 8);
    spec.ops = ops;
    spec.validate().map_err(|e| format!("--ops: {e}"))?;
    let mut out = std::io::stdout().lock();
    let mut steps = Vec::new();
    for index in 0..count {
        steps.clear();
        let mut rng = KeyedRng::new(seed, 0, index, Stream::Ops);
        draw_steps(&spec.ops, &mut rng, w, h, &mut steps);
        let line = serde_json::to_string(&steps).map_err(|e| e.to_string())?;
        writeln!(out, "{line}").map_err(|e| format!("stdout: {e}"))?;
    }
    Ok(())
}
