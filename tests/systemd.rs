//! The real `stokerd` driven as systemd drives it: a notification socket, the watchdog,
//! socket activation on fd 3, SIGTERM, SIGHUP; its Prometheus endpoint; `stoker status`;
//! and `systemd-analyze verify` over the units in deploy/.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use stoker::protocol::ErrorCode;
use stoker::sock::{SeqPacket, SeqPacketListener};
use stoker::{AttachOptions, Client, ClientError, DType, PipelineSpec};
use stoker_testkit::{stokerd_path, write_image_folder};

/// u8 output keeps the rings small.
fn spec(batch: u32, epochs: Option<u32>) -> PipelineSpec {
    PipelineSpec {
        dtype: DType::U8,
        epochs,
        ..PipelineSpec::train(batch, 16)
    }
}

fn options(dataset: &str, job: &str, epochs: Option<u32>) -> AttachOptions {
    AttachOptions {
        seed: 99,
        ..AttachOptions::new(job, dataset, spec(4, epochs))
    }
}

fn dataset(dir: &Path, name: &str, n: u32) -> PathBuf {
    let data = dir.join(name);
    write_image_folder(&data, 2, n, 24);
    data
}

/// A stokerd child, killed and reaped on drop unless it exited.
struct Stokerd {
    child: Child,
}

impl Stokerd {
    fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
    }

    fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "stokerd did not exit in time");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Stokerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Room for any pid in `LISTEN_PID=`; the child writes its own pid over it before exec.
const PID_PLACEHOLDER: &str = "00000000000000000000";

/// Writes `pid` in decimal at `value`, NUL-terminated. No allocation: callable after fork.
///
/// # Safety
/// `value` must be valid for writes of 21 bytes.
unsafe fn write_pid(value: *mut u8, pid: u64) {
    let mut digits = [0u8; 20];
    let mut n = 0;
    let mut v = pid;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    // SAFETY: n <= 20 digits and a NUL fit in the 21 bytes the caller vouches for.
    unsafe {
        for i in 0..n {
            *value.add(i) = digits[n - 1 - i];
        }
        *value.add(n) = 0;
    }
}

/// The environment stokerd gets: ours, less systemd's variables, plus `envs`.
fn child_env(dir: &Path, envs: &[(&str, &str)]) -> Vec<(String, String)> {
    let drop = [
        "NOTIFY_SOCKET",
        "LISTEN_FDS",
        "LISTEN_PID",
        "LISTEN_FDNAMES",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        "JOURNAL_STREAM",
        "RUST_LOG",
        "XDG_CACHE_HOME",
    ];
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| !drop.contains(&k.as_str()))
        .collect();
    env.push(("RUST_LOG".into(), "info".into()));
    env.push((
        "XDG_CACHE_HOME".into(),
        dir.join("cache").to_str().unwrap().into(),
    ));
    env.extend(envs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// Starts stokerd with `args` and `envs`; with `listen`, passes it as fd 3 with
/// LISTEN_FDS=1 and LISTEN_PID set to the child's own pid (socket activation), as systemd
/// does: a pre_exec hook moves the fd to 3, writes the child's pid into the prepared
/// environment and execs with it.
fn spawn(dir: &Path, args: &[&str], envs: &[(&str, &str)], listen: Option<OwnedFd>) -> Stokerd {
    use std::ffi::CString;
    let program = stokerd_path();
    let mut cmd = Command::new(&program);
    cmd.args(args).env_clear().stdin(Stdio::null());
    let mut env = child_env(dir, envs);
    let Some(fd) = listen else {
        cmd.envs(env);
        return Stokerd {
            child: cmd.spawn().expect("spawn stokerd"),
        };
    };
    env.push(("LISTEN_FDS".into(), "1".into()));
    env.push(("LISTEN_FDNAMES".into(), "stokerd.socket".into()));
    // Everything exec needs is built here, before fork: the hook only writes and execs.
    let c_program = CString::new(program.to_str().unwrap()).unwrap();
    let c_args: Vec<CString> = std::iter::once(c_program.clone())
        .chain(args.iter().map(|a| CString::new(*a).unwrap()))
        .collect();
    let mut c_env: Vec<CString> = env
        .iter()
        .map(|(k, v)| CString::new(format!("{k}={v}")).unwrap())
        .collect();
    c_env.push(CString::new(format!("LISTEN_PID={PID_PLACEHOLDER}")).unwrap());
    let pid_value = c_env.last().unwrap().as_ptr() as usize + "LISTEN_PID=".len();
    let argv: Vec<usize> = c_args
        .iter()
        .map(|a| a.as_ptr() as usize)
        .chain([0])
        .collect();
    let envp: Vec<usize> = c_env
        .iter()
        .map(|e| e.as_ptr() as usize)
        .chain([0])
        .collect();
    let raw: RawFd = fd.as_raw_fd();
    // SAFETY: the hook calls only async-signal-safe functions (dup2, fcntl, getpid, execve)
    // and writes into the child's copy of a buffer the parent prepared (`c_env`, which the
    // closure keeps alive).
    unsafe {
        cmd.pre_exec(move || {
            let _keep = (&c_program, &c_args, &c_env);
            if raw == 3 {
                let flags = libc::fcntl(3, libc::F_GETFD);
                libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            } else if libc::dup2(raw, 3) != 3 {
                return Err(std::io::Error::last_os_error());
            }
            write_pid(pid_value as *mut u8, libc::getpid() as u64);
            libc::execve(
                c_program.as_ptr(),
                argv.as_ptr() as *const *const libc::c_char,
                envp.as_ptr() as *const *const libc::c_char,
            );
            Err(std::io::Error::last_os_error())
        });
    }
    let child = cmd.spawn().expect("spawn stokerd");
    drop(fd);
    Stokerd { child }
}

fn wait_listening(d: &mut Stokerd, socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while SeqPacket::connect(socket).is_err() {
        assert!(d.running(), "stokerd exited before serving");
        assert!(Instant::now() < deadline, "stokerd did not listen in time");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh folder with a small dataset, and a stokerd (2 threads) listening on a socket there.
fn serving() -> (tempfile::TempDir, PathBuf, PathBuf, Stokerd) {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), "data", 4);
    let socket = dir.path().join("stoker.sock");
    let mut d = spawn(
        dir.path(),
        &["--socket", socket.to_str().unwrap(), "--threads", "2"],
        &[],
        None,
    );
    wait_listening(&mut d, &socket);
    (dir, data, socket, d)
}

/// A datagram socket standing in for systemd's notification socket.
struct NotifySocket {
    fd: OwnedFd,
    /// What to put in $NOTIFY_SOCKET.
    address: String,
}

impl NotifySocket {
    /// A socket at `path`, or in the abstract namespace when `path` starts with '@'.
    fn bind(address: &str) -> NotifySocket {
        // SAFETY: plain syscall; the fd is owned on the next line.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0);
        // SAFETY: fresh fd, owned once.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_un is plain old data.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = address.as_bytes();
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let mut len = 2 + bytes.len();
        if bytes[0] == b'@' {
            addr.sun_path[0] = 0;
        } else {
            len += 1;
        }
        // SAFETY: `addr` is valid for `len` bytes.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "bind {address}: {}", std::io::Error::last_os_error());
        NotifySocket {
            fd,
            address: address.to_owned(),
        }
    }

    /// The next datagram, or None after `timeout`.
    fn recv(&self, timeout: Duration) -> Option<String> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
        if rc <= 0 {
            return None;
        }
        let mut buf = [0u8; 4096];
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        (n >= 0).then(|| String::from_utf8_lossy(&buf[..n as usize]).into_owned())
    }

    /// Waits for a datagram with the line `line`; returns every datagram seen until then.
    fn wait_for(&self, line: &str, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            if let Some(m) = self.recv(deadline - Instant::now()) {
                let hit = m.lines().any(|l| l == line);
                seen.push(m);
                if hit {
                    return seen;
                }
            }
        }
        panic!("no {line} within {timeout:?}; got {seen:?}");
    }
}

#[test]
fn ready_is_sent_only_once_a_client_can_attach() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), "data", 4);
    let notify = NotifySocket::bind(dir.path().join("notify").to_str().unwrap());
    let socket = dir.path().join("stoker.sock");
    let _d = spawn(
        dir.path(),
        &["--socket", socket.to_str().unwrap(), "--threads", "2"],
        &[("NOTIFY_SOCKET", &notify.address)],
        None,
    );
    let seen = notify.wait_for("READY=1", Duration::from_secs(30));
    // Attach right after READY: it must succeed at once, with no retry.
    let mut c = Client::attach(&socket, options(data.to_str().unwrap(), "ready", Some(1)))
        .expect("attach right after READY=1");
    assert!(c.next_batch().unwrap().is_some());
    let ready = seen.last().unwrap();
    assert!(
        ready.lines().any(|l| l.starts_with("STATUS=serving on ")),
        "{ready}"
    );
    // STATUS= lines follow with jobs, clients and img/s.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = notify.recv(Duration::from_secs(5)).expect("STATUS= lines");
        if m.starts_with("STATUS=") && m.contains("clients") && m.contains("img/s") {
            break;
        }
        assert!(Instant::now() < deadline, "no STATUS= summary line");
    }
}

#[test]
fn watchdog_is_fed_at_half_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let address = format!("@stoker-test-watchdog-{}", std::process::id());
    let notify = NotifySocket::bind(&address);
    let socket = dir.path().join("stoker.sock");
    let _d = spawn(
        dir.path(),
        &["--socket", socket.to_str().unwrap(), "--threads", "1"],
        &[("NOTIFY_SOCKET", &address), ("WATCHDOG_USEC", "400000")],
        None,
    );
    notify.wait_for("READY=1", Duration::from_secs(30));
    let start = Instant::now();
    let mut pings = Vec::new();
    while start.elapsed() < Duration::from_secs(2) {
        if let Some(m) = notify.recv(Duration::from_millis(500)) {
            if m == "WATCHDOG=1" {
                pings.push(start.elapsed());
            }
        }
    }
    // Every 200 ms for 2 s: about 10 pings; a loaded machine may lose a couple.
    assert!(
        (7..=13).contains(&pings.len()),
        "{} pings in 2 s: {pings:?}",
        pings.len()
    );
    for w in pings.windows(2) {
        assert!(
            w[1] - w[0] < Duration::from_millis(400),
            "gap over the watchdog interval: {pings:?}"
        );
    }
}

#[test]
fn an_activated_socket_on_fd_3_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), "data", 4);
    let path = dir.path().join("activated.sock");
    let listener = SeqPacketListener::bind(&path).unwrap();
    let fd = listener.as_fd().try_clone_to_owned().unwrap();
    drop(listener);
    let notify = NotifySocket::bind(dir.path().join("notify").to_str().unwrap());
    // A --socket the daemon must not use: the activated socket wins.
    let unused = dir.path().join("not-this.sock");
    let mut d = spawn(
        dir.path(),
        &["--socket", unused.to_str().unwrap(), "--threads", "2"],
        &[("NOTIFY_SOCKET", &notify.address)],
        Some(fd),
    );
    notify.wait_for("READY=1", Duration::from_secs(30));
    let mut c = Client::attach(&path, options(data.to_str().unwrap(), "act", Some(1)))
        .expect("attach through the activated socket");
    let mut images = 0;
    while let Some(b) = c.next_batch().unwrap() {
        images += b.indices().len();
    }
    assert_eq!(images, 8);
    assert!(
        !unused.exists(),
        "stokerd bound --socket despite activation"
    );
    let status = stoker_daemon::cli::status::query(&path).unwrap();
    assert!(status.activated);
    assert_eq!(status.socket, path.display().to_string());
    // systemd owns the socket file: stokerd leaves it on exit.
    d.signal(libc::SIGTERM);
    assert!(d.wait_exit(Duration::from_secs(15)).success());
    assert!(path.exists());
}

#[test]
fn a_non_seqpacket_fd_3_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: plain syscall; owned on the next line.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0) };
    // SAFETY: fresh fd, owned once.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut d = spawn(
        dir.path(),
        &["--socket", dir.path().join("s").to_str().unwrap()],
        &[],
        Some(fd),
    );
    let status = d.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(78), "{status}");
}

#[test]
fn a_bad_config_at_start_exits_78() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("stoker.toml");
    std::fs::write(&config, "[server]\nslots = 3\n").unwrap();
    let mut d = spawn(
        dir.path(),
        &["--config", config.to_str().unwrap()],
        &[],
        None,
    );
    assert_eq!(d.wait_exit(Duration::from_secs(30)).code(), Some(78));
}

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
    let mut d = spawn(
        dir.path(),
        &["--config", config.to_str().unwrap(), "--threads", "2"],
        &[],
        None,
    );
    wait_listening(&mut d, &socket);
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
    assert!(d.running());
    assert!(c.next_batch().unwrap().is_some());
    drop(Client::attach(&socket, options("second", "again", Some(1))).unwrap());
}

/// An HTTP GET of `path` on `addr`; returns (status line, body).
fn http_get(addr: &str, path: &str) -> (String, String) {
    // The metrics listener starts just after the unix socket: retry briefly.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match std::net::TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connect {addr}: {e}"),
        }
    };
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The value of the sample `series` (name and labels exactly as rendered).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

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

#[test]
fn metrics_count_exactly_what_clients_received() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), "data", 7);
    let socket = dir.path().join("stoker.sock");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut d = spawn(
        dir.path(),
        &[
            "--socket",
            socket.to_str().unwrap(),
            "--threads",
            "2",
            "--metrics-listen",
            &addr,
        ],
        &[],
        None,
    );
    wait_listening(&mut d, &socket);
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

#[test]
fn systemd_analyze_verifies_the_units() {
    let analyze = Command::new("systemd-analyze").arg("--version").output();
    if analyze.is_err() {
        let installed = Command::new("apt-get")
            .args(["install", "-y", "systemd"])
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            eprintln!(
                "SKIPPED systemd_analyze_verifies_the_units: systemd-analyze is missing and \
                 `apt-get install systemd` failed"
            );
            return;
        }
    }
    // verify checks that ExecStart's binary exists: run it in a temp root holding a stub
    // /usr/bin/stokerd, the system's own units (targets the socket and service name), and
    // ours in /etc/systemd/system.
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("usr/bin")).unwrap();
    std::fs::create_dir_all(r.join("bin")).unwrap();
    std::fs::create_dir_all(r.join("etc/systemd/system")).unwrap();
    std::fs::create_dir_all(r.join("usr/lib/systemd")).unwrap();
    std::fs::write(r.join("usr/bin/stokerd"), "#!/bin/sh\n").unwrap();
    std::fs::copy("/bin/kill", r.join("bin/kill")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        let stub = r.join("usr/bin/stokerd");
        std::fs::set_permissions(stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let system = ["/usr/lib/systemd/system", "/lib/systemd/system"]
        .into_iter()
        .find(|p| Path::new(p).is_dir())
        .expect("the system's unit folder");
    let cp = Command::new("cp")
        .args(["-r", system])
        .arg(r.join("usr/lib/systemd/system"))
        .status()
        .unwrap();
    assert!(cp.success());
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let mut units = Vec::new();
    for unit in ["stokerd.service", "stokerd.socket"] {
        let dst = r.join("etc/systemd/system").join(unit);
        std::fs::copy(deploy.join(unit), &dst).unwrap();
        units.push(dst);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", r.display()))
        .arg("--man=no")
        .args(&units)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{stderr}"
    );
    // Unknown keys are only warnings to verify; they are errors here.
    assert!(
        !stderr.contains("Unknown") && !stderr.contains("ignoring"),
        "systemd-analyze verify warned:\n{stderr}"
    );
    let service = std::fs::read_to_string(deploy.join("stokerd.service")).unwrap();
    for line in [
        "Type=notify",
        "ExecStart=/usr/bin/stokerd --config /etc/stoker/stoker.toml",
        "RestartPreventExitStatus=78",
        "LimitMEMLOCK=infinity",
        "RuntimeDirectory=stoker",
        "CacheDirectory=stoker",
        "User=stoker",
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=/dev/nvidia-uvm rw",
    ] {
        assert!(
            service.lines().any(|l| l == line),
            "stokerd.service lacks {line}"
        );
    }
    assert!(service.lines().any(|l| l.starts_with("WatchdogSec=")));
    let socket = std::fs::read_to_string(deploy.join("stokerd.socket")).unwrap();
    for line in [
        "ListenSequentialPacket=/run/stoker/stoker.sock",
        "SocketMode=0660",
        "SocketGroup=stoker-clients",
    ] {
        assert!(
            socket.lines().any(|l| l == line),
            "stokerd.socket lacks {line}"
        );
    }
}

/// Every key of the config reference parses: the example file is a valid config.
#[test]
fn the_example_config_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/stoker.toml.example");
    let c = stoker_daemon::config::Config::load(&path).unwrap();
    assert_eq!(c.metrics.listen.as_deref(), Some("127.0.0.1:9464"));
}

/// Under systemd ($JOURNAL_STREAM) log lines carry no timestamp; piped, they carry no colour.
#[test]
fn logs_suit_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("stoker.toml");
    std::fs::write(&config, "[server]\nslots = 3\n").unwrap();
    let run = |journal: bool| {
        let mut cmd = Command::new(stokerd_path());
        cmd.args(["--config", config.to_str().unwrap()])
            .env_remove("JOURNAL_STREAM")
            .env("RUST_LOG", "info");
        if journal {
            cmd.env("JOURNAL_STREAM", "8:12345");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(78));
        String::from_utf8(out.stderr).unwrap()
    };
    let journal = run(true);
    let first = journal.lines().next().unwrap();
    assert!(first.trim_start().starts_with("ERROR"), "{journal}");
    assert!(first.contains("slots"), "{journal}");
    assert!(
        !journal.contains('\x1b'),
        "colour codes in piped logs: {journal:?}"
    );
    let plain = run(false);
    let first = plain.lines().next().unwrap();
    assert!(
        first.starts_with(|c: char| c.is_ascii_digit()),
        "no timestamp outside systemd: {plain}"
    );
    assert!(!plain.contains('\x1b'), "{plain:?}");
}
