//! A relay between a home daemon and a worker (issue 42 item 5): it passes the handshake
//! through untouched, then alters the worker's answers, one relay flipping a pixel of every
//! unit, another calling a good sample failed and zeroing its pixels. The home must notice
//! (every frame after the handshake carries a MAC under a key of that connection), drop the
//! connection, fill the unit locally, and serve the local batches bit for bit.
//!
//! The relay is a TCP forwarder on its own loopback port between two real `stokerd`
//! processes; it knows the framing (it is an attacker who read the protocol), not the secret.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;

/// The bytes of a frame's MAC from protocol version 2 on.
const TAG_BYTES: usize = 32;

/// What a relay does to each unit's answer.
#[derive(Clone, Copy, Debug)]
enum Tamper {
    /// Flips bits of the first pixel byte of every image.
    FlipPixels,
    /// Rewrites the first Ok sample's fate to failed ("corrupt") and zeroes its pixels.
    FailSample,
}

/// A relay on a free loopback port to `worker`; its address and how many answers it altered.
fn relay(worker: &str, tamper: Tamper) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let altered = Arc::new(AtomicUsize::new(0));
    let (worker, count) = (worker.to_owned(), Arc::clone(&altered));
    std::thread::spawn(move || {
        // Bounded: the home daemon reconnects after backoffs of 0.5 s and more.
        for home in listener.incoming().take(40) {
            let Ok(home) = home else { continue };
            let Ok(up) = TcpStream::connect(&worker) else {
                continue;
            };
            let count = Arc::clone(&count);
            std::thread::spawn(move || {
                let (mut to_worker, mut from_home) =
                    (up.try_clone().unwrap(), home.try_clone().unwrap());
                let ask = std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_home, &mut to_worker);
                    let _ = to_worker.shutdown(Shutdown::Both);
                    let _ = from_home.shutdown(Shutdown::Both);
                });
                let _ = answers(&up, &home, tamper, &count);
                let _ = up.shutdown(Shutdown::Both);
                let _ = home.shutdown(Shutdown::Both);
                let _ = ask.join();
            });
        }
    });
    (addr, altered)
}

/// Forwards the worker's frames to the home, altering each unit's answer by `tamper`.
fn answers(
    mut worker: &TcpStream,
    mut home: &TcpStream,
    tamper: Tamper,
    altered: &AtomicUsize,
) -> std::io::Result<()> {
    let (mut version, mut tag) = (0, 0);
    loop {
        let mut len = [0u8; 4];
        worker.read_exact(&mut len)?;
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        worker.read_exact(&mut body)?;
        let mut after = vec![0u8; tag];
        worker.read_exact(&mut after)?;
        let mut message: serde_json::Value = serde_json::from_slice(&body)?;
        let mut pixels = Vec::new();
        match message["type"].as_str() {
            Some("challenge") => version = message["version"].as_u64().unwrap_or(0),
            // The handshake is over: from version 2 on every frame carries a MAC.
            Some("welcome") if version >= 2 => tag = TAG_BYTES,
            Some("done") => {
                let bytes = usize::try_from(message["bytes"].as_u64().unwrap_or(0)).unwrap();
                pixels = vec![0u8; bytes + if bytes > 0 { tag } else { 0 }];
                worker.read_exact(&mut pixels)?;
                let n = message["samples"].as_array().map_or(0, Vec::len);
                if alter(&mut message, &mut pixels[..bytes], n, tamper) {
                    body = serde_json::to_vec(&message)?;
                    altered.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {}
        }
        let len = u32::try_from(body.len()).unwrap().to_le_bytes();
        home.write_all(&[&len[..], &body, &after, &pixels].concat())?;
    }
}

/// Alters one answer of `n` samples whose pixels are `pixels`; whether it did.
fn alter(message: &mut serde_json::Value, pixels: &mut [u8], n: usize, tamper: Tamper) -> bool {
    if n == 0 || pixels.is_empty() {
        return false;
    }
    let image = pixels.len() / n;
    match tamper {
        Tamper::FlipPixels => {
            for at in (0..pixels.len()).step_by(image) {
                pixels[at] ^= 0x55;
            }
            true
        }
        Tamper::FailSample => {
            let samples = message["samples"].as_array_mut().unwrap();
            let Some(k) = samples.iter().position(|s| s["status"] == "ok") else {
                return false;
            };
            samples[k]["status"] = "failed".into();
            samples[k]["bad"] = serde_json::json!(["corrupt", "says the relay"]);
            pixels[k * image..(k + 1) * image].fill(0);
            true
        }
    }
}

#[test]
fn a_relay_altering_answers_after_the_handshake_is_caught_and_changes_no_batch() {
    let world = World::new();
    let expected = reference(&world);
    let (_worker, _, worker) = world.worker("worker");
    let (flip, flipped) = relay(&worker, Tamper::FlipPixels);
    let (fail, failed) = relay(&worker, Tamper::FailSample);
    let (home, home_log, metrics) = world.home_with("home", &[&flip, &fail], 1);
    let batches = serve_job(home.socket(), &world.data, 0, || {});
    let (flipped, failed) = (
        flipped.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    assert!(
        flipped > 0 && failed > 0,
        "answers altered: {flipped} flipped, {failed} failed"
    );
    let differ = batches
        .iter()
        .flatten()
        .zip(expected.iter().flatten())
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(
        differ,
        0,
        "{differ} of {} batches differ from the local ones",
        expected.iter().flatten().count()
    );
    assert_eq!(batches, expected);
    let log = read_log(&home_log);
    let text = stoker_testkit::prometheus::http_get(&metrics, "/metrics").1;
    for relay in [&flip, &fail] {
        let caught = log.lines().any(|l| {
            l.contains("its unit is filled locally")
                && l.contains(relay.as_str())
                && l.contains("MAC")
        });
        assert!(
            caught,
            "{relay}: no dropped connection for a bad MAC in the home's log:\n{log}"
        );
        assert!(
            remote_units(&text, relay, "reissued") >= 1.0,
            "{relay}\n{text}"
        );
        assert_eq!(remote_units(&text, relay, "done"), 0.0, "{relay}\n{text}");
    }
}
