//! stoker's pipeline: from a dataset to filled ring slots. It knows no socket, config file,
//! systemd or worker protocol; the daemon (`stoker-daemon`) composes it into a server, and the
//! `stoker` tool (`stoker-tool`) runs it in process.
//!
//! Rooms (docs/architecture.md draws them and what each may touch), lowest first:
//! - **sync**: the one lock policy (locks recover from poison), used by every room;
//! - **ratelimit**: the log-line rate limiter;
//! - **metrics**: the metric names and handles every room records through;
//! - **source**: `source` (`index`: layouts and index cache; `local`: the io_uring reader and
//!   safe opens; `object`: s3:// object storage and the node cache);
//! - **transform**: `transform` (`sampler`, `rng`, `decode` (libjpeg-turbo), `augment`
//!   (crop-resize-flip-normalize-convert), `badsample`);
//! - **engine**: `engine` (jobs, fair-share scheduler, feeds, in-order publishing on
//!   completion, the backend trait, the CPU backend and the CUDA backend).
//!
//! Data flow for one rank (see docs/design.md):
//! `transform::sampler` → `source` (io_uring / object storage) → decode (`transform::decode`:
//! libjpeg-turbo; or nvJPEG in `engine::cuda`) → augment (`transform::augment`, or the
//! `stoker_augment` kernel on a GPU: fused crop-resize-flip-normalize-convert into the slot)
//! → the `engine` publishes the slot.

pub mod engine;
pub mod metrics;
pub mod ratelimit;
pub mod source;
pub mod sync;
pub mod transform;
