//! Who may attach, which datasets they may name, and how much ring memory they may hold.
//!
//! The daemon may run as a service user that can read datasets its clients cannot, so an
//! attach is checked before anything is opened or allocated:
//! 1. **Peer**: the uid, gid and supplementary groups of the connecting process (SO_PEERCRED
//!    and SO_PEERGROUPS, taken from the socket when it is accepted, never from `/proc/<pid>`,
//!    whose pid may be another process's by then) against `[access] allowed_uids` /
//!    `allowed_gids` (gids or group names, looked up when the rules are made). Root and the
//!    daemon's own uid are always allowed (the lists add to them), so the operator's
//!    `stoker status` and a readiness probe work whatever the lists say.
//! 2. **Dataset**: a name registered in `[datasets]` (trusted as configured), or an absolute
//!    path. A path may have no `..` component; with `dataset_roots` set it must lie under a
//!    root both as written and once canonicalised (so a symlink cannot leave the root), and
//!    every file of the opened dataset must too (a file list naming `/etc/shadow`, a symlinked
//!    image). Paths are resolved with the client's filesystem credentials, as its files are
//!    read (a user's own 0700 folder resolves for that user, not for a service user that may
//!    not enter it). With no roots set, only the daemon's own uid and root may name paths:
//!    they could read them anyway.
//! 3. **Quotas**: ring bytes per client (all connections of one uid), ring bytes per job (all
//!    its ranks), clients attached per uid and in all, jobs per uid and in all (the registry).
//!    The per-uid caps default to half the totals, so one user can never hold every ring or
//!    job; a refusal names the limit that bit, the user's own first. A [`QuotaGrant`] holds
//!    its share until dropped.
//!
//! 4. **Opening**: a dataset a client named by path is indexed and read with that client's
//!    filesystem credentials when its uid is not the daemon's (so the kernel decides what it
//!    may read, at every open, not only at attach), and with no symlink followed when
//!    `dataset_roots` is set (a file swapped for a symlink after the attach is refused). See
//!    [`stoker_pipeline::source::local::fsopen`].
//!
//! Steps 2 and 4 are one decision, asked once per attach: [`AccessPolicy::admit`] answers
//! with an [`Admission`] (the path, how it is read, the roots its files must stay under),
//! and the registry opens the dataset with it ([`Admission::open`]).
//!
//! Every refusal names the path or the numbers and the rule that refused it.
//!
//! # Limitations
//! - A registered dataset is trusted: its files are not checked against the roots, and are
//!   read with the daemon's credentials.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

mod admission;
mod quota;

pub(crate) use admission::{Admission, OpenDatasetError};
pub(crate) use quota::{QuotaGrant, Quotas};
use stoker_wire::socket::{SeqPacket, SockError};

use crate::serve::config::AccessConfig;
use stoker_pipeline::source::local::fsopen::{self, Credentials, OpenPolicy};

/// Why an attach was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AccessError {
    /// The peer's credentials are not allowed.
    #[error("{0}")]
    Peer(String),
    /// The dataset may not be named by this client.
    #[error("{0}")]
    Dataset(String),
    /// A bare name that is not in the registry (and so not a path either).
    #[error("{0}")]
    UnknownName(String),
    /// A quota or limit would be exceeded.
    #[error("{0}")]
    Quota(String),
}

/// The connecting process, as the kernel vouches for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, as recorded when the peer connected (SO_PEERGROUPS).
    pub groups: Vec<u32>,
}

impl Peer {
    /// The credentials the kernel recorded for the socket's peer when it connected: uid, gid
    /// (SO_PEERCRED) and supplementary groups (SO_PEERGROUPS). The pid is for logs only.
    pub(crate) fn of(sock: &SeqPacket) -> Result<Peer, SockError> {
        let cred = sock.peer_cred()?;
        Ok(Peer {
            pid: cred.pid,
            uid: cred.uid,
            gid: cred.gid,
            groups: sock.peer_groups()?,
        })
    }
}

/// A group named in `access.allowed_gids` that this system does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "access.allowed_gids: the group {0} does not exist on this host (create it, e.g. \
     `groupadd --system NAME` or systemd-sysusers with deploy/sysusers-stoker.conf, or name \
     the group by its gid)"
)]
pub struct UnknownGroup(pub String);

/// The access rules of one daemon.
#[derive(Debug, Clone)]
pub(crate) struct AccessPolicy {
    daemon_uid: u32,
    allowed_uids: Vec<u32>,
    allowed_gids: Vec<u32>,
    /// As configured and canonicalised (a root that does not exist is kept as written).
    roots: Vec<(PathBuf, PathBuf)>,
    registry: BTreeMap<String, PathBuf>,
}

impl AccessPolicy {
    /// The rules of `access` over the registered datasets `registry`; a group name the
    /// system does not know is refused.
    pub(crate) fn new(
        access: &AccessConfig,
        registry: &BTreeMap<String, PathBuf>,
    ) -> Result<AccessPolicy, UnknownGroup> {
        let allowed_gids = access
            .allowed_gids
            .iter()
            .map(|g| g.gid().ok_or_else(|| UnknownGroup(g.to_string())))
            .collect::<Result<Vec<u32>, _>>()?;
        Ok(AccessPolicy::with_gids(access, allowed_gids, registry))
    }

    fn with_gids(
        access: &AccessConfig,
        allowed_gids: Vec<u32>,
        registry: &BTreeMap<String, PathBuf>,
    ) -> AccessPolicy {
        let daemon_uid = rustix::process::geteuid().as_raw();
        AccessPolicy {
            daemon_uid,
            allowed_uids: access.allowed_uids.clone(),
            allowed_gids,
            roots: access
                .dataset_roots
                .iter()
                .map(|r| {
                    (
                        r.clone(),
                        std::fs::canonicalize(r).unwrap_or_else(|_| r.clone()),
                    )
                })
                .collect(),
            registry: registry.clone(),
        }
    }

    /// The names of the registered datasets.
    pub(crate) fn dataset_names(&self) -> Vec<String> {
        self.registry.keys().cloned().collect()
    }

    /// The defaults: the daemon's own uid and root, any path for them, no registry.
    pub(crate) fn permissive_for_owner() -> AccessPolicy {
        AccessPolicy::with_gids(&AccessConfig::default(), Vec::new(), &BTreeMap::new())
    }

    fn is_owner(&self, peer: &Peer) -> bool {
        self.sees_every_job(peer.uid)
    }

    /// Whether `uid` may see every user's jobs (root and the daemon's own uid); any other
    /// uid sees only the jobs it created.
    pub(crate) fn sees_every_job(&self, uid: u32) -> bool {
        uid == self.daemon_uid || uid == 0
    }

    /// Whether `peer` may attach at all: root and the daemon's own uid always, others when
    /// the lists name their uid or one of their groups.
    pub(crate) fn check_peer(&self, peer: &Peer) -> Result<(), AccessError> {
        let allowed = self.is_owner(peer)
            || self.allowed_uids.contains(&peer.uid)
            || self.allowed_gids.contains(&peer.gid)
            || peer.groups.iter().any(|g| self.allowed_gids.contains(g));
        if allowed {
            return Ok(());
        }
        let rule = if self.allowed_uids.is_empty() && self.allowed_gids.is_empty() {
            format!(
                "only the daemon's own uid {} and root may attach (set access.allowed_gids to a \
                 group of the users who may, e.g. [\"stoker-clients\"], or access.allowed_uids)",
                self.daemon_uid
            )
        } else {
            format!(
                "allowed: root, the daemon's uid {}, uids {:?}, gids {}",
                self.daemon_uid,
                self.allowed_uids,
                gid_list(&self.allowed_gids)
            )
        };
        Err(AccessError::Peer(format!(
            "peer pid {} uid {} gid {} (groups {:?}) is not allowed: {rule}",
            peer.pid, peer.uid, peer.gid, peer.groups
        )))
    }

    /// Decides, once, whether `peer` may open the dataset it named `name`: the path to open,
    /// the credentials and symlink rule its files are read with, and the roots every file it
    /// reads must resolve under. The registry opens the dataset with that one decision.
    pub(crate) fn admit(&self, peer: &Peer, name: &str) -> Result<Admission, AccessError> {
        let path = self.resolve_dataset(peer, name)?;
        let policy = self.open_policy(peer, name);
        // A registered dataset is trusted; object storage has no local files to confine.
        let confined = !self.roots.is_empty()
            && !self.registry.contains_key(name)
            && !stoker_pipeline::source::url::is_url(&path);
        let roots = if confined {
            self.roots.clone()
        } else {
            Vec::new()
        };
        Ok(Admission::new(name, path, policy, roots))
    }

    /// The path to open for the dataset a client named, or why it may not.
    fn resolve_dataset(&self, peer: &Peer, name: &str) -> Result<PathBuf, AccessError> {
        if let Some(path) = self.registry.get(name) {
            return Ok(path.clone());
        }
        let refuse = |rule: String| Err(AccessError::Dataset(format!("dataset {name:?}: {rule}")));
        let path = Path::new(name);
        if stoker_pipeline::source::url::is_url(path) {
            // Object storage is read with the daemon's credentials: only the daemon's own
            // user may name a bucket that is not registered.
            if self.is_owner(peer) {
                return Ok(path.to_owned());
            }
            return refuse(format!(
                "not a registered dataset; uid {} may name registered s3:// datasets only",
                peer.uid
            ));
        }
        if path.components().any(|c| c == Component::ParentDir) {
            return refuse("a path may not contain '..' components".into());
        }
        if !path.is_absolute() {
            // Not found, never "permission denied": a bare name is a dataset the daemon does
            // not know, a relative path one it cannot place (it has no client's folder).
            return Err(AccessError::UnknownName(format!(
                "dataset {name:?}: not found: not a registered dataset (registered: {:?}), and \
                 a relative path means nothing to the daemon (name the folder absolute)",
                self.registry.keys().collect::<Vec<_>>()
            )));
        }
        if self.roots.is_empty() {
            if self.is_owner(peer) {
                return Ok(path.to_owned());
            }
            return refuse(format!(
                "not a registered dataset, and no access.dataset_roots are configured, so uid {} \
                 may name registered datasets only",
                peer.uid
            ));
        }
        let Some((root, canonical_root)) = self
            .roots
            .iter()
            .find(|(r, c)| path.starts_with(r) || path.starts_with(c))
        else {
            return refuse(format!(
                "absolute path outside the allowed roots {:?}",
                self.root_list()
            ));
        };
        // With the client's credentials, as its files will be read: a user's own 0700
        // folder resolves for that user though the daemon's uid may not enter it.
        let creds = self.open_policy(peer, name).credentials;
        let canonical = fsopen::as_client(creds.as_ref(), || std::fs::canonicalize(path))
            .map_err(|e| AccessError::Dataset(format!("dataset {name:?}: {e}")))?
            .map_err(|e| {
                let who = creds.map_or(String::new(), |c| format!(" as uid {}", c.uid));
                AccessError::Dataset(format!(
                    "dataset {name:?}: cannot resolve the path{who}: {e}"
                ))
            })?;
        if !canonical.starts_with(canonical_root) {
            return refuse(format!(
                "resolves to {} through a symlink, leaving the root {}",
                canonical.display(),
                root.display()
            ));
        }
        Ok(canonical)
    }

    /// How the files of the dataset `name` are opened for `peer`: registered datasets and
    /// the daemon's own uid (or root) with the daemon's credentials; any other uid with its
    /// own. With roots configured, a path-named dataset is read without following symlinks.
    fn open_policy(&self, peer: &Peer, name: &str) -> OpenPolicy {
        if self.registry.contains_key(name) {
            return OpenPolicy::default();
        }
        let credentials = (!self.is_owner(peer)).then(|| Credentials {
            uid: peer.uid,
            gid: peer.gid,
            groups: peer.groups.clone(),
        });
        OpenPolicy {
            credentials,
            no_symlinks: !self.roots.is_empty(),
        }
    }

    fn root_list(&self) -> Vec<String> {
        root_list(&self.roots)
    }
}

/// Gids for messages, each with its name where the system has one: `[997 (stoker-clients)]`.
fn gid_list(gids: &[u32]) -> String {
    let named: Vec<String> = gids
        .iter()
        .map(|&g| match stoker_wire::socket::groups::name_of(g) {
            Some(n) => format!("{g} ({n})"),
            None => g.to_string(),
        })
        .collect();
    format!("[{}]", named.join(", "))
}

/// The roots as configured, for messages.
pub(super) fn root_list(roots: &[(PathBuf, PathBuf)]) -> Vec<String> {
    roots.iter().map(|(r, _)| r.display().to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::config::GroupRef;
    use crate::serve::config::LimitsConfig;
    use crate::serve::key::JobKey;
    use stoker_pipeline::source::index::OpenOptions;

    fn key(owner: u32, name: &str) -> JobKey {
        JobKey {
            owner,
            name: name.to_owned(),
        }
    }

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer {
            pid: 1,
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    fn policy(uids: &[u32], gids: &[u32], roots: &[&Path]) -> AccessPolicy {
        let mut registry = BTreeMap::new();
        registry.insert("imagenet".to_owned(), PathBuf::from("/data/imagenet"));
        AccessPolicy::new(
            &AccessConfig {
                allowed_uids: uids.to_vec(),
                allowed_gids: gids.iter().map(|&g| GroupRef::Gid(g)).collect(),
                dataset_roots: roots.iter().map(|r| r.to_path_buf()).collect(),
            },
            &registry,
        )
        .unwrap()
    }

    #[test]
    fn peers_are_checked_by_uid_gid_and_groups() {
        let p = policy(&[], &[], &[]);
        p.check_peer(&peer(0, 0, &[])).unwrap();
        p.check_peer(&peer(p.daemon_uid, 5, &[])).unwrap();
        if p.daemon_uid != 4242 {
            let e = p.check_peer(&peer(4242, 4242, &[])).unwrap_err();
            assert!(e.to_string().contains("uid 4242"), "{e}");
        }
        let p = policy(&[1000], &[300], &[]);
        p.check_peer(&peer(1000, 1, &[])).unwrap();
        p.check_peer(&peer(2000, 300, &[])).unwrap();
        p.check_peer(&peer(2000, 1, &[7, 300])).unwrap();
        // Root and the daemon's own uid are never locked out by the lists.
        p.check_peer(&peer(0, 0, &[])).unwrap();
        p.check_peer(&peer(p.daemon_uid, 5, &[])).unwrap();
        if p.daemon_uid != 2000 {
            let e = p.check_peer(&peer(2000, 1, &[7])).unwrap_err();
            assert!(e.to_string().contains("uids [1000], gids [300"), "{e}");
        }
    }

    #[test]
    fn groups_are_named_by_gid_or_name_and_an_unknown_name_is_refused() {
        let access = |gids: Vec<GroupRef>| AccessConfig {
            allowed_gids: gids,
            ..AccessConfig::default()
        };
        let p = AccessPolicy::new(
            &access(vec![GroupRef::Name("root".into()), GroupRef::Gid(300)]),
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(p.allowed_gids, [0, 300]);
        let e = AccessPolicy::new(
            &access(vec![GroupRef::Name("no-such-group-of-stoker".into())]),
            &BTreeMap::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("access.allowed_gids") && e.contains("\"no-such-group-of-stoker\""),
            "{e}"
        );
    }

    #[test]
    fn groups_are_the_sockets() {
        let (a, b) = SeqPacket::pair().unwrap();
        let p = Peer::of(&a).unwrap();
        assert_eq!(p.uid, rustix::process::geteuid().as_raw());
        let mut mine: Vec<u32> = rustix::process::getgroups()
            .unwrap()
            .iter()
            .map(|g| g.as_raw())
            .collect();
        let mut theirs = p.groups.clone();
        mine.sort_unstable();
        theirs.sort_unstable();
        assert_eq!(theirs, mine);
        drop(b);
    }

    #[test]
    fn dataset_paths_follow_the_rules() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("ok")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
        let p = policy(&[], &[], &[&root]);
        let me = peer(p.daemon_uid, 0, &[]);
        assert_eq!(
            p.resolve_dataset(&me, "imagenet").unwrap(),
            PathBuf::from("/data/imagenet")
        );
        let ok = root.join("ok");
        assert_eq!(
            p.resolve_dataset(&me, ok.to_str().unwrap()).unwrap(),
            std::fs::canonicalize(&ok).unwrap()
        );
        let dotdot = format!("{}/ok/../../outside", root.display());
        let e = p.resolve_dataset(&me, &dotdot).unwrap_err().to_string();
        assert!(e.contains("'..'") && e.contains(&dotdot), "{e}");
        let e = p.resolve_dataset(&me, "/etc").unwrap_err().to_string();
        assert!(
            e.contains("outside the allowed roots") && e.contains("/etc"),
            "{e}"
        );
        let esc = root.join("escape");
        let e = p
            .resolve_dataset(&me, esc.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("symlink") && e.contains("leaving the root"),
            "{e}"
        );
        for relative in ["relative", "relative/path"] {
            let e = p.resolve_dataset(&me, relative).unwrap_err();
            assert!(matches!(e, AccessError::UnknownName(_)), "{e}");
            assert!(e.to_string().contains("not found"), "{e}");
        }

        let open = policy(&[], &[], &[]);
        open.resolve_dataset(&me, "/anything").unwrap();
        let stranger = peer(open.daemon_uid.wrapping_add(12345), 1, &[]);
        let e = open
            .resolve_dataset(&stranger, "/anything")
            .unwrap_err()
            .to_string();
        assert!(e.contains("registered datasets only"), "{e}");
    }

    #[test]
    fn one_admission_answers_path_credentials_and_roots_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let outside = dir.path().join("outside.jpg");
        std::fs::write(&outside, b"not read, only listed").unwrap();
        let list = root.join("list.txt");
        std::fs::write(&list, format!("{}\t0\n", outside.display())).unwrap();
        let p = policy(&[], &[], &[&root]);
        let me = peer(p.daemon_uid, 0, &[]);
        let a = p.admit(&me, list.to_str().unwrap()).unwrap();
        assert_eq!(a.path, std::fs::canonicalize(&list).unwrap());
        assert_eq!(a.policy.credentials, None, "the daemon's own uid");
        assert!(a.policy.no_symlinks, "roots are set");
        let opts = OpenOptions {
            use_cache: false,
            ..OpenOptions::default()
        };
        let e = a.open(&opts).unwrap_err().to_string();
        assert!(
            e.contains("outside the allowed roots") && e.contains("outside.jpg"),
            "{e}"
        );
        let stranger = peer(p.daemon_uid.wrapping_add(12345), 7, &[8]);
        let s = p.admit(&stranger, list.to_str().unwrap()).unwrap();
        let creds = s.policy.credentials.expect("the client's own credentials");
        assert_eq!(
            (creds.uid, creds.gid, creds.groups),
            (stranger.uid, 7, vec![8])
        );
        // A registered dataset: the daemon's credentials, its files trusted.
        let r = p.admit(&stranger, "imagenet").unwrap();
        assert_eq!(r.path, PathBuf::from("/data/imagenet"));
        assert_eq!(r.policy, OpenPolicy::default());
        let e = p.admit(&stranger, "/etc").unwrap_err().to_string();
        assert!(e.contains("outside the allowed roots"), "{e}");
    }

    #[test]
    fn one_uid_holds_at_most_half_the_clients_by_default() {
        let q = Quotas::new(LimitsConfig {
            max_clients: 4,
            ..LimitsConfig::default()
        });
        let a = q.reserve(&key(1, "a"), 1).unwrap();
        let _b = q.reserve(&key(1, "b"), 1).unwrap();
        let e = q.reserve(&key(1, "c"), 1).unwrap_err().to_string();
        assert!(
            e.contains("uid 1 has 2") && e.contains("limits.max_clients_per_uid) is 2"),
            "{e}"
        );
        q.reserve(&key(2, "a"), 1).unwrap();
        drop(a);
        q.reserve(&key(1, "c"), 1).unwrap();
    }

    #[test]
    fn quotas_refuse_with_numbers_and_are_given_back() {
        let q = Quotas::new(LimitsConfig {
            max_client_ring_bytes: 100,
            max_job_ring_bytes: 80,
            max_clients: 3,
            max_clients_per_uid: Some(3),
            max_jobs: 10,
            ..LimitsConfig::default()
        });
        let a = q.reserve(&key(1, "j"), 60).unwrap();
        let e = q.reserve(&key(1, "k"), 50).unwrap_err().to_string();
        assert!(
            e.contains("50 bytes") && e.contains("60 bytes") && e.contains("100"),
            "{e}"
        );
        let e = q.reserve(&key(1, "j"), 30).unwrap_err().to_string();
        assert!(
            e.contains("per-job") && e.contains("60 bytes") && e.contains("80"),
            "{e}"
        );
        // Another uid's job of the same key has its own share.
        let b = q.reserve(&key(2, "j"), 80).unwrap();
        let _c = q.reserve(&key(3, "x"), 1).unwrap();
        let e = q.reserve(&key(4, "y"), 1).unwrap_err().to_string();
        assert!(e.contains("max_clients"), "{e}");
        drop((a, b));
        assert_eq!(q.usage(), (1, 1));
        q.reserve(&key(1, "j"), 80).unwrap();
    }
}
