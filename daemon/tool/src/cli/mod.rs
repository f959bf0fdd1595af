//! The `stoker` command-line tool's commands, as library code: `src/main.rs` only parses
//! the arguments and dispatches here. Each command returns its process exit code.

pub mod bench;
pub mod bench_client;
pub mod check;
pub mod decode_file;
mod gpu;
pub mod ops;
pub mod pack;
pub mod selftest;
pub mod status;
pub mod stop;
pub mod synth;

pub(crate) use stoker_wire::exit::Exit;
