//! Operations: how the daemon is configured, secured, observed and run under systemd. Each
//! module is re-exported at the crate root (`crate::service::config`, `crate::serve::access`, ...), the paths
//! the rest of the code uses.
//!
//! - `config`: the TOML file, its defaults and validation;
//! - `access`: who may attach, which datasets they may name, memory quotas;
//! - `metrics`: the Prometheus names and the `/metrics` listener;
//! - `systemd`: sd_notify, the watchdog, socket activation, signals;
//! - `logging`: the tracing subscriber;
//! - `ratelimit`: the log-line rate limiter.
//!
//! # Design
//! - Nothing here decodes or serves; the engine and the server read what these modules hold.
//!
//! # Limitations
//! - Reload (SIGHUP) applies the access rules and datasets only; the rest needs a restart.

#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

pub mod access;
pub mod config;
pub mod logging;
pub mod metrics;
pub mod ratelimit;
pub mod systemd;
