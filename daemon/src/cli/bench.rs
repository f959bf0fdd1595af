//! `stoker bench DATA`: measures the CPU pipeline in this process on a dataset and prints
//! images/s with the time per stage.

use std::path::PathBuf;

use clap::Args;
use stoker::spec::{Crop, DType, Layout, PipelineSpec};

use crate::bench::{run_in_process, BenchOptions};
use crate::config::BackendChoice;

use super::{EXIT_OK, EXIT_USAGE};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Dataset: an ImageFolder tree, a flat folder, a file list or tar shards.
    pub data: PathBuf,
    /// Decode backend (only `cpu` is built so far; `auto` means cpu here).
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendArg,
    /// Worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    #[arg(long, default_value_t = 64)]
    pub batch: u32,
    /// Output side (RandomResizedCrop, or CenterCrop with --eval).
    #[arg(long, default_value_t = 224)]
    pub size: u32,
    /// Evaluation transform (Resize + CenterCrop) instead of RandomResizedCrop + flip.
    #[arg(long)]
    pub eval: bool,
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DTypeArg,
    #[arg(long, value_enum, default_value = "nchw")]
    pub layout: LayoutArg,
    /// Timed epochs (after one warm-up epoch).
    #[arg(long, default_value_t = 2)]
    pub epochs: u64,
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BackendArg {
    Auto,
    Cpu,
    Cuda,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DTypeArg {
    U8,
    F16,
    Bf16,
    F32,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LayoutArg {
    Nchw,
    Nhwc,
}

impl BenchArgs {
    fn spec(&self) -> PipelineSpec {
        let base = if self.eval {
            PipelineSpec::eval(self.batch, self.size)
        } else {
            PipelineSpec::train(self.batch, self.size)
        };
        PipelineSpec {
            crop: if self.eval {
                Crop::center(self.size)
            } else {
                base.crop
            },
            dtype: match self.dtype {
                DTypeArg::U8 => DType::U8,
                DTypeArg::F16 => DType::F16,
                DTypeArg::Bf16 => DType::Bf16,
                DTypeArg::F32 => DType::F32,
            },
            layout: match self.layout {
                LayoutArg::Nchw => Layout::Nchw,
                LayoutArg::Nhwc => Layout::Nhwc,
            },
            ..base
        }
    }
}

pub fn run(args: &BenchArgs) -> i32 {
    let backend = match args.backend {
        BackendArg::Auto | BackendArg::Cpu => BackendChoice::Cpu,
        BackendArg::Cuda => BackendChoice::Cuda,
    };
    if backend == BackendChoice::Cuda {
        eprintln!(
            "stoker bench: the cuda backend is not wired into the pipeline yet; use --backend cpu"
        );
        return EXIT_USAGE;
    }
    let spec = args.spec();
    if let Err(e) = spec.validate() {
        eprintln!("stoker bench: {e}");
        return EXIT_USAGE;
    }
    let mut opts = BenchOptions::standard(&args.data, args.threads);
    opts.spec = spec;
    opts.epochs = args.epochs.max(1);
    opts.warmup_epochs = args.warmup;
    opts.seed = args.seed;
    match run_in_process(&opts) {
        Ok(report) => {
            println!("{}", report.table());
            if let Some(path) = &args.json {
                let text = serde_json::to_string_pretty(&report).expect("report serialises");
                if let Err(e) = std::fs::write(path, text + "\n") {
                    eprintln!("stoker bench: cannot write {}: {e}", path.display());
                    return EXIT_USAGE;
                }
            }
            EXIT_OK
        }
        Err(e) => {
            eprintln!("stoker bench: {e}");
            super::EXIT_FAILURES
        }
    }
}
