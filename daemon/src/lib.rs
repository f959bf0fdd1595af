//! The stoker daemon's library: everything `stokerd` and `stoker` are made of.
//!
//! Data flow for one rank (see `../shared/DESIGN.md`):
//! `sampler` → `reader` (io_uring) → `decode` (libjpeg-turbo / nvJPEG) → `augment` (fused
//! crop-resize-flip-normalize-convert into the slot) → `pipeline` publishes the slot.

pub mod access;
pub mod augment;
pub mod backend;
pub mod badsample;
pub mod bench;
pub mod cli;
pub mod config;
pub mod dataset;
pub mod decode;
pub mod engine;
pub mod logging;
pub mod metrics;
pub mod pack;
pub mod pipeline;
pub mod ratelimit;
pub mod reader;
pub mod rng;
pub mod sampler;
pub mod server;
pub mod synth;
pub mod systemd;
