//! The messages that cross the daemon's socket, and their wire format.
//!
//! Every message is one SOCK_SEQPACKET datagram of at most [`MAX_MESSAGE_BYTES`]:
//!
//! ```text
//! offset 0  magic    2 bytes  "SK"
//! offset 2  version  u16 LE   PROTOCOL_VERSION
//! offset 4  type     u16 LE   MessageType
//! offset 6  reserved u16 LE   must be 0
//! offset 8  body              per type, below
//! ```
//!
//! Hot messages (READY, RELEASE) have fixed little-endian bodies; the rare ones that carry a
//! spec or free text (ATTACH, ATTACHED) are JSON. ERROR is a `u16` code then a UTF-8 message.
//! `docs/protocol.md` is the full reference.
//!
//! # Design
//! - [`Message::decode`] never panics and never allocates more than the datagram's size: any
//!   byte string yields either a message or a [`DecodeError`] that says what was wrong.
//! - Unknown message types, trailing bytes, a non-zero reserved field and unknown JSON fields
//!   are all errors: a peer that speaks another dialect is refused, not half understood.
//!
//! - The header's version is checked before anything else: a peer of another protocol
//!   version gets an ERROR in its own version saying which side to upgrade (see [`version`]).
//!
//! # Limitations
//! - The version is checked for equality; there is no negotiation yet.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

use crate::ring::ImageMemory;

/// First two bytes of every message.
pub const MAGIC: [u8; 2] = *b"SK";
/// Size of the fixed header.
pub const HEADER_BYTES: usize = 8;
/// Largest message either side sends or accepts, header included.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Most bytes of class names an ATTACHED carries (with [`MAX_MESSAGE_BYTES`], room for ImageNet-1k's
/// 1000 names many times over; a dataset with more is told by `classes` only).
pub const CLASS_NAMES_BYTES: usize = 32 * 1024;
/// Most bytes of skipped file names an ATTACHED carries: names past it are only counted.
pub const SKIPPED_NAMES_BYTES: usize = 4 * 1024;
/// Most bad samples a [`BadSamples`] names, and most bytes of their names: others are only
/// counted.
pub const BAD_NAMES: usize = 8;
/// See [`BAD_NAMES`].
pub const BAD_NAMES_BYTES: usize = 4 * 1024;
/// Longest error message sent; longer ones are cut at a character boundary.
pub(crate) const MAX_ERROR_TEXT: usize = 4096;

/// Message type numbers. Stable: never renumber, only add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum MessageType {
    /// Client → daemon: [`Attach`], JSON.
    Attach = 1,
    /// Daemon → client: [`Attached`], JSON, with the ring's fds.
    Attached = 2,
    /// Daemon → client: [`Ready`], fixed body.
    Ready = 3,
    /// Client → daemon: [`Release`], fixed body.
    Release = 4,
    /// Client → daemon: the rank leaves (no body).
    Detach = 5,
    /// Daemon → client: the last epoch asked for is delivered (no body).
    EndOfData = 6,
    /// Either way: [`ErrorMessage`], a `u16` code then UTF-8 text.
    Error = 7,
    /// Client → daemon: a status connection's question (no body).
    Status = 8,
    /// Daemon → client: [`DaemonStatus`], JSON.
    StatusReply = 9,
    /// Client → daemon: [`Stats`], fixed body.
    Stats = 10,
    /// Daemon → client: [`BadSamples`], JSON (protocol 4).
    BadSamples = 11,
}

impl MessageType {
    /// The type numbered `v` on the wire; `None` for a number no version has used.
    pub(crate) fn from_u16(v: u16) -> Option<MessageType> {
        Some(match v {
            1 => MessageType::Attach,
            2 => MessageType::Attached,
            3 => MessageType::Ready,
            4 => MessageType::Release,
            5 => MessageType::Detach,
            6 => MessageType::EndOfData,
            7 => MessageType::Error,
            8 => MessageType::Status,
            9 => MessageType::StatusReply,
            10 => MessageType::Stats,
            11 => MessageType::BadSamples,
            _ => return None,
        })
    }
}

/// Daemon → client, the answer to [`Attach`]; the ring's memfd travels with it (SCM_RIGHTS),
/// followed by the device allocation's fd when the images are device memory.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attached {
    /// Slots in the ring.
    pub slots: u32,
    /// Bytes of one slot (the client checks it against the layout it computes from the spec).
    pub slot_bytes: u64,
    /// Bytes of the whole ring (the memfd's size).
    pub ring_bytes: u64,
    /// Batches per epoch for this rank.
    pub steps_per_epoch: u64,
    /// Batches of the elastic offset's epoch for this rank, when the attach had an offset
    /// (only then is it sent, so clients that never send one never see it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset_epoch_steps: Option<u64>,
    /// Samples in the dataset.
    pub dataset_len: u64,
    /// Classes in the dataset (labels are `0..classes`).
    pub classes: u64,
    /// The classes' names, label order (an ImageFolder's class folders), when they fit in
    /// [`CLASS_NAMES_BYTES`]; left out when the dataset has none (a flat folder, a file list,
    /// shards) or they do not fit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub class_names: Vec<String>,
    /// Files the dataset's index left out (no format stoker decodes), counted; left out on
    /// the wire when none were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped: u64,
    /// The first few of them (paths below the dataset's root, at most
    /// [`SKIPPED_NAMES_BYTES`] in all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_first: Vec<String>,
    /// Ranks of the job attached now, this one included.
    pub ranks_attached: u32,
    /// Whether this attach created the job (the first rank) or joined it.
    pub created_job: bool,
    /// The daemon's [`VERSION`] (`git describe` at its build).
    pub daemon_version: String,
    /// Whether the daemon takes [`Message::Stats`] on this connection (a daemon from before
    /// STATS omits the field: the client then sends none).
    #[serde(default)]
    pub accepts_stats: bool,
    /// Where the images live: host (in the memfd, the only fd) or device (a CUDA VMM
    /// allocation, exported as a second fd). Left out on the wire for host.
    #[serde(default, skip_serializing_if = "ImageMemory::is_host")]
    pub image_memory: ImageMemory,
    /// Bytes of the device allocation holding the images; left out (0) for host images.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub image_ring_bytes: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Daemon → client: a slot is filled and leased to the client until it sends [`Release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    /// The filled slot, `0..slots` of the ring.
    pub slot: u32,
    /// Counts the slot's fillings; a RELEASE must name the filling it releases.
    pub generation: u64,
    /// The batch's epoch.
    pub epoch: u64,
    /// The batch's step within its epoch, for this rank.
    pub step: u64,
    /// Samples in the batch (the last batch of an epoch may be short).
    pub n: u32,
}

/// Client → daemon: the client is done with a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// The slot given back.
    pub slot: u32,
    /// The filling released, as its [`Ready`] numbered it; a stale one is refused.
    pub generation: u64,
}

/// Client → daemon: where the training loop's time went since the attach (the data stall).
/// Totals, not deltas, so a lost or late report costs nothing; sent every
/// the client's `STATS_EVERY` or so, only to a daemon whose ATTACHED said
/// `accepts_stats`. Fixed body of three u64 (24 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Nanoseconds spent inside `next()` waiting for a batch.
    pub wait_ns: u64,
    /// Nanoseconds spent between a `next()` returning and the following call (the loop's own
    /// work).
    pub compute_ns: u64,
    /// Batches received.
    pub batches: u64,
}

/// Daemon → client, before the READY of a batch when the job's bad samples grew since the
/// last one this connection was told of: how many samples of the job (all its ranks) could
/// not be read or decoded so far, and the first few files' names, so that the training
/// script can say which. Sent only on the job's own connections: a client is told the names
/// of files in a dataset it attached to.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BadSamples {
    /// Bad samples met in the job so far (a file met again in a later epoch counts again).
    pub count: u64,
    /// The first distinct files among them, in the order met: paths below the dataset's root
    /// (`shard.tar:member` for shards), at most [`BAD_NAMES`] and [`BAD_NAMES_BYTES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first: Vec<String>,
}

/// Error codes. Stable numbers: never renumber, only add.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// The peer sent bytes that are not a message, or a message out of turn.
    BadMessage = 1,
    /// The peer speaks another protocol version.
    VersionMismatch = 2,
    /// The spec (or world_size, dataset, seed) differs from the job's.
    SpecMismatch = 3,
    /// The dataset is unknown or cannot be opened.
    UnknownDataset = 4,
    /// That rank of that job is attached already.
    RankTaken = 5,
    /// The attach would exceed a memory quota.
    Quota = 6,
    /// The daemon is shutting down.
    Stopping = 7,
    /// Something failed inside the daemon.
    Internal = 8,
    /// The spec or the attach's fields are invalid on their own.
    InvalidSpec = 9,
    /// The device is not one this daemon can serve.
    UnsupportedDevice = 10,
    /// The daemon does not allow this peer.
    PermissionDenied = 11,
}

impl ErrorCode {
    /// The code numbered `v` on the wire; `None` for a number no version has used.
    pub(crate) fn from_u16(v: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match v {
            1 => BadMessage,
            2 => VersionMismatch,
            3 => SpecMismatch,
            4 => UnknownDataset,
            5 => RankTaken,
            6 => Quota,
            7 => Stopping,
            8 => Internal,
            9 => InvalidSpec,
            10 => UnsupportedDevice,
            11 => PermissionDenied,
            _ => return None,
        })
    }

    /// The code's name as messages and logs print it (`spec mismatch`).
    pub fn name(self) -> &'static str {
        use ErrorCode::*;
        match self {
            BadMessage => "bad message",
            VersionMismatch => "version mismatch",
            SpecMismatch => "spec mismatch",
            UnknownDataset => "unknown dataset",
            RankTaken => "rank taken",
            Quota => "quota",
            Stopping => "stopping",
            Internal => "internal",
            InvalidSpec => "invalid spec",
            UnsupportedDevice => "unsupported device",
            PermissionDenied => "permission denied",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A refusal or failure, with a message meant for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorMessage {
    /// What kind of refusal or failure, for a program to act on.
    pub code: ErrorCode,
    /// Why, for a person; at most [`MAX_ERROR_TEXT`] bytes.
    pub message: String,
}

/// One protocol message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Client → daemon, first message of a rank's connection.
    Attach(Box<Attach>),
    /// Daemon → client, the answer to ATTACH.
    Attached(Attached),
    /// Daemon → client: a slot is filled and leased.
    Ready(Ready),
    /// Client → daemon: a leased slot is given back.
    Release(Release),
    /// Client → daemon: the rank leaves; its leases end.
    Detach,
    /// Daemon → client: every batch asked for has been sent.
    EndOfData,
    /// Either way: a refusal or failure; the sender closes the connection after it.
    Error(ErrorMessage),
    /// Client → daemon, the only message of a status connection (no body).
    Status,
    /// Daemon → client, the answer to STATUS.
    StatusReply(Box<DaemonStatus>),
    /// Client → daemon: the data stall's totals.
    Stats(Stats),
    /// Daemon → client: the job's bad samples so far, named.
    BadSamples(BadSamples),
}

/// Why bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The datagram (of this many bytes) is shorter than the header.
    #[error("message of {0} bytes is shorter than the {HEADER_BYTES}-byte header")]
    Short(usize),
    /// The datagram (of this many bytes) is over [`MAX_MESSAGE_BYTES`].
    #[error("message of {0} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")]
    TooLong(usize),
    /// The first two bytes (these) are not [`MAGIC`].
    #[error("bad magic {0:02x?} (not a stoker peer)")]
    Magic([u8; 2]),
    /// The peer speaks another protocol version; `peer_version` is its software version when
    /// its message said.
    #[error("protocol version {got} (this build speaks {PROTOCOL_VERSION}, stoker {VERSION})")]
    Version {
        /// The protocol version in the peer's header.
        got: u16,
        /// The peer's software version (`git describe`), when its message carried one.
        peer_version: Option<String>,
    },
    /// The header's type number is none this build knows.
    #[error("unknown message type {0}")]
    UnknownType(u16),
    /// The header's reserved field holds this non-zero value.
    #[error("reserved header field is {0}, must be 0")]
    Reserved(u16),
    /// A fixed body, or ERROR's code, has the wrong length.
    #[error("{kind:?} body is {got} bytes, expected {want}")]
    BodyLength {
        /// The message type whose body it is.
        kind: MessageType,
        /// Bytes of the body received.
        got: usize,
        /// Bytes that type's body has (or at least has, for ERROR).
        want: usize,
    },
    /// A JSON body does not parse as its type (serde_json's message).
    #[error("{kind:?} body is not valid JSON for it: {reason}")]
    Json {
        /// The message type whose body it is.
        kind: MessageType,
        /// serde_json's message, naming the line, column and field.
        reason: String,
    },
    /// ERROR's code is none this build knows.
    #[error("unknown error code {0}")]
    UnknownErrorCode(u16),
    /// ERROR's text is not UTF-8.
    #[error("error text is not UTF-8")]
    ErrorText,
    /// ATTACH's `device` is none of the names a device has.
    #[error("ATTACH: {0}")]
    Device(UnknownDevice),
}

impl DecodeError {
    /// The code to answer the peer with.
    pub fn code(&self) -> ErrorCode {
        match self {
            DecodeError::Version { .. } => ErrorCode::VersionMismatch,
            DecodeError::Device(_) => ErrorCode::UnsupportedDevice,
            _ => ErrorCode::BadMessage,
        }
    }
}

/// Why a message cannot be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The encoded message would be this many bytes, over [`MAX_MESSAGE_BYTES`].
    #[error("encoded message is {0} bytes, over the {MAX_MESSAGE_BYTES}-byte limit")]
    TooLong(usize),
    /// A JSON body cannot be written.
    #[error("cannot encode as JSON: {0}")]
    Json(#[source] serde_json::Error),
}

mod attach;
mod codec;
mod device;
pub mod position;
mod status;
pub mod version;
pub use attach::Attach;
pub use device::{CudaDevice, Device, UnknownDevice};
pub use position::{EpochOffset, EpochSteps, Position, ResumedEpoch};
pub use status::{DaemonStatus, GpuStatus, JobStatus, RankStall, WorkerStatus};
pub use version::{Speaker, VersionMismatch, PROTOCOL_VERSION, VERSION, VERSION_LINE};

#[cfg(test)]
mod tests;
