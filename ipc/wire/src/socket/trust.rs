//! Whom a client trusts as its daemon, checked on the connected socket before anything is
//! sent: the one rule the Rust client, the C ABI (and so the Python package) and
//! `stoker status` follow.
//!
//! # Design
//! - The daemon's uid comes from the socket (`SO_PEERCRED`, recorded by the kernel when the
//!   daemon called `listen`), never from a file's owner alone: a relay another user put in a
//!   folder we would use shows its own uid there.
//! - Trusted: this user's uid, root, the owner of the socket's folder when only root could
//!   have given it that folder (its parent is root's and no one else may write to it: a
//!   folder root made for a service user, as `install -d -o stoker /run/stoker` does), and the
//!   owner of the socket file itself when its folder is root's and no one else may write to
//!   it (only root could have put it there: systemd's socket unit, `SocketUser=stoker` in a
//!   `/run/stoker` it made): the system daemon's service user.
//! - This user's own daemon folder ([`super::path::user_daemon_dir`]) must also be a real
//!   directory this user owns that no one else may write to (`stoker_private::check_dir`):
//!   one another user made first (`/tmp/stoker-<uid>` without `XDG_RUNTIME_DIR`) is refused
//!   with what to remove, even before the daemon's uid is looked at.
//!
//! # Limitations
//! - `$STOKER_SOCKET` pointing into a folder of a service user that root did not make (under
//!   `/srv`, say) is trusted only when that user is root or this user.

#![forbid(unsafe_code)]

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{SeqPacket, SockError};

/// The uids a client accepts as the daemon serving `socket`: its own, root's, and the
/// owner of the socket's folder when root made that folder (see the module docs).
pub(crate) fn trusted_daemon_uids(socket: &Path) -> Vec<u32> {
    let mut uids = vec![stoker_private::euid(), 0];
    let given = [
        root_given_folder_owner(socket),
        root_given_socket_owner(socket),
    ];
    for owner in given.into_iter().flatten() {
        if !uids.contains(&owner) {
            uids.push(owner);
        }
    }
    uids
}

/// A folder nobody but its owner may write to.
fn private(m: &std::fs::Metadata) -> bool {
    m.is_dir() && m.mode() & 0o022 == 0
}

/// The owner of the socket file when its folder is root's and nobody else may write to it:
/// only root (systemd's socket unit) could have made it, and given it that owner.
fn root_given_socket_owner(socket: &Path) -> Option<u32> {
    use std::os::unix::fs::FileTypeExt;
    let dir = std::fs::symlink_metadata(socket.parent()?).ok()?;
    let file = std::fs::symlink_metadata(socket).ok()?;
    (private(&dir) && dir.uid() == 0 && file.file_type().is_socket()).then_some(file.uid())
}

/// The owner of `socket`'s folder when no one but root could have made it: the folder and its
/// parent are real directories nobody else may write to, and the parent is root's.
fn root_given_folder_owner(socket: &Path) -> Option<u32> {
    let dir = socket.parent()?;
    let parent = dir.parent()?;
    let (d, p) = (
        std::fs::symlink_metadata(dir).ok()?,
        std::fs::symlink_metadata(parent).ok()?,
    );
    (private(&d) && private(&p) && p.uid() == 0).then_some(d.uid())
}

/// Refuses the daemon at `path` (connected as `sock`) unless its uid is trusted, and a socket
/// in this user's own daemon folder unless that folder is this user's private one.
pub fn check_daemon(sock: &SeqPacket, path: &Path) -> Result<(), SockError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir.filter(|d| *d == super::path::user_daemon_dir()) {
        stoker_private::check_dir(dir).map_err(|source| SockError::UntrustedFolder {
            path: path.to_owned(),
            source,
        })?;
    }
    let uid = sock.peer_cred()?.uid;
    let trusted = trusted_daemon_uids(path);
    if trusted.contains(&uid) {
        return Ok(());
    }
    Err(SockError::UntrustedUid {
        path: path.to_owned(),
        uid,
        ours: trusted[0],
        trusted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::socket::SeqPacketListener;

    #[test]
    fn a_daemon_of_this_uid_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let _l = SeqPacketListener::bind(&path).unwrap();
        let c = SeqPacket::connect(&path).unwrap();
        check_daemon(&c, &path).unwrap();
        assert_eq!(trusted_daemon_uids(&path)[..2], [stoker_private::euid(), 0]);
    }

    #[test]
    fn a_daemon_of_an_untrusted_uid_is_refused_naming_the_uids_and_the_socket() {
        let e = SockError::UntrustedUid {
            path: "/tmp/stoker-5/stoker.sock".into(),
            uid: 65534,
            ours: 5,
            trusted: vec![5, 0],
        };
        assert_eq!(
            e.to_string(),
            "refusing the stoker daemon at /tmp/stoker-5/stoker.sock: the process serving it \
             runs as uid 65534, not as this user (uid 5), root, or the owner of a folder root \
             made for it (trusted: [5, 0]); remove /tmp/stoker-5/stoker.sock if you did not \
             start it"
        );
    }

    #[test]
    fn a_socket_root_gave_a_service_user_in_a_folder_of_roots_is_trusted() {
        use std::os::unix::fs::PermissionsExt;
        if stoker_private::euid() != 0 {
            eprintln!("SKIPPED a_socket_root_gave_...: needs root to chown the socket");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("run-stoker");
        std::fs::create_dir(&folder).unwrap();
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = folder.join("stoker.sock");
        let _l = SeqPacketListener::bind(&path).unwrap();
        std::os::unix::fs::lchown(&path, Some(4321), Some(4321)).unwrap();
        assert!(trusted_daemon_uids(&path).contains(&4321));
        // A folder others may write to vouches for nothing.
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!trusted_daemon_uids(&path).contains(&4321));
    }
}
