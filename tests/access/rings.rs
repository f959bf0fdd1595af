//! One connection cannot obtain another one's ring.

use super::*;
use stoker_testkit::wire::raw_attach;

fn inode(fd: &OwnedFd) -> (u64, u64) {
    // SAFETY: fstat on a valid fd into a zeroed stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    (st.st_dev, st.st_ino)
}

/// Every fd that arrives on `s` until the daemon closes it (or 300 ms of silence).
fn fds_until_closed(s: &SeqPacket) -> Vec<OwnedFd> {
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let mut fds = Vec::new();
    while let Ok(Some(r)) = s.recv(&mut buf) {
        fds.extend(r.fds);
    }
    fds
}

#[test]
fn a_second_connection_cannot_obtain_the_first_ones_ring() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 1, 4);
    let daemon = Daemon::start(dir.path(), &["--threads", "1"]);
    let a = Attach {
        job: "j".into(),
        rank: 0,
        world_size: 2,
        device: stoker::Device::Cpu,
        spec: spec(2, 8, None),
        dataset: data.to_str().unwrap().into(),
        seed: 1,
        start: Position::default(),
        offset: None,
    };
    let (_first, fd, msg) = raw_attach(daemon.socket(), &a);
    assert!(matches!(msg, Message::Attached(_)));
    let theirs = inode(&fd.expect("ring fd"));

    let attached = Attached {
        slots: 4,
        slot_bytes: 1,
        ring_bytes: 1,
        steps_per_epoch: 1,
        offset_epoch_steps: None,
        dataset_len: 1,
        classes: 1,
        ranks_attached: 1,
        created_job: false,
        daemon_version: "x".into(),
        accepts_stats: false,
        ..Attached::default()
    };
    let mut probes: Vec<Vec<u8>> = [
        Message::Attach(Box::new(a.clone())), // the same rank: RANK_TAKEN
        Message::Release(Release {
            slot: 0,
            generation: 1,
        }),
        Message::Ready(Ready {
            slot: 0,
            generation: 1,
            epoch: 0,
            step: 0,
            n: 2,
        }),
        Message::Attached(attached),
        Message::Detach,
        Message::EndOfData,
        Message::error(ErrorCode::Internal, "x"),
    ]
    .iter()
    .map(|m| m.encode().unwrap())
    .collect();
    probes.push(b"garbage".to_vec());
    for bytes in &probes {
        let s = SeqPacket::connect(daemon.socket()).unwrap();
        s.send(bytes, &[]).unwrap();
        for fd in fds_until_closed(&s) {
            assert_ne!(
                inode(&fd),
                theirs,
                "a second connection got the first one's ring"
            );
        }
    }
    // Attached as the other rank, then asking for the first rank's slots: its own ring only.
    let mut b = a.clone();
    b.rank = 1;
    let (s, fd, msg) = raw_attach(daemon.socket(), &b);
    assert!(matches!(msg, Message::Attached(_)));
    assert_ne!(inode(&fd.unwrap()), theirs);
    s.send(
        &Message::Release(Release {
            slot: 0,
            generation: 1,
        })
        .encode()
        .unwrap(),
        &[],
    )
    .unwrap();
    for fd in fds_until_closed(&s) {
        assert_ne!(inode(&fd), theirs);
    }
}
