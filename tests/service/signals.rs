//! SIGTERM and SIGHUP.

use super::*;

#[test]
fn sigterm_tells_attached_clients_and_exits_0() {
    let (_dir, data, socket, mut d) = serving();
    let data = data.to_str().unwrap().to_owned();
    let clients: Vec<_> = (0..2)
        .map(|r| {
            let opts = AttachOptions {
                rank: r,
                world_size: 2,
                ..options(&data, "term", None)
            };
            Client::attach(&socket, opts).unwrap()
        })
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    let handles: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut got = 0;
                loop {
                    match c.next_batch() {
                        Ok(Some(_)) => {
                            got += 1;
                            if got == 1 {
                                tx.send(()).unwrap();
                            }
                        }
                        Ok(None) => panic!("data ended: the spec has no epoch limit"),
                        Err(e) => return (got, e),
                    }
                }
            })
        })
        .collect();
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(30)).unwrap();
    }
    d.signal(libc::SIGTERM);
    for h in handles {
        let (got, err) = h.join().unwrap();
        assert!(got >= 1);
        match &err {
            ClientError::Refused { code, message } => {
                assert_eq!(*code, ErrorCode::Stopping, "{err}");
                assert!(message.contains("daemon stopping"), "{err}");
            }
            other => panic!("expected a STOPPING refusal, got {other}"),
        }
    }
    let status = d.wait_exit(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(!socket.exists(), "the socket file is left behind");
}

#[test]
fn sighup_adds_a_dataset_while_a_client_keeps_receiving() {
    let dir = tempfile::tempdir().unwrap();
    let first = dataset(dir.path(), "first", 4);
    let second = dataset(dir.path(), "second", 3);
    let socket = dir.path().join("stoker.sock");
    let config = dir.path().join("stoker.toml");
    let write_config = |datasets: &[(&str, &Path)]| {
        let mut text = format!(
            "[server]\nsocket = {:?}\n\n[datasets]\n",
            socket.to_str().unwrap()
        );
        for (name, p) in datasets {
            text.push_str(&format!("{name} = {:?}\n", p.to_str().unwrap()));
        }
        std::fs::write(&config, text).unwrap();
    };
    write_config(&[("first", &first)]);
    let mut d = spawn_ready(
        dir.path(),
        &["--config", config.to_str().unwrap(), "--threads", "2"],
    );
    let mut c = Client::attach(&socket, options("first", "keeps", None)).unwrap();
    assert_eq!(c.attached().dataset_len, 8);
    assert!(c.next_batch().unwrap().is_some());
    let refused = Client::attach(&socket, options("second", "new", Some(1))).unwrap_err();
    // An unregistered name that is not a path: unknown, or (with access rules) not allowed.
    let not_attachable = |e: &ClientError| {
        matches!(
            e.code(),
            Some(ErrorCode::UnknownDataset) | Some(ErrorCode::PermissionDenied)
        )
    };
    assert!(not_attachable(&refused), "{refused}");

    write_config(&[("first", &first), ("second", &second)]);
    d.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut added = loop {
        match Client::attach(&socket, options("second", "new", Some(1))) {
            Ok(c) => break c,
            Err(e) if not_attachable(&e) => {
                assert!(Instant::now() < deadline, "second never became attachable");
                // The existing client goes on meanwhile.
                assert!(c.next_batch().unwrap().is_some());
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(added.attached().dataset_len, 6);
    let mut n = 0;
    while let Some(b) = added.next_batch().unwrap() {
        n += b.indices().len();
    }
    assert_eq!(n, 6);
    for _ in 0..5 {
        assert!(c.next_batch().unwrap().is_some());
    }

    // A broken config on reload is logged and the running one kept.
    std::fs::write(&config, "[datasets\n").unwrap();
    d.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    assert!(d.is_running());
    assert!(c.next_batch().unwrap().is_some());
    drop(Client::attach(&socket, options("second", "again", Some(1))).unwrap());
}
