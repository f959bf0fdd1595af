//! The stoker client library (`libstoker`): everything a training process needs to talk to
//! `stokerd`, and everything that crosses the process boundary between them.
//!
//! - `spec`: what a batch is (the pipeline spec), validated.
//! - `ring`: the ring layout both sides compute from the spec, memfd rings (host memory) and
//!   the plan of a ring in device memory.
//! - `protocol`: the messages on the daemon's socket and their wire format, and the one
//!   position type (`protocol::position`) the client, the C ABI and the daemon's engine share.
//! - `socket`: SOCK_SEQPACKET sockets with fd passing, and which socket path to use.
//! - `client`: the Rust client (attach, receive batches, release them, resume).
//! - `capi`: the C ABI of `libstoker.so` (header `include/stoker.h`), which the Python package
//!   uses through ctypes; `dlpack`: the DLPack tensors it hands out.
//!
//! Device memory sharing is inter-process communication too: `ring::vmm_plan` sizes a ring in device
//! memory, and the client imports it with the CUDA driver binding of `stoker-nvidia` (without
//! NVRTC or nvJPEG).
//!
//! This crate knows nothing of decoding: it describes what a batch is and how it travels.

pub mod capi;
pub mod client;
pub mod dlpack;
pub mod protocol;
pub mod ring;
pub mod socket;
pub mod spec;

pub use client::{
    AttachOptions, Batch, Client, ClientError, ConsumerStream, DeviceError, DeviceSlice,
    FieldError, StallStats,
};
pub use protocol::{
    CudaDevice, Device, EpochOffset, ErrorCode, Message, Position, UnknownDevice, PROTOCOL_VERSION,
};
pub use ring::memfd::{MemfdError, MemfdRing};
pub use ring::vmm_plan::VmmPlan;
pub use ring::{FieldStatus, ImageMemory, RingLayout, SampleStatus, SlotLayout};
pub use socket::path::{
    client_socket_path, default_socket_path, resolve_client_socket, socket_env_note,
    user_socket_path, SocketSource,
};
pub use spec::{Crop, DType, Layout, PipelineSpec, SpecError, View};
