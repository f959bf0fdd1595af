//! READY, the watchdog, socket activation on fd 3, bad configs.

use super::*;

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
    let status = stoker_tool::cli::status::query(&path).unwrap();
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

/// A remote worker started from deploy/stoker-worker.toml.example (its paths and port moved
/// into a temp folder), as deploy/stokerd-worker.service starts it: READY=1 comes once its TCP
/// port accepts, so systemd's "started" means home daemons can connect.
#[test]
fn a_worker_from_the_example_config_is_ready_once_its_port_listens() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let secret = d.join("worker.secret");
    std::fs::write(&secret, "a test secret of some length\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/stoker-worker.toml.example");
    let mut config = std::fs::read_to_string(example).unwrap();
    for (from, to) in [
        (
            "\"/run/stoker-worker/stoker.sock\"",
            format!("{:?}", d.join("stoker.sock")),
        ),
        ("[\"/data\"]", format!("[{d:?}]")),
        ("\"0.0.0.0:7411\"", format!("\"127.0.0.1:{port}\"")),
        ("\"/etc/stoker/worker.secret\"", format!("{secret:?}")),
        ("listen = \"127.0.0.1:9464\"", String::new()),
    ] {
        assert!(config.contains(from), "the example no longer has {from}");
        config = config.replace(from, &to);
    }
    let path = d.join("worker.toml");
    std::fs::write(&path, config).unwrap();
    let notify = NotifySocket::bind(d.join("notify").to_str().unwrap());
    let _w = spawn(
        d,
        &["--config", path.to_str().unwrap()],
        &[("NOTIFY_SOCKET", &notify.address)],
        None,
    );
    notify.wait_for("READY=1", Duration::from_secs(30));
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("the worker's port right after READY");
    let status = stoker_tool::cli::status::query(&d.join("stoker.sock")).unwrap();
    assert_eq!(status.socket, d.join("stoker.sock").display().to_string());
}
