//! The pipeline spec flags `stoker bench` and `stoker bench-client` share.

#![forbid(unsafe_code)]

use clap::Args;
use stoker_wire::spec::{Crop, DType, Layout, PipelineSpec};

/// The pipeline spec, shared by `bench` and `bench-client`.
#[derive(Debug, Clone, Args)]
pub(crate) struct SpecArgs {
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
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum DTypeArg {
    U8,
    F16,
    Bf16,
    F32,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum LayoutArg {
    Nchw,
    Nhwc,
}

impl SpecArgs {
    pub(crate) fn spec(&self) -> PipelineSpec {
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

    /// The same flags, to pass on to a `bench-client`.
    pub(super) fn to_flags(&self) -> Vec<String> {
        let mut v = vec![
            "--batch".into(),
            self.batch.to_string(),
            "--size".into(),
            self.size.to_string(),
            "--dtype".into(),
            format!("{:?}", self.dtype).to_lowercase(),
            "--layout".into(),
            format!("{:?}", self.layout).to_lowercase(),
        ];
        if self.eval {
            v.push("--eval".into());
        }
        v
    }
}
