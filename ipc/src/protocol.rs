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
//! # Limitations
//! - The version is checked for equality; there is no negotiation yet.

use serde::{Deserialize, Serialize};

use crate::ring::ImageMemory;
use crate::spec::PipelineSpec;

/// Wire protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;
/// First two bytes of every message.
pub const MAGIC: [u8; 2] = *b"SK";
/// Size of the fixed header.
pub const HEADER_BYTES: usize = 8;
/// Largest message either side sends or accepts, header included.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Longest error message sent; longer ones are cut at a character boundary.
pub const MAX_ERROR_TEXT: usize = 4096;

/// Message type numbers. Stable: never renumber, only add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum MessageType {
    Attach = 1,
    Attached = 2,
    Ready = 3,
    Release = 4,
    Detach = 5,
    EndOfData = 6,
    Error = 7,
    Status = 8,
    StatusReply = 9,
    Stats = 10,
}

impl MessageType {
    pub fn from_u16(v: u16) -> Option<MessageType> {
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
            _ => return None,
        })
    }
}

/// Where a client wants to start (or resume): the first batch it receives is `step` of `epoch`.
///
/// With an `offset` (an elastic resume, see `docs/multi-host.md`), epoch `offset.epoch` covers
/// only its permutation after the first `offset.consumed` samples, split over this attach's
/// world size, and its steps count from 0 in that reduced epoch. Every rank of a job sends the
/// same offset (it is part of the job, like the seed). Without one (the only form before it was
/// added, and still the JSON an old client sends) every epoch is the usual partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartPosition {
    pub epoch: u64,
    pub step: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<EpochOffset>,
}

impl StartPosition {
    /// Batch `step` of `epoch`, no elastic offset.
    pub fn at(epoch: u64, step: u64) -> StartPosition {
        StartPosition {
            epoch,
            step,
            offset: None,
        }
    }

    /// The start of what is left of an epoch after an elastic checkpoint `point`: step 0 of
    /// `point.epoch`, whose partition begins after `point.consumed` samples.
    pub fn resume(point: EpochOffset) -> StartPosition {
        StartPosition {
            epoch: point.epoch,
            step: 0,
            offset: (point.consumed > 0).then_some(point),
        }
    }

    /// The elastic checkpoint of this position for a job of `world_size` ranks and batches of
    /// `batch_size`: samples of the epoch's permutation every rank together consumed before
    /// it (`offset.consumed` if it is the offset's epoch, plus `step * batch_size *
    /// world_size`). Exact for any position inside an epoch (padding and drop_last only touch
    /// an epoch's last step).
    pub fn consumed(&self, world_size: u32, batch_size: u32) -> EpochOffset {
        let base = self
            .offset
            .filter(|o| o.epoch == self.epoch)
            .map_or(0, |o| o.consumed);
        EpochOffset {
            epoch: self.epoch,
            consumed: base + self.step * u64::from(batch_size) * u64::from(world_size),
        }
    }
}

/// An elastic resume point: the first `consumed` samples of epoch `epoch`'s permutation were
/// served (at whatever world size); the rest of that epoch is still to come.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochOffset {
    pub epoch: u64,
    pub consumed: u64,
}

impl std::fmt::Display for EpochOffset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "epoch {} after {} samples", self.epoch, self.consumed)
    }
}

/// Client → daemon, first message of a connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attach {
    /// Names the job; every rank of one job sends the same key.
    pub job: String,
    pub rank: u32,
    pub world_size: u32,
    /// `"cpu"`, or the UUID of the rank's GPU (`GPU-xxxxxxxx-...`).
    pub device: String,
    pub spec: PipelineSpec,
    /// A dataset registered in the daemon's config, or a path.
    pub dataset: String,
    pub seed: u64,
    #[serde(default)]
    pub start: StartPosition,
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
    /// Ranks of the job attached now, this one included.
    pub ranks_attached: u32,
    /// Whether this attach created the job (the first rank) or joined it.
    pub created_job: bool,
    /// The daemon's version, for logs.
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
    pub slot: u32,
    /// Counts the slot's fillings; a RELEASE must name the filling it releases.
    pub generation: u64,
    pub epoch: u64,
    pub step: u64,
    /// Samples in the batch (the last batch of an epoch may be short).
    pub n: u32,
}

/// Client → daemon: the client is done with a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub slot: u32,
    pub generation: u64,
}

/// Client → daemon: where the training loop's time went since the attach (the data stall).
/// Totals, not deltas, so a lost or late report costs nothing; sent every
/// [`STATS_EVERY`](crate::client::STATS_EVERY) or so, only to a daemon whose ATTACHED said
/// `accepts_stats`. Fixed body of [`STATS_BODY`] bytes.
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

/// Daemon → client, the answer to [`Message::Status`]: what the daemon serves now. JSON,
/// bounded by [`MAX_MESSAGE_BYTES`] (the daemon leaves out jobs that do not fit and says so
/// in `jobs_left_out`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonStatus {
    pub daemon_version: String,
    pub pid: u32,
    pub uptime_s: f64,
    /// The socket the daemon serves on.
    pub socket: String,
    /// Whether the socket came from systemd (socket activation).
    pub activated: bool,
    /// True once SIGTERM started the drain.
    pub stopping: bool,
    /// Attached ranks (all jobs).
    pub clients: u64,
    /// Decode backend in use (`cpu`, `cuda`).
    pub backend: String,
    /// Reader in use (`io_uring`, `pread`).
    pub reader: String,
    pub threads: u64,
    /// Images delivered to clients since start.
    pub images_delivered: u64,
    /// Delivered images per second over the last few seconds.
    pub images_per_s: f64,
    /// Samples that could not be read or decoded since start.
    pub bad_samples: u64,
    /// Ring memory mapped for clients (bytes, host).
    pub ring_bytes: u64,
    /// Datasets registered in the config, by name.
    pub datasets: Vec<String>,
    pub jobs: Vec<JobStatus>,
    /// Jobs not listed because the reply would exceed the message size limit.
    pub jobs_left_out: u64,
    /// Each GPU the cuda backend serves from (one once a rank attached on it); left out when
    /// there is none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuStatus>,
}

/// One GPU in a [`DaemonStatus`]: its health, decode mix, ring memory and time per batch.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuStatus {
    pub uuid: String,
    pub name: String,
    /// The GPU is stoker's emulator (tests/gpu-emulator), not a real device.
    pub emulated: bool,
    /// Why the GPU stopped serving (its context broke), if it did.
    pub broken: Option<String>,
    /// Images decoded on the hardware JPEG engines, the GPU-hybrid decoder, the CPU.
    pub decoded_hardware: u64,
    pub decoded_hybrid: u64,
    pub decoded_cpu: u64,
    pub batches: u64,
    pub batches_in_flight: i64,
    /// Device memory of the rings on this GPU.
    pub ring_device_bytes: u64,
    /// Mean host time per batch in decode (nvJPEG calls and the CPU path).
    pub decode_ms_per_batch: f64,
    /// Mean device time per batch from the end of decode to the end of the kernel.
    pub kernel_ms_per_batch: f64,
}

/// One job in a [`DaemonStatus`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobStatus {
    pub job: String,
    pub dataset: String,
    pub samples: u64,
    pub world_size: u32,
    /// Ranks attached now.
    pub ranks: Vec<u32>,
    pub batch_size: u32,
    pub steps_per_epoch: u64,
    /// Images delivered to this job's ranks.
    pub images_delivered: u64,
    /// The data stall of each attached rank that reported one (see [`Stats`]), by rank.
    #[serde(default)]
    pub stalls: Vec<RankStall>,
}

/// One rank's data stall in a [`JobStatus`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankStall {
    pub rank: u32,
    /// Share of the training loop's time spent waiting for data, over the interval between
    /// the rank's last two reports (the whole attach after its first report).
    pub wait_fraction: f64,
    /// Seconds waited inside `next()` since the attach.
    pub wait_s: f64,
    /// Seconds spent between `next()` calls since the attach.
    pub compute_s: f64,
    pub batches: u64,
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
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
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
    pub code: ErrorCode,
    pub message: String,
}

/// One protocol message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Attach(Box<Attach>),
    Attached(Attached),
    Ready(Ready),
    Release(Release),
    Detach,
    EndOfData,
    Error(ErrorMessage),
    /// Client → daemon, the only message of a status connection (no body).
    Status,
    StatusReply(Box<DaemonStatus>),
    Stats(Stats),
}

/// Why bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("message of {0} bytes is shorter than the {HEADER_BYTES}-byte header")]
    Short(usize),
    #[error("message of {0} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")]
    TooLong(usize),
    #[error("bad magic {0:02x?} (not a stoker peer)")]
    Magic([u8; 2]),
    #[error("protocol version {got} (this build speaks {PROTOCOL_VERSION})")]
    Version { got: u16 },
    #[error("unknown message type {0}")]
    UnknownType(u16),
    #[error("reserved header field is {0}, must be 0")]
    Reserved(u16),
    #[error("{kind:?} body is {got} bytes, expected {want}")]
    BodyLength {
        kind: MessageType,
        got: usize,
        want: usize,
    },
    #[error("{kind:?} body is not valid JSON for it: {reason}")]
    Json { kind: MessageType, reason: String },
    #[error("unknown error code {0}")]
    UnknownErrorCode(u16),
    #[error("error text is not UTF-8")]
    ErrorText,
}

impl DecodeError {
    /// The code to answer the peer with.
    pub fn code(&self) -> ErrorCode {
        match self {
            DecodeError::Version { .. } => ErrorCode::VersionMismatch,
            _ => ErrorCode::BadMessage,
        }
    }
}

/// Why a message cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("encoded message is {0} bytes, over the {MAX_MESSAGE_BYTES}-byte limit")]
    TooLong(usize),
    #[error("cannot encode as JSON: {0}")]
    Json(String),
}

const READY_BODY: usize = 4 + 8 + 8 + 8 + 4;
const RELEASE_BODY: usize = 4 + 8;
/// Bytes of a [`Stats`] body: three u64.
pub const STATS_BODY: usize = 3 * 8;

impl Message {
    pub fn kind(&self) -> MessageType {
        match self {
            Message::Attach(_) => MessageType::Attach,
            Message::Attached(_) => MessageType::Attached,
            Message::Ready(_) => MessageType::Ready,
            Message::Release(_) => MessageType::Release,
            Message::Detach => MessageType::Detach,
            Message::EndOfData => MessageType::EndOfData,
            Message::Error(_) => MessageType::Error,
            Message::Status => MessageType::Status,
            Message::StatusReply(_) => MessageType::StatusReply,
            Message::Stats(_) => MessageType::Stats,
        }
    }

    /// An error message; the text is cut to [`MAX_ERROR_TEXT`] bytes.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Message {
        let mut message = message.into();
        if message.len() > MAX_ERROR_TEXT {
            let mut cut = MAX_ERROR_TEXT;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        Message::Error(ErrorMessage { code, message })
    }

    /// Appends the encoded message to `out` (cleared first).
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.kind() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        match self {
            Message::Attach(a) => {
                serde_json::to_writer(&mut *out, a).map_err(|e| EncodeError::Json(e.to_string()))?
            }
            Message::Attached(a) => {
                serde_json::to_writer(&mut *out, a).map_err(|e| EncodeError::Json(e.to_string()))?
            }
            Message::Ready(r) => {
                out.extend_from_slice(&r.slot.to_le_bytes());
                out.extend_from_slice(&r.generation.to_le_bytes());
                out.extend_from_slice(&r.epoch.to_le_bytes());
                out.extend_from_slice(&r.step.to_le_bytes());
                out.extend_from_slice(&r.n.to_le_bytes());
            }
            Message::Release(r) => {
                out.extend_from_slice(&r.slot.to_le_bytes());
                out.extend_from_slice(&r.generation.to_le_bytes());
            }
            Message::StatusReply(s) => {
                serde_json::to_writer(&mut *out, s).map_err(|e| EncodeError::Json(e.to_string()))?
            }
            Message::Stats(st) => {
                out.extend_from_slice(&st.wait_ns.to_le_bytes());
                out.extend_from_slice(&st.compute_ns.to_le_bytes());
                out.extend_from_slice(&st.batches.to_le_bytes());
            }
            Message::Detach | Message::EndOfData | Message::Status => {}
            Message::Error(e) => {
                out.extend_from_slice(&(e.code as u16).to_le_bytes());
                out.extend_from_slice(e.message.as_bytes());
            }
        }
        if out.len() > MAX_MESSAGE_BYTES {
            return Err(EncodeError::TooLong(out.len()));
        }
        Ok(())
    }

    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// Checks a datagram's header; returns its message type and body.
    fn decode_header(bytes: &[u8]) -> Result<(MessageType, &[u8]), DecodeError> {
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(DecodeError::TooLong(bytes.len()));
        }
        let Some((header, body)) = bytes.split_first_chunk::<HEADER_BYTES>() else {
            return Err(DecodeError::Short(bytes.len()));
        };
        let magic = [header[0], header[1]];
        if magic != MAGIC {
            return Err(DecodeError::Magic(magic));
        }
        let version = u16::from_le_bytes([header[2], header[3]]);
        if version != PROTOCOL_VERSION {
            return Err(DecodeError::Version { got: version });
        }
        let ty = u16::from_le_bytes([header[4], header[5]]);
        let kind = MessageType::from_u16(ty).ok_or(DecodeError::UnknownType(ty))?;
        let reserved = u16::from_le_bytes([header[6], header[7]]);
        if reserved != 0 {
            return Err(DecodeError::Reserved(reserved));
        }
        Ok((kind, body))
    }

    /// Decodes one whole datagram. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
        let (kind, body) = Message::decode_header(bytes)?;
        let want = |want: usize| {
            if body.len() == want {
                Ok(())
            } else {
                Err(DecodeError::BodyLength {
                    kind,
                    got: body.len(),
                    want,
                })
            }
        };
        let json_err = |e: serde_json::Error| DecodeError::Json {
            kind,
            reason: e.to_string(),
        };
        let mut r = Reader(body);
        Ok(match kind {
            MessageType::Attach => {
                Message::Attach(Box::new(serde_json::from_slice(body).map_err(json_err)?))
            }
            MessageType::Attached => {
                Message::Attached(serde_json::from_slice(body).map_err(json_err)?)
            }
            MessageType::Ready => {
                want(READY_BODY)?;
                Message::Ready(Ready {
                    slot: r.u32(),
                    generation: r.u64(),
                    epoch: r.u64(),
                    step: r.u64(),
                    n: r.u32(),
                })
            }
            MessageType::Release => {
                want(RELEASE_BODY)?;
                Message::Release(Release {
                    slot: r.u32(),
                    generation: r.u64(),
                })
            }
            MessageType::Detach => {
                want(0)?;
                Message::Detach
            }
            MessageType::EndOfData => {
                want(0)?;
                Message::EndOfData
            }
            MessageType::Status => {
                want(0)?;
                Message::Status
            }
            MessageType::StatusReply => {
                Message::StatusReply(Box::new(serde_json::from_slice(body).map_err(json_err)?))
            }
            MessageType::Stats => {
                want(STATS_BODY)?;
                Message::Stats(Stats {
                    wait_ns: r.u64(),
                    compute_ns: r.u64(),
                    batches: r.u64(),
                })
            }
            MessageType::Error => {
                let Some((code, text)) = body.split_first_chunk::<2>() else {
                    return Err(DecodeError::BodyLength {
                        kind,
                        got: body.len(),
                        want: 2,
                    });
                };
                let code = u16::from_le_bytes(*code);
                let code = ErrorCode::from_u16(code).ok_or(DecodeError::UnknownErrorCode(code))?;
                let message = std::str::from_utf8(text)
                    .map_err(|_| DecodeError::ErrorText)?
                    .to_owned();
                Message::Error(ErrorMessage { code, message })
            }
        })
    }
}

/// Reads fixed-size little-endian fields from a body whose length was checked beforehand;
/// reading past the end yields zeros rather than panicking.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        match self.0.split_first_chunk::<N>() {
            Some((head, rest)) => {
                self.0 = rest;
                *head
            }
            None => [0; N],
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn attach() -> Attach {
        Attach {
            job: "resnet50-run7".into(),
            rank: 3,
            world_size: 8,
            device: "cpu".into(),
            spec: PipelineSpec::train(256, 224),
            dataset: "/data/imagenet/train".into(),
            seed: 42,
            start: StartPosition::at(2, 17),
        }
    }

    fn all_messages() -> Vec<Message> {
        vec![
            Message::Attach(Box::new(attach())),
            Message::Attached(Attached {
                slots: 4,
                slot_bytes: 1 << 20,
                ring_bytes: 4 << 20,
                steps_per_epoch: 625,
                offset_epoch_steps: None,
                dataset_len: 1_281_167,
                classes: 1000,
                ranks_attached: 2,
                created_job: false,
                daemon_version: "0.1.0".into(),
                accepts_stats: true,
                ..Attached::default()
            }),
            Message::Attached(Attached {
                slots: 3,
                slot_bytes: 1 << 20,
                ring_bytes: 1 << 16,
                image_memory: ImageMemory::Device,
                image_ring_bytes: 4 << 20,
                ..Attached::default()
            }),
            Message::Ready(Ready {
                slot: 3,
                generation: u64::MAX - 1,
                epoch: 9,
                step: 1234,
                n: 256,
            }),
            Message::Release(Release {
                slot: 2,
                generation: 77,
            }),
            Message::Detach,
            Message::EndOfData,
            Message::Status,
            Message::StatusReply(Box::new(DaemonStatus {
                daemon_version: "0.1.0".into(),
                pid: 42,
                clients: 2,
                backend: "cpu".into(),
                jobs: vec![JobStatus {
                    job: "j".into(),
                    ranks: vec![0, 1],
                    stalls: vec![RankStall {
                        rank: 1,
                        wait_fraction: 0.25,
                        wait_s: 1.0,
                        compute_s: 3.0,
                        batches: 40,
                    }],
                    ..JobStatus::default()
                }],
                ..DaemonStatus::default()
            })),
            Message::error(
                ErrorCode::SpecMismatch,
                "spec differs from the job's in dtype",
            ),
            Message::Stats(Stats {
                wait_ns: 1_500_000_000,
                compute_ns: u64::MAX,
                batches: 12,
            }),
        ]
    }

    #[test]
    fn a_host_ring_attached_keeps_the_old_wire_form() {
        let host = Attached {
            slots: 2,
            slot_bytes: 512,
            ring_bytes: 4096,
            daemon_version: "x".into(),
            ..Attached::default()
        };
        let bytes = Message::Attached(host.clone()).encode().unwrap();
        let json = std::str::from_utf8(&bytes[HEADER_BYTES..]).unwrap();
        assert!(
            !json.contains("image_memory") && !json.contains("image_ring_bytes"),
            "{json}"
        );
        // A message without the fields (every daemon before them) reads as host images.
        let old = r#"{"slots":2,"slot_bytes":512,"ring_bytes":4096,"steps_per_epoch":0,
            "dataset_len":0,"classes":0,"ranks_attached":0,"created_job":false,
            "daemon_version":"x"}"#;
        let parsed: Attached = serde_json::from_str(old).unwrap();
        assert_eq!(parsed, host);
        assert_eq!(parsed.image_memory, ImageMemory::Host);
        // Device images are named on the wire.
        let device = Attached {
            image_memory: ImageMemory::Device,
            image_ring_bytes: 2 << 20,
            ..host
        };
        let bytes = Message::Attached(device).encode().unwrap();
        let json = std::str::from_utf8(&bytes[HEADER_BYTES..]).unwrap();
        assert!(json.contains(r#""image_memory":"device""#), "{json}");
    }

    #[test]
    fn every_message_round_trips() {
        for m in all_messages() {
            let bytes = m.encode().unwrap();
            assert_eq!(&bytes[..2], b"SK");
            assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), m.kind() as u16);
            assert_eq!(Message::decode(&bytes).unwrap(), m, "{:?}", m.kind());
        }
    }

    #[test]
    fn both_start_position_forms_are_understood() {
        // The form every client sent before elastic offsets existed still decodes, as no offset.
        let mut json = serde_json::to_value(attach()).unwrap();
        assert_eq!(json["start"], serde_json::json!({"epoch": 2, "step": 17}));
        json["start"] = serde_json::json!({"epoch": 4, "step": 1});
        let mut bytes = b"SK\x01\x00\x01\x00\x00\x00".to_vec();
        bytes.extend(serde_json::to_vec(&json).unwrap());
        let Message::Attach(a) = Message::decode(&bytes).unwrap() else {
            panic!("not an attach")
        };
        assert_eq!(a.start, StartPosition::at(4, 1));
        // The elastic form round-trips, and so does the answer that goes with it.
        let mut a = attach();
        a.start = StartPosition::resume(EpochOffset {
            epoch: 3,
            consumed: 5120,
        });
        let m = Message::Attach(Box::new(a));
        assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
        let answer = Attached {
            slots: 2,
            slot_bytes: 64,
            ring_bytes: 4096,
            steps_per_epoch: 10,
            offset_epoch_steps: Some(3),
            dataset_len: 80,
            classes: 2,
            ranks_attached: 1,
            created_job: true,
            daemon_version: "0.1.0".into(),
            accepts_stats: true,
            ..Attached::default()
        };
        let m = Message::Attached(answer);
        assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
        // An offset of nothing is no offset.
        assert_eq!(
            StartPosition::resume(EpochOffset {
                epoch: 3,
                consumed: 0
            }),
            StartPosition::at(3, 0)
        );
    }

    #[test]
    fn consumed_counts_every_rank_and_the_offset_of_its_own_epoch_only() {
        let offset = Some(EpochOffset {
            epoch: 2,
            consumed: 100,
        });
        let in_offset_epoch = StartPosition {
            epoch: 2,
            step: 3,
            offset,
        };
        assert_eq!(
            in_offset_epoch.consumed(4, 8),
            EpochOffset {
                epoch: 2,
                consumed: 100 + 3 * 8 * 4
            }
        );
        let later = StartPosition {
            epoch: 3,
            step: 3,
            offset,
        };
        assert_eq!(later.consumed(4, 8).consumed, 3 * 8 * 4);
    }

    #[test]
    fn hot_messages_have_fixed_sizes() {
        let ready = Message::Ready(Ready {
            slot: 0,
            generation: 0,
            epoch: 0,
            step: 0,
            n: 0,
        });
        assert_eq!(ready.encode().unwrap().len(), HEADER_BYTES + READY_BODY);
        let release = Message::Release(Release {
            slot: 0,
            generation: 0,
        });
        assert_eq!(release.encode().unwrap().len(), HEADER_BYTES + RELEASE_BODY);
        let stats = Message::Stats(Stats::default());
        assert_eq!(stats.encode().unwrap().len(), HEADER_BYTES + STATS_BODY);
    }

    #[test]
    fn an_attached_without_accepts_stats_decodes_as_not_accepting() {
        // A daemon from before STATS sends no `accepts_stats`.
        let json = br#"{"slots":4,"slot_bytes":1,"ring_bytes":4,"steps_per_epoch":1,"dataset_len":1,"classes":0,"ranks_attached":1,"created_job":true,"daemon_version":"0.0.9"}"#;
        let mut bytes = b"SK\x01\x00\x02\x00\x00\x00".to_vec();
        bytes.extend_from_slice(json);
        let Message::Attached(a) = Message::decode(&bytes).unwrap() else {
            panic!("expected ATTACHED")
        };
        assert!(!a.accepts_stats);
    }

    #[test]
    fn a_wrong_version_is_reported_as_such() {
        let mut bytes = Message::Detach.encode().unwrap();
        bytes[2] = 9;
        let err = Message::decode(&bytes).unwrap_err();
        assert_eq!(err, DecodeError::Version { got: 9 });
        assert_eq!(err.code(), ErrorCode::VersionMismatch);
    }

    #[test]
    fn malformed_messages_say_what_is_wrong() {
        assert_eq!(Message::decode(b"SK"), Err(DecodeError::Short(2)));
        assert_eq!(
            Message::decode(b"XX\x01\x00\x05\x00\x00\x00"),
            Err(DecodeError::Magic(*b"XX"))
        );
        assert_eq!(
            Message::decode(b"SK\x01\x00\x63\x00\x00\x00"),
            Err(DecodeError::UnknownType(0x63))
        );
        assert_eq!(
            Message::decode(b"SK\x01\x00\x05\x00\x01\x00"),
            Err(DecodeError::Reserved(1))
        );
        // Trailing bytes after a fixed body.
        let mut bytes = Message::Detach.encode().unwrap();
        bytes.push(0);
        assert!(matches!(
            Message::decode(&bytes),
            Err(DecodeError::BodyLength {
                got: 1,
                want: 0,
                ..
            })
        ));
        // Unknown JSON field in an attach.
        let mut json = serde_json::to_value(attach()).unwrap();
        json["colour"] = 1.into();
        let mut bytes = b"SK\x01\x00\x01\x00\x00\x00".to_vec();
        bytes.extend(serde_json::to_vec(&json).unwrap());
        let err = Message::decode(&bytes).unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
        let big = vec![0u8; MAX_MESSAGE_BYTES + 1];
        assert_eq!(
            Message::decode(&big),
            Err(DecodeError::TooLong(MAX_MESSAGE_BYTES + 1))
        );
    }

    #[test]
    fn oversize_messages_are_not_encoded_and_error_text_is_cut() {
        let mut a = attach();
        a.dataset = "x".repeat(MAX_MESSAGE_BYTES);
        assert!(matches!(
            Message::Attach(Box::new(a)).encode(),
            Err(EncodeError::TooLong(_))
        ));
        let Message::Error(e) = Message::error(ErrorCode::Internal, "é".repeat(MAX_ERROR_TEXT))
        else {
            unreachable!()
        };
        assert!(e.message.len() <= MAX_ERROR_TEXT);
        assert!(e.message.chars().all(|c| c == 'é'));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Message::decode(&bytes);
        }

        #[test]
        fn arbitrary_bodies_behind_a_valid_header_never_panic(
            ty in 0u16..11,
            body in proptest::collection::vec(any::<u8>(), 0..128),
        ) {
            let mut bytes = b"SK\x01\x00".to_vec();
            bytes.extend(ty.to_le_bytes());
            bytes.extend([0, 0]);
            bytes.extend(body);
            if let Ok(m) = Message::decode(&bytes) {
                // Whatever decodes re-encodes to a message that decodes the same.
                prop_assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
            }
        }

        #[test]
        fn mutated_valid_messages_never_panic(
            which in 0usize..10,
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            cut in any::<usize>(),
        ) {
            let mut bytes = all_messages()[which].encode().unwrap();
            for (at, x) in flips {
                let i = at % bytes.len();
                bytes[i] ^= x;
            }
            bytes.truncate(cut % (bytes.len() + 1));
            let _ = Message::decode(&bytes);
        }

        #[test]
        fn ready_round_trips(slot: u32, generation: u64, epoch: u64, step: u64, n: u32) {
            let m = Message::Ready(Ready { slot, generation, epoch, step, n });
            prop_assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
        }
    }
}
