//! A hostile filesystem (FIFOs swapped in mid-job, symlink loops, shards replaced by rename)
//! and JPEGs with ICC segments after the frame header.

use super::*;

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
}

// ---------------------------------------------------------------------------------------
// (1) A FIFO swapped in for a sample.

#[test]
fn a_fifo_swapped_in_mid_job_is_a_bad_sample_and_other_jobs_keep_their_rate() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for (d, seed) in [(&a, 0), (&b, 100)] {
        std::fs::create_dir_all(d).unwrap();
        for i in 0..8 {
            write_jpeg(&d.join(format!("img{i:03}.jpg")), 40, 32, seed + i);
        }
    }
    let config = write_config(
        dir.path(),
        "[pipeline]\nbad_samples = \"fail\"\n[limits]\nlog_bad_samples_per_second = 100000\n",
    );
    let log = dir.path().join("stokerd.log");
    let daemon = Daemon::start_logged(
        dir.path(),
        &[
            "--threads",
            "2",
            "--slots",
            "2",
            "--config",
            config.to_str().unwrap(),
        ],
        &log,
    );
    let socket = daemon.socket().to_owned();
    // Job A: 2 steps an epoch, 6 epochs; its first batch is in before the swap.
    let mut job_a = Client::attach(
        &socket,
        options(a.to_str().unwrap(), "a", spec(4, 16, Some(6))),
    )
    .unwrap();
    let first = got(&job_a.next_batch().unwrap().unwrap());
    assert!(first.status.iter().all(|&s| s == SampleStatus::Ok as u8));
    for i in [1, 5] {
        let f = a.join(format!("img{i:03}.jpg"));
        std::fs::remove_file(&f).unwrap();
        mkfifo(&f);
    }
    // Job A goes on meeting the FIFOs (the bug: every worker blocked in their open)...
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(drain(&mut job_a));
    });
    let early = rx.recv_timeout(Duration::from_secs(2)).ok();
    // ...and job B, on another dataset, must keep receiving while the FIFOs exist.
    let b_path = b.to_str().unwrap().to_owned();
    let b_batches = within(
        "job B on another dataset",
        Duration::from_secs(60),
        move || {
            let mut c = Client::attach(&socket, options(&b_path, "b", spec(4, 16, None))).unwrap();
            (0..20)
                .filter(|_| c.next_batch().unwrap().is_some())
                .count()
        },
    );
    assert_eq!(b_batches, 20);
    let rest = match early {
        Some(rest) => rest,
        None => rx
            .recv_timeout(Duration::from_secs(60))
            .expect("job A after the swap: blocked"),
    };
    assert_eq!(rest.len(), 11, "every batch of A arrives");
    // The last two epochs were certainly made after the swap: the FIFOs are failed samples.
    let mut failed = 0;
    for g in rest.iter().filter(|g| g.epoch >= 4) {
        for (k, &i) in g.indices.iter().enumerate() {
            let want = if i == 1 || i == 5 {
                SampleStatus::Failed
            } else {
                SampleStatus::Ok
            };
            assert_eq!(g.status[k], want as u8, "index {i} in {g:?}");
            failed += usize::from(want == SampleStatus::Failed);
        }
    }
    assert_eq!(failed, 4, "two FIFOs in each of two epochs");
    // A FIFO named as a shard is refused when the dataset is indexed, not waited on.
    let shards = dir.path().join("shards");
    std::fs::create_dir_all(&shards).unwrap();
    mkfifo(&shards.join("shard-000000.tar"));
    let socket = daemon.socket().to_owned();
    let err = within(
        "indexing a FIFO shard",
        Duration::from_secs(30),
        move || {
            Client::attach(
                &socket,
                options(shards.to_str().unwrap(), "fifo-shard", spec(4, 16, Some(1))),
            )
            .err()
            .map(|e| e.to_string())
        },
    );
    let err = err.expect("a FIFO shard is refused");
    assert!(err.contains("FIFO"), "{err}");
    drop(daemon);
    let text = read_log(&log);
    assert!(
        text.contains("not_regular") && text.contains("FIFO") && text.contains("img001.jpg"),
        "the log names the FIFO and the reason:\n{text}"
    );
}

// ---------------------------------------------------------------------------------------
// (2) Symlink loops, the filesystem root, deep and wide trees.

#[test]
fn symlink_loops_and_the_filesystem_root_are_indexed_or_refused_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let looped = dir.path().join("L");
    std::fs::create_dir_all(looped.join("a")).unwrap();
    write_jpeg(&looped.join("a/x.jpg"), 32, 32, 1);
    write_jpeg(&looped.join("a/y.jpg"), 32, 32, 2);
    std::os::unix::fs::symlink("..", looped.join("a/up")).unwrap();
    std::os::unix::fs::symlink("..", looped.join("a/up2")).unwrap();
    // Deeper than the configured depth, and wider than the configured entries.
    let mut deep = dir.path().join("deep/c");
    for d in 0..12 {
        deep = deep.join(format!("d{d}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    write_jpeg(&deep.join("z.jpg"), 32, 32, 3);
    let wide = dir.path().join("wide");
    std::fs::create_dir_all(&wide).unwrap();
    let jpeg = std::fs::read(looped.join("a/x.jpg")).unwrap();
    for i in 0..100 {
        std::fs::write(wide.join(format!("w{i:03}.jpg")), &jpeg).unwrap();
    }
    let log = dir.path().join("stokerd.log");
    let daemon = Daemon::start_logged(dir.path(), &["--threads", "1"], &log);
    let (socket, pid) = (daemon.socket().to_owned(), daemon.pid());
    // The attach must come back (the bug: it never did, and RSS grew without end).
    let (tx, rx) = mpsc::channel();
    let (s, l) = (socket.clone(), looped.to_str().unwrap().to_owned());
    std::thread::spawn(move || {
        let r = Client::attach(&s, options(&l, "loop", spec(2, 16, Some(1))))
            .map(|mut c| (c.attached().dataset_len, drain(&mut c).len()));
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    let started = Instant::now();
    let attached = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(r) => break r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let rss = stoker_testkit::proc_rss_kib(pid);
                assert!(
                    rss < 1 << 20,
                    "indexing the loop: RSS {rss} KiB and growing"
                );
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "indexing the loop never ends"
                );
            }
            Err(e) => panic!("attach thread: {e}"),
        }
    };
    assert_eq!(attached, Ok((2, 1)), "the loop's two images, once each");
    within("status", Duration::from_secs(10), move || {
        stoker_tool::cli::status::query(&socket).map_err(|e| e.to_string())
    })
    .expect("status answers");
    refused(
        &daemon,
        Path::new("/"),
        "the filesystem root is not a dataset",
    );
    let rss = daemon.rss_kib();
    assert!(rss < 256 * 1024, "RSS after indexing: {rss} KiB");
    drop(daemon);
    let text = read_log(&log);
    assert!(
        text.contains("walked already"),
        "the loop is logged:\n{text}"
    );
    // Trees deeper or wider than the limits are refused, naming the limit.
    let config = write_config(
        dir.path(),
        "[limits]\nmax_index_depth = 8\nmax_index_entries = 64\n",
    );
    let daemon = Daemon::start_configured(dir.path(), &config, &["--threads", "1"]);
    refused(&daemon, &dir.path().join("deep"), "limits.max_index_depth");
    refused(&daemon, &wide, "limits.max_index_entries");
}

/// Attaching `data` is refused with a message holding `rule`.
fn refused(daemon: &Daemon, data: &Path, rule: &str) {
    let err = Client::attach(
        daemon.socket(),
        options(data.to_str().unwrap(), "x", spec(2, 16, Some(1))),
    )
    .expect_err(&data.display().to_string());
    assert!(err.to_string().contains(rule), "{}: {err}", data.display());
}

// ---------------------------------------------------------------------------------------
// (3) A shard replaced by rename.

/// Writes a tar shard of `n` synthetic images (seeds from `seed`), labels `i % 3`.
fn write_shard(path: &Path, seed: u32, n: u32) {
    let mut w = TarWriter::create(path).unwrap();
    for i in 0..n {
        let (wd, ht) = (36 + i % 5, 30);
        let jpeg = encode_jpeg(&synthetic_rgb(wd, ht, seed + i), wd, ht, 90);
        w.append(&format!("s{i:04}.jpg"), &jpeg).unwrap();
        w.append(&format!("s{i:04}.cls"), (i % 3).to_string().as_bytes())
            .unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn a_replaced_shard_is_read_new_by_a_new_job_and_old_by_the_running_one() {
    let dir = tempfile::tempdir().unwrap();
    let p = |s: &str| dir.path().join(s);
    for d in ["s", "ra", "rb", "x"] {
        std::fs::create_dir_all(p(d)).unwrap();
    }
    write_shard(&p("s/shard-000000.tar"), 0, 6);
    write_shard(&p("ra/shard-000000.tar"), 0, 6);
    write_shard(&p("x/b.tar"), 500, 8);
    std::fs::copy(p("x/b.tar"), p("rb/shard-000000.tar")).unwrap();
    let daemon = Daemon::start(dir.path(), &["--threads", "2", "--slots", "2"]);
    let socket = daemon.socket().to_owned();
    let serve = |data: &Path, job: &str, epochs: u32| {
        let mut c = Client::attach(
            &socket,
            options(data.to_str().unwrap(), job, spec(2, 16, Some(epochs))),
        )
        .unwrap();
        (c.attached().dataset_len, drain(&mut c))
    };
    let (_, want_old) = serve(&p("ra"), "ref-old", 4);
    let (_, want_new) = serve(&p("rb"), "ref-new", 2);
    // The running job reads its first batch from the old shard, then the shard is replaced.
    let mut running = Client::attach(
        &socket,
        options(p("s").to_str().unwrap(), "running", spec(2, 16, Some(4))),
    )
    .unwrap();
    let mut old = vec![got(&running.next_batch().unwrap().unwrap())];
    std::fs::copy(p("x/b.tar"), p("s/.n.tar")).unwrap();
    std::fs::rename(p("s/.n.tar"), p("s/shard-000000.tar")).unwrap();
    let (len, new) = serve(&p("s"), "new", 2);
    assert_eq!(len, 8, "the new job indexes the new shard");
    assert_eq!(
        new, want_new,
        "the new job reads the new shard, every sample Ok"
    );
    old.extend(drain(&mut running));
    assert_eq!(
        old, want_old,
        "the running job reads its snapshot, the old shard, to the end"
    );
}

// ---------------------------------------------------------------------------------------
// (5) An ICC profile after the frame header.

/// An APP2 ICC_PROFILE segment: part `seq` of `count`.
fn icc_segment(seq: u8, count: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = b"ICC_PROFILE\0".to_vec();
    body.extend_from_slice(&[seq, count]);
    body.extend_from_slice(payload);
    let mut seg = vec![0xFF, 0xE2];
    seg.extend_from_slice(&u16::try_from(body.len() + 2).unwrap().to_be_bytes());
    seg.extend_from_slice(&body);
    seg
}

/// Where the segment after the frame header (SOF0) ends.
fn end_of_sof(jpeg: &[u8]) -> usize {
    let mut pos = 2;
    loop {
        assert_eq!(jpeg[pos], 0xFF);
        let len = u16::from_be_bytes([jpeg[pos + 2], jpeg[pos + 3]]) as usize;
        if jpeg[pos + 1] == 0xC0 {
            return pos + 2 + len;
        }
        pos += 2 + len;
    }
}

/// `jpeg` with `before` inserted after SOI and `after` after the frame header.
fn with_segments(jpeg: &[u8], before: &[Vec<u8>], after: &[Vec<u8>]) -> Vec<u8> {
    let sof = end_of_sof(jpeg);
    let mut out = jpeg[..2].to_vec();
    before.iter().for_each(|s| out.extend_from_slice(s));
    out.extend_from_slice(&jpeg[2..sof]);
    after.iter().for_each(|s| out.extend_from_slice(s));
    out.extend_from_slice(&jpeg[sof..]);
    out
}

#[test]
fn jpegs_with_an_icc_profile_after_the_frame_header_decode() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("icc");
    std::fs::create_dir_all(&data).unwrap();
    let jpeg = encode_jpeg(&synthetic_rgb(48, 40, 3), 48, 40, 90);
    let mut profile = vec![0u8; 128];
    profile.extend_from_slice(b"acspAPPL");
    profile.resize(300, 7);
    let files = [
        // One whole profile after SOF.
        with_segments(&jpeg, &[], &[icc_segment(1, 1, &profile)]),
        // A profile before SOF and another appended after it (a tool adding a profile).
        with_segments(
            &jpeg,
            &[icc_segment(1, 1, &profile)],
            &[icc_segment(1, 1, &profile)],
        ),
        // A profile in two parts, the second after SOF.
        with_segments(
            &jpeg,
            &[icc_segment(1, 2, &profile[..150])],
            &[icc_segment(2, 2, &profile[150..])],
        ),
    ];
    for (i, f) in files.iter().enumerate() {
        std::fs::write(data.join(format!("icc{i}.jpg")), f).unwrap();
        // djpeg, where installed, decodes each without a warning.
        if let Ok(out) = std::process::Command::new("djpeg")
            .arg(data.join(format!("icc{i}.jpg")))
            .output()
        {
            assert!(
                out.status.success() && out.stderr.is_empty(),
                "djpeg on icc{i}"
            );
        }
    }
    let config = write_config(dir.path(), "[pipeline]\nbad_samples = \"fail\"\n");
    let log = dir.path().join("stokerd.log");
    let daemon = Daemon::start_logged(
        dir.path(),
        &["--threads", "1", "--config", config.to_str().unwrap()],
        &log,
    );
    let mut c = Client::attach(
        daemon.socket(),
        options(data.to_str().unwrap(), "icc", spec(3, 16, Some(1))),
    )
    .unwrap();
    let batches = drain(&mut c);
    assert_eq!(batches.len(), 1);
    assert_eq!(
        batches[0].status,
        vec![SampleStatus::Ok as u8; 3],
        "every ICC variant decodes; log:\n{}",
        read_log(&log)
    );
}
