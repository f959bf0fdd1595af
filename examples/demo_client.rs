//! A training process's view of stoker: attach to a running `stokerd`, receive augmented
//! batches (RandomResizedCrop 224 + flip + normalize, f32 NCHW) straight from the shared ring,
//! read every byte as a training step would, release, and print throughput per epoch.
//!
//! usage: demo_client --socket PATH --dataset PATH [--epochs N] [--batch B] [--ranks R]
//!                    [--job KEY] [--rank R --world W] [--seed S] [--json]
//!
//! With `--ranks R` the process attaches R ranks of one job (threads here; separate processes
//! under torchrun) and shows that they split each epoch between them. With `--rank r --world W`
//! it attaches that one rank of a W-rank job (one process per rank, as torchrun would).
//! `--json` prints one JSON line: images, seconds, and the steady-state rate after epoch 0.

use std::path::PathBuf;
use std::time::Instant;

use stoker::client::{AttachOptions, Client};
use stoker::spec::PipelineSpec;

struct Args {
    socket: PathBuf,
    dataset: String,
    epochs: u32,
    batch: u32,
    ranks: u32,
    job: String,
    /// One rank of a `world`-rank job, instead of `ranks` ranks of a `ranks`-rank job.
    one_rank: Option<(u32, u32)>,
    seed: u64,
    json: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        socket: stoker::default_socket_path(),
        dataset: String::new(),
        epochs: 3,
        batch: 64,
        ranks: 1,
        job: "demo".into(),
        one_rank: None,
        seed: 0,
        json: false,
    };
    let (mut rank, mut world) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--socket" => args.socket = PathBuf::from(value()?),
            "--dataset" => args.dataset = value()?,
            "--epochs" => args.epochs = value()?.parse().map_err(|e| format!("--epochs: {e}"))?,
            "--batch" => args.batch = value()?.parse().map_err(|e| format!("--batch: {e}"))?,
            "--ranks" => args.ranks = value()?.parse().map_err(|e| format!("--ranks: {e}"))?,
            "--job" => args.job = value()?,
            "--rank" => rank = Some(value()?.parse().map_err(|e| format!("--rank: {e}"))?),
            "--world" => world = Some(value()?.parse().map_err(|e| format!("--world: {e}"))?),
            "--seed" => args.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--json" => args.json = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.dataset.is_empty() {
        return Err("--dataset is required".into());
    }
    match (rank, world) {
        (Some(r), Some(w)) if r < w => args.one_rank = Some((r, w)),
        (None, None) => {}
        _ => return Err("--rank and --world go together, with rank < world".into()),
    }
    Ok(args)
}

/// What one rank saw.
#[derive(Default)]
struct RankStats {
    images: u64,
    bytes: u64,
    checksum: f64,
    replaced: u64,
    per_epoch: Vec<(u64, f64)>,
}

fn run_rank(args: &Args, rank: u32) -> Result<RankStats, String> {
    let spec = PipelineSpec {
        epochs: Some(args.epochs),
        ..PipelineSpec::train(args.batch, 224)
    };
    let mut opts = AttachOptions::new(args.job.clone(), args.dataset.clone(), spec);
    (opts.rank, opts.world_size) = args.one_rank.unwrap_or((rank, args.ranks));
    opts.seed = args.seed;
    let mut client = Client::attach(&args.socket, opts).map_err(|e| e.to_string())?;
    let mut stats = RankStats::default();
    let mut epoch_start = Instant::now();
    let (mut epoch, mut epoch_images) = (0u64, 0u64);
    while let Some(batch) = client.next_batch().map_err(|e| e.to_string())? {
        if batch.epoch() != epoch {
            stats
                .per_epoch
                .push((epoch_images, epoch_start.elapsed().as_secs_f64()));
            (epoch, epoch_images, epoch_start) = (batch.epoch(), 0, Instant::now());
        }
        // Read every pixel of the batch, as the first layer of a model would.
        let floats = bytemuck_f32(batch.images(), batch.n() * 3 * 224 * 224);
        stats.checksum += floats.iter().map(|&v| f64::from(v)).sum::<f64>();
        stats.bytes += (floats.len() * 4) as u64;
        stats.replaced += batch.status()[..batch.n()]
            .iter()
            .filter(|&&s| s != 0)
            .count() as u64;
        stats.images += batch.n() as u64;
        epoch_images += batch.n() as u64;
        // Dropping the batch releases its slot to the daemon.
    }
    stats
        .per_epoch
        .push((epoch_images, epoch_start.elapsed().as_secs_f64()));
    Ok(stats)
}

/// The first `n` f32 values of a slot's image bytes (the ring is 256-byte aligned).
fn bytemuck_f32(bytes: &[u8], n: usize) -> &[f32] {
    assert!(bytes.len() >= n * 4 && bytes.as_ptr().align_offset(4) == 0);
    // SAFETY: the region holds at least n f32 values (checked), is 4-byte aligned (checked),
    // and every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const f32, n) }
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("demo_client: {e}");
            std::process::exit(2);
        }
    };
    if !args.json {
        println!(
            "demo_client: {} rank(s) attaching to {} for dataset {}",
            args.ranks,
            args.socket.display(),
            args.dataset
        );
    }
    let t0 = Instant::now();
    let ranks: Vec<u32> = match args.one_rank {
        Some((r, _)) => vec![r],
        None => (0..args.ranks).collect(),
    };
    let results: Vec<Result<RankStats, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .copied()
            .map(|r| {
                let args = &args;
                s.spawn(move || run_rank(args, r))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = t0.elapsed().as_secs_f64();
    if args.json {
        // Steady state: everything after epoch 0 (page cache warm-up, thread start). Ranks run
        // side by side, so the slowest rank's time is the wall time of the steady part.
        let (mut images, mut steady_images, mut steady_seconds) = (0u64, 0u64, 0f64);
        for r in &results {
            let st = r.as_ref().unwrap_or_else(|e| {
                eprintln!("demo_client: {e}");
                std::process::exit(1)
            });
            images += st.images;
            steady_images += st.per_epoch.iter().skip(1).map(|&(n, _)| n).sum::<u64>();
            let t: f64 = st.per_epoch.iter().skip(1).map(|&(_, t)| t).sum();
            steady_seconds = steady_seconds.max(t);
        }
        println!(
            "{{\"images\": {images}, \"seconds\": {elapsed:.4}, \"steady_images\": {steady_images}, \"steady_seconds\": {steady_seconds:.4}, \"steady_images_per_s\": {:.2}}}",
            steady_images as f64 / steady_seconds.max(1e-9)
        );
        return;
    }
    let mut total = 0u64;
    for (rank, r) in results.iter().enumerate() {
        match r {
            Ok(st) => {
                total += st.images;
                let epochs: Vec<String> = st
                    .per_epoch
                    .iter()
                    .enumerate()
                    .map(|(e, &(n, t))| format!("epoch {e}: {n} images {:.0} img/s", n as f64 / t))
                    .collect();
                println!(
                    "rank {rank}: {} images, {:.1} MB read from the ring, {} replaced bad samples, checksum {:.3e}\n  {}",
                    st.images,
                    st.bytes as f64 / 1e6,
                    st.replaced,
                    st.checksum,
                    epochs.join("\n  ")
                );
            }
            Err(e) => {
                eprintln!("rank {rank}: {e}");
                std::process::exit(1);
            }
        }
    }
    println!(
        "total: {total} images in {elapsed:.2}s = {:.1} img/s (first epoch includes the page cache warm-up)",
        total as f64 / elapsed
    );
}
