//! The stoker daemon: the server and the service composed over the pipeline
//! (`stoker-pipeline`). `stokerd` (src/bin/stokerd.rs) is this library's one user outside the
//! integration tests.
//!
//! Rooms (docs/architecture.md draws them and what each may touch), lowest first:
//! - **serve**: `serve` (registry, connection state machine, accept loop, ops handle, `lobby`,
//!   `stall`, `access`);
//! - **remote**: `remote` (remote CPU workers: a worker's TCP listener, the home daemon's
//!   backends that send units to workers, the wire, the shared-secret handshake);
//! - **service**: `service` (what `stokerd` runs; `config`, `systemd`, `detach`, `logging`,
//!   `metrics`): the composition root.

pub mod remote;
pub(crate) mod serve;
pub mod service;
