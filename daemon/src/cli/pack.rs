//! `stoker pack SRC OUT`: turns any dataset (folder tree, flat folder, file list, shards) into
//! WebDataset tar shards of a target size, labels preserved, with progress on stderr.

use std::path::PathBuf;

use clap::Args;

use crate::pack::{pack, DEFAULT_SHARD_BYTES};

#[derive(Debug, Args)]
pub struct PackArgs {
    /// The dataset to pack.
    pub src: PathBuf,
    /// Folder to write shard-NNNNNN.tar files into (created if missing).
    pub out: PathBuf,
    /// Target shard size in MB (a shard closes once it reaches it).
    #[arg(long, default_value_t = DEFAULT_SHARD_BYTES / 1_000_000)]
    pub shard_mb: u64,
}

pub fn run(args: &PackArgs) -> i32 {
    let t0 = std::time::Instant::now();
    match pack(&args.src, &args.out, args.shard_mb.max(1) * 1_000_000, true) {
        Ok(s) => {
            println!(
                "packed {} samples into {} shards ({:.1} MB) in {} in {:.1}s",
                s.samples,
                s.shards,
                s.bytes as f64 / 1e6,
                args.out.display(),
                t0.elapsed().as_secs_f64()
            );
            super::EXIT_OK
        }
        Err(e) => {
            eprintln!("stoker pack: {e}");
            super::EXIT_FAILURES
        }
    }
}
