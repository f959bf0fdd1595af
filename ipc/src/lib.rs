//! stoker's process boundary: the pipeline spec, the ring layout, the protocol messages, fd
//! passing, memfd rings, the Rust client and the C ABI (`capi`, DLPack tensors in `dlpack`,
//! header `include/stoker.h`).
//!
//! Device memory sharing is inter-process communication too: `vmm_plan` sizes a ring in device
//! memory, and the client imports it with the CUDA driver binding of `stoker-nvidia` (without
//! NVRTC or nvJPEG).
//!
//! This crate knows nothing of decoding: it describes what a batch is and how it travels.

pub mod capi;
pub mod client;
/// cbindgen:ignore
mod client_device;
pub mod dlpack;
pub mod memfd;
pub mod protocol;
pub mod ring;
pub mod sock;
pub mod spec;
/// cbindgen:ignore
pub mod vmm_plan;

pub use client::{
    client_socket_path, default_socket_path, user_socket_path, AttachOptions, Batch, Client,
    ClientError, ConsumerStream, DeviceError, DeviceSlice, StallStats,
};
pub use client_device::resolve_device;
pub use memfd::{MemfdError, MemfdRing};
pub use protocol::{EpochOffset, ErrorCode, Message, StartPosition, PROTOCOL_VERSION};
pub use ring::{ImageMemory, RingLayout, SampleStatus, SlotLayout};
pub use spec::{Crop, DType, Layout, PipelineSpec, SpecError};
pub use vmm_plan::VmmPlan;
