//! The root package: integration tests (`tests/`) and benchmarks (`benches/`) live here, and
//! this library holds what they share (fixture builders, process helpers).

pub mod daemon_proc;
