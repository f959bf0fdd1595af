//! A refusal: the error code and message a client is sent before its connection closes.
//!
//! # Design
//! - Every refusal names the input and the reason; access errors map to their codes here.
//!
//! # Limitations
//! - One refusal per connection: it always ends the connection.

#![forbid(unsafe_code)]

use stoker::protocol::ErrorCode;

use crate::serve::access::AccessError;
/// A refusal sent to the client before the connection closes.
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) code: ErrorCode,
    pub(super) message: String,
}

pub(super) fn refuse(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
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
