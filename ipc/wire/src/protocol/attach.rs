//! ATTACH, the first message of a rank's connection, and its JSON on the wire.
//!
//! # Design
//! - [`Attach`] keeps the elastic offset beside the start [`Position`] (the offset belongs to
//!   the job, like the seed). The JSON keeps the form every client has sent since offsets
//!   exist: the offset nested in `start` (`{"epoch":..,"step":..,"offset":{..}}`), left out when
//!   there is none, and `start` itself optional (clients from before it existed). `AttachJson`
//!   is that form, written and read only here; a golden test holds it byte for byte.
//! - Since protocol 2 the JSON ends with `client_version`, the sending build's
//!   [`VERSION`](super::VERSION): always this build's, so it is not a field of [`Attach`]. A
//!   daemon repeats it in the message answering an ATTACH it cannot read (another protocol
//!   version, or a JSON it does not know).
//! - `device` is parsed into a [`Device`] here, once: a name that is no device fails the
//!   decode as [`DecodeError::Device`], which the daemon answers with UNSUPPORTED_DEVICE. On
//!   the wire it is the device's `Display` (`cpu` or a GPU UUID once the client resolved it).

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

use super::device::Device;
use super::position::{EpochOffset, Position};
use super::{DecodeError, MessageType};
use crate::spec::PipelineSpec;

/// Client → daemon, first message of a connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Attach {
    /// Names the job; every rank of one job sends the same key.
    pub job: String,
    /// This rank, `0..world_size`.
    pub rank: u32,
    /// Ranks of the job; every rank sends the same.
    pub world_size: u32,
    /// `cpu`, or the rank's GPU by UUID (a client resolves an ordinal before it sends; the
    /// daemon refuses one).
    pub device: Device,
    /// What a batch is; every rank of a job sends the same.
    pub spec: PipelineSpec,
    /// A dataset registered in the daemon's config, or a path.
    pub dataset: String,
    /// The job's seed for shuffling and augmentation; every rank sends the same.
    pub seed: u64,
    /// The first batch to receive.
    pub start: Position,
    /// An elastic resume's offset (see [`super::position`]): epoch `offset.epoch` covers only
    /// its permutation after the first `offset.consumed` samples, split over this attach's
    /// world size. Part of the job: every rank of a job sends the same one.
    pub offset: Option<EpochOffset>,
}

/// [`Attach`] as its JSON reads.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AttachJson {
    job: String,
    rank: u32,
    world_size: u32,
    device: String,
    spec: PipelineSpec,
    dataset: String,
    seed: u64,
    #[serde(default)]
    start: StartJson,
    client_version: String,
}

/// ATTACH's `start`: the position, with the job's elastic offset inside it.
#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StartJson {
    epoch: u64,
    step: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    offset: Option<EpochOffset>,
}

impl Attach {
    /// Appends the JSON body to `out`.
    pub(super) fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        let a = self.clone();
        let json = AttachJson {
            job: a.job,
            rank: a.rank,
            world_size: a.world_size,
            device: a.device.to_string(),
            spec: a.spec,
            dataset: a.dataset,
            seed: a.seed,
            start: StartJson {
                epoch: a.start.epoch,
                step: a.start.step,
                offset: a.offset,
            },
            client_version: super::VERSION.to_owned(),
        };
        serde_json::to_writer(out, &json)
    }

    /// Reads a JSON body. A body this version cannot read names the client's version when it
    /// holds one (a client that added a field without bumping the protocol version).
    pub(super) fn read_json(body: &[u8]) -> Result<Attach, DecodeError> {
        let a: AttachJson = serde_json::from_slice(body).map_err(|e| DecodeError::Json {
            kind: MessageType::Attach,
            reason: match super::version::peer_version(body) {
                Some(v) => format!("{e} (client stoker {v}, daemon stokerd {})", super::VERSION),
                None => e.to_string(),
            },
        })?;
        Ok(Attach {
            device: a.device.parse().map_err(DecodeError::Device)?,
            job: a.job,
            rank: a.rank,
            world_size: a.world_size,
            spec: a.spec,
            dataset: a.dataset,
            seed: a.seed,
            start: Position::at(a.start.epoch, a.start.step),
            offset: a.start.offset,
        })
    }
}
