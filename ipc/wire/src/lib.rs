//! The contract between `stokerd` and the processes it serves: everything that crosses the
//! process boundary, and nothing that runs on either side of it.
//!
//! - `spec`: what a batch is (the pipeline spec), validated.
//! - `ring`: the ring layout both sides compute from the spec, memfd rings (host memory) and
//!   the plan of a ring in device memory.
//! - `protocol`: the messages on the daemon's socket and their wire format, and the one
//!   position type (`protocol::position`) the client, the C ABI and the daemon's engine share.
//! - `socket`: SOCK_SEQPACKET sockets with fd passing, which socket path to use, which
//!   daemon a client may trust, and the user and group names of ids.
//! - `exit`: the exit codes of `stokerd` and `stoker`, which systemd and clients act on.
//! - `escape`: text another process chose, made safe to print or log.
//!
//! The client (`stoker-client`), the pipeline (`stoker-pipeline`), the daemon and the tool all
//! depend on this crate; it depends on none of them.

pub mod escape;
pub mod exit;
pub mod protocol;
pub mod ring;
pub mod socket;
pub mod spec;

pub use protocol::{
    CudaDevice, Device, EpochOffset, ErrorCode, Message, Position, UnknownDevice, PROTOCOL_VERSION,
};
pub use ring::memfd::{MemfdError, MemfdRing};
pub use ring::{FieldStatus, ImageMemory, RingLayout, SampleStatus, SlotLayout, VmmPlan};
pub use socket::path::{
    client_socket_path, default_socket_path, resolve_client_socket, socket_env_note,
    user_socket_path, SocketSource,
};
pub use spec::{Crop, DType, Layout, PipelineSpec, SpecError, View};
