//! How many batched decodes each CUDA stream has had pending at once, for tests: a worker that
//! keeps two batches in flight has its next batch's decode enqueued while the last one's is
//! still waiting for the stream; one that synchronises its stream first never has more than
//! one. Not an nvJPEG rule: the emulator's own record, like the decoded images' paths.
//!
//! # Design
//! - The count per stream rises at a batched call that enqueues and falls when the stream has
//!   run that decode; the most seen on any one stream is written to
//!   `$STOKER_EMU_STATS_DIR/<pid>.nvjpeg.json` (`batched_pending_on_one_stream_max`) whenever
//!   it grows, beside the emulated driver's `<pid>.json`.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Mutex;

struct Counts {
    /// Pending batched decodes per stream (its address).
    now: BTreeMap<usize, usize>,
    /// The most on one stream so far.
    max: usize,
}

static COUNTS: Mutex<Counts> = Mutex::new(Counts {
    now: BTreeMap::new(),
    max: 0,
});

fn counts() -> std::sync::MutexGuard<'static, Counts> {
    COUNTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A batched decode was enqueued on `stream`.
pub(crate) fn enqueued(stream: usize) {
    let mut c = counts();
    let n = c.now.entry(stream).or_insert(0);
    *n += 1;
    let n = *n;
    if n > c.max {
        c.max = n;
        write(n);
    }
}

/// `stream` has run one of its batched decodes (or the enqueue failed).
pub(crate) fn ran(stream: usize) {
    if let Some(n) = counts().now.get_mut(&stream) {
        *n = n.saturating_sub(1);
    }
}

fn write(max: usize) {
    let Some(dir) = std::env::var_os("STOKER_EMU_STATS_DIR").filter(|d| !d.is_empty()) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let pid = std::process::id();
    let json = format!("{{\"pid\": {pid}, \"batched_pending_on_one_stream_max\": {max}}}\n");
    let tmp = dir.join(format!(".{pid}.nvjpeg.json.tmp"));
    let done = std::fs::File::create(&tmp).and_then(|mut f| f.write_all(json.as_bytes()));
    if done.is_ok() {
        let _ = std::fs::rename(&tmp, dir.join(format!("{pid}.nvjpeg.json")));
    }
}
