//! Workers that answer garbage: each answer that is not exactly the unit drops the
//! connection, the unit is filled locally, and the batches stay the local ones.

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use stoker_daemon::remote::auth::{self, Secret};
use stoker_daemon::remote::seal::Session;
use stoker_daemon::remote::wire::{Message, SampleFate, SampleResult};

use super::*;

/// How a fake worker spoils its answers.
#[derive(Clone, Copy)]
enum Garbage {
    /// The answer names another unit.
    WrongUnit,
    /// One byte of pixels fewer than the unit holds.
    WrongSize,
    /// The header is right; half the pixels come, then the connection closes.
    Cut,
    /// A replacement the engine could not have chosen (the bad sample itself). (A worker
    /// that calls a good sample bad and names one of its candidates is not caught: the home
    /// trusts an authenticated worker's decoding.)
    ImpossibleReplacement,
}

/// A fake worker on a loopback port that passes the handshake, opens every job, and answers
/// every unit with `garbage`.
fn fake_worker(secret: &Path, garbage: Garbage) -> String {
    let secret = Secret::load(secret).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        // Bounded: the home daemon reconnects after backoffs of 0.5 s and more.
        for stream in listener.incoming().take(20) {
            let mut s = stream.unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            if let Ok(mut session) = auth::accept(&mut s, &secret, deadline, || Ok(())) {
                let _ = answer_badly(&mut s, &mut session, garbage);
            }
        }
    });
    addr
}

fn answer_badly(s: &mut TcpStream, session: &mut Session, garbage: Garbage) -> Result<(), String> {
    let mut image_bytes = 0;
    loop {
        let unit = match session.read(s, None).map_err(|e| e.to_string())? {
            Message::Open(open) => {
                image_bytes = open.spec.image_bytes();
                let opened = Message::Opened {
                    job: open.job,
                    closed: Vec::new(),
                };
                session.write(s, &opened, &[]).map_err(|e| e.to_string())?;
                continue;
            }
            Message::Unit { id, indices, .. } => (id, indices),
            other => return Err(format!("{other:?}")),
        };
        let (id, indices) = unit;
        let mut samples: Vec<SampleResult> = indices
            .iter()
            .map(|&i| SampleResult {
                status: SampleFate::Ok,
                delivered: i,
                bad: None,
            })
            .collect();
        let mut pixels = vec![7u8; indices.len() * image_bytes];
        let mut bytes = pixels.len() as u64;
        let mut id = id;
        match garbage {
            Garbage::WrongUnit => id += 1,
            Garbage::WrongSize => bytes -= 1,
            Garbage::Cut => pixels.truncate(pixels.len() / 2),
            Garbage::ImpossibleReplacement => {
                samples[0].status = SampleFate::Replaced;
                samples[0].bad = Some(("corrupt".into(), "made up".into()));
            }
        }
        pixels.truncate(usize::try_from(bytes).unwrap());
        let done = Message::Done { id, samples, bytes };
        session
            .write(s, &done, &pixels)
            .map_err(|e| e.to_string())?;
        if matches!(garbage, Garbage::Cut) {
            return Ok(());
        }
    }
}

#[test]
fn workers_answering_another_unit_size_a_cut_frame_or_an_impossible_fate_change_nothing() {
    let world = World::new();
    let expected = reference(&world);
    let fakes: Vec<String> = [
        Garbage::WrongUnit,
        Garbage::WrongSize,
        Garbage::Cut,
        Garbage::ImpossibleReplacement,
    ]
    .into_iter()
    .map(|g| fake_worker(&world.secret, g))
    .collect();
    let workers: Vec<&str> = fakes.iter().map(String::as_str).collect();
    let (home, home_log, metrics) = world.home_with("home", &workers, 1);
    let batches = serve_job(home.socket(), &world.data, 0, || {});
    assert_eq!(batches, expected);
    let log = read_log(&home_log);
    for (what, needle) in [
        ("another unit", "with Done"),
        ("another size", "bytes for a unit of"),
        ("a cut frame", "connection closed"),
        ("an impossible replacement", "an impossible result"),
    ] {
        assert!(
            log.contains(needle),
            "{what}: no {needle:?} in the home's log:\n{log}"
        );
    }
    let drops = log.matches("its unit is filled locally").count();
    assert!(drops >= 4, "{drops} connections dropped:\n{log}");
    let text = stoker_testkit::prometheus::http_get(&metrics, "/metrics").1;
    for fake in &fakes {
        assert!(
            remote_units(&text, fake, "reissued") >= 1.0,
            "{fake}\n{text}"
        );
        assert_eq!(remote_units(&text, fake, "done"), 0.0, "{fake}\n{text}");
    }
}
