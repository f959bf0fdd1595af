//! The `rank` role: one rank of a multi-host job, following its `RankOrders`.
//!
//! Log lines: `B epoch step hash i,j,...` per batch; `D` when the daemon went away, `R epoch
//! step` once attached again there; `H` while held at the gate; `C epoch consumed` (the
//! elastic checkpoint) when told to stop; `E` at the end of the data.

use std::io::Write;

use stoker::{Client, SampleStatus};
use stoker_testkit::fnv1a;
use stoker_testkit::rank_orders::{wait_for, RankOrders};

/// Runs the rank the JSON `orders` describe.
pub(crate) fn run(orders: &str) {
    let orders = RankOrders::from_json(orders);
    let mut log = std::fs::File::create(&orders.log).unwrap();
    let mut line = |text: String| {
        log.write_all(format!("{text}\n").as_bytes()).unwrap();
        log.flush().unwrap();
    };
    let mut opts = orders.options();
    let mut client = Client::attach(&orders.socket, opts.clone()).unwrap();
    let mut received = 0u64;
    loop {
        if orders.stop_after == Some(received) {
            let c = client.checkpoint();
            line(format!("C {} {}", c.epoch, c.consumed));
            return;
        }
        if orders.hold_after == Some(received) {
            line("H".into());
            wait_for(|| orders.gate.exists(), "the gate");
        }
        match client.next_batch() {
            Ok(Some(b)) => {
                assert!(b.status().iter().all(|&s| s == SampleStatus::Ok as u8));
                let indices: Vec<String> = b.indices().iter().map(u64::to_string).collect();
                let hash = fnv1a(&[b.images(), bytes_of(b.labels())]);
                line(format!(
                    "B {} {} {hash:x} {}",
                    b.epoch(),
                    b.step(),
                    indices.join(",")
                ));
                received += 1;
            }
            Ok(None) => {
                line("E".into());
                return;
            }
            Err(e) if e.is_disconnected() => {
                line("D".into());
                opts.start = client.position();
                drop(client);
                client = Client::attach(&orders.socket, opts.clone()).unwrap();
                line(format!("R {} {}", opts.start.epoch, opts.start.step));
            }
            Err(e) => panic!("rank {}: {e}", orders.rank),
        }
    }
}

fn bytes_of(labels: &[i64]) -> &[u8] {
    // SAFETY: i64 has no padding; the slice's bytes are initialised and live as long.
    unsafe { std::slice::from_raw_parts(labels.as_ptr().cast(), std::mem::size_of_val(labels)) }
}
