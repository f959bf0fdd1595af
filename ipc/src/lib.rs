//! stoker's process boundary: the pipeline spec, the ring layout, and (as they land) the
//! protocol messages, fd passing, the Rust client and the C ABI.
//!
//! This crate knows nothing of decoding: it describes what a batch is and how it travels.

pub mod dlpack;
pub mod ring;
pub mod spec;

pub use ring::{RingLayout, SampleStatus, SlotLayout};
pub use spec::{Crop, DType, Layout, PipelineSpec, SpecError};
