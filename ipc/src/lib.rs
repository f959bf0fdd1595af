//! stoker's process boundary: the pipeline spec, the ring layout, the protocol messages, fd
//! passing, memfd rings, the Rust client and the C ABI (`capi`, DLPack tensors in `dlpack`,
//! header `include/stoker.h`).
//!
//! Device memory sharing is inter-process communication too, so the CUDA driver binding lives
//! here (`cuda`: loading libcuda at run time, devices by UUID, contexts, streams, events, VMM
//! ring export/import; `loader`: how NVIDIA libraries are found): the client imports rings
//! without NVRTC or nvJPEG. `stoker-kernels` re-exports both under their former paths.
//!
//! This crate knows nothing of decoding: it describes what a batch is and how it travels.

pub mod capi;
pub mod client;
/// cbindgen:ignore
mod client_device;
/// cbindgen:ignore
pub mod cuda;
pub mod dlpack;
/// cbindgen:ignore
pub mod loader;
pub mod memfd;
pub mod protocol;
pub mod ring;
pub mod sock;
pub mod spec;

pub use client::{
    client_socket_path, default_socket_path, user_socket_path, AttachOptions, Batch, Client,
    ClientError, ConsumerStream, DeviceError, DeviceSlice, StallStats,
};
pub use client_device::resolve_device;
pub use memfd::{MemfdError, MemfdRing};
pub use protocol::{EpochOffset, ErrorCode, Message, StartPosition, PROTOCOL_VERSION};
pub use ring::{ImageMemory, RingLayout, SampleStatus, SlotLayout};
pub use spec::{Crop, DType, Layout, PipelineSpec, SpecError};
