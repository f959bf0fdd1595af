//! The daemon as a service: what `stokerd` runs once its flags are parsed. Reads the config,
//! chooses the backend, binds (or takes systemd's socket), starts metrics, the signal and
//! supervisor threads, serves, and drains on SIGTERM.
//!
//! # Design
//! - `stokerd`'s `main` parses flags, blocks signals, sets up logging and calls [`run`]; every
//!   failure comes back as a [`ServiceError`] whose [`ServiceError::exit_code`] tells
//!   configuration errors (78, EX_CONFIG, so systemd's `RestartPreventExitStatus=78` stops a
//!   restart loop) from failures at run time (1).
//! - SIGTERM drains (clients are told the daemon stops), a second SIGTERM exits at once,
//!   SIGHUP reloads the access rules and registered datasets.
//!
//! Files: `run` (the run itself: config, backend, bind, serve, drain), `config` (the TOML
//! file: the rooms' sections assembled, validated), `systemd` (sd_notify, the watchdog, socket activation, signals), `detach` (`--detach`: the ready notice from the
//! child), `logging` (the tracing subscriber), `metrics` (the Prometheus recorder and the
//! `/metrics` listener over the pipeline's names).
//!
//! # Limitations
//! - A drain that outlasts `run::DRAIN_TIMEOUT` (10 s) exits with clients still attached.
//! - Reload (SIGHUP) applies the access rules and datasets only; the rest needs a restart.

pub mod config;
pub mod detach;
pub mod logging;
pub mod metrics;
mod run;
pub mod systemd;

pub use run::{run, ServiceError, StokerdArgs};
