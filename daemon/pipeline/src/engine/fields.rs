//! Filling a unit's fields: the per-sample members a spec asks for (`PipelineSpec::fields`),
//! read byte-exact into the slot's field regions beside the images.
//!
//! # Design
//! - Backend-agnostic, run by the worker once a unit's outcomes are settled, so the fields are
//!   those of the sample actually delivered at each position (a replacement's own, never the
//!   bad sample's) and a resumed job gets the same ones (they follow the delivered index).
//! - One batched read per unit for every field that fits, with the job's open rules (the
//!   client's credentials), through the dataset's storage (local or object) like the images.
//! - A field is a per-(sample, field) outcome, never the batch's: missing, over the spec's
//!   `field_max_bytes` (its bytes are not even read) or unreadable is written as that field's
//!   [`FieldStatus`], the image is still served, and the client names the sample and reason.
//!
//! # Limitations
//! - Fields are read after the images, not in the images' read; a shard's members of one key
//!   usually lie side by side, so a merged read would save a request per sample.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use stoker_wire::ring::FieldStatus;

use super::job::Job;
use super::memory::HostWriter;
use super::stats::StageStats;
use super::{EngineConfig, CPU_UNIT_SAMPLES};
use crate::source::local::reader::{ReadError, ReadRequest, Reader};
use crate::transform::badsample::{BadSample, BadSampleLog};

/// Why one sample's field could not be read (its status then says `Unreadable` and the log
/// names it).
#[derive(Debug, thiserror::Error)]
enum FieldReadError {
    /// The worker has no reader for fields (io_uring and pread setup both failed).
    #[error("cannot make a reader for fields: {0}")]
    NoReader(Arc<ReadError>),
    /// The read failed.
    #[error("{0}")]
    Read(ReadError),
}

/// One worker's reader and buffers for fields, the reader made when a job first asks.
#[derive(Default)]
pub(super) struct FieldFiller {
    reader: Option<Reader>,
    bufs: Vec<Vec<u8>>,
}

/// The unit whose fields are filled: positions `start..start + delivered.len()`.
pub(super) struct FieldUnit<'a> {
    pub(super) job: &'a Job,
    pub(super) start: usize,
    /// The global index of the sample delivered at each position.
    pub(super) delivered: &'a [u64],
    pub(super) due: Option<Instant>,
    pub(super) config: &'a EngineConfig,
    pub(super) stats: &'a StageStats,
    pub(super) log: &'a BadSampleLog,
}

impl FieldUnit<'_> {
    /// Logs why field `name` of sample `index` is not served: once per (sample, field),
    /// rate-limited (the bad-sample log's rule); the client reads its own reason in the slot.
    fn note(&self, index: u64, name: &str, detail: String) {
        // Sample indices are below the dataset's length, a usize.
        #[allow(clippy::cast_possible_truncation)]
        let sample = self.job.dataset.display_name(index as usize);
        let bad = BadSample {
            reason: "field",
            detail,
        };
        self.log.log(&format!("{sample} (field {name})"), &bad);
    }
}

impl FieldFiller {
    /// Writes every field the spec asks for of every position of `unit`.
    pub(super) fn fill(&mut self, unit: &FieldUnit<'_>, host: &mut HostWriter<'_>) {
        let names = &unit.job.spec.fields;
        if names.is_empty() {
            return;
        }
        let max = unit.job.spec.field_max_bytes;
        let ds = &unit.job.dataset;
        // (position, field, request) of each field to read.
        let mut wanted: Vec<(usize, usize, ReadRequest<'_>)> = Vec::new();
        for (k, &index) in unit.delivered.iter().enumerate() {
            let at = unit.start + k;
            // Sample indices are below the dataset's length, a usize.
            #[allow(clippy::cast_possible_truncation)]
            let i = index as usize;
            for (f, name) in names.iter().enumerate() {
                match ds.field(i, name) {
                    None => host.write_field(at, f, FieldStatus::Missing, 0, &[]),
                    Some(r) if r.len > u64::from(max) => {
                        let len = u32::try_from(r.len).unwrap_or(u32::MAX);
                        host.write_field(at, f, FieldStatus::TooLarge, len, &[]);
                        let why = format!("{} bytes, over the spec's field_max_bytes {max}", r.len);
                        unit.note(index, name, why);
                    }
                    Some(r) => wanted.push((at, f, ds.field_source(i, r).request())),
                }
            }
        }
        if wanted.is_empty() {
            return;
        }
        let reqs: Vec<ReadRequest<'_>> = wanted.iter().map(|w| w.2).collect();
        let results = self.read(unit, &reqs);
        for (((at, f, _), result), bytes) in wanted.iter().zip(results).zip(&self.bufs) {
            match result {
                Ok(()) => {
                    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
                    let read = &unit.stats.bytes_read;
                    read.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    host.write_field(*at, *f, FieldStatus::Ok, len, bytes);
                }
                Err(why) => {
                    host.write_field(*at, *f, FieldStatus::Unreadable, 0, &[]);
                    unit.note(unit.delivered[at - unit.start], &names[*f], why.to_string());
                }
            }
        }
    }

    /// Reads `reqs` into `bufs` with the worker's field reader (made on first use) under the
    /// job's open rules; one result per request.
    fn read(
        &mut self,
        unit: &FieldUnit<'_>,
        reqs: &[ReadRequest<'_>],
    ) -> Vec<Result<(), FieldReadError>> {
        if self.reader.is_none() {
            match Reader::new(unit.config.reader, CPU_UNIT_SAMPLES) {
                Ok(r) => self.reader = Some(r),
                Err(e) => {
                    let e = Arc::new(e);
                    return (0..reqs.len())
                        .map(|_| Err(FieldReadError::NoReader(e.clone())))
                        .collect();
                }
            }
        }
        let Some(reader) = self.reader.as_mut() else {
            unreachable!("made above");
        };
        reader.set_rules(&unit.job.rules);
        if self.bufs.len() < reqs.len() {
            self.bufs.resize_with(reqs.len(), Vec::new);
        }
        let bufs = &mut self.bufs[..reqs.len()];
        crate::source::read_batch(&unit.job.dataset, reader, reqs, bufs, unit.due)
            .into_iter()
            .map(|r| r.map_err(FieldReadError::Read))
            .collect()
    }
}
