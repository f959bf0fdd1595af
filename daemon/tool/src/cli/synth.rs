//! `stoker synth DIR`: writes a generated dataset of realistic JPEGs, as an ImageFolder or
//! (`--shards N`) as WebDataset tar shards.

#![forbid(unsafe_code)]

use crate::cli::Exit;
use std::path::PathBuf;

use clap::Args;

use crate::synth::{generate, SynthOptions};

/// Arguments of `stoker synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Folder to write (class_NNNN/img_NNNNNNNN.jpg); created if missing.
    pub(crate) dir: PathBuf,
    #[arg(long, default_value_t = 1000)]
    pub(crate) images: usize,
    #[arg(long, default_value_t = 10)]
    pub(crate) classes: usize,
    #[arg(long, default_value_t = 90)]
    pub(crate) quality: u8,
    /// Image side scale; 1.0 gives ImageNet-like sizes (about 500x375).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) scale: f64,
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Encoding threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub(crate) threads: usize,
    /// Write N WebDataset tar shards (KEY.jpg + KEY.cls) instead of an ImageFolder.
    #[arg(long, default_value_t = 0)]
    pub(crate) shards: usize,
}

/// Runs `stoker synth`: writes the dataset and returns the exit code.
pub fn run(args: &SynthArgs) -> Exit {
    let opts = SynthOptions {
        images: args.images,
        classes: args.classes,
        seed: args.seed,
        quality: args.quality,
        size_scale: args.scale,
        threads: args.threads,
        shards: args.shards,
    };
    let t0 = std::time::Instant::now();
    match generate(&args.dir, &opts) {
        Ok(bytes) => {
            println!(
                "wrote {} images ({:.1} MB) in {} classes{} to {} in {:.1}s",
                args.images,
                bytes as f64 / 1e6,
                args.classes,
                if args.shards > 0 {
                    format!(", {} tar shards,", args.shards)
                } else {
                    String::new()
                },
                args.dir.display(),
                t0.elapsed().as_secs_f64()
            );
            Exit::Ok
        }
        Err(e) => {
            eprintln!("stoker synth: {e}");
            Exit::Failure
        }
    }
}
