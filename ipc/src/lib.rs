//! stoker's process boundary: the pipeline spec, the ring layout, the protocol messages, fd
//! passing, memfd rings, the Rust client and the C ABI (`capi`, DLPack tensors in `dlpack`,
//! header `include/stoker.h`).
//!
//! This crate knows nothing of decoding: it describes what a batch is and how it travels.

pub mod capi;
pub mod client;
pub mod dlpack;
pub mod memfd;
pub mod protocol;
pub mod ring;
pub mod sock;
pub mod spec;

pub use client::{default_socket_path, AttachOptions, Batch, Client, ClientError};
pub use memfd::{MemfdError, MemfdRing};
pub use protocol::{ErrorCode, Message, StartPosition, PROTOCOL_VERSION};
pub use ring::{ImageMemory, RingLayout, SampleStatus, SlotLayout};
pub use spec::{Crop, DType, Layout, PipelineSpec, SpecError};
