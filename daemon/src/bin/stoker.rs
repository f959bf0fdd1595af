//! `stoker`: the command-line tool. A thin main: parse the arguments, dispatch into
//! `stoker_daemon::cli`, exit with the command's code.

use clap::{Parser, Subcommand};
use stoker_daemon::cli;

#[derive(Debug, Parser)]
#[command(
    name = "stoker",
    version,
    about = "stoker: decoded, augmented training batches"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Decode every sample under PATH and report each failure with its reason.
    Check(cli::check::CheckArgs),
    /// Decode one JPEG at full size (no augmentation) and write it as binary PPM.
    Decode(cli::decode_file::DecodeArgs),
}

fn main() {
    let args = Cli::parse();
    let code = match &args.command {
        Command::Check(a) => cli::check::run(a),
        Command::Decode(a) => cli::decode_file::run(a),
    };
    std::process::exit(code);
}
