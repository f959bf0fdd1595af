//! The shared secret and the handshake that proves both sides hold it.
//!
//! # Design
//! - The secret is a file only its owner may read or write (mode `0600` or stricter), owned
//!   by the daemon's own uid or by root (ssh's rule for keys: another user could have
//!   written it or could read it); a root-owned one may be group-readable too (`0640`, as
//!   PostgreSQL allows for root-owned keys: Kubernetes mounts Secrets so under an fsGroup), of at least [`MIN_SECRET_BYTES`] bytes; surrounding
//!   whitespace is not part of it. The file is opened once and checked through that open
//!   file, so what is checked is what is read. Its bytes are an HMAC-SHA256 key and appear nowhere else: not in errors, logs,
//!   status or metrics ([`Secret`]'s `Debug` prints no byte of it).
//! - Challenge-response both ways, each side with a fresh 32-byte nonce: the worker sends
//!   its nonce; the home answers with its own and `HMAC(secret, "home" | worker nonce | home
//!   nonce)`; the worker checks it in constant time (`ring::hmac::verify`) and answers with
//!   `HMAC(secret, "worker" | home nonce | worker nonce)`, which the home checks the same way.
//!   Neither proof can be replayed (fresh nonces) or reflected (the role is in the MAC).
//!
//! - Both sides then hold a [`Session`]: keys derived from the secret and both nonces, one
//!   per direction, that MAC every later frame ([`super::seal`]).
//!
//! # Limitations
//! - Not encrypted without TLS: the frames after the handshake are MACed, not hidden.

#![forbid(unsafe_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use super::gate::GateRefusal;
use super::seal::{Session, Side};
use super::wire::WIRE_VERSION;
use super::wire::{hex, read_message, unhex, write_message, Message, Transport, WireError};

/// The fewest bytes a secret may have.
pub(crate) const MIN_SECRET_BYTES: usize = 16;
const NONCE_BYTES: usize = 32;

/// The shared secret, as an HMAC key.
pub struct Secret(hmac::Key);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Why the secret file cannot be used (never says what is in it).
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be opened, read or inspected.
    #[error("secret file {path}: {source}")]
    Read {
        /// The secret file as configured.
        path: PathBuf,
        /// What the open, read or stat reported.
        source: std::io::Error,
    },
    /// Others than its owner may read or write the file.
    #[error("secret file {path}: mode {mode:o} lets others read or write it (chmod 600 it)")]
    Mode {
        /// The secret file as configured.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file belongs to neither this daemon's uid nor root.
    #[error(
        "secret file {path}: owned by uid {owner}, not by this daemon's uid {me} or root \
         (chown it)"
    )]
    Owner {
        /// The secret file as configured.
        path: PathBuf,
        /// The uid that owns it.
        owner: u32,
        /// This daemon's uid.
        me: u32,
    },
    /// The path names a folder, a device or another non-file.
    #[error("secret file {path}: not a regular file")]
    NotFile {
        /// The secret file as configured.
        path: PathBuf,
    },
    /// The file holds fewer bytes than a secret needs (`MIN_SECRET_BYTES`, 16).
    #[error("secret file {path}: {len} bytes, fewer than {MIN_SECRET_BYTES}")]
    Short {
        /// The secret file as configured.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The connection failed, timed out or carried a malformed frame.
    #[error("{0}")]
    Wire(#[from] WireError),
    /// The peer speaks another protocol version than this side's.
    #[error(
        "the peer speaks link protocol version {got}, this side speaks version {WIRE_VERSION} \
         (upgrade the older stokerd)"
    )]
    Version {
        /// The version the peer's message carried.
        got: u32,
    },
    /// The peer's HMAC over both nonces does not match the shared secret.
    #[error("the peer's proof of the shared secret is wrong")]
    BadProof,
    /// Another message came where the handshake wanted a given one.
    #[error("expected {expected}, got {got}")]
    Unexpected {
        /// The message the handshake wanted next (`challenge`, `hello`, `welcome`).
        expected: &'static str,
        /// The start of the message that came, as debug text (80 characters at most).
        got: String,
    },
    /// The peer refused the connection; the text is its reason as it sent it.
    #[error("refused: {0}")]
    Refused(String),
}

/// The bytes of the file at `path`, if only its owner may read or write it (and its group
/// read it, when root owns it) and that owner is this daemon's uid or root (a secret, a TLS
/// key).
pub(crate) fn read_private(path: &Path) -> Result<Vec<u8>, SecretError> {
    let read = |source| SecretError::Read {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read)?;
    let meta = file.metadata().map_err(read)?;
    if !meta.is_file() {
        return Err(SecretError::NotFile {
            path: path.to_owned(),
        });
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(SecretError::Owner {
            path: path.to_owned(),
            owner: meta.uid(),
            me,
        });
    }
    // A root-owned file may also be read by its group (PostgreSQL's rule for root-owned key
    // files): Kubernetes gives a Secret mounted in a pod with an fsGroup mode 0440 whatever
    // its defaultMode (kubernetes/kubernetes#57923), owned by root and the pod's group.
    let others = if meta.uid() == 0 { 0o037 } else { 0o077 };
    if meta.mode() & others != 0 {
        return Err(SecretError::Mode {
            path: path.to_owned(),
            mode: meta.mode() & 0o777,
        });
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes).map_err(read)?;
    Ok(bytes)
}

impl Secret {
    /// Reads the secret file at `path`.
    pub fn load(path: &Path) -> Result<Secret, SecretError> {
        let bytes = read_private(path)?;
        let trimmed = bytes.trim_ascii();
        if trimmed.len() < MIN_SECRET_BYTES {
            return Err(SecretError::Short {
                path: path.to_owned(),
                len: trimmed.len(),
            });
        }
        Ok(Secret(hmac::Key::new(hmac::HMAC_SHA256, trimmed)))
    }

    fn proof(&self, role: &[u8], first: &[u8], second: &[u8]) -> Vec<u8> {
        let mut ctx = hmac::Context::with_key(&self.0);
        ctx.update(role);
        ctx.update(first);
        ctx.update(second);
        ctx.sign().as_ref().to_vec()
    }

    fn verify(&self, role: &[u8], first: &[u8], second: &[u8], proof: &str) -> bool {
        let Some(proof) = unhex(proof) else {
            return false;
        };
        let message = [role, first, second].concat();
        hmac::verify(&self.0, &message, &proof).is_ok()
    }
}

fn nonce() -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    SystemRandom::new()
        .fill(&mut n)
        .expect("the system's random source works");
    n
}

fn unexpected(expected: &'static str, got: &Message) -> AuthError {
    match got {
        Message::Refused { reason, .. } => AuthError::Refused(reason.clone()),
        other => AuthError::Unexpected {
            expected,
            got: format!("{other:?}").chars().take(80).collect(),
        },
    }
}

/// The worker's side: challenges the peer and checks its proof, by `deadline`. A peer that
/// fails is told only "authentication failed"; one that passes is then let in by `admit`,
/// or told its reason. Without a secret (mutual TLS proved who the peer is) only the
/// protocol version is checked. The session that MACs the connection's later frames.
pub fn accept<'a>(
    stream: &mut impl Transport,
    secret: impl Into<Option<&'a Secret>>,
    deadline: Instant,
    admit: impl FnOnce() -> Result<(), GateRefusal>,
) -> Result<Session, AuthError> {
    let secret = secret.into();
    let ours = nonce();
    let challenge = Message::Challenge {
        version: WIRE_VERSION,
        nonce: hex(&ours),
    };
    write_message(stream, &challenge, &[])?;
    let hello = read_message(stream, Some(deadline))?;
    let Message::Hello {
        version,
        nonce: theirs,
        proof,
    } = hello
    else {
        return Err(unexpected("hello", &hello));
    };
    let refuse = |stream: &mut dyn Transport, reason: &str| {
        let _ = write_message(
            stream,
            &Message::Refused {
                job: None,
                unit: None,
                reason: reason.to_owned(),
            },
            &[],
        );
    };
    if version != WIRE_VERSION {
        refuse(
            stream,
            &format!(
                "this worker speaks link protocol version {WIRE_VERSION}, the home daemon \
                 {version} (upgrade the older stokerd)"
            ),
        );
        return Err(AuthError::Version { got: version });
    }
    let theirs = unhex(&theirs).filter(|n| n.len() == NONCE_BYTES);
    let proved = |t: &Vec<u8>| secret.is_none_or(|s| s.verify(b"home", &ours, t, &proof));
    let Some(theirs) = theirs.filter(proved) else {
        refuse(stream, "authentication failed");
        return Err(AuthError::BadProof);
    };
    if let Err(refusal) = admit() {
        let reason = refusal.to_string();
        refuse(stream, &reason);
        return Err(AuthError::Refused(reason));
    }
    let welcome = Message::Welcome {
        proof: secret.map_or_else(String::new, |s| hex(&s.proof(b"worker", &theirs, &ours))),
    };
    write_message(stream, &welcome, &[])?;
    Ok(secret.map_or_else(Session::untagged, |s| {
        Session::keyed(&s.0, Side::Worker, &theirs, &ours)
    }))
}

/// The home daemon's side: answers the worker's challenge and checks its proof, by
/// `deadline`. Without a secret (TLS proved who the worker is) it sends no proof. The
/// session that MACs the connection's later frames.
pub fn connect<'a>(
    stream: &mut impl Transport,
    secret: impl Into<Option<&'a Secret>>,
    deadline: Instant,
) -> Result<Session, AuthError> {
    let secret = secret.into();
    let challenge = read_message(stream, Some(deadline))?;
    let Message::Challenge {
        version,
        nonce: theirs,
    } = challenge
    else {
        return Err(unexpected("challenge", &challenge));
    };
    if version != WIRE_VERSION {
        return Err(AuthError::Version { got: version });
    }
    let theirs = unhex(&theirs)
        .filter(|n| n.len() == NONCE_BYTES)
        .ok_or(AuthError::BadProof)?;
    let ours = nonce();
    let hello = Message::Hello {
        version: WIRE_VERSION,
        nonce: hex(&ours),
        proof: secret.map_or_else(String::new, |s| hex(&s.proof(b"home", &theirs, &ours))),
    };
    write_message(stream, &hello, &[])?;
    match read_message(stream, Some(deadline))? {
        Message::Welcome { proof }
            if secret.is_none_or(|s| s.verify(b"worker", &ours, &theirs, &proof)) =>
        {
            Ok(secret.map_or_else(Session::untagged, |s| {
                Session::keyed(&s.0, Side::Home, &ours, &theirs)
            }))
        }
        Message::Welcome { .. } => Err(AuthError::BadProof),
        other => Err(unexpected("welcome", &other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpStream;
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    fn secret_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn a_secret_file_others_may_read_or_too_short_is_refused_without_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let open = secret_file(dir.path(), "open", "0123456789abcdef-open", 0o644);
        let e = Secret::load(&open).unwrap_err().to_string();
        assert!(e.contains("mode 644") && !e.contains("0123456789"), "{e}");
        let short = secret_file(dir.path(), "short", "tooshort\n", 0o600);
        let e = Secret::load(&short).unwrap_err().to_string();
        assert!(e.contains("8 bytes") && !e.contains("tooshort"), "{e}");
        let theirs = secret_file(dir.path(), "theirs", "0123456789abcdef-theirs", 0o600);
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            let e = Secret::load(&theirs).unwrap_err().to_string();
            assert!(
                e.contains("owned by uid 65534") && e.contains("theirs"),
                "{e}"
            );
        }
        if rustix::process::geteuid().is_root() {
            // Root-owned: its group may read it (a Kubernetes Secret under an fsGroup is
            // 0440), never write it, and others nothing.
            let pod = secret_file(dir.path(), "pod", "0123456789abcdef-pod", 0o440);
            assert!(Secret::load(&pod).is_ok());
            for mode in [0o460, 0o444] {
                let bad = secret_file(dir.path(), "bad", "0123456789abcdef-bad", mode);
                let e = Secret::load(&bad).unwrap_err().to_string();
                assert!(e.contains(&format!("mode {mode:o}")), "{e}");
            }
        }
        let good = secret_file(dir.path(), "good", "0123456789abcdef\n", 0o600);
        let s = Secret::load(&good).unwrap();
        assert_eq!(format!("{s:?}"), "Secret(..)");
    }

    /// Runs the handshake between a worker holding `worker` and a home holding `home`.
    fn handshake(
        worker: &str,
        home: &str,
    ) -> (Result<Session, AuthError>, Result<Session, AuthError>) {
        let dir = tempfile::tempdir().unwrap();
        let w = Secret::load(&secret_file(dir.path(), "w", worker, 0o600)).unwrap();
        let h = Secret::load(&secret_file(dir.path(), "h", home, 0o600)).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            accept(&mut s, &w, deadline, || Ok(()))
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let home_side = connect(&mut c, &h, deadline);
        (server.join().unwrap(), home_side)
    }

    #[test]
    fn both_sides_holding_the_secret_pass_and_a_wrong_secret_is_refused() {
        let (w, h) = handshake("the-shared-secret-1", "the-shared-secret-1");
        assert!(w.is_ok() && h.is_ok(), "{w:?} {h:?}");
        let (w, h) = handshake("the-shared-secret-1", "the-shared-secret-2");
        assert!(matches!(w, Err(AuthError::BadProof)), "{w:?}");
        assert!(
            matches!(&h, Err(AuthError::Refused(r)) if r == "authentication failed"),
            "{h:?}"
        );
    }
}
