//! A hostile filesystem and a hostile neighbour (issue 14): FIFOs, symlink loops, shards
//! replaced by rename, permissions bypassed, ICC segments after the frame header, log forging
//! and connection floods. Real `stokerd` processes, real clients, real files.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stoker::sock::SeqPacket;
use stoker::{AttachOptions, Client, DType, ErrorCode, PipelineSpec, SampleStatus};
use stoker_daemon::pack::TarWriter;
use stoker_testkit::batches::{drain, got, write_config, Got};
use stoker_testkit::child::{self, OTHER_UID};
use stoker_testkit::{encode_jpeg, synthetic_rgb, write_jpeg, Daemon};

fn spec(batch: u32, side: u32, epochs: Option<u32>) -> PipelineSpec {
    PipelineSpec {
        dtype: DType::U8,
        epochs,
        ..PipelineSpec::train(batch, side)
    }
}

fn options(data: &str, job: &str, spec: PipelineSpec) -> AttachOptions {
    AttachOptions {
        seed: 7,
        connect_timeout: Duration::ZERO,
        ..AttachOptions::new(job, data, spec)
    }
}

fn read_log(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// Runs `f` on its own thread and returns its result, failing the test when it has none
/// within `limit`: the bugs these tests catch show as a client blocked for good.
fn within<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: blocked for {limit:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked (see above)"),
    }
}

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
        stoker_daemon::cli::status::query(&socket).map_err(|e| e.to_string())
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
    let daemon = Daemon::start(
        dir.path(),
        &["--threads", "1", "--config", config.to_str().unwrap()],
    );
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
// (4) Access decided with the client's credentials, at open time. (5) below.

/// The socket, and the folder the child of another uid works in.
const CHILD_SOCKET_ENV: &str = "STOKER_HOSTILE_SOCKET";
const CHILD_DIR_ENV: &str = "STOKER_HOSTILE_DIR";

/// Runs this test binary's `hostile_child` test as uid [`OTHER_UID`] in `mode`; returns its
/// output, failing when it fails.
fn run_child(mode: &str, socket: &Path, dir: &Path) -> String {
    let out = child::rerun_test("hostile_child", mode, |cmd| {
        child::as_other_uid(cmd.env(CHILD_SOCKET_ENV, socket).env(CHILD_DIR_ENV, dir));
    });
    child::output_text(&out)
}

/// Not a test on its own: the client process of another uid that the permission and lobby
/// tests start. Without the variable it does nothing.
#[test]
fn hostile_child() {
    let Some(mode) = child::role() else {
        return;
    };
    let socket = PathBuf::from(std::env::var_os(CHILD_SOCKET_ENV).unwrap());
    let dir = PathBuf::from(std::env::var_os(CHILD_DIR_ENV).unwrap());
    match mode.as_str() {
        "permissions" => child_permissions(&socket, &dir),
        "lobby" => child_lobby(&socket),
        other => panic!("unknown child mode {other}"),
    }
}

fn child_permissions(socket: &Path, root: &Path) {
    let attach = |data: &Path, epochs: u32| {
        Client::attach(
            socket,
            options(data.to_str().unwrap(), "perm", spec(4, 16, Some(epochs))),
        )
    };
    for unreadable in ["secret", "secret.tsv"] {
        let err = attach(&root.join(unreadable), 1).expect_err(unreadable);
        assert_eq!(
            err.code(),
            Some(ErrorCode::PermissionDenied),
            "{unreadable}: {err}"
        );
        assert!(
            err.to_string().contains(&format!("uid {OTHER_UID}")),
            "{err}"
        );
        println!("refused as expected: {err}");
    }
    // A folder it may read: served; then one of its files becomes a symlink to a file it may
    // not read, outside the roots. From then on that sample fails (policy fail).
    let mut c = attach(&root.join("open"), 6).unwrap();
    let first = got(&c.next_batch().unwrap().unwrap());
    assert!(first.status.iter().all(|&s| s == SampleStatus::Ok as u8));
    let swapped = root.join("open/c0/img002.jpg");
    std::fs::remove_file(&swapped).unwrap();
    // Beside the roots: the parent test wrote it, mode 0600, owned by root.
    let outside = root.parent().unwrap().join("outside/secret.jpg");
    std::os::unix::fs::symlink(outside, &swapped).unwrap();
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

#[test]
fn a_client_uid_gets_permission_denied_for_what_it_cannot_read_itself() {
    if !child::can_run_as_other_uid(
        "a_client_uid_gets_permission_denied_for_what_it_cannot_read_itself",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    let root = top.join("root");
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    stoker_testkit::write_image_folder(&root.join("secret"), 1, 4, 24);
    mode(&root.join("secret"), 0o700);
    stoker_testkit::write_image_folder(&root.join("open"), 1, 4, 24);
    let list = root.join("secret.tsv");
    std::fs::write(
        &list,
        format!("{}\t0\n", root.join("open/c0/img000.jpg").display()),
    )
    .unwrap();
    mode(&list, 0o600);
    let outside = top.join("outside/secret.jpg");
    std::fs::create_dir_all(outside.parent().unwrap()).unwrap();
    write_jpeg(&outside, 24, 24, 77);
    mode(&outside, 0o600);
    // The child owns the open dataset: it may swap its files.
    for p in [root.join("open"), root.join("open/c0")] {
        std::os::unix::fs::chown(&p, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    }
    for e in std::fs::read_dir(root.join("open/c0")).unwrap() {
        std::os::unix::fs::chown(e.unwrap().path(), Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    }
    for p in [top, &root, &top.join("outside")] {
        mode(p, 0o755);
    }
    let config = write_config(
        top,
        &format!(
            "[pipeline]\nbad_samples = \"fail\"\n[access]\nallowed_uids = [0, {OTHER_UID}]\n\
             dataset_roots = [\"{}\"]\n",
            root.display()
        ),
    );
    let daemon = Daemon::start(
        top,
        &[
            "--threads",
            "2",
            "--slots",
            "2",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    mode(daemon.socket(), 0o777);
    let out = run_child("permissions", daemon.socket(), &root);
    assert!(
        out.contains("refused as expected") && out.contains("symlink was refused"),
        "{out}"
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

// ---------------------------------------------------------------------------------------
// (7) Connections that never attach.

fn child_lobby(socket: &Path) {
    let t0 = Instant::now();
    let mut c = Client::attach(socket, options("reg", "lobby-other", spec(2, 16, Some(1))))
        .expect("the other uid attaches");
    assert!(c.next_batch().unwrap().is_some());
    let took = t0.elapsed();
    println!("attached and received in {} ms", took.as_millis());
    assert!(took < Duration::from_secs(1), "attach took {took:?}");
}

#[test]
fn idle_connections_of_one_uid_do_not_lock_out_another_under_a_low_fd_limit() {
    if !child::can_run_as_other_uid(
        "idle_connections_of_one_uid_do_not_lock_out_another_under_a_low_fd_limit",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    stoker_testkit::write_image_folder(&data, 2, 4, 24);
    let config = write_config(
        dir.path(),
        &format!(
            "[access]\nallowed_uids = [0, {OTHER_UID}]\n[datasets]\nreg = \"{}\"\n",
            data.display()
        ),
    );
    let log = dir.path().join("stokerd.log");
    let daemon = Daemon::start_logged_with(
        dir.path(),
        &["--threads", "1", "--config", config.to_str().unwrap()],
        &log,
        |cmd| {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child yet.
            unsafe {
                cmd.pre_exec(|| {
                    let lim = libc::rlimit {
                        rlim_cur: 200,
                        rlim_max: 200,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
        },
    );
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // Index once, so the other uid's attach measures the lobby, not the walk.
    let mut warm = Client::attach(
        daemon.socket(),
        options("reg", "warm", spec(2, 16, Some(1))),
    )
    .unwrap();
    drain(&mut warm);
    drop(warm);
    let idle: Vec<SeqPacket> = (0..300)
        .map(|_| SeqPacket::connect(daemon.socket()).unwrap())
        .collect();
    let out = run_child("lobby", daemon.socket(), dir.path());
    let line = out.lines().find(|l| l.contains("attached and received"));
    println!("uid {OTHER_UID}, beside 300 idle connections: {line:?}");
    assert!(line.is_some(), "{out}");
    drop(idle);
    drop(daemon);
    let text = read_log(&log);
    let closed = text.matches("connection closed before attaching").count();
    assert!(
        closed > 0 && closed <= 60,
        "{closed} lobby lines (rate-limited):\n{text}"
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
    stoker_daemon::cli::status::query(daemon.socket()).unwrap();
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
    stoker_daemon::cli::status::query(daemon.socket()).expect("status after the floods");
}
