//! Versions: the version of this build ([`VERSION`], what `--version` prints) and of the wire
//! protocol ([`PROTOCOL_VERSION`]), and the message a user reads when a client and a daemon
//! speak different protocols ([`VersionMismatch`]).
//!
//! # Design
//! - Every message header carries the sender's protocol version; ATTACH carries the client's
//!   [`VERSION`] (`client_version`), ATTACHED and STATUS_REPLY the daemon's (`daemon_version`).
//! - Any change to a message a peer of the previous version would refuse or misread (a new
//!   field, a new meaning) bumps [`PROTOCOL_VERSION`]; the protocol's golden tests pin the
//!   JSON forms to it. A peer of another version is then refused by its header, before any of
//!   its body is read as this version's, so an old daemon never answers a new client with
//!   `unknown field 'offset'`.
//! - The refusal says which side is older and what to upgrade, with both versions. ERROR's
//!   layout (a `u16` code, then UTF-8 text) is the same in every protocol version, so the
//!   daemon answers a mismatched ATTACH with an ERROR in the client's own protocol version,
//!   which any client reads; a client that gets an answer in another version (a daemon from
//!   before this rule) composes the same message itself.
//!
//! # Limitations
//! - Versions are compared for equality: a daemon serves only clients of its own protocol
//!   version (no negotiation of a common one).

#![forbid(unsafe_code)]

/// This build's version: `git describe` of its source at build time (`0.1.0+g1a2b3c4d5e`
/// where no release tag exists), or the crate version when built without git (see
/// `ipc/wire/build.rs`).
pub const VERSION: &str = env!("STOKER_VERSION");

/// [`VERSION`] ending in a NUL byte, for the C ABI's `stoker_version()`.
pub const VERSION_NUL: &str = concat!(env!("STOKER_VERSION"), "\0");

/// Wire protocol version this build speaks. Version 2 added the software versions
/// (`client_version` in ATTACH, `protocol` in STATUS_REPLY) and this mismatch rule; version 3
/// the spec's per-sample `fields` and the slot's field regions (`ring::SlotLayout`); version 4
/// BAD_SAMPLES (the job's bad samples named to its clients).
pub const PROTOCOL_VERSION: u16 = 4;

/// What `--version` prints after the program's name: the version and the protocol version
/// (a literal, as clap wants a `&'static str`; a test holds it to [`PROTOCOL_VERSION`]).
pub const VERSION_LINE: &str = concat!(env!("STOKER_VERSION"), " (protocol 4)");

/// One side of a connection, as a mismatch message names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Speaker {
    /// The protocol version of its messages' headers.
    pub protocol: u16,
    /// Its software version, when it said (peers from before protocol 2 do not).
    pub version: Option<String>,
}

impl Speaker {
    /// This build.
    pub fn this_build() -> Speaker {
        Speaker {
            protocol: PROTOCOL_VERSION,
            version: Some(VERSION.to_owned()),
        }
    }

    fn describe(&self, program: &str) -> String {
        let version = match &self.version {
            Some(v) => format!("{program} {v}"),
            None => format!("{program} of a version that does not report it"),
        };
        format!("{version}, protocol {}", self.protocol)
    }
}

/// A client and a daemon speak different protocol versions. The `Display` is the whole
/// message: both sides' versions and which one to upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionMismatch {
    /// The client's side (this build, when the client composes the message).
    pub client: Speaker,
    /// The daemon's side.
    pub daemon: Speaker,
}

impl VersionMismatch {
    /// This build as the client, against a daemon whose message came in protocol `protocol`
    /// (its software version, where the message carried one).
    pub fn with_daemon(protocol: u16, version: Option<String>) -> VersionMismatch {
        VersionMismatch {
            client: Speaker::this_build(),
            daemon: Speaker { protocol, version },
        }
    }

    /// Whether the daemon is the older side (the one to upgrade).
    fn daemon_is_older(&self) -> bool {
        self.daemon.protocol < self.client.protocol
    }
}

impl std::fmt::Display for VersionMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let client = self.client.describe("client stoker");
        let daemon = self.daemon.describe("daemon stokerd");
        write!(f, "protocol version mismatch: {client}; {daemon}: ")?;
        let newer = |s: &Speaker| match &s.version {
            Some(v) => format!("{v} or later"),
            None => format!("a version speaking protocol {}", s.protocol),
        };
        if self.daemon_is_older() {
            write!(
                f,
                "upgrade the daemon (stokerd) to {}, or use a client of the daemon's version",
                newer(&self.client)
            )
        } else {
            write!(
                f,
                "upgrade the client (the stoker Python package, libstoker or the stoker tool) to \
                 {}, or use a daemon of the client's version",
                newer(&self.daemon)
            )
        }
    }
}

/// The software version a message in another protocol version says its sender is, read
/// leniently from its JSON body (`client_version` in an ATTACH, `daemon_version` in an
/// ATTACHED or STATUS_REPLY); `None` where the body holds none.
pub(super) fn peer_version(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object()?;
    ["client_version", "daemon_version"]
        .iter()
        .find_map(|k| object.get(*k)?.as_str())
        .map(|v| {
            v.chars()
                .filter(|c| !c.is_control())
                .take(MAX_VERSION_CHARS)
                .collect()
        })
}

/// The most characters of a peer's version a message repeats.
const MAX_VERSION_CHARS: usize = 80;
