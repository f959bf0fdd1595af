//! The job registry: job key -> job, the terms every rank of a job must agree on, and each
//! rank's seat.
//!
//! # Design
//! - Jobs belong to the uid that created them: a job is keyed by its owner and the key its
//!   ranks name ([`JobKey`]), so another uid's attach under the same key (torchrun's
//!   predictable `ADDR:PORT/dataset`) makes a job of its own instead of joining, taking a
//!   rank's share or locking the real rank out. Refusing it instead would let anyone who
//!   guesses a key first lock its owner out.
//! - The first rank of a job creates it (opening the dataset); a later rank whose terms differ
//!   is refused naming the field; a rank attached twice is refused. Dropping a [`RankSeat`]
//!   frees the rank, and the job with its last rank.
//!
//! - Jobs of one owner on one dataset share one index: a new job's freshly opened index that
//!   equals a live job's (same admission: resolved path, credentials and roots; the same
//!   samples from the same files, `Dataset::same_index`) is dropped for that job's `Arc`
//!   ([`Registry::shared_index`]), so its memory counts once; a changed dataset is a new
//!   index. Other owners get their own (their open is checked against their permissions).
//!
//! # Limitations
//! - A job still opens (indexes, lists) its dataset before it can share: the copy is dropped
//!   at once, but a listing's time and its transient memory are spent per job.
//! - The first rank of a job indexes its dataset outside the registry lock (status and other
//!   attaches go on); two first ranks of one job arriving together both index, and the later
//!   one joins the job the earlier one made.

#![forbid(unsafe_code)]

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};

use stoker_wire::protocol::{Attach, EpochOffset, ErrorCode};
use stoker_wire::spec::PipelineSpec;

use crate::serve::access::{AccessPolicy, Admission, OpenDatasetError};
use stoker_pipeline::engine::{Job, PipelineError};
use stoker_pipeline::source::index::{Asker, Dataset, DatasetError, OpenOptions, WalkLimits};
use stoker_pipeline::source::object::{ObjectStore, S3Config};

use super::key::JobKey;
use super::refusal::{refuse, Refusal};
/// What every rank of a job must agree on.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct JobTerms {
    pub(super) spec: PipelineSpec,
    pub(super) world_size: u32,
    pub(super) dataset: String,
    pub(super) seed: u64,
    /// The elastic resume point (an offset of 0 is none).
    pub(super) offset: Option<EpochOffset>,
}

impl JobTerms {
    pub(super) fn of(a: &Attach) -> JobTerms {
        JobTerms {
            spec: a.spec.clone(),
            world_size: a.world_size,
            dataset: a.dataset.clone(),
            seed: a.seed,
            offset: a.offset.filter(|o| o.consumed > 0),
        }
    }

    /// The first field in which `other` differs, for a SPEC_MISMATCH refusal.
    pub(super) fn mismatch(&self, other: &JobTerms) -> Option<String> {
        if self.world_size != other.world_size {
            return Some(format!(
                "world_size {} differs from the job's {}",
                other.world_size, self.world_size
            ));
        }
        if self.dataset != other.dataset {
            return Some(format!(
                "dataset {:?} differs from the job's {:?}",
                other.dataset, self.dataset
            ));
        }
        if self.seed != other.seed {
            return Some(format!(
                "seed {} differs from the job's {}",
                other.seed, self.seed
            ));
        }
        if self.offset != other.offset {
            let show = |o: Option<EpochOffset>| o.map_or("none".to_owned(), |o| o.to_string());
            return Some(format!(
                "elastic offset ({}) differs from the job's ({})",
                show(other.offset),
                show(self.offset)
            ));
        }
        self.spec
            .first_difference(&other.spec)
            .map(|field| format!("spec field {field} differs from the job's"))
    }
}

pub(super) struct JobEntry {
    pub(super) terms: JobTerms,
    pub(super) job: Arc<Job>,
    pub(super) ranks: BTreeSet<u32>,
    /// Images delivered to this job's ranks.
    pub(super) delivered: Arc<AtomicU64>,
}

/// Job key → job, and the access rules (which SIGHUP may replace). Shared by every
/// connection.
pub(super) struct Registry {
    pub(super) jobs: Mutex<HashMap<JobKey, JobEntry>>,
    /// Jobs being made (their datasets indexed or listed), per owner uid: they count
    /// against the job limits as jobs do.
    pub(super) opening: Mutex<HashMap<u32, usize>>,
    pub(super) access: RwLock<AccessPolicy>,
    pub(super) max_jobs: usize,
    /// `limits.max_jobs_per_uid` (or its default, half of `max_jobs`).
    pub(super) max_jobs_per_uid: usize,
    pub(super) walk: WalkLimits,
    /// Object storage, handed to every dataset a job opens (a reload reconfigures it).
    pub(super) objects: Arc<ObjectStore>,
    /// The indexes live jobs hold, for the next job of the same owner on the same dataset.
    pub(super) indexes: Mutex<Vec<SharedIndex>>,
}

/// An index a live job holds, and what another job's must match to share it.
pub(super) struct SharedIndex {
    owner: u32,
    admission: Admission,
    dataset: Weak<Dataset>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            jobs: Mutex::default(),
            opening: Mutex::default(),
            access: RwLock::new(AccessPolicy::permissive_for_owner()),
            max_jobs: usize::MAX,
            max_jobs_per_uid: usize::MAX,
            walk: WalkLimits::default(),
            objects: ObjectStore::new(&S3Config::default(), &Default::default()),
            indexes: Mutex::default(),
        }
    }
}

/// A job of `uid` being made (its dataset opening), counted in [`Registry::opening`] while
/// this lives.
struct Opening<'r> {
    registry: &'r Registry,
    uid: u32,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        let mut opening = (self.registry.opening.lock()).unwrap_or_else(|e| e.into_inner());
        if let Some(n) = opening.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                opening.remove(&self.uid);
            }
        }
    }
}

/// A rank seated in the registry.
pub(super) struct Seated {
    pub(super) job: Arc<Job>,
    pub(super) seat: RankSeat,
    /// Ranks of the job attached now, this one included.
    pub(super) ranks_attached: u32,
    /// Whether this attach created the job.
    pub(super) created_job: bool,
}

/// One rank's place in the registry; dropping it frees the rank (and the job, if it was the
/// last rank).
pub(super) struct RankSeat {
    pub(super) registry: Arc<Registry>,
    pub(super) key: JobKey,
    pub(super) rank: u32,
    pub(super) delivered: Arc<AtomicU64>,
}

impl Drop for RankSeat {
    fn drop(&mut self) {
        let mut jobs = self.registry.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = jobs.get_mut(&self.key) {
            entry.ranks.remove(&self.rank);
            if entry.ranks.is_empty() {
                jobs.remove(&self.key);
                tracing::info!(job = %self.key, "job ended: no ranks attached");
            }
        }
    }
}

impl Registry {
    /// The access rules in force.
    pub(super) fn access(&self) -> std::sync::RwLockReadGuard<'_, AccessPolicy> {
        self.access.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses a new job of `key.owner` when that uid runs `limits.max_jobs_per_uid` jobs
    /// already, or when `limits.max_jobs` run in all; the refusal names the limit that bit.
    fn check_job_count(
        &self,
        jobs: &HashMap<JobKey, JobEntry>,
        key: &JobKey,
    ) -> Result<(), Refusal> {
        let uid = key.owner;
        let opening = self.opening.lock().unwrap_or_else(|e| e.into_inner());
        let (my_opening, all_opening) = (opening.get(&uid).copied().unwrap_or(0), {
            opening.values().sum::<usize>()
        });
        drop(opening);
        let mine = jobs.keys().filter(|k| k.owner == uid).count() + my_opening;
        if mine >= self.max_jobs_per_uid {
            return Err(refuse(
                ErrorCode::Quota,
                format!(
                    "job {:?}: uid {uid} runs {mine} jobs ({my_opening} of them opening their \
                     dataset), its limit (limits.max_jobs_per_uid) is {}",
                    key.name, self.max_jobs_per_uid
                ),
            ));
        }
        let all = jobs.len() + all_opening;
        if all < self.max_jobs {
            return Ok(());
        }
        Err(refuse(
            ErrorCode::Quota,
            format!(
                "job {:?}: {all} jobs are running or opening their dataset, the limit \
                 (limits.max_jobs) is {}",
                key.name, self.max_jobs
            ),
        ))
    }

    /// Counts a job of `uid` as opening its dataset until the guard returned goes.
    fn opening_for(&self, uid: u32) -> Opening<'_> {
        let mut opening = self.opening.lock().unwrap_or_else(|e| e.into_inner());
        *opening.entry(uid).or_default() += 1;
        Opening {
            registry: self,
            uid,
        }
    }

    /// Opens the dataset of a job's first rank as access `admitted` it and makes the job.
    fn create_job(
        &self,
        a: &Attach,
        peer_uid: u32,
        admitted: &Admission,
        offset: Option<EpochOffset>,
        asker: &Asker,
    ) -> Result<Arc<Job>, Refusal> {
        let opts = OpenOptions {
            limits: self.walk,
            objects: Some(self.objects.clone()),
            asker: Some(asker.clone()),
            owner: Some(peer_uid),
            ..OpenOptions::default()
        };
        let dataset = admitted.open(&opts).map_err(|e| match e {
            OpenDatasetError::Access(e) => Refusal::from(e),
            OpenDatasetError::Dataset(e) => self.dataset_refusal(a, peer_uid, &e),
        })?;
        let ds = self.shared_index(peer_uid, admitted, dataset);
        let (spec, policy) = (a.spec.clone(), admitted.policy.clone());
        let made = Job::with_policy(ds, spec, a.seed, a.world_size, offset, policy, peer_uid);
        made.map_err(|e| match e {
            PipelineError::Spec(e) => refuse(ErrorCode::InvalidSpec, e.to_string()),
            PipelineError::Sampler(e) => refuse(ErrorCode::InvalidSpec, e),
            e => refuse(ErrorCode::Internal, e.to_string()),
        })
    }

    /// The index a live job of `owner` holds for the same admission when `opened` is the same
    /// index ([`Dataset::same_index`]), else `opened`, kept for the next job.
    fn shared_index(&self, owner: u32, admitted: &Admission, opened: Dataset) -> Arc<Dataset> {
        let mut shelf = self.indexes.lock().unwrap_or_else(|e| e.into_inner());
        shelf.retain(|s| s.dataset.strong_count() > 0);
        let mine = |s: &SharedIndex| s.owner == owner && &s.admission == admitted;
        let live = shelf
            .iter()
            .filter(|s| mine(s))
            .find_map(|s| s.dataset.upgrade())
            .filter(|d| d.same_index(&opened));
        if let Some(dataset) = live {
            tracing::debug!(
                owner,
                bytes = dataset.index_bytes(),
                "job shares a live job's index"
            );
            return dataset;
        }
        let dataset = Arc::new(opened);
        shelf.retain(|s| !mine(s));
        shelf.push(SharedIndex {
            owner,
            admission: admitted.clone(),
            dataset: Arc::downgrade(&dataset),
        });
        dataset
    }

    /// Why a dataset could not be opened, as the client of `peer_uid` is told: an object
    /// storage error's body (on AWS it carries the access key id and the string to sign) only
    /// to the dataset's owners (root and the daemon's uid, who configured it); any other user
    /// gets the S3 code and the dataset's name, and the log keeps the whole error.
    fn dataset_refusal(&self, a: &Attach, peer_uid: u32, e: &DatasetError) -> Refusal {
        match e {
            DatasetError::Remote { code, .. } if !self.access().sees_every_job(peer_uid) => {
                tracing::warn!(dataset = %a.dataset, uid = peer_uid, error = %e, "object storage refused");
                refuse(
                    ErrorCode::UnknownDataset,
                    format!(
                        "dataset {:?}: S3 error {code} (the details are in the daemon's log)",
                        a.dataset
                    ),
                )
            }
            _ => refuse(ErrorCode::UnknownDataset, e.to_string()),
        }
    }

    /// Makes the job `a` names for its first rank, unless another first rank made it while
    /// this one indexed. Returns whether this call made it.
    fn create_if_absent<'r>(
        &'r self,
        key: &JobKey,
        a: &Attach,
        admitted: &Admission,
        terms: &JobTerms,
        asker: &Asker,
    ) -> Result<(MutexGuard<'r, HashMap<JobKey, JobEntry>>, bool), Refusal> {
        let lock = || self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let mut jobs = lock();
        if jobs.contains_key(key) {
            return Ok((jobs, false));
        }
        self.check_job_count(&jobs, key)?;
        // Indexing may take long (a large or hostile tree, a listing): not under the lock,
        // so status and other attaches go on meanwhile; it counts as a job of its owner.
        let opening = self.opening_for(key.owner);
        drop(jobs);
        let job = self.create_job(a, key.owner, admitted, terms.offset, asker);
        drop(opening);
        let job = job?;
        jobs = lock();
        // Another first rank of the same job may have made it meanwhile: join that one.
        if jobs.contains_key(key) {
            return Ok((jobs, false));
        }
        self.check_job_count(&jobs, key)?;
        tracing::info!(
            job = %a.job,
            owner = key.owner,
            dataset = %a.dataset,
            samples = job.dataset.len(),
            world_size = a.world_size,
            steps_per_epoch = job.steps_per_epoch(),
            offset = ?terms.offset,
            "job created"
        );
        let entry = JobEntry {
            terms: terms.clone(),
            job,
            ranks: BTreeSet::new(),
            delivered: Arc::default(),
        };
        jobs.insert(key.clone(), entry);
        Ok((jobs, true))
    }

    /// Checks an attach against the job it names, creating the job for its first rank (from
    /// the dataset access `admitted` for the peer `peer_uid`: its path, read under its
    /// policy; `asker` says when the client has gone, which stops a listing), and takes the
    /// rank's seat. Returns the job, the seat, how many ranks are now attached, and whether
    /// this attach created the job ([`Seated`]).
    pub(super) fn seat(
        self: &Arc<Self>,
        a: &Attach,
        admitted: &Admission,
        peer_uid: u32,
        asker: &Asker,
    ) -> Result<Seated, Refusal> {
        let terms = JobTerms::of(a);
        let key = JobKey::of(peer_uid, a);
        let (mut jobs, created) = self.create_if_absent(&key, a, admitted, &terms, asker)?;
        let entry = jobs.get(&key).expect("inserted or present above");
        if let Some(diff) = entry.terms.mismatch(&terms) {
            return Err(refuse(
                ErrorCode::SpecMismatch,
                format!("job {:?}, rank {}: {diff}", a.job, a.rank),
            ));
        }
        if entry.job.open_policy() != &admitted.policy {
            return Err(refuse(
                ErrorCode::PermissionDenied,
                format!(
                    "job {:?} reads its files with other credentials than uid {}'s: \
                     another user's job cannot be joined",
                    a.job, peer_uid
                ),
            ));
        }
        if entry.ranks.contains(&a.rank) {
            return Err(refuse(
                ErrorCode::RankTaken,
                format!("job {:?}: rank {} is attached already", a.job, a.rank),
            ));
        }
        let entry = jobs.get_mut(&key).expect("inserted or present above");
        entry.ranks.insert(a.rank);
        let seat = RankSeat {
            registry: Arc::clone(self),
            key,
            rank: a.rank,
            delivered: Arc::clone(&entry.delivered),
        };
        Ok(Seated {
            job: Arc::clone(&entry.job),
            seat,
            ranks_attached: u32::try_from(entry.ranks.len()).unwrap_or(u32::MAX),
            created_job: created,
        })
    }
}
