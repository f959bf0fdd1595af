//! A job's key: the uid that created it and the name its ranks give, so that another uid's
//! attach under the same name is another job.

#![forbid(unsafe_code)]

use stoker_wire::protocol::Attach;

/// A job's identity: the uid that created it and the key its ranks name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct JobKey {
    pub(crate) owner: u32,
    pub(crate) name: String,
}

impl JobKey {
    /// The job `a` names for a peer of `uid`.
    pub(crate) fn of(uid: u32, a: &Attach) -> JobKey {
        JobKey {
            owner: uid,
            name: a.job.clone(),
        }
    }
}

impl std::fmt::Display for JobKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} of uid {}", self.name, self.owner)
    }
}
