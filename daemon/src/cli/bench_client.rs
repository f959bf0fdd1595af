//! `stoker bench-client` (hidden): one real client process for `stoker bench`. Attaches with
//! the Rust client, consumes every batch of the job reading every byte of every image (as a
//! training step would copy it to the GPU), and prints its figures as one JSON line on stdout.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde::Serialize;
use stoker::client::{AttachOptions, Client};
use stoker::spec::PipelineSpec;

use super::bench::SpecArgs;
use super::{EXIT_FAILURES, EXIT_OK};

#[derive(Debug, Args)]
pub struct BenchClientArgs {
    #[arg(long)]
    pub socket: PathBuf,
    /// Dataset path, as the daemon should open it.
    #[arg(long)]
    pub data: String,
    #[arg(long)]
    pub job: String,
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    #[arg(long, default_value_t = 1)]
    pub world: u32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Epochs consumed before timing starts.
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    #[arg(long, default_value_t = 2)]
    pub epochs: u64,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// What one client measured (printed as JSON).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ClientStats {
    pub rank: u32,
    /// Every image received, warm-up included.
    pub images_all: u64,
    /// Images and bytes received in the timed epochs.
    pub images: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// Time blocked in `next_batch` for each timed batch, in ms.
    pub waits_ms: Vec<f64>,
    pub cpu_s: f64,
    pub peak_rss_mb: f64,
    /// Sum of every delivered byte, so that no read can be optimised away.
    pub checksum: u64,
}

pub fn run(args: &BenchClientArgs) -> i32 {
    match consume(args) {
        Ok(stats) => {
            println!(
                "{}",
                serde_json::to_string(&stats).expect("stats serialise")
            );
            EXIT_OK
        }
        Err(e) => {
            eprintln!("stoker bench-client rank {}: {e}", args.rank);
            EXIT_FAILURES
        }
    }
}

fn consume(args: &BenchClientArgs) -> Result<ClientStats, stoker::client::ClientError> {
    let spec = PipelineSpec {
        epochs: Some((args.warmup + args.epochs) as u32),
        ..args.spec.spec()
    };
    let mut opts = AttachOptions::new(args.job.clone(), args.data.clone(), spec);
    opts.rank = args.rank;
    opts.world_size = args.world;
    opts.seed = args.seed;
    let mut client = Client::attach(&args.socket, opts)?;
    let mut start = Instant::now();
    let mut timing = args.warmup == 0;
    let (mut images_all, mut images, mut bytes, mut checksum) = (0u64, 0u64, 0u64, 0u64);
    let mut waits_ms = Vec::new();
    loop {
        let t0 = Instant::now();
        let Some(batch) = client.next_batch()? else {
            break;
        };
        let waited = t0.elapsed().as_secs_f64() * 1e3;
        let data = batch.images();
        // Read every byte: a training step copies the whole batch to the GPU.
        let mut sum = 0u64;
        for c in data.chunks_exact(8) {
            sum = sum.wrapping_add(u64::from_ne_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in data.chunks_exact(8).remainder() {
            sum = sum.wrapping_add(u64::from(b));
        }
        checksum = checksum.wrapping_add(sum);
        images_all += batch.n() as u64;
        if batch.epoch() >= args.warmup {
            if !timing {
                // The first timed batch: time from when it was asked for.
                timing = true;
                start = t0;
            }
            images += batch.n() as u64;
            bytes += data.len() as u64;
            waits_ms.push(waited);
        }
        batch.release()?;
    }
    Ok(ClientStats {
        rank: args.rank,
        images_all,
        images,
        bytes,
        seconds: start.elapsed().as_secs_f64(),
        waits_ms,
        cpu_s: crate::bench::process_cpu_seconds(),
        peak_rss_mb: crate::bench::peak_rss_mb(None).unwrap_or(0.0),
        checksum,
    })
}
