//! `stoker`: the command-line tool. A thin main: parse the arguments, dispatch into
//! `stoker_tool::cli`, exit with the command's code.

#![forbid(unsafe_code)]

use std::io::IsTerminal;

use clap::{Parser, Subcommand};
use stoker_tool::cli;

#[derive(Debug, Parser)]
#[command(
    name = "stoker",
    version = stoker_wire::protocol::VERSION_LINE,
    about = "stoker: decoded, augmented training batches"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure the pipeline's images/s on a dataset, with the time per stage.
    Bench(Box<cli::bench::BenchArgs>),
    /// One client process of `stoker bench` (internal).
    #[command(hide = true)]
    BenchClient(cli::bench_client::BenchClientArgs),
    /// Decode every sample under PATH and report each failure with its reason.
    Check(cli::check::CheckArgs),
    /// Decode one image of any supported format (JPEG, PNG, WebP, BMP, TIFF, PPM/PGM) at full
    /// size, without augmentation, and write it as binary PPM.
    Decode(cli::decode_file::DecodeArgs),
    /// Apply one view operation to raw RGB, or print the operations' draws (checks against
    /// torchvision).
    Ops(cli::ops::OpsArgs),
    /// Ask the running daemon what it serves: jobs, ranks, img/s, backend, errors.
    Status(cli::status::StatusArgs),
    /// Stop the daemon (this user's own by default): it drains, exits, and this waits for it.
    Stop(cli::stop::StopArgs),
    /// Turn a dataset (folder, file list, shards) into WebDataset tar shards of a target size.
    Pack(cli::pack::PackArgs),
    /// Check this machine's GPUs: nvJPEG and the kernels against the CPU, rings across
    /// processes.
    Selftest(cli::selftest::SelftestArgs),
    /// The second process of `stoker selftest --gpu`'s ring check (internal).
    #[command(hide = true)]
    SelftestRingReader(cli::selftest::RingReaderArgs),
    /// Write a generated dataset of realistic JPEGs (ImageFolder layout or tar shards).
    Synth(cli::synth::SynthArgs),
}

fn main() -> std::process::ExitCode {
    let args = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STOKER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, never into a pipe or a log file.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let code = match &args.command {
        Command::Bench(a) => cli::bench::run(a),
        Command::BenchClient(a) => cli::bench_client::run(a),
        Command::Check(a) => cli::check::run(a),
        Command::Decode(a) => cli::decode_file::run(a),
        Command::Ops(a) => cli::ops::run(a),
        Command::Status(a) => cli::status::run(a),
        Command::Stop(a) => cli::stop::run(a),
        Command::Pack(a) => cli::pack::run(a),
        Command::Selftest(a) => cli::selftest::run(a),
        Command::SelftestRingReader(a) => cli::selftest::run_reader(a),
        Command::Synth(a) => cli::synth::run(a),
    };
    std::process::ExitCode::from(code)
}
