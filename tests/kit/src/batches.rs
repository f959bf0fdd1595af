//! Batches reduced to what identifies them, for comparing runs, processes and daemons.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use stoker::{Batch, Client};

use crate::device_batches::HostBatch;
use crate::fnv1a;

/// One received batch: where it sits in the job, a hash of everything in it (images, labels,
/// indices, status), its indices and statuses.
#[derive(Debug, Clone, PartialEq)]
pub struct Got {
    /// The epoch the batch belongs to.
    pub epoch: u64,
    /// Its step within the epoch.
    pub step: u64,
    /// FNV-1a ([`fnv1a`]) over its images, labels, indices and statuses.
    pub hash: u64,
    /// The dataset index of each sample.
    pub indices: Vec<u64>,
    /// Each sample's `SampleStatus` as its byte.
    pub status: Vec<u8>,
}

/// Reduces a batch to a [`Got`].
pub fn got(b: &Batch) -> Got {
    let labels: Vec<u8> = b.labels().iter().flat_map(|l| l.to_le_bytes()).collect();
    let indices: Vec<u8> = b.indices().iter().flat_map(|i| i.to_le_bytes()).collect();
    Got {
        epoch: b.epoch(),
        step: b.step(),
        hash: fnv1a(&[b.images(), &labels, &indices, b.status()]),
        indices: b.indices().to_vec(),
        status: b.status().to_vec(),
    }
}

/// Every batch left in the client's job, reduced; panics on a client error.
pub fn drain(c: &mut Client) -> Vec<Got> {
    let mut out = Vec::new();
    while let Some(b) = c.next_batch().unwrap() {
        out.push(got(&b));
    }
    out
}

/// Every batch left in the client's job, copied; panics on a client error.
pub fn drain_copies(c: &mut Client) -> Vec<HostBatch> {
    let mut out = Vec::new();
    while let Some(b) = c.next_batch().unwrap() {
        out.push(HostBatch::of(&b));
    }
    out
}

/// As [`drain_copies`], asserting that every sample of every batch is Ok.
pub fn drain_ok(c: &mut Client) -> Vec<HostBatch> {
    let out = drain_copies(c);
    for b in &out {
        assert!(
            b.all_ok(),
            "a sample failed in epoch {} step {}",
            b.epoch,
            b.step
        );
    }
    out
}

/// Writes `text` as `dir/stoker.toml` and returns its path.
pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("stoker.toml");
    std::fs::write(&path, text).unwrap();
    path
}
