//! The `stoker` command-line tool, as library code: `src/main.rs` only parses the arguments
//! and dispatches into [`cli`]. It is built on the pipeline's library (`stoker_pipeline`): the
//! same datasets, reader, decoder, augmenter and engine `stokerd` runs.
//!
//! - `cli`: the commands (`bench`, `check`, `status`, `selftest`, `synth`, `pack`, `decode`);
//! - `bench` (private): the in-process pipeline benchmark `stoker bench` runs;
//! - `synth`: generated datasets of realistic JPEGs;
//! - `pack`: WebDataset tar shards from any dataset;
//! - `edge_manifest`: the edge corpus's manifest (what each file must do).

mod bench;
pub mod cli;
pub mod edge_manifest;
pub mod pack;
pub mod synth;
