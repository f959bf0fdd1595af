//! A unit done on a worker exactly as the home's local CPU backend would do it, and the
//! datasets a worker agrees to open.
//!
//! # Design
//! - A job is opened per connection: the dataset is resolved by the worker's own rules
//!   ([`DatasetRules`]), opened once per worker process and shared, and checked against the
//!   home's [`fingerprint`]. A dataset that differs from the home's is read again (it may have
//!   changed since the worker opened it), at most once per [`REREAD_INTERVAL`], and at most
//!   [`MAX_OPEN_DATASETS`] are kept (the least recently used go; jobs keep theirs). The job gets its own [`CpuBackend`] made with the home's decode
//!   limits (which must not exceed the worker's own), so every outcome is the local one.
//! - A unit is filled by [`CpuBackend::fill`] into the job's buffer; each bad sample is then
//!   settled as the engine settles it: under `skip`, the first of
//!   [`replacement_candidates`] that fills, else zeroed and failed.
//!
//! # Limitations
//! - The dataset must be at the same path on the worker as on the home daemon (a shared
//!   filesystem, the same mount in every pod, or `s3://`).

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ring::digest;
use stoker_wire::ring::SlotLayout;

use super::wire::{hex, OpenJob, SampleFate, SampleResult};
use crate::serve::access::{
    AccessError, AccessPolicy, Admission, OpenDatasetError, Peer, UnknownGroup,
};
use crate::serve::config::AccessConfig;
use stoker_pipeline::engine::{
    replacement_candidates, Backend, BadSamplePolicy, CpuBackend, EngineConfig, Job, PipelineError,
    Position, SampleOutcome, SampleWork, SlotImages, StageStats, UnitWork,
};
use stoker_pipeline::source::index::{Dataset, OpenOptions};
use stoker_pipeline::source::local::fsopen::OpenPolicy;
use stoker_pipeline::source::object::S3Url;
use stoker_pipeline::sync::lock;

/// The owner of the jobs a worker runs for home daemons: `(uid_t)-1`, which no process can
/// have, so their decodes keep their own entry points (`CpuDecoder::set_entry_scope`), apart
/// from every local uid's (root's included). Homes share it: they all hold the worker's
/// secret.
pub(crate) const REMOTE_OWNER: u32 = u32::MAX;

/// Most samples in one unit a worker takes.
pub(crate) const MAX_UNIT_SAMPLES: usize = 256;

/// A dataset whose fingerprint differs from a home's is read again at most this often (a
/// home with another dataset at the same path must not make the worker re-index it per open).
pub(crate) const REREAD_INTERVAL: Duration = Duration::from_secs(10);

/// Datasets a worker keeps opened (their indexes) for the next jobs.
pub(crate) const MAX_OPEN_DATASETS: usize = 8;

/// A digest of what a dataset's index numbers: each sample's file (relative to the
/// dataset's root), offset, length and label, in order. Home and worker must agree on it.
pub fn fingerprint(dataset: &Dataset) -> String {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(&(dataset.len() as u64).to_le_bytes());
    let root = dataset.root();
    for i in 0..dataset.len() {
        let s = dataset.sample(i);
        let rel = s.path.strip_prefix(root).unwrap_or(s.path);
        ctx.update(rel.as_os_str().as_encoded_bytes());
        ctx.update(&[0]);
        ctx.update(&s.offset.to_le_bytes());
        ctx.update(&s.len.to_le_bytes());
        ctx.update(&s.label.to_le_bytes());
    }
    hex(ctx.finish().as_ref())
}

/// Which datasets home daemons may name on this worker: registered ones (by their path),
/// paths under `[access] dataset_roots` (checked as for local clients, symlinks included),
/// and `s3://` URLs under `[worker] s3_prefixes`. Nothing else, whatever the home says.
pub(crate) struct DatasetRules {
    policy: AccessPolicy,
    registered: BTreeMap<String, PathBuf>,
    has_roots: bool,
    s3_prefixes: Vec<String>,
    open: OpenOptions,
    /// Datasets opened, by path, with their fingerprint and how their files are read.
    opened: Mutex<Shelf>,
}

struct Opened {
    dataset: Arc<Dataset>,
    fingerprint: String,
    policy: OpenPolicy,
}

/// The datasets kept opened, by the path homes name them by.
#[derive(Default)]
struct Shelf {
    entries: HashMap<String, Kept>,
    /// Counts uses, for the least recently used.
    tick: u64,
}

struct Kept {
    opened: Arc<Opened>,
    used: u64,
    /// When a home's differing fingerprint last had it read again: set before the reading, so
    /// opens meanwhile (and failed readings) wait out [`REREAD_INTERVAL`] instead of reading.
    reread: Option<Instant>,
}

impl Shelf {
    /// The entry for `path`, marked used.
    fn get(&mut self, path: &str) -> Option<&mut Kept> {
        self.tick += 1;
        let tick = self.tick;
        let kept = self.entries.get_mut(path)?;
        kept.used = tick;
        Some(kept)
    }

    /// Keeps `opened` for `path`: in place of `replaces` (a reading it followed), or where
    /// nothing is kept; an entry another thread put meanwhile stays. Then lets the least
    /// recently used entries that no job holds go, past [`MAX_OPEN_DATASETS`] (one a job holds
    /// would free nothing, and the next open would index it a second time).
    fn put(&mut self, path: &str, opened: Arc<Opened>, replaces: Option<&Arc<Opened>>) {
        self.tick += 1;
        let used = self.tick;
        match self.entries.get_mut(path) {
            Some(k) if replaces.is_some_and(|r| Arc::ptr_eq(r, &k.opened)) => {
                k.opened = opened;
                k.used = used;
            }
            Some(_) => {}
            None => {
                let reread = replaces.map(|_| Instant::now());
                self.entries.insert(
                    path.to_owned(),
                    Kept {
                        opened,
                        used,
                        reread,
                    },
                );
            }
        }
        while self.entries.len() > MAX_OPEN_DATASETS {
            let unused = self
                .entries
                .iter()
                .filter(|(p, k)| p.as_str() != path && Arc::strong_count(&k.opened.dataset) == 1)
                .min_by_key(|(_, k)| k.used)
                .map(|(p, _)| p.clone());
            let Some(oldest) = unused else {
                break;
            };
            self.entries.remove(&oldest);
        }
    }
}

/// Why a worker will not open a job; the text is the reason the home is sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JobRefusal {
    /// The spec has several views; a unit's answer holds one image per sample.
    #[error("a spec of {0} views: workers decode one view per sample")]
    Views(usize),
    /// The home decodes under higher limits than this worker's.
    #[error(
        "the home's decode limits ({home_pixels} pixels, {home_bytes} bytes) exceed this \
         worker's ({own_pixels}, {own_bytes}): samples it decodes could not be decoded here"
    )]
    Limits {
        home_pixels: u64,
        home_bytes: u64,
        own_pixels: u64,
        own_bytes: u64,
    },
    /// An `s3://` URL neither registered nor under `worker.s3_prefixes`.
    #[error(
        "{path:?} is not a registered dataset of this worker nor under its \
         worker.s3_prefixes {prefixes:?}"
    )]
    NotUnderPrefixes { path: String, prefixes: Vec<String> },
    /// A path not registered, on a worker with no `access.dataset_roots`.
    #[error(
        "{path:?} is not a registered dataset of this worker, and it has no \
         access.dataset_roots"
    )]
    NoRoots { path: String },
    /// The worker's access rules refuse the path.
    #[error("{0}")]
    Access(#[from] AccessError),
    /// The dataset could not be opened or indexed.
    #[error("{0}")]
    Open(#[from] OpenDatasetError),
    /// The worker's index of the dataset is not the home's (its fingerprint differs).
    #[error("dataset {0:?} differs here: its index numbers other files than the home's")]
    Differs(String),
    /// The engine would not make the job or its CPU backend.
    #[error("{0}")]
    Pipeline(#[from] PipelineError),
}

/// Why a worker will not do a unit; the text is the reason the home is sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnitRefusal {
    /// An index at or past the dataset's length.
    #[error("sample {index} is past the dataset's {len}")]
    PastEnd { index: u64, len: u64 },
    /// No sample, or more than `MAX_UNIT_SAMPLES`.
    #[error("{0} samples: a unit has 1 to {MAX_UNIT_SAMPLES}")]
    Count(usize),
}

impl DatasetRules {
    pub(crate) fn new(
        roots: &[PathBuf],
        registered: &BTreeMap<String, PathBuf>,
        s3_prefixes: &[String],
        open: OpenOptions,
    ) -> Result<DatasetRules, UnknownGroup> {
        let access = AccessConfig {
            dataset_roots: roots.to_vec(),
            ..AccessConfig::default()
        };
        let policy = AccessPolicy::new(&access, registered)?;
        Ok(DatasetRules {
            policy,
            registered: registered.clone(),
            has_roots: !roots.is_empty(),
            s3_prefixes: s3_prefixes.to_vec(),
            open,
            opened: Mutex::default(),
        })
    }

    /// The dataset at `path` with its fingerprint, or why this worker will not open it. One
    /// kept whose fingerprint is not `want` is read again (see [`REREAD_INTERVAL`]). Kept
    /// datasets are found by what `path` resolves to ([`DatasetRules::admit`]), not by its
    /// spelling: `/d//data` and `/d/data/` are one dataset, one index.
    fn open(&self, path: &str, want: &str) -> Result<Arc<Opened>, JobRefusal> {
        let (admission, key) = self.admit(path)?;
        let kept = lock(&self.opened).get(&key).map(|k| {
            let stale = k.opened.fingerprint != want
                && k.reread.is_none_or(|t| t.elapsed() >= REREAD_INTERVAL);
            if stale {
                k.reread = Some(Instant::now());
            }
            (Arc::clone(&k.opened), stale)
        });
        match kept {
            Some((opened, false)) => Ok(opened),
            Some((old, true)) => {
                let opened = self.read(&admission)?;
                tracing::info!(
                    dataset = path,
                    same = opened.fingerprint == want,
                    "worker read the dataset again: a home's index of it differed"
                );
                lock(&self.opened).put(&key, Arc::clone(&opened), Some(&old));
                Ok(opened)
            }
            None => {
                let opened = self.read(&admission)?;
                lock(&self.opened).put(&key, Arc::clone(&opened), None);
                Ok(opened)
            }
        }
    }

    /// What the worker's rules make of `path`: the admission (the path resolved: canonical
    /// under the roots, a registered dataset's path, a URL normalised), and the key it is
    /// kept under: that path and, for a local one, its file identity (device and inode), so
    /// a folder replaced under the same path is another dataset.
    fn admit(&self, path: &str) -> Result<(Admission, String), JobRefusal> {
        // A registered dataset is named by its name to the access rules (trusted as
        // configured); anything else must pass them as a path.
        let name = self
            .registered
            .iter()
            .find(|(_, p)| Path::new(path) == p.as_path())
            .map(|(n, _)| n.clone());
        let is_url = stoker_pipeline::source::url::is_url(Path::new(path));
        if name.is_none() && is_url && !self.s3_prefixes.iter().any(|p| under_prefix(path, p)) {
            return Err(JobRefusal::NotUnderPrefixes {
                path: path.to_owned(),
                prefixes: self.s3_prefixes.clone(),
            });
        }
        if name.is_none() && !is_url && !self.has_roots {
            return Err(JobRefusal::NoRoots {
                path: path.to_owned(),
            });
        }
        let me = Peer {
            pid: 0,
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            groups: Vec::new(),
        };
        let admission = self.policy.admit(&me, name.as_deref().unwrap_or(path))?;
        let key = match S3Url::parse(&admission.path) {
            Some(Ok(url)) => url.as_string(),
            _ => {
                use std::os::unix::fs::MetadataExt;
                let at = &admission.path;
                let id = std::fs::metadata(at).map_or((0, 0), |m| (m.dev(), m.ino()));
                format!("{} (device {}, inode {})", at.display(), id.0, id.1)
            }
        };
        Ok((admission, key))
    }

    /// Opens the dataset `admission` resolved under this worker's rules.
    fn read(&self, admission: &Admission) -> Result<Arc<Opened>, JobRefusal> {
        let dataset = admission.open(&self.open)?;
        Ok(Arc::new(Opened {
            fingerprint: fingerprint(&dataset),
            dataset: Arc::new(dataset),
            policy: admission.policy.clone(),
        }))
    }
}

/// Whether `url` is `prefix` or below it (at a `/`), with no `.`, `..` or empty component
/// below it that a server or HTTP client could read as a step elsewhere. (The listing of
/// `url` is of `url/`, so `s3://b/data` never holds `s3://b/data2/...`:
/// `stoker_pipeline::source::object::index`.)
fn under_prefix(url: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    let Some(rest) = url.strip_prefix(prefix) else {
        return false;
    };
    let Some(below) = rest.strip_prefix('/') else {
        return rest.is_empty();
    };
    let below = below.strip_suffix('/').unwrap_or(below);
    below.is_empty() || below.split('/').all(|c| !matches!(c, "" | "." | ".."))
}

/// One job opened on a connection: its engine job, limits and backend.
pub(crate) struct WorkerJob {
    job: Arc<Job>,
    config: EngineConfig,
    backend: CpuBackend,
    stats: StageStats,
    buf: Vec<u8>,
    outcomes: Vec<SampleOutcome>,
}

impl WorkerJob {
    /// Opens what `open` asks for, within `rules` and this worker's `own` limits.
    pub(crate) fn open(
        open: &OpenJob,
        rules: &DatasetRules,
        own: &EngineConfig,
    ) -> Result<Self, JobRefusal> {
        // A unit's answer is one image per sample (`run` sizes its buffer so): the home decodes
        // jobs of several views itself and never sends them.
        if open.spec.view_count() > 1 {
            return Err(JobRefusal::Views(open.spec.view_count()));
        }
        if open.max_pixels > own.limits.max_pixels
            || open.max_file_bytes > own.limits.max_file_bytes
        {
            return Err(JobRefusal::Limits {
                home_pixels: open.max_pixels,
                home_bytes: open.max_file_bytes,
                own_pixels: own.limits.max_pixels,
                own_bytes: own.limits.max_file_bytes,
            });
        }
        let opened = rules.open(&open.dataset, &open.fingerprint)?;
        if opened.fingerprint != open.fingerprint {
            return Err(JobRefusal::Differs(open.dataset.clone()));
        }
        let job = Job::with_policy(
            Arc::clone(&opened.dataset),
            open.spec.clone(),
            open.seed,
            1,
            None,
            opened.policy.clone(),
            REMOTE_OWNER,
        )?;
        let mut config = own.clone();
        config.limits.max_pixels = open.max_pixels;
        config.limits.max_file_bytes = open.max_file_bytes;
        config.policy = open.policy;
        config.throttle = None;
        let backend = CpuBackend::new(&config)?;
        Ok(WorkerJob {
            job,
            config,
            backend,
            stats: StageStats::default(),
            buf: Vec::new(),
            outcomes: Vec::new(),
        })
    }

    /// The bytes this job holds for its peer: its buffer now, and its dataset's index.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.buffer_bytes() + self.index_bytes()
    }

    /// The bytes this job's pixel buffer holds now.
    pub(crate) fn buffer_bytes(&self) -> u64 {
        self.buf.capacity() as u64
    }

    /// The bytes its dataset's index holds in memory (counted for the peer that opened the
    /// job, as its pixel buffer is).
    pub(crate) fn index_bytes(&self) -> u64 {
        self.job.dataset.index_bytes()
    }

    /// The bytes a unit of `samples` samples needs.
    pub(crate) fn unit_bytes(&self, samples: usize) -> u64 {
        (samples as u64).saturating_mul(self.job.spec.image_bytes() as u64)
    }

    /// Why the unit may not be done (an index past the dataset), if so.
    pub(crate) fn check(&self, indices: &[u64]) -> Result<(), UnitRefusal> {
        let len = self.job.dataset.len() as u64;
        match indices.iter().find(|&&i| i >= len) {
            Some(&index) => Err(UnitRefusal::PastEnd { index, len }),
            None if indices.is_empty() || indices.len() > MAX_UNIT_SAMPLES => {
                Err(UnitRefusal::Count(indices.len()))
            }
            None => Ok(()),
        }
    }

    /// Fills samples `indices` of `epoch` as the local CPU backend and engine would: their
    /// fates, and their images one after another.
    pub(crate) fn run(&mut self, epoch: u64, indices: &[u64]) -> (Vec<SampleResult>, &[u8]) {
        let n = indices.len();
        self.buf.clear();
        // Exactly the unit's bytes: the worker counts them against its peer's memory cap.
        self.buf.reserve_exact(n * self.job.spec.image_bytes());
        self.buf.resize(n * self.job.spec.image_bytes(), 0);
        let layout = SlotLayout {
            batch_size: n,
            ..SlotLayout::new(&self.job.spec)
        };
        let images = SlotImages::Host(self.buf.as_mut_ptr());
        let pos = Position { epoch, step: 0 };
        let unit = UnitWork {
            job: &self.job,
            pos,
            start: 0,
            indices,
            images,
            layout,
            config: &self.config,
            stats: &self.stats,
            due: None,
        };
        self.outcomes.clear();
        // The CPU backend completes on return.
        let _ = self.backend.fill(&unit, &mut self.outcomes);
        let outcomes = std::mem::take(&mut self.outcomes);
        let results = outcomes
            .iter()
            .enumerate()
            .map(|(at, outcome)| match outcome {
                Ok(()) => SampleResult {
                    status: SampleFate::Ok,
                    delivered: indices[at],
                    bad: None,
                },
                Err(bad) => {
                    let (status, delivered) = self.settle(pos, at, indices[at], images, layout);
                    SampleResult {
                        status,
                        delivered,
                        bad: Some((bad.reason.to_owned(), bad.detail.clone())),
                    }
                }
            })
            .collect();
        self.outcomes = outcomes;
        (results, &self.buf)
    }

    /// The engine's policy for the bad sample `bad` at `at`: its fate and what is in its place.
    fn settle(
        &mut self,
        pos: Position,
        at: usize,
        bad: u64,
        images: SlotImages,
        layout: SlotLayout,
    ) -> (SampleFate, u64) {
        if self.config.policy == BadSamplePolicy::Skip {
            let len = self.job.dataset.len() as u64;
            for other in replacement_candidates(self.job.seed, pos.epoch, bad, len) {
                let work = SampleWork {
                    job: &self.job,
                    pos,
                    index: other,
                    at,
                    images,
                    layout,
                    config: &self.config,
                    stats: &self.stats,
                    due: None,
                };
                if self.backend.fill_sample(&work).is_ok() {
                    return (SampleFate::Replaced, other);
                }
            }
        }
        self.backend.clear_sample(images, &layout, at);
        (SampleFate::Failed, bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A home holding the secret that sends a spec of several views is refused before
    /// anything is opened (a unit's buffer holds one image per sample).
    #[test]
    fn a_spec_of_several_views_is_refused() {
        let mut spec = stoker_wire::PipelineSpec::train(4, 32);
        spec.extra_views.push(stoker_wire::spec::View {
            crop: spec.crop,
            flip_prob: 0.5,
            ops: Vec::new(),
            erasing: None,
        });
        let open = OpenJob {
            job: 1,
            dataset: "/nowhere".into(),
            fingerprint: String::new(),
            spec,
            seed: 1,
            policy: BadSamplePolicy::default(),
            max_pixels: 1,
            max_file_bytes: 1,
        };
        let rules = DatasetRules::new(&[], &BTreeMap::new(), &[], OpenOptions::default()).unwrap();
        let refused = WorkerJob::open(&open, &rules, &EngineConfig::default()).err();
        assert!(refused.is_some_and(|r| r.to_string().contains("2 views")));
    }

    #[test]
    fn an_s3_prefix_covers_itself_and_what_is_below_a_slash_only() {
        assert!(under_prefix("s3://b/data", "s3://b/data/"));
        assert!(under_prefix("s3://b/data/x", "s3://b/data"));
        assert!(!under_prefix("s3://b/database", "s3://b/data"));
        assert!(!under_prefix("s3://c/data", "s3://b/data"));
        assert!(!under_prefix("s3://b/data2/x", "s3://b/data/"));
        assert!(!under_prefix("s3://b/data/../data2", "s3://b/data"));
        assert!(!under_prefix("s3://b/data/./x", "s3://b/data"));
        assert!(!under_prefix("s3://b/data//x", "s3://b/data"));
        assert!(under_prefix("s3://b/data/x/", "s3://b/data"));
    }

    #[test]
    fn a_worker_keeps_the_last_datasets_it_used_and_rereads_a_differing_one_rarely() {
        let root = tempfile::tempdir().unwrap();
        let folders: Vec<String> = (0..MAX_OPEN_DATASETS + 2)
            .map(|i| {
                let dir = root.path().join(format!("d{i}"));
                std::fs::create_dir(&dir).unwrap();
                std::fs::write(dir.join("a.jpg"), b"bytes").unwrap();
                dir.to_str().unwrap().to_owned()
            })
            .collect();
        let opts = OpenOptions {
            use_cache: false,
            ..OpenOptions::default()
        };
        let rules =
            DatasetRules::new(&[root.path().to_owned()], &BTreeMap::new(), &[], opts).unwrap();
        let mut first = Vec::new();
        for f in &folders[..MAX_OPEN_DATASETS] {
            first.push(rules.open(f, "").unwrap());
        }
        // d0 used again (its fingerprint matches: kept as it is), then two more datasets: d1
        // and d2, the least recently used, go.
        let d0 = rules.open(&folders[0], &first[0].fingerprint).unwrap();
        assert!(Arc::ptr_eq(&first[0], &d0));
        // A job holds d1: letting it go would free nothing, so d2 and d3 go.
        let job = Arc::clone(&first[1].dataset);
        for f in &folders[MAX_OPEN_DATASETS..] {
            rules.open(f, "").unwrap();
        }
        let key = |f: &String| rules.admit(f).unwrap().1;
        let keys: Vec<String> = folders.iter().map(key).collect();
        let shelf = lock(&rules.opened);
        assert_eq!(shelf.entries.len(), MAX_OPEN_DATASETS);
        assert!(shelf.entries.contains_key(&keys[0]));
        assert!(shelf.entries.contains_key(&keys[1]));
        assert!(!shelf.entries.contains_key(&keys[2]));
        assert!(!shelf.entries.contains_key(&keys[3]));
        drop((shelf, job));
        // A fingerprint that differs reads d0 again once, then not within the interval.
        let again = rules.open(&folders[0], "other").unwrap();
        assert!(!Arc::ptr_eq(&d0, &again));
        assert!(lock(&rules.opened).entries[&keys[0]].reread.is_some());
        let kept = rules.open(&folders[0], "other").unwrap();
        assert!(Arc::ptr_eq(&again, &kept));
    }

    #[test]
    fn opens_at_once_with_a_differing_fingerprint_read_the_dataset_again_once() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("a.jpg"), b"bytes").unwrap();
        let path = dir.to_str().unwrap();
        let rules = DatasetRules::new(
            &[root.path().to_owned()],
            &BTreeMap::new(),
            &[],
            OpenOptions {
                use_cache: false,
                ..OpenOptions::default()
            },
        )
        .unwrap();
        let old = rules.open(path, "").unwrap();
        let key = rules.admit(path).unwrap().1;
        for _ in 0..20 {
            lock(&rules.opened).entries.get_mut(&key).unwrap().reread = None;
            let before = rules.open(path, &old.fingerprint).unwrap();
            let barrier = std::sync::Barrier::new(2);
            let (a, b) = std::thread::scope(|s| {
                let open = || {
                    barrier.wait();
                    rules.open(path, "other").unwrap()
                };
                let a = s.spawn(open);
                let b = s.spawn(open);
                (a.join().unwrap(), b.join().unwrap())
            });
            // One reading at most: the other open got the kept entry, old or new.
            let both_read =
                !Arc::ptr_eq(&a, &before) && !Arc::ptr_eq(&b, &before) && !Arc::ptr_eq(&a, &b);
            assert!(!both_read, "both opens read the dataset");
        }
    }
}
