//! The client against a fake daemon in-process (the real daemon's tests are in `tests/`).

#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use super::*;
use crate::protocol::Release;
use crate::ring::SampleStatus;
use crate::spec::SpecError;

#[test]
fn missing_daemon_is_named_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stoker.sock");
    let opts = AttachOptions::new("j", "/nowhere", PipelineSpec::train(2, 8));
    let err = Client::attach(&path, opts).unwrap_err();
    assert!(err.is_disconnected());
    assert_eq!(
        err.to_string(),
        format!("no stoker daemon at {}", path.display())
    );
}

#[test]
fn an_invalid_spec_is_refused_before_connecting() {
    let opts = AttachOptions::new("j", "/nowhere", PipelineSpec::train(0, 8));
    let err = Client::attach(Path::new("/nonexistent/s.sock"), opts).unwrap_err();
    assert!(
        matches!(err, ClientError::Spec(SpecError::BatchSize(0))),
        "{err}"
    );
}

/// A daemon stand-in on a real socket at `path`: expects job "job-a" rank 1 of 2 from
/// (3, 4), answers with a 2-slot ring for `spec`, fills slot 1 with a known batch of 3
/// (bytes 9, labels 10.., indices 100.., status [0, 0, 1]), sends READY (generation 7)
/// then END_OF_DATA, and returns what the client sent back until it hung up.
pub(crate) fn fake_daemon(
    path: &Path,
    spec: PipelineSpec,
) -> std::thread::JoinHandle<Vec<Message>> {
    use crate::protocol::Attached;
    use crate::socket::SeqPacketListener;
    use std::os::fd::AsFd;

    let listener = SeqPacketListener::bind(path).unwrap();
    let layout = RingLayout::new(&spec, 2, page_size());
    std::thread::spawn(move || {
        let conn = listener.accept().unwrap();
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        let r = conn.recv(&mut buf).unwrap().unwrap();
        let Message::Attach(a) = Message::decode(&buf[..r.len]).unwrap() else {
            panic!("expected attach")
        };
        assert_eq!((a.job.as_str(), a.rank, a.world_size), ("job-a", 1, 2));
        assert_eq!(a.start, Position::at(3, 4));
        let ring = MemfdRing::create(c"fake", layout).unwrap();
        let s = layout.slot;
        let base = ring.host_ptr(1);
        let images = ring.image_ptr(1).unwrap();
        // SAFETY: slot 1 is inside the ring and nobody else touches it yet.
        unsafe {
            std::ptr::write_bytes(images.add(s.images), 9, 3 * s.image_bytes);
            for i in 0..3 {
                base.add(s.labels + 8 * i)
                    .cast::<i64>()
                    .write(10 + i as i64);
                base.add(s.indices + 8 * i)
                    .cast::<u64>()
                    .write(100 + i as u64);
            }
            base.add(s.status + 2).write(SampleStatus::Replaced as u8);
        }
        let attached = Message::Attached(Attached {
            slots: 2,
            slot_bytes: s.slot_bytes as u64,
            ring_bytes: layout.ring_bytes as u64,
            steps_per_epoch: 5,
            offset_epoch_steps: None,
            dataset_len: 19,
            classes: 3,
            ranks_attached: 1,
            created_job: true,
            daemon_version: "test".into(),
            accepts_stats: false,
            ..Attached::default()
        });
        conn.send(&attached.encode().unwrap(), &[ring.as_fd()])
            .unwrap();
        let ready = Message::Ready(Ready {
            slot: 1,
            generation: 7,
            epoch: 3,
            step: 4,
            n: 3,
        });
        conn.send(&ready.encode().unwrap(), &[]).unwrap();
        conn.send(&Message::EndOfData.encode().unwrap(), &[])
            .unwrap();
        let mut got = Vec::new();
        while let Some(r) = conn.recv(&mut buf).unwrap() {
            got.push(Message::decode(&buf[..r.len]).unwrap());
        }
        got
    })
}

#[test]
fn attach_receive_release_against_a_fake_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stoker.sock");
    let spec = PipelineSpec::train(4, 8);
    let daemon = fake_daemon(&path, spec.clone());

    let mut opts = AttachOptions::new("job-a", "/data", spec);
    opts.rank = 1;
    opts.world_size = 2;
    opts.start = Position::at(3, 4);
    let mut client = Client::attach(&path, opts).unwrap();
    assert_eq!(client.attached().steps_per_epoch, 5);
    let batch = client.next_batch().unwrap().unwrap();
    assert_eq!((batch.epoch(), batch.step(), batch.n()), (3, 4, 3));
    assert_eq!(batch.labels(), &[10, 11, 12]);
    assert_eq!(batch.indices(), &[100, 101, 102]);
    assert_eq!(batch.status(), &[0, 0, 1]);
    assert_eq!(batch.sample_status(2), SampleStatus::Replaced);
    assert!(batch.images().iter().all(|&b| b == 9));
    assert_eq!(batch.images().len(), 3 * 8 * 8 * 3 * 4);
    // Step 4 was the epoch's last (5 steps): resume at the next epoch's first.
    assert_eq!(client.position(), Position::at(4, 0));
    assert!(client.next_batch().unwrap().is_none());
    assert!(client.next_batch().unwrap().is_none());
    drop(batch);
    drop(client);
    let got = daemon.join().unwrap();
    assert_eq!(
        got,
        vec![
            Message::Release(Release {
                slot: 1,
                generation: 7
            }),
            Message::Detach
        ]
    );
}

#[test]
fn the_stall_clock_splits_wait_from_compute() {
    let mut clock = StallClock::new();
    let t = clock.enter();
    std::thread::sleep(Duration::from_millis(30));
    clock.leave(t, true);
    std::thread::sleep(Duration::from_millis(60));
    let t = clock.enter();
    clock.leave(t, false);
    let s = clock.totals;
    assert_eq!(s.batches, 1);
    assert!(s.wait >= Duration::from_millis(30), "{s:?}");
    assert!(s.compute >= Duration::from_millis(60), "{s:?}");
    assert!(s.wait_fraction() > 0.0 && s.wait_fraction() < 0.5, "{s:?}");
    assert_eq!(StallStats::default().wait_fraction(), 0.0);
    let Message::Stats(m) = s.message() else {
        panic!("a STATS message")
    };
    assert_eq!(m.batches, 1);
    assert_eq!(m.wait_ns, s.wait.as_nanos() as u64);
}

#[test]
fn a_closed_connection_is_reported_as_such() {
    use crate::socket::SeqPacketListener;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stoker.sock");
    let listener = SeqPacketListener::bind(&path).unwrap();
    let daemon = std::thread::spawn(move || {
        let conn = listener.accept().unwrap();
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        conn.recv(&mut buf).unwrap();
        // Hang up without answering.
    });
    let opts = AttachOptions::new("j", "/data", PipelineSpec::train(2, 8));
    let err = Client::attach(&path, opts).unwrap_err();
    daemon.join().unwrap();
    assert!(matches!(err, ClientError::Closed), "{err}");
    assert_eq!(err.to_string(), "daemon closed the connection");
}
