//! The `stoker` command-line tool's commands, as library code: `src/main.rs` only parses
//! the arguments and dispatches here. Each command returns its process exit code.

pub mod bench;
pub mod bench_client;
pub mod check;
pub mod decode_file;
pub mod gpu;
pub mod pack;
pub mod selftest;
pub mod status;
pub mod synth;

/// Exit code: success.
pub const EXIT_OK: i32 = 0;
/// Exit code: the command ran and found failures (undecodable samples, a file that fails).
pub const EXIT_FAILURES: i32 = 1;
/// Exit code: bad arguments or configuration (clap uses 2 for usage errors too).
pub const EXIT_USAGE: i32 = 2;
