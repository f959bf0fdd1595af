//! A refusal: the error code and message a client is sent before its connection closes.
//!
//! # Design
//! - Every refusal names the input and the reason; access errors map to their codes here.
//!
//! # Limitations
//! - One refusal per connection: it always ends the connection.

#![forbid(unsafe_code)]

use stoker_wire::protocol::{DecodeError, ErrorCode, Speaker, VersionMismatch, PROTOCOL_VERSION};

use crate::serve::access::AccessError;
/// A refusal sent to the client before the connection closes.
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) code: ErrorCode,
    pub(super) message: String,
    /// The protocol version the ERROR is sent in: the client's, so that a client of another
    /// version reads why it was refused.
    pub(super) protocol: u16,
}

pub(super) fn refuse(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
        protocol: PROTOCOL_VERSION,
    }
}

/// The refusal of an opening message that cannot be decoded: for a client of another protocol
/// version, which side to upgrade, sent in that client's version.
pub(super) fn undecodable(e: DecodeError) -> Refusal {
    match e {
        DecodeError::Version { got, peer_version } => {
            let mismatch = VersionMismatch {
                client: Speaker {
                    protocol: got,
                    version: peer_version,
                },
                daemon: Speaker::this_build(),
            };
            Refusal {
                protocol: got,
                ..refuse(ErrorCode::VersionMismatch, mismatch.to_string())
            }
        }
        e => refuse(e.code(), e.to_string()),
    }
}

impl From<AccessError> for Refusal {
    fn from(e: AccessError) -> Refusal {
        let code = match e {
            AccessError::Peer(_) | AccessError::Dataset(_) => ErrorCode::PermissionDenied,
            AccessError::UnknownName(_) => ErrorCode::UnknownDataset,
            AccessError::Quota(_) => ErrorCode::Quota,
        };
        refuse(code, e.to_string())
    }
}
