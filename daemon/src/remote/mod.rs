//! Remote CPU workers: a `stokerd` on another machine does units of work for home daemons
//! over TCP (`[worker]`), and a home daemon sends some of its units there (`[remote]`; both
//! sections are `crate::remote::config`).
//!
//! Files: `config` (the `[worker]` and `[remote]` sections), `wire` (frames and messages), `auth` (the
//! shared secret and its challenge-response), `gate` (what each peer may hold on a worker:
//! handshakes, connections, pixel memory), `worker` (the worker's listener and
//! connections), `unit` (a unit done on the worker exactly as the local CPU backend does it),
//! `home` (the home daemon's side: a backend per connection that sends units out), `board`
//! (what a home daemon shows of each worker in `stoker status` and `/metrics`), `seal` (the
//! MAC on every frame after the handshake), `tally` (a
//! worker's own `/metrics`), `resolve` (worker names resolved again on a timer), `tls`
//! (TLS and mutual TLS, rustls).
//!
//! # Design
//! - A home daemon's engine gets, beside its decode threads, `[remote] connections` threads
//!   per worker ([`stoker_pipeline::engine::ExtraWorkers`]). They take units from the same scheduler as
//!   the local threads, so a worker's share follows how fast it returns units, and batches
//!   are published in order as always. They wait on the network, never a decode thread.
//! - A unit crosses as (job, epoch, sample indices); the worker draws every crop, flip and
//!   replacement from (seed, epoch, index) with the same code as the local CPU backend
//!   ([`stoker_pipeline::engine::CpuBackend`], [`stoker_pipeline::engine::replacement_candidates`]), so its
//!   bytes are the local bytes. The job is opened once per connection with the dataset's
//!   path, a fingerprint of its index (both sides must number the same samples alike), the
//!   spec, seed, bad-sample policy and decode limits.
//! - The pixels of a unit travel raw after a small header and are read straight into the
//!   slot (no staging copy). docs/decisions.md ("Remote workers") says why frames over TCP
//!   and not gRPC, and why the bytes are the spec's output bytes.
//! - A unit that is not back by `[remote] unit_timeout_ms`, or comes back malformed (another
//!   unit, another size, a cut frame, an impossible replacement), is filled locally at once
//!   and the connection dropped; it is tried again after a backoff. A worker's name is
//!   resolved again every `[remote] resolve_interval_s` ([`resolve`]), so the connections
//!   follow a Kubernetes headless Service's pods.
//! - Only who is allowed: HMAC-SHA256 challenge-response both ways over a shared secret file
//!   (never logged; compared in constant time), then a MAC on every frame under keys of that
//!   connection ([`seal`]), so a relay can neither alter, replay nor inject a frame; the worker opens only registered datasets,
//!   paths under its own `[access] dataset_roots` or `s3://` URLs under `[worker]
//!   s3_prefixes`, and caps handshakes, connections, jobs and pixel memory per peer
//!   ([`gate`]). Both sides keep TCP keepalive on and bound writes; a worker closes a
//!   connection silent for `[worker] idle_timeout_ms`.
//!
//! # Limitations
//! - Without `tls_*` keys ([`tls`]) traffic is authenticated and MACed, not encrypted: a
//!   listener on the network reads the pixels and paths.
//! - An authenticated worker is trusted with its decoding: the home checks an answer's
//!   shape and that a replacement is one the engine's rule allows, not the pixels, nor that
//!   a sample it calls bad is bad.
//! - One unit in flight per connection; more connections give more in flight.
//! - While a worker is down its threads fill their units locally (after the backoff each
//!   tries once to reconnect), which adds threads to the local CPUs.

pub mod auth;
pub(crate) mod board;
pub(crate) mod config;
pub(crate) mod gate;
pub(crate) mod home;
pub(crate) mod resolve;
pub mod seal;
pub(crate) mod tally;
pub(crate) mod tls;
pub mod unit;
pub mod wire;
pub(crate) mod worker;

pub use config::{RemoteConfig, WorkerConfig};
