//! Forged log lines and floods of idle connections.

use super::*;

// ---------------------------------------------------------------------------------------
// (6) Log forging.

#[test]
fn logged_job_keys_and_paths_show_control_characters_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_jpeg(&data.join("good.jpg"), 32, 32, 1);
    std::fs::write(data.join("evil\nINFO fake file line.jpg"), b"not a jpeg").unwrap();
    let log = dir.path().join("stokerd.log");
    let daemon = Daemon::start_logged(dir.path(), &["--threads", "1"], &log);
    let key = "a\u{0}b\nINFO fake log line";
    let mut c = Client::attach(
        daemon.socket(),
        options(data.to_str().unwrap(), key, spec(2, 16, Some(1))),
    )
    .unwrap();
    assert_eq!(drain(&mut c).len(), 1);
    drop(c);
    drop(daemon);
    let text = read_log(&log);
    assert!(!text.contains('\0'), "a raw NUL in the log:\n{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("INFO fake")),
        "a forged line:\n{text}"
    );
    assert!(
        text.contains(r"a\0b\nINFO fake log line"),
        "the job key escaped:\n{text}"
    );
    assert!(
        text.contains(r"evil\nINFO fake file line.jpg"),
        "the file name escaped:\n{text}"
    );
}

#[test]
fn floods_of_idle_connections_leave_rss_at_its_idle_baseline() {
    // The test holds 4,000 connections at once.
    // SAFETY: rlimit is plain data; getrlimit / setrlimit fill and read it.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max.min(16_384);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        if lim.rlim_cur < 4_200 {
            eprintln!(
                "SKIP floods_of_idle_connections_leave_rss_at_its_idle_baseline: fd limit {} \
                 under 4,200",
                lim.rlim_cur
            );
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stokerd.log");
    let daemon = Daemon::start_logged(dir.path(), &["--threads", "1"], &log);
    let settle = |what: &str, fds: usize| {
        let t0 = Instant::now();
        while daemon.fd_count() > fds {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{what}: fds stay up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    stoker_tool::cli::status::query(daemon.socket()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (fds, baseline) = (daemon.fd_count(), daemon.rss_kib());
    let mut after = Vec::new();
    for flood in 0..5 {
        let conns: Vec<SeqPacket> = (0..4000)
            .map(|_| SeqPacket::connect(daemon.socket()).unwrap())
            .collect();
        drop(conns);
        settle(&format!("flood {flood}"), fds);
        after.push(daemon.rss_kib());
    }
    println!("idle RSS {baseline} KiB; after each flood of 4,000: {after:?} KiB");
    let last = *after.last().unwrap();
    assert!(
        last * 10 <= baseline * 11,
        "RSS {last} KiB after 5 floods, over 110% of the idle {baseline} KiB ({after:?})"
    );
    stoker_tool::cli::status::query(daemon.socket()).expect("status after the floods");
}
