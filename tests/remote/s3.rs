//! A real S3-compatible server for the remote tests: SeaweedFS `weed mini` on 127.0.0.1
//! (installed by scripts/s3-server, as tests/object_storage uses it), with signature
//! checking on; killed on drop.

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stoker_pipeline::source::object::{Connection, ObjectStore, S3Config, S3Url};
use stoker_testkit::daemon::repo_root;

use super::*;

const ACCESS_KEY: &str = "STOKERREMOTEKEY";
const SECRET_KEY: &str = "stoker-remote-test-key";
pub(crate) const BUCKET: &str = "stoker";

pub(crate) struct Weed {
    child: Child,
    port: u16,
    log: PathBuf,
}

/// `weed mini` serving S3 on `port` (and its other services on the next four), logging to `log`.
fn spawn_weed(bin: &Path, dir: &Path, port: u16, log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    Command::new(bin)
        .arg("mini")
        .arg(format!("-dir={}", dir.join("weed").display()))
        .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
        .arg(format!("-s3.config={}", dir.join("s3.json").display()))
        .arg(format!("-s3.port={port}"))
        .arg(format!("-master.port={}", port + 1))
        .arg(format!("-volume.port={}", port + 2))
        .arg(format!("-filer.port={}", port + 3))
        .arg(format!("-admin.port={}", port + 4))
        .args(["-admin.ui=false", "-webdav=false"])
        .args(["-s3.port.iceberg=0", "-s3.port.lance=0"])
        .arg(format!("-bucket={BUCKET}"))
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawn weed mini")
}

impl Weed {
    pub(crate) fn start(dir: &Path) -> Weed {
        let bin = std::env::var_os("STOKER_SEAWEEDFS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/stoker/seaweedfs")
            })
            .join("bin/weed");
        if !bin.is_file() {
            let ok = Command::new(repo_root().join("scripts/s3-server")).status();
            assert!(ok.is_ok_and(|s| s.success()), "scripts/s3-server failed");
        }
        let identities = format!(
            r#"{{"identities":[{{"name":"stoker","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List"]}}]}}"#
        );
        std::fs::write(dir.join("s3.json"), identities).unwrap();
        let log = dir.join("weed.log");
        // Five ports from a block of this process's; another process may hold one of them
        // (weed then exits at once), so a few other blocks are tried.
        let first = 40_000 + u16::try_from(std::process::id() % 200).unwrap() * 100;
        for attempt in 0..8u16 {
            let port = 40_000 + (first - 40_000 + attempt * 1_300) % 20_000;
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                continue; // someone else's server: not ours to test against
            }
            let _ = std::fs::remove_dir_all(dir.join("weed"));
            std::fs::create_dir_all(dir.join("weed")).unwrap();
            let mut child = spawn_weed(&bin, dir, port, &log);
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Weed { child, port, log };
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                assert!(Instant::now() < deadline, "weed:\n{}", read_log(&log));
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("weed exited on ports {port}..{}: trying others", port + 4);
        }
        panic!("weed never started:\n{}", read_log(&log));
    }

    /// A daemon config's `[s3]` sections for this server, its node cache under `dir`.
    pub(crate) fn config(&self, dir: &Path) -> String {
        format!(
            "[s3]\ncache_dir = {:?}\nindex_ttl_s = 0\n[s3.default]\n\
             endpoint = \"http://127.0.0.1:{}\"\nregion = \"us-east-1\"\npath_style = true\n\
             access_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"{SECRET_KEY}\"\n",
            dir.join("objects"),
            self.port
        )
    }

    /// Uploads `dir` under `prefix`, retrying while the server finishes starting.
    pub(crate) fn upload(&self, dir: &Path, prefix: &str) {
        let store = ObjectStore::new(
            &S3Config {
                default: Connection {
                    endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
                    region: Some("us-east-1".into()),
                    path_style: Some(true),
                    access_key_id: Some(ACCESS_KEY.into()),
                    secret_access_key: Some(SECRET_KEY.into()),
                    session_token: None,
                },
                retries: 2,
                ..S3Config::default()
            },
            &BTreeMap::new(),
        );
        let url = format!("s3://{BUCKET}/{prefix}");
        let url = S3Url::parse(Path::new(&url)).unwrap().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(e) = store.upload_dir(dir, &url) {
            assert!(
                Instant::now() < deadline,
                "upload: {e}; see {}",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
