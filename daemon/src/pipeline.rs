//! The engine's former path, kept so `stoker_daemon::pipeline::...` keeps compiling: the
//! engine now lives in [`crate::engine`] (scheduler, feeds, backends).

pub use crate::engine::*;
