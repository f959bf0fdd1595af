//! Ring memory and attachment counts, shared by every connection: what one client, one job
//! and one uid may hold ([`Quotas`]), granted per attach and given back on drop
//! ([`QuotaGrant`]).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::AccessError;
use crate::serve::config::LimitsConfig;
use crate::serve::key::JobKey;

/// Ring memory and attachment counts, shared by every connection.
#[derive(Debug)]
pub(crate) struct Quotas {
    /// `[limits]`: `max_client_ring_bytes`, `max_job_ring_bytes`, `max_clients`.
    limits: LimitsConfig,
    used: Mutex<Usage>,
}

#[derive(Debug, Default)]
struct Usage {
    clients: usize,
    /// Clients attached, by uid.
    clients_by_uid: HashMap<u32, usize>,
    by_uid: HashMap<u32, u64>,
    by_job: HashMap<JobKey, u64>,
}

/// One attached rank's share of the quotas; dropping it gives the share back.
#[derive(Debug)]
pub(crate) struct QuotaGrant {
    quotas: Arc<Quotas>,
    job: JobKey,
    bytes: u64,
}

impl Quotas {
    pub(crate) fn new(limits: LimitsConfig) -> Arc<Quotas> {
        Arc::new(Quotas {
            limits,
            used: Mutex::default(),
        })
    }

    /// Reserves a ring of `bytes` for a rank of `job` (its owner's client), or says which
    /// limit it is over, with the numbers.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        job: &JobKey,
        bytes: u64,
    ) -> Result<QuotaGrant, AccessError> {
        let uid = job.owner;
        let l = &self.limits;
        let mut u = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if u.clients >= l.max_clients {
            return Err(AccessError::Quota(format!(
                "{} clients are attached, the limit (limits.max_clients) is {}",
                u.clients, l.max_clients
            )));
        }
        let mine = u.clients_by_uid.get(&uid).copied().unwrap_or(0);
        if mine >= l.clients_per_uid() {
            return Err(AccessError::Quota(format!(
                "uid {uid} has {mine} clients attached, its limit (limits.max_clients_per_uid) \
                 is {}",
                l.clients_per_uid()
            )));
        }
        let by_uid = u.by_uid.get(&uid).copied().unwrap_or(0);
        if by_uid.saturating_add(bytes) > l.max_client_ring_bytes {
            return Err(AccessError::Quota(format!(
                "a ring of {bytes} bytes for uid {uid}, who holds {by_uid} bytes of rings already, \
                 is over the per-client quota (limits.max_client_ring_bytes) of {} bytes",
                l.max_client_ring_bytes
            )));
        }
        let by_job = u.by_job.get(job).copied().unwrap_or(0);
        if by_job.saturating_add(bytes) > l.max_job_ring_bytes {
            return Err(AccessError::Quota(format!(
                "a ring of {bytes} bytes for job {job}, whose ranks hold {by_job} bytes already, \
                 is over the per-job quota (limits.max_job_ring_bytes) of {} bytes",
                l.max_job_ring_bytes
            )));
        }
        u.clients += 1;
        *u.clients_by_uid.entry(uid).or_default() += 1;
        *u.by_uid.entry(uid).or_default() += bytes;
        *u.by_job.entry(job.clone()).or_default() += bytes;
        Ok(QuotaGrant {
            quotas: Arc::clone(self),
            job: job.clone(),
            bytes,
        })
    }

    /// Clients attached now and ring bytes they hold.
    #[cfg(test)]
    pub(crate) fn usage(&self) -> (usize, u64) {
        let u = self.used.lock().unwrap_or_else(|e| e.into_inner());
        (u.clients, u.by_uid.values().sum())
    }
}

impl Drop for QuotaGrant {
    fn drop(&mut self) {
        let mut u = self.quotas.used.lock().unwrap_or_else(|e| e.into_inner());
        u.clients -= 1;
        if let Some(n) = u.clients_by_uid.get_mut(&self.job.owner) {
            *n -= 1;
            if *n == 0 {
                u.clients_by_uid.remove(&self.job.owner);
            }
        }
        let give_back = |m: &mut u64| *m -= self.bytes;
        if let Some(v) = u.by_uid.get_mut(&self.job.owner) {
            give_back(v);
            if *v == 0 {
                u.by_uid.remove(&self.job.owner);
            }
        }
        if let Some(v) = u.by_job.get_mut(&self.job) {
            give_back(v);
            if *v == 0 {
                u.by_job.remove(&self.job);
            }
        }
    }
}
