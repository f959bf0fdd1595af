//! A home daemon that goes silent after its handshake (partitioned, stopped, or just gone
//! without a FIN) does not hold a worker's connections forever: the worker closes them
//! after `[worker] idle_timeout_ms`, logged, and another home daemon gets in.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use stoker_daemon::remote::auth;

use super::refusals::{secret, wait_for_line};
use super::*;

/// The worker's keys: two connections per peer, silence ends a connection after 1 s.
const KEYS: &str = "max_connections_per_peer = 2\nidle_timeout_ms = 1000\n";

#[test]
fn a_silent_home_daemon_loses_its_connections_and_another_gets_in() {
    let world = World::new();
    let addr = format!("127.0.0.1:{}", free_port());
    let (_worker, log, addr) = world.worker_at("worker", &addr, KEYS);
    let key = secret(&world, "a-test-secret-of-some-length");
    let soon = || Instant::now() + Duration::from_secs(5);
    // The silent home: both its connections authenticate, then nothing more is sent.
    let silent: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            auth::connect(&mut s, &key, soon()).unwrap();
            s
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(8);
    let got_in = loop {
        let mut s = TcpStream::connect(&addr).unwrap();
        match auth::connect(&mut s, &key, soon()) {
            Ok(_) => break Instant::now(),
            Err(e) => assert!(
                Instant::now() < deadline,
                "a silent home daemon still holds the worker's connections: {e}\n{}",
                read_log(&log)
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let line = wait_for_line(&log, "idle for");
    assert!(line.contains("worker.idle_timeout_ms"), "{line}");
    // The silent connections were closed by the worker: reading them ends at once.
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut byte = [0u8; 1];
        let n = std::io::Read::read(&mut s, &mut byte);
        assert!(matches!(n, Ok(0)) || n.is_err(), "{n:?}");
    }
    let _ = got_in;
}
