//! The stoker client library (`libstoker`): everything a training process needs to talk to
//! `stokerd`. What crosses the process boundary (the spec, the protocol, the ring layout, the
//! socket and its path) is the contract of `stoker-wire`, re-exported here under the same
//! names (`stoker::spec`, `stoker::protocol`, `stoker::ring`, `stoker::socket`).
//!
//! - `client`: the Rust client (attach, receive batches, release them, resume).
//! - `capi`: the C ABI of `libstoker.so` (header `include/stoker.h`), which the Python package
//!   uses through ctypes; `dlpack`: the DLPack tensors it hands out.
//!
//! Device memory sharing is inter-process communication too: `ring::VmmPlan` sizes a ring in device
//! memory, and the client imports it with the CUDA driver binding of `stoker-nvidia` (without
//! NVRTC or nvJPEG).
//!
//! This crate knows nothing of decoding: it describes what a batch is and how it travels.

pub mod capi;
pub mod client;
pub mod dlpack;

pub use stoker_wire::{protocol, ring, socket, spec};

pub use client::{
    AttachOptions, Batch, Client, ClientError, ConsumerStream, DeviceError, DeviceSlice,
    FieldError, StallStats,
};
pub use stoker_wire::{
    client_socket_path, default_socket_path, resolve_client_socket, socket_env_note,
    user_socket_path, Crop, CudaDevice, DType, Device, EpochOffset, ErrorCode, FieldStatus,
    ImageMemory, Layout, MemfdError, MemfdRing, Message, PipelineSpec, Position, RingLayout,
    SampleStatus, SlotLayout, SocketSource, SpecError, UnknownDevice, View, VmmPlan,
    PROTOCOL_VERSION,
};
