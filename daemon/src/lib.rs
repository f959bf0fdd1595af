//! The stoker daemon's library: everything `stokerd` is made of, and what the `stoker` tool
//! (`daemon/tool`, package `stoker-tool`) builds on.
//!
//! Rooms (docs/architecture.md draws them and what each may touch):
//! - **source**: `source` (`index`: layouts and index cache; `local`: the io_uring reader and
//!   safe opens; `object`: s3:// object storage and the node cache);
//! - **transform**: `transform` (`sampler`, `rng`, `decode` (libjpeg-turbo), `augment`
//!   (crop-resize-flip-normalize-convert), `badsample`);
//! - **engine**: `engine` (jobs, fair-share scheduler, feeds, in-order publishing on
//!   completion, the backend trait, the CPU backend and the CUDA backend);
//! - **serve**: `serve` (registry, connection state machine, accept loop, ops handle, `lobby`,
//!   `stall`, `access`);
//! - **remote**: `remote` (remote CPU workers: a worker's TCP listener, the home daemon's
//!   backends that send units to workers, the wire, the shared-secret handshake);
//! - **service**: `service` (what `stokerd` runs; `config`, `backend` (the `--backend`
//!   choice), `systemd`, `detach`, `logging`, `metrics`, `ratelimit`);
//! - **sync**: the one lock policy (locks recover from poison), used by every room.
//!
//! Data flow for one rank (see docs/design.md):
//! `transform::sampler` → `source` (io_uring / object storage) → decode (`transform::decode`:
//! libjpeg-turbo; or nvJPEG in `engine::cuda`) → augment (`transform::augment`, or the
//! `stoker_augment` kernel on a GPU: fused crop-resize-flip-normalize-convert into the slot)
//! → the `engine` publishes the slot.

pub mod engine;
pub mod remote;
pub mod serve;
pub mod service;
pub mod source;
pub mod sync;
pub mod transform;
