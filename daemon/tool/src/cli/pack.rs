//! `stoker pack SRC OUT`: turns any dataset (folder tree, flat folder, file list, shards) into
//! WebDataset tar shards of a target size, labels preserved, with progress on stderr; OUT may
//! be an `s3://` prefix, the shards then uploaded as they are written.

#![forbid(unsafe_code)]

use crate::cli::Exit;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::pack::{
    pack, pack_dataset_with, PackError, PackOptions, PackSummary, DEFAULT_SHARD_BYTES,
};
use stoker_pipeline::source::index::{Dataset, OpenOptions};
use stoker_pipeline::source::object::{ObjectStore, S3Url};

/// Arguments of `stoker pack`.
#[derive(Debug, Args)]
pub struct PackArgs {
    /// The dataset to pack.
    pub(crate) src: PathBuf,
    /// Folder to write shard-NNNNNN.tar files (and their .tar.idx sidecar indexes) into,
    /// created if missing; or an `s3://bucket/prefix` to upload them to (one shard at a time
    /// on local disk; the connection from the AWS environment variables).
    pub(crate) out: PathBuf,
    /// Target shard size in MB (a shard closes once it reaches it).
    #[arg(long, default_value_t = DEFAULT_SHARD_BYTES / 1_000_000)]
    pub(crate) shard_mb: u64,
    /// Rewrite each JPEG losslessly with restart markers (same pixels), so crops entropy
    /// decode only the restart intervals they touch; files that cannot be rewritten
    /// (progressive, arithmetic, CMYK, not a JPEG, corrupt) are stored as they are.
    #[arg(long)]
    pub(crate) restart: bool,
}

/// Runs `stoker pack`: writes the shards, prints what was written, returns the exit code.
pub fn run(args: &PackArgs) -> Exit {
    let t0 = std::time::Instant::now();
    let opts = PackOptions {
        shard_bytes: args.shard_mb.max(1) * 1_000_000,
        progress: true,
        restart: args.restart,
    };
    let packed = if stoker_pipeline::source::object::is_url(&args.out) {
        pack_to_s3(&args.src, &args.out, &opts)
    } else {
        pack(&args.src, &args.out, &opts)
    };
    match packed {
        Ok(s) => {
            println!(
                "packed {} samples into {} shards ({:.1} MB) in {} in {:.1}s",
                s.samples,
                s.shards,
                s.bytes as f64 / 1e6,
                args.out.display(),
                t0.elapsed().as_secs_f64()
            );
            if args.restart {
                println!(
                    "restart markers: {} samples rewritten ({:.1} MB -> {:.1} MB), {} stored as they are",
                    s.restart_indexed,
                    s.rewritten_bytes_in as f64 / 1e6,
                    s.rewritten_bytes_out as f64 / 1e6,
                    s.kept_as_is
                );
            }
            Exit::Ok
        }
        Err(e) => {
            eprintln!("stoker pack: {e}");
            Exit::Failure
        }
    }
}

/// Packs `src` into shards under the `s3://` prefix `out`: each shard and its sidecar index
/// are written to a temporary folder, uploaded as soon as complete and removed, so one shard
/// at a time is on local disk. The connection comes from the environment, as for `check`.
fn pack_to_s3(src: &Path, out: &Path, opts: &PackOptions) -> Result<PackSummary, PackError> {
    let url = match S3Url::parse(out) {
        Some(Ok(u)) => u,
        Some(Err(reason)) => {
            return Err(PackError::BadUrl {
                path: out.to_owned(),
                reason,
            })
        }
        None => {
            return Err(PackError::NotS3 {
                path: out.to_owned(),
            })
        }
    };
    let ds = Dataset::open(src, &OpenOptions::default())?;
    let objects = ObjectStore::from_environment();
    let tmp = std::env::temp_dir().join(format!("stoker-pack-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|source| PackError::Write {
        path: tmp.clone(),
        source,
    })?;
    let mut upload = |shard: &Path| -> Result<(), PackError> {
        let mut idx = shard.as_os_str().to_owned();
        idx.push(stoker_pipeline::source::object::sidecar::SUFFIX);
        for file in [shard.to_path_buf(), PathBuf::from(idx)] {
            let name = file.file_name().unwrap_or_default().to_string_lossy();
            objects
                .upload_file(&file, &url.join(&name))
                .map_err(|source| PackError::Upload {
                    path: file.clone(),
                    source,
                })?;
            let _ = std::fs::remove_file(&file);
        }
        Ok(())
    };
    let packed = pack_dataset_with(&ds, &tmp, opts, &mut upload);
    let _ = std::fs::remove_dir_all(&tmp);
    packed
}
