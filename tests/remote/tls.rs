//! TLS between home daemons and workers, and mutual TLS in place of the shared secret:
//! certificates made by the `openssl` CLI at test time. A home daemon with a certificate
//! of the worker's CA is served the local batches through the worker; one whose certificate
//! another CA signed, and a peer speaking plain TCP, are refused in the handshake with
//! rustls's reason logged.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use super::*;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output();
    let out = out.expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The arguments of `openssl req` that make a new P-256 key, unencrypted, into `key`.
fn new_ec_key(key: &str) -> [&str; 7] {
    [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        key,
    ]
}

/// A CA `name`.pem (key `name`.key) in `dir`.
fn ca(dir: &Path, name: &str) {
    let (key, pem, subj) = (
        format!("{name}.key"),
        format!("{name}.pem"),
        format!("/CN={name}"),
    );
    openssl(
        dir,
        &[
            &["req", "-x509"],
            &new_ec_key(&key)[..],
            &["-out", &pem, "-days", "2", "-subj", &subj],
        ]
        .concat(),
    );
}

/// A certificate `name`.pem (key `name`.key, mode 0600) signed by CA `by`, with `ext`
/// (its subjectAltName and extendedKeyUsage).
fn leaf(dir: &Path, name: &str, by: &str, ext: &str) {
    let (key, csr, pem) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
    );
    let extfile = format!("{name}.ext");
    std::fs::write(
        dir.join(&extfile),
        format!("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n{ext}\n"),
    )
    .unwrap();
    let subj = format!("/CN={name}");
    openssl(
        dir,
        &[
            &["req"],
            &new_ec_key(&key)[..],
            &["-out", &csr, "-subj", &subj],
        ]
        .concat(),
    );
    let (ca_pem, ca_key) = (format!("{by}.pem"), format!("{by}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &extfile,
        ],
    );
    let key = dir.join(key);
    std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The certificates of one test: CA `ca` signs the worker's (for 127.0.0.1) and a home's;
/// CA `rogue` signs another home's.
fn certificates(world: &World) -> PathBuf {
    let dir = world.dir("pki");
    ca(&dir, "ca");
    ca(&dir, "rogue");
    let server = "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth";
    let client = "subjectAltName=DNS:home.test\nextendedKeyUsage=clientAuth";
    leaf(&dir, "worker", "ca", server);
    leaf(&dir, "home", "ca", client);
    leaf(&dir, "intruder", "rogue", client);
    dir
}

/// A home daemon's `[remote]` section: TLS to `addr`, as `who` (a certificate of `pki`).
fn remote_section(pki: &Path, addr: &str, who: &str) -> String {
    format!(
        "[remote]\nworkers = [{addr:?}]\nconnections = 2\nunit_timeout_ms = 3000\n\
         tls_ca = {:?}\ntls_cert = {:?}\ntls_key = {:?}\n",
        pki.join("ca.pem"),
        pki.join(format!("{who}.pem")),
        pki.join(format!("{who}.key"))
    )
}

#[test]
fn mutual_tls_serves_the_local_batches_and_refuses_a_certificate_of_another_ca() {
    let world = World::new();
    let expected = reference(&world);
    let pki = certificates(&world);
    // The worker asks for mutual TLS and holds no shared secret.
    let dir = world.dir("worker");
    let addr = format!("127.0.0.1:{}", free_port());
    let config = write_config(
        &dir,
        &format!(
            "[pipeline]\nthreads = 1\n[access]\ndataset_roots = [{:?}]\n[worker]\n\
             listen = {addr:?}\ntls_cert = {:?}\ntls_key = {:?}\ntls_client_ca = {:?}\n",
            world.tmp.path(),
            pki.join("worker.pem"),
            pki.join("worker.key"),
            pki.join("ca.pem")
        ),
    );
    let log = dir.join("log");
    let _worker = Daemon::start_logged(&dir, &["--config", config.to_str().unwrap()], &log);

    let (home, home_log, metrics) =
        world.home_configured("home", &[], &remote_section(&pki, &addr, "home"));
    let batches = serve_job(home.socket(), &world.data, 0, || {});
    assert_eq!(batches, expected);
    let text = stoker_testkit::prometheus::http_get(&metrics, "/metrics").1;
    assert!(
        remote_units(&text, &addr, "done") > 0.0,
        "no unit done through TLS; home log:\n{}\nworker log:\n{}",
        read_log(&home_log),
        read_log(&log)
    );
    assert!(!read_log(&home_log).contains("filling locally"));

    // Another CA's certificate: refused in the handshake, the batches the local ones.
    let (intruder, intruder_log, _) =
        world.home_configured("intruder", &[], &remote_section(&pki, &addr, "intruder"));
    assert_eq!(
        serve_job(intruder.socket(), &world.data, 0, || {}),
        expected
    );
    let line = super::refusals::wait_for_line(&log, "refused a peer's TLS handshake");
    assert!(line.contains("UnknownIssuer"), "{line}");
    let home_side = read_log(&intruder_log);
    assert!(home_side.contains("cannot reach the worker"), "{home_side}");

    // A peer speaking plain TCP with the protocol's first message gets nothing.
    let mut plain = std::net::TcpStream::connect(&addr).unwrap();
    let soon = Instant::now() + Duration::from_secs(5);
    let key = super::refusals::secret(&world, "a-test-secret-of-some-length");
    assert!(stoker_daemon::remote::auth::connect(&mut plain, &key, soon).is_err());
    let refused = read_log(&log)
        .matches("refused a peer's TLS handshake")
        .count();
    assert!(refused >= 2, "{}", read_log(&log));
    // No key material in any log.
    for text in [read_log(&log), read_log(&home_log), home_side] {
        assert!(!text.contains("PRIVATE KEY"), "{text}");
    }
}
