//! What one rank's client process does in the multi-host tests (`stoker-test-client rank
//! <json>`): the orders the test writes and the process reads.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stoker::protocol::{EpochOffset, Position};
use stoker::{AttachOptions, DType, PipelineSpec};

/// The seed of every multi-host job.
pub const SEED: u64 = 4242;

/// The dataset's name in every host's config.
pub const DATASET: &str = "train";

/// Longest wait for anything in these tests; they normally take a few seconds.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// u8 batches of `batch` 16x16 images for `epochs` epochs.
pub fn spec(batch: u32, epochs: u32) -> PipelineSpec {
    PipelineSpec {
        dtype: DType::U8,
        epochs: Some(epochs),
        ..PipelineSpec::train(batch, 16)
    }
}

/// What one client process does.
#[derive(Debug)]
pub struct RankOrders {
    /// The socket of the daemon it attaches to.
    pub socket: PathBuf,
    /// The job's name.
    pub job: String,
    /// Its rank in the job.
    pub rank: u32,
    /// The job's number of ranks.
    pub world: u32,
    /// Images per batch ([`spec`]).
    pub batch: u32,
    /// Epochs of the job ([`spec`]).
    pub epochs: u32,
    /// The position it attaches at.
    pub start: Position,
    /// The job's elastic offset, if it resumes one.
    pub offset: Option<EpochOffset>,
    /// The file it writes its log lines to (see `stoker-test-client`'s `rank` role).
    pub log: PathBuf,
    /// After this many batches, wait until `gate` exists.
    pub hold_after: Option<u64>,
    /// The file whose existence lets a held rank go on.
    pub gate: PathBuf,
    /// Detach after this many batches (and log the checkpoint).
    pub stop_after: Option<u64>,
}

impl RankOrders {
    /// The orders as JSON, for `stoker-test-client rank <json>`.
    pub fn to_json(&self) -> String {
        json!({
            "socket": self.socket, "job": self.job, "rank": self.rank, "world": self.world,
            "batch": self.batch, "epochs": self.epochs, "start": self.start,
            "offset": self.offset, "log": self.log,
            "hold_after": self.hold_after, "gate": self.gate, "stop_after": self.stop_after,
        })
        .to_string()
    }

    /// Orders from [`RankOrders::to_json`]'s text.
    pub fn from_json(text: &str) -> RankOrders {
        let v: Value = serde_json::from_str(text).unwrap();
        let path = |k: &str| PathBuf::from(v[k].as_str().unwrap());
        let num = |k: &str| v[k].as_u64().unwrap();
        RankOrders {
            socket: path("socket"),
            job: v["job"].as_str().unwrap().to_owned(),
            rank: num("rank") as u32,
            world: num("world") as u32,
            batch: num("batch") as u32,
            epochs: num("epochs") as u32,
            start: serde_json::from_value(v["start"].clone()).unwrap(),
            offset: serde_json::from_value(v["offset"].clone()).unwrap(),
            log: path("log"),
            hold_after: v["hold_after"].as_u64(),
            gate: path("gate"),
            stop_after: v["stop_after"].as_u64(),
        }
    }

    /// What the rank attaches with.
    pub fn options(&self) -> AttachOptions {
        AttachOptions {
            rank: self.rank,
            world_size: self.world,
            seed: SEED,
            start: self.start,
            offset: self.offset,
            // A restarting host takes a few seconds at most; the test bounds the whole run.
            connect_timeout: PATIENCE,
            ..AttachOptions::new(&self.job, DATASET, spec(self.batch, self.epochs))
        }
    }
}

/// Polls `done` (a file appearing, a log growing) until it holds, for at most [`PATIENCE`].
pub fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
