//! `stoker-test-client <role> <args>`: the client processes the integration tests start, so
//! that what a child does is no test of its own. Roles:
//!
//! - `hold <socket> <data> <ready>`: attaches rank 0 of 2 of job `kill`, takes two batches,
//!   writes `ready` and sleeps holding them (until killed).
//! - `refused <socket>`: attaches and must be refused for its uid (run as another uid).
//! - `permissions <socket> <root>`: must be refused what it cannot read, then served a folder
//!   whose file turned into a symlink out of the roots fails (run as another uid).
//! - `lobby <socket>`: attaches the registered dataset `reg` and receives within 1 s (run as
//!   another uid).
//! - `intruder <socket> <job>`: attaches ranks 0 and 1 of 2 of another uid's job key on `reg`,
//!   reports a data stall, prints `ready` and holds them (run as another uid).
//! - `attach-error <socket> <dataset>`: attaches `dataset`, must be refused, prints why.
//! - `hog <socket> <n> <seconds>`: attaches `n` jobs of `reg`, and takes batches from all of
//!   them for `seconds` (0: holds them until killed) (run as another uid).
//! - `rank <json>`: one rank of a multi-host job (`stoker_testkit::rank_orders`).
//! - `train <socket> <dataset>`: one epoch of `dataset` as a one-rank job, at `socket` (`-`:
//!   wherever the client's default rule finds a daemon, as a user's script would); prints
//!   `trained <images> images at <socket>`, or the error and exits 1.
//!
//! A failed check panics: the exit status and stderr tell the parent test.

mod other_uid;
mod rank;

use std::path::Path;
use std::time::Duration;

use stoker::{AttachOptions, Client, PipelineSpec};
use stoker_testkit::attach::{rank_options, u8_spec};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| -> &str {
        args.get(i)
            .unwrap_or_else(|| panic!("stoker-test-client: argument {i} missing in {args:?}"))
    };
    match arg(0) {
        "hold" => hold(Path::new(arg(1)), arg(2), Path::new(arg(3))),
        "refused" => other_uid::refused(Path::new(arg(1))),
        "permissions" => other_uid::permissions(Path::new(arg(1)), Path::new(arg(2))),
        "lobby" => other_uid::lobby(Path::new(arg(1))),
        "statuses" => other_uid::statuses(
            Path::new(arg(1)),
            arg(2),
            arg(3).parse().expect("an epoch count"),
        ),
        "intruder" => other_uid::intruder(Path::new(arg(1)), arg(2)),
        "attach-error" => other_uid::attach_error(Path::new(arg(1)), arg(2)),
        "hog" => other_uid::hog(
            Path::new(arg(1)),
            arg(2).parse().expect("a job count"),
            arg(3).parse().expect("seconds"),
        ),
        "rank" => rank::run(arg(1)),
        "train" => train(arg(1), arg(2)),
        other => panic!("stoker-test-client: unknown role {other:?}"),
    }
}

/// One rank of a job reading `data` once in u8 batches (small rings): what the tests of
/// other uids and of resuming attach with.
fn options(data: &str, job: &str, (rank, world): (u32, u32), spec: PipelineSpec) -> AttachOptions {
    rank_options(data, job, (rank, world), 7, spec)
}

/// The client of `tests/resume`'s SIGKILL test: rank 0 of 2 of job `kill` (the parent's seed
/// and spec), holding two leases until killed.
fn hold(socket: &Path, data: &str, ready: &Path) {
    let o = rank_options(data, "kill", (0, 2), 1234, u8_spec(2, 16, Some(1)));
    let mut c = Client::attach(socket, o).expect("attach");
    let held: Vec<_> = (0..2)
        .map(|_| c.next_batch().expect("a batch").expect("not the end"))
        .collect();
    std::fs::write(ready, format!("holding {}", held.len())).expect("write the ready file");
    std::thread::sleep(Duration::from_secs(120));
}

/// One epoch of `dataset` at `socket` (`-`: the default rule's socket), as a user trains.
fn train(socket: &str, dataset: &str) {
    let o = options(dataset, "train", (0, 1), u8_spec(2, 16, Some(1)));
    let (path, attached) = if socket == "-" {
        let path = stoker::client_socket_path();
        (path, Client::attach_default(o))
    } else {
        (socket.into(), Client::attach(Path::new(socket), o))
    };
    let mut client = attached.unwrap_or_else(|e| {
        eprintln!("stoker-test-client train: {e}");
        std::process::exit(1)
    });
    let mut images = 0;
    while let Some(batch) = client.next_batch().expect("a batch") {
        images += batch.n();
    }
    println!("trained {images} images at {}", path.display());
}
