//! The transform room: what turns an indexed sample into the bytes of its slot.
//!
//! Files: `sampler` (which samples each rank reads, in which order, per epoch), `rng` (the
//! seeded generators the sampler and augmentation draw from), `decode` (libjpeg-turbo, and the
//! sniffing of formats), `augment` (fused crop-resize-flip-normalize-convert into the slot),
//! `badsample` (why a sample could not be delivered, counted and logged by reason), `orient`
//! (EXIF orientation in the crop geometry), `ops` (torchvision's per-sample operations after
//! the crop, and RandomErasing), `mix` (MixUp and CutMix over a whole batch, and the soft
//! labels they make).
//!
//! # Design
//! - Nothing here reads storage or serves: the engine hands these functions bytes and slots.

pub mod augment;
pub mod badsample;
pub mod decode;
pub mod mix;
pub mod ops;
pub mod orient;
pub mod rng;
pub mod sampler;
