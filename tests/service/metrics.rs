//! The Prometheus endpoint and `stoker status`.

use super::*;

use stoker_testkit::prometheus::{http_get, sample};

/// Metric names documented in docs/operations.md's metrics table (rows starting "| `stoker_").
fn documented_metrics() -> Vec<String> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"))
            .expect("docs/operations.md");
    let names: Vec<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `stoker_"))
        .map(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            format!("stoker_{name}")
        })
        .collect();
    assert!(names.len() >= 8, "metrics table not found: {names:?}");
    names
}

/// A strict check of the Prometheus text format (what promtool checks, and more): every
/// family has HELP and TYPE before its samples, sample lines parse, counters end in _total.
fn check_exposition(text: &str) {
    use std::collections::HashMap;
    let mut help: HashMap<&str, bool> = HashMap::new();
    let mut types: HashMap<&str, &str> = HashMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').expect("HELP name text");
            assert!(!h.trim().is_empty(), "empty HELP: {line}");
            help.insert(name, true);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("TYPE name type");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&ty),
                "{line}"
            );
            if ty == "counter" {
                assert!(name.ends_with("_total"), "counter without _total: {name}");
            }
            types.insert(name, ty);
        } else {
            assert!(!line.starts_with('#'), "stray comment: {line}");
            let (series, value) = line.rsplit_once(' ').expect("series value");
            value
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("value of {line}"));
            let name = series.split('{').next().unwrap();
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "{line}"
            );
            if let Some(labels) = series.strip_prefix(name) {
                if !labels.is_empty() {
                    assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
                    check_label_values(line, labels);
                }
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| types.get(f) == Some(&"histogram"))
                })
                .unwrap_or(name);
            assert!(types.contains_key(family), "no TYPE before {line}");
            assert!(help.contains_key(family), "no HELP for {family}");
        }
    }
}

/// Label values as the text format allows them: inside quotes a backslash escapes only `\\`,
/// `"` or `n` (promtool refuses any other escape), and no raw control character.
fn check_label_values(line: &str, labels: &str) {
    let mut quoted = false;
    let mut chars = labels.chars();
    while let Some(c) = chars.next() {
        assert!(!c.is_control(), "raw control character {c:?} in {line:?}");
        match (quoted, c) {
            (false, '"') => quoted = true,
            (true, '"') => quoted = false,
            (true, '\\') => {
                let next = chars.next();
                assert!(
                    matches!(next, Some('\\' | '"' | 'n')),
                    "escape \\{} in a label value of {line:?}",
                    next.map(String::from).unwrap_or_default()
                );
            }
            _ => {}
        }
    }
    assert!(!quoted, "an unterminated label value in {line:?}");
}

#[test]
fn metrics_count_exactly_what_clients_received() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), "data", 7);
    let socket = dir.path().join("stoker.sock");
    let (_daemon, addr) = spawn_with_metrics(dir.path(), &socket);
    let delivered = r#"stoker_images_total{stage="delivered"}"#;
    let (status, before) = http_get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let d0 = sample(&before, delivered).expect("delivered counter registered at start");
    assert_eq!(d0, 0.0);
    assert_eq!(http_get(&addr, "/").0, "HTTP/1.1 404 Not Found");

    let mut c = Client::attach(&socket, options(data.to_str().unwrap(), "m", Some(2))).unwrap();
    let mut received = 0;
    let mut during = String::new();
    while let Some(b) = c.next_batch().unwrap() {
        received += b.indices().len();
        if during.is_empty() {
            during = http_get(&addr, "/metrics").1;
        }
    }
    assert_eq!(received, 28);
    assert_eq!(sample(&during, "stoker_clients"), Some(1.0), "{during}");
    assert_eq!(sample(&during, "stoker_jobs"), Some(1.0));
    assert!(sample(&during, r#"stoker_ring_bytes{memory="host"}"#).unwrap() > 0.0);
    let (_, after) = http_get(&addr, "/metrics");
    assert_eq!(
        sample(&after, delivered),
        Some(d0 + received as f64),
        "delivered counter vs images received"
    );
    assert!(sample(&after, r#"stoker_images_total{stage="decode"}"#).unwrap() >= received as f64);
    assert!(sample(&after, "stoker_bytes_read_total").unwrap() > 0.0);
    assert!(sample(&after, r#"stoker_decode_total{backend="cpu"}"#).unwrap() >= received as f64);
    assert!(
        sample(&after, r#"stoker_stage_seconds_count{stage="decode"}"#).unwrap() >= received as f64
    );
    for name in documented_metrics() {
        assert!(
            after.contains(&format!("# TYPE {name} ")),
            "documented metric {name} is missing from the scrape:\n{after}"
        );
    }
    check_exposition(&after);
    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(mut p) => {
            p.stdin.take().unwrap().write_all(after.as_bytes()).unwrap();
            let out = p.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool check metrics failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(e) => eprintln!(
            "SKIPPED promtool check metrics: promtool not available ({e}); the strict format \
             check above ran instead (apt-get install prometheus provides promtool)"
        ),
    }
}

#[test]
fn stoker_status_prints_jobs_and_json() {
    let (dir, data, socket, _d) = serving();
    let mut c = Client::attach(&socket, options(data.to_str().unwrap(), "resnet", None)).unwrap();
    for _ in 0..3 {
        assert!(c.next_batch().unwrap().is_some());
    }
    let stoker = stokerd_path().with_file_name("stoker");
    let out = Command::new(&stoker)
        .args(["status", "--socket", socket.to_str().unwrap()])
        .output()
        .expect("run stoker status");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(table.contains("JOB"), "{table}");
    assert!(table.contains("resnet"), "{table}");
    assert!(table.contains("1/1 [0]"), "{table}");
    assert!(table.contains("backend cpu"), "{table}");
    let out = Command::new(&stoker)
        .args(["status", "--json", "--socket", socket.to_str().unwrap()])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["clients"], 1);
    assert_eq!(v["jobs"][0]["job"], "resnet");
    assert_eq!(v["jobs"][0]["ranks"], serde_json::json!([0]));
    assert!(v["jobs"][0]["images_delivered"].as_u64().unwrap() >= 12);
    let out = Command::new(&stoker)
        .args([
            "status",
            "--socket",
            dir.path().join("none").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
}

/// No raw control character in `text` but the newlines that end its lines.
fn assert_no_raw_controls(what: &str, text: &str) {
    let text = &text.replace(&"k".repeat(200), "k…");
    let raw: Vec<char> = text
        .chars()
        .filter(|&c| c != '\n' && c.is_control())
        .collect();
    assert!(
        raw.is_empty(),
        "{what} has raw control characters {raw:?}:\n{text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("FORGED")),
        "{what} has a forged row:\n{text}"
    );
}

#[test]
fn status_and_metrics_escape_job_keys_and_cut_long_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), "data", 4);
    let socket = dir.path().join("stoker.sock");
    let (_d, addr) = spawn_with_metrics(dir.path(), &socket);
    let data = data.to_str().unwrap();
    let forged = "\u{1b}[2J\rFORGED\n\0row";
    let long = "k".repeat(65_000);
    let mut clients: Vec<Client> = [forged, long.as_str(), "plain"]
        .iter()
        .map(|key| Client::attach(&socket, options(data, key, None)).unwrap())
        .collect();
    // A batch, then one more after the stall report is due: the forged key reaches the
    // per-rank stall series of /metrics and `stoker status`.
    for c in &mut clients {
        assert!(c.next_batch().unwrap().is_some());
    }
    std::thread::sleep(Duration::from_millis(600)); // past the client's STATS_EVERY (500 ms)
    for c in &mut clients {
        assert!(c.next_batch().unwrap().is_some());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let (_, m) = http_get(&addr, "/metrics");
        if m.contains("FORGED") || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_no_raw_controls("/metrics", &metrics);
    // Other control characters than the newline are replaced, not escaped: the text format
    // has no escape for them.
    assert!(
        metrics.contains("job=\"\u{fffd}[2J\u{fffd}FORGED\\n\u{fffd}row\""),
        "{metrics}"
    );
    check_exposition(&metrics);

    let stoker = stokerd_path().with_file_name("stoker");
    let out = Command::new(&stoker)
        .args(["status", "--socket", socket.to_str().unwrap()])
        .output()
        .expect("run stoker status");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert_no_raw_controls("stoker status", &table);
    assert!(table.contains(r"\e[2J\rFORGED\n\0row"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("plain ")), "{table}");
    assert!(table.lines().all(|l| l.chars().count() < 300), "{table}");
    let out = Command::new(&stoker)
        .args(["status", "--json", "--socket", socket.to_str().unwrap()])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys: Vec<&str> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job"].as_str().unwrap())
        .collect();
    assert!(
        keys.contains(&forged) && keys.contains(&"plain"),
        "{keys:?}"
    );
}

#[test]
fn label_values_keep_to_the_text_format_and_status_escapes_bidi_controls() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), "data", 4);
    let socket = dir.path().join("stoker.sock");
    let (_d, addr) = spawn_with_metrics(dir.path(), &socket);
    let data = data.to_str().unwrap();
    // A tab (promtool refuses the whole page when it is escaped as \t) and a right-to-left
    // override (it reorders what an operator's terminal shows after it).
    let key = "tab\there\u{202e}gnp.exe";
    let mut c = Client::attach(&socket, options(data, key, None)).unwrap();
    assert!(c.next_batch().unwrap().is_some());
    std::thread::sleep(Duration::from_millis(600)); // past the client's STATS_EVERY (500 ms)
    assert!(c.next_batch().unwrap().is_some());
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let (_, m) = http_get(&addr, "/metrics");
        if m.contains("gnp.exe") || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    check_exposition(&metrics);
    assert!(
        metrics.contains("job=\"tab\u{fffd}here\u{fffd}gnp.exe\""),
        "the tab and the override replaced:\n{metrics}"
    );

    let stoker = stokerd_path().with_file_name("stoker");
    let out = Command::new(&stoker)
        .args(["status", "--socket", socket.to_str().unwrap()])
        .output()
        .expect("run stoker status");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(
        !table.contains('\u{202e}') && table.contains(r"tab\there\u{202e}gnp.exe"),
        "stoker status escapes the override as the log does:\n{table}"
    );
}

/// The `/metrics` page once a rank of job `key` on `data` reported its stall.
fn page_with_job(socket: &Path, addr: &str, data: &str, key: &str) -> String {
    let mut c = Client::attach(socket, options(data, key, None)).unwrap();
    assert!(c.next_batch().unwrap().is_some());
    std::thread::sleep(Duration::from_millis(600)); // past the client's STATS_EVERY (500 ms)
    assert!(c.next_batch().unwrap().is_some());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = http_get(addr, "/metrics");
        if m.contains("torchrun-7") || Instant::now() > deadline {
            return m;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn metrics_show_no_dataset_path_in_a_job_key_unless_the_operator_asks() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), "data", 4);
    let data = data.to_str().unwrap();
    // torchrun's key as the Python loader makes it: the run, then the dataset's path.
    let key = format!("torchrun-7/{data}");
    let socket = dir.path().join("stoker.sock");
    let (d, addr) = spawn_with_metrics(dir.path(), &socket);
    let page = page_with_job(&socket, &addr, data, &key);
    check_exposition(&page);
    assert!(page.contains("job=\"torchrun-7/#"), "{page}");
    assert!(
        !page.contains(data),
        "another user's dataset path on /metrics:\n{page}"
    );
    drop(d);

    // With metrics.show_paths the whole key is shown.
    let other = dir.path().join("shown");
    std::fs::create_dir_all(&other).unwrap();
    let config = other.join("stoker.toml");
    std::fs::write(&config, "[metrics]\nshow_paths = true\n").unwrap();
    let socket = other.join("stoker.sock");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let args = [
        "--socket",
        socket.to_str().unwrap(),
        "--metrics-listen",
        &addr,
        "--config",
        config.to_str().unwrap(),
    ];
    let _d = spawn_ready(&other, &args);
    let page = page_with_job(&socket, &addr, data, &key);
    assert!(page.contains(&format!("job=\"{key}\"")), "{page}");
}

#[test]
fn a_clients_stats_cannot_make_a_total_go_down() {
    use stoker::protocol::{Attach, Message, Stats};
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), "data", 4);
    let socket = dir.path().join("stoker.sock");
    let (_d, addr) = spawn_with_metrics(dir.path(), &socket);
    let o = options(data.to_str().unwrap(), "stats", None);
    let a = Attach {
        job: o.job.clone(),
        rank: 0,
        world_size: 1,
        device: stoker::Device::Cpu,
        spec: o.spec.clone(),
        dataset: o.dataset.clone(),
        seed: o.seed,
        start: stoker::Position::default(),
        offset: None,
    };
    let (sock, _ring, answer) = stoker_testkit::wire::raw_attach(&socket, &a);
    assert!(matches!(answer, Message::Attached(_)), "{answer:?}");
    let series = "stoker_client_wait_seconds_total{job=\"stats\",rank=\"0\",uid=\"";
    let total = |want: f64| -> f64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, m) = http_get(&addr, "/metrics");
            let got = m
                .lines()
                .find(|l| l.starts_with(series))
                .and_then(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok());
            if got == Some(want) || Instant::now() > deadline {
                return got.unwrap_or(f64::NAN);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let stats = |wait_s: u64| {
        let m = Message::Stats(Stats {
            wait_ns: wait_s * 1_000_000_000,
            compute_ns: 0,
            batches: 1,
        });
        sock.send(&m.encode().unwrap(), &[]).unwrap();
    };
    stats(5);
    assert_eq!(total(5.0), 5.0, "the first report");
    // A report of 1 s after 5: the counter must not go down (a restart of the client's own
    // count adds to it).
    stats(1);
    let after = total(6.0);
    assert!(
        after >= 5.0,
        "a client's STATS made stoker_client_wait_seconds_total go from 5 to {after}"
    );
}

/// A daemon on `socket` with 2 threads and `/metrics` on a free port of 127.0.0.1, and that
/// address.
fn spawn_with_metrics(dir: &Path, socket: &Path) -> (Daemon, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let args = [
        "--socket",
        socket.to_str().unwrap(),
        "--threads",
        "2",
        "--metrics-listen",
        &addr,
    ];
    (spawn_ready(dir, &args), addr)
}

/// A GET of `/metrics` that gives up after `limit`: (status line, or the error, and the time).
fn scrape_within(addr: &str, limit: Duration) -> (Result<String, String>, Duration) {
    use std::io::Read;
    let t0 = Instant::now();
    let got = (|| {
        let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
        write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
        let mut text = String::new();
        s.read_to_string(&mut text).map_err(|e| e.to_string())?;
        Ok(text.lines().next().unwrap_or("").to_owned())
    })();
    (got, t0.elapsed())
}

#[test]
fn forty_slow_local_clients_do_not_starve_scrapes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("stoker.sock");
    let (_daemon, addr) = spawn_with_metrics(dir.path(), &socket);
    let (status, _) = http_get(&addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    // 40 clients that send half a request and wait, connecting again whenever closed.
    let stop = Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..40)
        .map(|_| {
            let (addr, stop) = (addr.clone(), stop.clone());
            std::thread::spawn(move || {
                use std::io::Read;
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = std::net::TcpStream::connect(&addr) else {
                        continue;
                    };
                    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ");
                    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                    let mut b = [0u8; 64];
                    // Until the daemon closes it (or the test ends).
                    while !stop.load(Ordering::Relaxed) {
                        match s.read(&mut b) {
                            Ok(0) => break,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                            _ => break,
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut failed = Vec::new();
    for _ in 0..20 {
        let (got, took) = scrape_within(&addr, Duration::from_secs(5));
        if !got.as_ref().is_ok_and(|s| s.contains("200")) {
            failed.push(format!("{got:?} after {took:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    for t in slow {
        t.join().unwrap();
    }
    assert!(
        failed.is_empty(),
        "{} of 20 scrapes failed beside 40 slow clients: {failed:?}",
        failed.len()
    );
}

#[test]
fn a_slowloris_connection_neither_holds_up_a_scrape_nor_outlives_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("stoker.sock");
    let (_daemon, addr) = spawn_with_metrics(dir.path(), &socket);
    let (status, _) = http_get(&addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    let slow_addr = addr.clone();
    // One byte of a request every 1.5 s (each within the old per-read timeout), until the
    // daemon closes the connection or 30 s have passed.
    let slow = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(&slow_addr).unwrap();
        let t0 = Instant::now();
        let request = b"GET /metrics HTTP/1.1\r\nX-Slow: ";
        for b in request.iter().chain(std::iter::repeat(&b'a')) {
            if s.write_all(&[*b]).is_err() || t0.elapsed() > Duration::from_secs(30) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1500));
        }
        t0.elapsed()
    });
    std::thread::sleep(Duration::from_millis(1000));
    let (got, took) = scrape_within(&addr, Duration::from_secs(5));
    println!("a scrape beside a slowloris connection: {got:?} in {took:?}");
    assert!(
        got.as_ref().is_ok_and(|s| s.contains("200")),
        "a scrape waited behind a connection sending a byte every 1.5 s: {got:?} after {took:?}"
    );
    let held = slow.join().unwrap();
    println!("the slowloris connection was held for {held:?}");
    assert!(
        held < Duration::from_secs(12),
        "a connection sending a byte every 1.5 s was held {held:?}"
    );
}
