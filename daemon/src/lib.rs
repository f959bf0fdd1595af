//! The stoker daemon's library: everything `stokerd` is made of, and what the `stoker` tool
//! (`daemon/tool`, package `stoker-tool`) builds on.
//!
//! Rooms (docs/architecture.md draws them and what each may touch):
//! - **source**: `source` (`index`: layouts and index cache; `local`: the io_uring reader and
//!   safe opens; `object`: s3:// object storage and the node cache);
//! - **stages**: `sampler`, `rng`,
//!   `decode` (libjpeg-turbo), `augment` (crop-resize-flip-normalize-convert), `badsample`;
//! - **engine**: `engine` (jobs, fair-share scheduler, feeds, in-order publishing on
//!   completion, the backend trait and the CPU backend); `backend` resolves `--backend`;
//!   `pipeline` is the engine's former path, kept as a re-export;
//! - **serving**: `server` (registry, connection state machine, accept loop, ops handle);
//! - **operations**: `ops` (`config`, `access`, `metrics`, `systemd`, `logging`, `ratelimit`,
//!   re-exported here) and `service` (what `stokerd` runs).
//!
//! Data flow for one rank (see `../shared/DESIGN.md`):
//! `sampler` → `reader` (io_uring) → `decode` (libjpeg-turbo / nvJPEG) → `augment` (fused
//! crop-resize-flip-normalize-convert into the slot) → the `engine` publishes the slot.

pub mod augment;
pub mod backend;
pub mod badsample;
pub mod decode;
pub mod detach;
pub mod engine;
pub mod lobby;
pub mod ops;
pub use ops::{access, config, logging, metrics, ratelimit, systemd};
pub mod pipeline;
pub mod rng;
pub mod sampler;
pub mod server;
pub mod service;
pub mod source;
pub mod stall;
