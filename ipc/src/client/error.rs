//! Why the client failed ([`ClientError`]; [`DeviceError`] for the GPU it asked for), and the questions a caller asks of a failure:
//! reconnect and resume ([`ClientError::is_disconnected`]), or read the daemon's refusal
//! ([`ClientError::code`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::protocol::{
    DecodeError, Device, EncodeError, ErrorCode, UnknownDevice, VersionMismatch,
};
use crate::ring::memfd::MemfdError;
use crate::socket::path::socket_env_note;
use crate::socket::SockError;
use crate::spec::SpecError;
use stoker_nvidia::cuda::CudaError;

/// Why the client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No daemon answered at this socket within the connect timeout.
    #[error("no stoker daemon at {}{}", .0.display(), socket_env_note(.0))]
    NoDaemon(PathBuf),
    /// Connecting failed, or the daemon that answered is not one this user trusts.
    #[error("cannot connect to the stoker daemon at {}: {source}", path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// What failed: the connect, or the trust check.
        #[source]
        source: SockError,
    },
    /// The socket exists but its permissions keep this user out: never retried, never
    /// worked around (a daemon of the user's own is started only when asked).
    #[error("cannot connect to the stoker daemon at {}: {reason}", path.display())]
    SocketRefused {
        /// The socket.
        path: PathBuf,
        /// The socket's mode, owner and group, this user's groups and what to do
        /// (`socket::path::explain_refusal`).
        reason: String,
    },
    /// The daemon closed the connection (or reset it).
    #[error("daemon closed the connection")]
    Closed,
    /// The daemon refused the attach, or failed, and said why.
    #[error("daemon refused: {code}: {message}")]
    Refused {
        /// The daemon's error code.
        code: ErrorCode,
        /// The daemon's message, as it sent it.
        message: String,
    },
    /// The caller asked for something that cannot be (a rank outside the world size, a
    /// batch's view or memory it does not have).
    #[error("invalid attach: {0}")]
    Invalid(String),
    /// The ATTACH built from the options cannot be encoded (too large for a message).
    #[error("invalid attach: {0}")]
    Encode(#[source] EncodeError),
    /// The options' spec is invalid.
    #[error("invalid spec: {0}")]
    Spec(#[from] SpecError),
    /// The daemon's bytes are not a message.
    #[error("daemon sent a malformed message: {0}")]
    Decode(DecodeError),
    /// The daemon speaks another protocol version: which side to upgrade, both versions.
    #[error("the daemon at {}: {mismatch}", socket.display())]
    Version {
        /// The daemon's socket.
        socket: PathBuf,
        /// Both sides' versions.
        mismatch: VersionMismatch,
    },
    /// The daemon sent a well-formed message that breaks the protocol (out of turn, a ring
    /// of another size, a slot it does not have).
    #[error("daemon broke the protocol: {0}")]
    Protocol(String),
    /// A send or receive on the socket failed.
    #[error("socket: {0}")]
    Socket(#[from] SockError),
    /// The ring's memfd cannot be checked or mapped.
    #[error("ring: {0}")]
    Ring(#[from] MemfdError),
    /// The GPU asked for cannot be used, or the device ring cannot be imported.
    #[error("{0}")]
    Device(#[from] DeviceError),
    /// With [`AttachOptions::reattach`](super::AttachOptions::reattach), the daemon went away
    /// and no attach succeeded within the bound.
    #[error(
        "the daemon at {} went away ({gone}) and did not come back within {:.1} s \
         (AttachOptions::reattach); last attempt: {last}",
        socket.display(),
        waited.as_secs_f64()
    )]
    StayedAway {
        /// The daemon's socket.
        socket: PathBuf,
        /// The error that said the daemon went away.
        gone: Box<ClientError>,
        /// How long the client tried to attach again.
        waited: Duration,
        /// The last attempt's error.
        #[source]
        last: Box<ClientError>,
    },
}

impl ClientError {
    /// True when the daemon is gone (not running, or went away): reconnect and resume.
    pub fn is_disconnected(&self) -> bool {
        match self {
            ClientError::NoDaemon(_) | ClientError::Closed | ClientError::StayedAway { .. } => true,
            ClientError::Socket(e) => matches!(
                e.raw_os_error(),
                Some(libc::EPIPE) | Some(libc::ECONNRESET) | Some(libc::ENOTCONN)
            ),
            _ => false,
        }
    }

    /// A message in another protocol version becomes [`ClientError::Version`], naming the
    /// daemon at `socket`.
    pub(super) fn with_socket(self, socket: &Path) -> ClientError {
        match self {
            ClientError::Decode(DecodeError::Version { got, peer_version }) => {
                ClientError::Version {
                    socket: socket.to_owned(),
                    mismatch: VersionMismatch::with_daemon(got, peer_version),
                }
            }
            e => e,
        }
    }

    /// The daemon's error code, when it refused something.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Why a client cannot use the GPU it asked for.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// `device` is neither `cpu`, `cuda`, `cuda:N` nor a `GPU-` UUID.
    #[error(transparent)]
    Unknown(#[from] UnknownDevice),
    /// The driver, the device, or an operation on it failed.
    #[error("device {device}: {source}")]
    Cuda {
        /// The device as named (`cuda:N`) or resolved (its UUID).
        device: Device,
        /// The driver's error.
        #[source]
        source: CudaError,
    },
    /// `cuda:N` with fewer visible devices.
    #[error("device cuda:{ordinal}: only {visible} CUDA device(s) visible")]
    NoOrdinal {
        /// The ordinal asked for.
        ordinal: usize,
        /// CUDA devices this process sees.
        visible: usize,
    },
    /// The daemon's device ring does not match this client's plan.
    #[error("device ring on {device}: {reason}")]
    Ring {
        /// The device the client attached on.
        device: Device,
        /// What does not match.
        #[source]
        reason: RingMismatch,
    },
}

/// How the daemon's device ring differs from what this client's spec and device allow.
#[derive(Debug, thiserror::Error)]
pub enum RingMismatch {
    /// The daemon sent a device ring to a client attached on the CPU.
    #[error("the daemon sent a device ring, but this client attached on no GPU")]
    NoGpu,
    /// ATTACHED's slots and sizes are not the layout this client computes from its spec.
    #[error(
        "{slots} slots x {slot_bytes} bytes with a host part of {ring_bytes} bytes do not match \
         the spec's layout ({want_slot_bytes} bytes per slot, host part {want_ring_bytes})"
    )]
    Layout {
        /// ATTACHED's slots.
        slots: u32,
        /// ATTACHED's bytes per slot.
        slot_bytes: u64,
        /// ATTACHED's bytes of the memfd (the host part).
        ring_bytes: u64,
        /// Bytes per slot of the spec's layout.
        want_slot_bytes: usize,
        /// Bytes of the host part of the spec's layout.
        want_ring_bytes: usize,
    },
    /// ATTACHED's image ring size (these bytes) does not fit a `usize`.
    #[error("an image ring of {0} bytes does not fit this host")]
    TooLarge(u64),
    /// The image ring's size is not the plan's for this spec and device.
    #[error(transparent)]
    Size(CudaError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_ring_of_another_layout_is_named_with_both_sizes() {
        let e = DeviceError::Ring {
            device: Device::Cpu,
            reason: RingMismatch::Layout {
                slots: 4,
                slot_bytes: 1024,
                ring_bytes: 8192,
                want_slot_bytes: 2048,
                want_ring_bytes: 4096,
            },
        };
        assert_eq!(
            e.to_string(),
            "device ring on cpu: 4 slots x 1024 bytes with a host part of 8192 bytes do not \
             match the spec's layout (2048 bytes per slot, host part 4096)"
        );
    }
}
