//! Serving: the real `stokerd` on a temp socket, real JPEG files, real clients. Whole epochs
//! in order, ranks splitting the permutation as the in-process pipeline does, refusals by
//! name, a killed daemon read as a closed connection, and no leak over a thousand attaches;
//! a client and a daemon of different protocol versions told which side to upgrade
//! (`versions`); the soak (ignored in the ordinary run, see `soak`).

mod clients;
mod leaks;
mod soak;
mod versions;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoker::protocol::{ErrorCode, Message, MAX_MESSAGE_BYTES};
use stoker::socket::SeqPacket;
use stoker::{AttachOptions, Client, ClientError, DType, PipelineSpec};
use stoker_pipeline::engine::{Engine, EngineConfig, FeedEvent, HeapRing, Job, Position};
use stoker_pipeline::source::index::{Dataset, OpenOptions};
use stoker_testkit::attach::{rank_options, u8_spec};
use stoker_testkit::batches::drain_ok as drain;
use stoker_testkit::device_batches::HostBatch;
use stoker_testkit::{temp_image_folder, Daemon};

/// u8 output keeps the rings small; one epoch so the data ends.
fn spec(batch: u32) -> PipelineSpec {
    u8_spec(batch, 16, Some(1))
}

fn options(data: &Path, job: &str, rank: u32, world: u32, batch: u32) -> AttachOptions {
    rank_options(
        data.to_str().unwrap(),
        job,
        (rank, world),
        1234,
        spec(batch),
    )
}
