//! The roles run as another uid (`stoker_testkit::child::OTHER_UID`).

use std::path::Path;
use std::time::{Duration, Instant};

use stoker::{Client, ErrorCode, SampleStatus};
use stoker_testkit::attach::u8_spec;
use stoker_testkit::batches::{drain, got, Got};
use stoker_testkit::child::OTHER_UID;

use crate::options;

/// Attaches to `socket` and must be refused for its uid.
pub(crate) fn refused(socket: &Path) {
    let o = options("/nowhere", "j", (0, 1), u8_spec(2, 8, Some(1)));
    let err = Client::attach(socket, o).expect_err("a process of another uid was let in");
    assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{err}");
    assert!(
        err.to_string().contains(&format!("uid {OTHER_UID}")),
        "{err}"
    );
    println!("refused as expected: {err}");
}

/// Refused `root/secret` and `root/secret.tsv`; served `root/open` until its `c0/img002.jpg`
/// becomes a symlink to a file out of the roots, which then fails (policy fail).
pub(crate) fn permissions(socket: &Path, root: &Path) {
    let attach = |data: &Path, epochs: u32| {
        let spec = u8_spec(4, 16, Some(epochs));
        Client::attach(
            socket,
            options(data.to_str().unwrap(), "perm", (0, 1), spec),
        )
    };
    for unreadable in ["secret", "secret.tsv"] {
        let err = attach(&root.join(unreadable), 1).expect_err(unreadable);
        let code = err.code();
        assert_eq!(
            code,
            Some(ErrorCode::PermissionDenied),
            "{unreadable}: {err}"
        );
        assert!(
            err.to_string().contains(&format!("uid {OTHER_UID}")),
            "{err}"
        );
        println!("refused as expected: {err}");
    }
    let mut c = attach(&root.join("open"), 6).expect("attach the open folder");
    let first = got(&c.next_batch().expect("a batch").expect("not the end"));
    assert!(first.status.iter().all(|&s| s == SampleStatus::Ok as u8));
    let swapped = root.join("open/c0/img002.jpg");
    std::fs::remove_file(&swapped).expect("remove img002.jpg");
    // Beside the roots: the parent test wrote it, mode 0600, owned by root.
    let outside = root
        .parent()
        .expect("root has a parent")
        .join("outside/secret.jpg");
    std::os::unix::fs::symlink(outside, &swapped).expect("symlink img002.jpg");
    let rest = drain(&mut c);
    let late: Vec<&Got> = rest.iter().filter(|g| g.epoch >= 4).collect();
    assert_eq!(late.len(), 2);
    for g in late {
        for (k, &i) in g.indices.iter().enumerate() {
            let want = if i == 2 {
                SampleStatus::Failed
            } else {
                SampleStatus::Ok
            };
            assert_eq!(g.status[k], want as u8, "index {i} in {g:?}");
        }
    }
    println!("the swapped-in symlink was refused");
}

/// Attaches the registered dataset `reg` and receives a batch within a second.
pub(crate) fn lobby(socket: &Path) {
    let t0 = Instant::now();
    let o = options("reg", "lobby-other", (0, 1), u8_spec(2, 16, Some(1)));
    let mut c = Client::attach(socket, o).expect("the other uid attaches");
    assert!(c.next_batch().expect("a batch").is_some());
    let took = t0.elapsed();
    println!("attached and received in {} ms", took.as_millis());
    assert!(took < Duration::from_secs(1), "attach took {took:?}");
}

/// Attaches ranks 0 and 1 of 2 of job `job` on the registered dataset `reg` (another uid's
/// job has that key), says for each whether it made a job or joined one, reports a data stall
/// from rank 1, prints `ready` and holds both ranks until killed.
pub(crate) fn intruder(socket: &Path, job: &str) {
    let attach = |rank: u32| {
        let o = options("reg", job, (rank, 2), u8_spec(2, 16, None));
        Client::attach(socket, o)
    };
    let mut held = Vec::new();
    for rank in [0, 1] {
        match attach(rank) {
            Ok(c) => {
                let a = c.attached();
                println!(
                    "rank {rank}: created_job {} ranks_attached {}",
                    a.created_job, a.ranks_attached
                );
                held.push(c);
            }
            Err(e) => println!("rank {rank}: refused: {e}"),
        }
    }
    if let Some(c) = held.last_mut() {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(1300) {
            c.next_batch().expect("a batch").expect("not the end");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    println!("ready");
    std::thread::sleep(Duration::from_secs(60));
}

/// Attaches the dataset `dataset`, which must be refused; prints the code and the message.
pub(crate) fn attach_error(socket: &Path, dataset: &str) {
    let o = options(dataset, "refused-dataset", (0, 1), u8_spec(2, 16, Some(1)));
    let err = Client::attach(socket, o).expect_err("the attach was served");
    println!("refused: {:?}: {err}", err.code());
}

/// Attaches `n` one-rank jobs `hog-<i>` (seed 7 + i) on the registered dataset `reg` and says for each
/// whether it was served; prints `attached`. With `seconds` > 0 it then takes batches from
/// every job for that long and prints `delivered <images>`; else it holds them until killed.
pub(crate) fn hog(socket: &Path, n: usize, seconds: f64) {
    let mut held = Vec::new();
    for i in 0..n {
        let mut o = options("reg", &format!("hog-{i}"), (0, 1), u8_spec(2, 16, None));
        // Orders of their own, as separate runs have: the jobs ask for different samples.
        o.seed += i as u64;
        match Client::attach(socket, o) {
            Ok(c) => {
                println!("job {i}: attached");
                held.push(c);
            }
            Err(e) => println!("job {i}: refused: {e}"),
        }
    }
    println!("attached");
    if seconds <= 0.0 {
        std::thread::sleep(Duration::from_secs(120));
        return;
    }
    let window = Duration::from_secs_f64(seconds);
    let threads: Vec<_> = held
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let mut images = 0u64;
                while t0.elapsed() < window {
                    let b = c.next_batch().expect("a batch").expect("not the end");
                    images += b.n() as u64;
                }
                images
            })
        })
        .collect();
    let delivered: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    println!("delivered {delivered}");
}

/// Reads `data` for `epochs` epochs (world size 1, batch 4) and prints each batch's indices
/// with their statuses, one line per batch: what a test compares between two daemons.
pub(crate) fn statuses(socket: &Path, data: &str, epochs: u32) {
    let o = options(data, "statuses", (0, 1), u8_spec(4, 16, Some(epochs)));
    let mut c = Client::attach(socket, o).expect("attach");
    for g in drain(&mut c) {
        let pairs: Vec<String> = g
            .indices
            .iter()
            .zip(&g.status)
            .map(|(i, s)| format!("{i}:{s}"))
            .collect();
        println!(
            "epoch {} step {} hash {:x}: {}",
            g.epoch,
            g.step,
            g.hash,
            pairs.join(" ")
        );
    }
}
