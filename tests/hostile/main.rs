//! Hostile input: a hostile filesystem (FIFOs, symlink loops, shards replaced by rename),
//! hostile data (the edge corpus, oversized files, ICC segments after the frame header) and
//! hostile bytes on the socket (malformed messages, forged log lines, connection floods).
//! Real `stokerd` processes, real clients, real files.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod data;
mod files;
mod floods;

use edge_manifest::Expected;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use stoker::protocol::{Attach, ErrorCode, Message, Release, MAX_MESSAGE_BYTES};
use stoker::socket::SeqPacket;
use stoker::{AttachOptions, Client, PipelineSpec, SampleStatus};
use stoker_pipeline::engine::{
    Engine, EngineConfig, FeedEvent, HeapRing, Job, Position, SlotMemory,
};
use stoker_pipeline::source::index::{Dataset, OpenOptions};
use stoker_pipeline::transform::decode::Limits;
use stoker_testkit::attach::{rank_options, u8_spec as spec};
use stoker_testkit::batches::{drain, got, write_config, Got};
use stoker_testkit::{edge_manifest, encode_jpeg, read_log, synthetic_rgb, write_jpeg, Daemon};
use stoker_tool::pack::TarWriter;

fn options(data: &str, job: &str, spec: PipelineSpec) -> AttachOptions {
    rank_options(data, job, (0, 1), 7, spec)
}

/// Runs `f` on its own thread and returns its result, failing the test when it has none
/// within `limit`: the bugs these tests catch show as a client blocked for good.
fn within<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: blocked for {limit:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked (see above)"),
    }
}
