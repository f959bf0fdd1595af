//! Resume: a client that vanishes or is killed with SIGKILL loses its leases and its rank
//! resumes; a daemon killed with SIGKILL restarts and the resumed batches equal an
//! uninterrupted run's; attach retries until its timeout while no daemon answers.

mod clients;
mod daemon;

use std::path::Path;
use std::time::{Duration, Instant};
use stoker::protocol::{Attach, ErrorCode, Message, Position, MAX_MESSAGE_BYTES};
use stoker::{AttachOptions, Client, ClientError, PipelineSpec};
use stoker_testkit::attach::{rank_options, u8_spec};
use stoker_testkit::batches::drain_ok as drain;
use stoker_testkit::{temp_image_folder, Daemon};

/// Rank `rank` of `world` reading `data` once in u8 batches of `batch` (small rings).
fn options(data: &Path, job: &str, rank: u32, world: u32, batch: u32) -> AttachOptions {
    let spec = u8_spec(batch, 16, Some(1));
    rank_options(data.to_str().unwrap(), job, (rank, world), 1234, spec)
}
