//! The node cache's own tests: eviction, pins, checks and the private folder.

use super::*;

/// Puts `bytes` in as a download received into its temporary file.
fn put(c: &NodeCache, name: &str, bytes: &[u8]) -> PathBuf {
    let Claim::Fetch(p) = c.claim(name, &"s3://b/k") else {
        panic!("{name} should be fetched");
    };
    let temp = c.temp_path(name);
    fs::write(&temp, bytes).unwrap();
    let fetched = Fetched::File {
        temp: &temp,
        size: bytes.len() as u64,
        tag: c.tags().tag_of_bytes(bytes),
    };
    match c.finish(name, &p, Ok(fetched), "s3://b/k").unwrap() {
        Cached::File(path) => path,
        Cached::Memory(_) => panic!("a file download is handed over as its file"),
    }
}

/// Puts `bytes` in as a download received into memory, handed over from there; its file is
/// written behind when `write` says so.
fn put_hot(c: &NodeCache, name: &str, bytes: &[u8], write: bool) -> Bytes {
    let Claim::Fetch(p) = c.claim(name, &"s3://b/k") else {
        panic!("{name} should be fetched");
    };
    let tag = c.tags().tag_of_bytes(bytes);
    let fetched = Fetched::Memory {
        bytes: Bytes::copy_from_slice(bytes),
        tag,
    };
    let Ok(Cached::Memory(got)) = c.finish(name, &p, Ok(fetched), "s3://b/k") else {
        panic!("a download received into memory is handed over from memory");
    };
    if write {
        c.write_behind(name, &got, &tag);
    }
    got
}

/// A cache of `cap` bytes in a fresh folder.
fn opened(cap: u64) -> (tempfile::TempDir, Arc<NodeCache>) {
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(NodeCache::open(dir.path(), cap).unwrap());
    (dir, c)
}

/// The file name of the 4-byte object `key`.
fn named(key: &str) -> String {
    NodeCache::name("e", "b", key, "etag", 4)
}

#[test]
fn objects_are_reused_and_least_recently_used_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let c = NodeCache::open(dir.path(), 10).unwrap();
    let a = NodeCache::name("e", "b", "a", "etag", 4);
    let b = NodeCache::name("e", "b", "b", "etag", 4);
    let d = NodeCache::name("e", "b", "d", "etag", 4);
    put(&c, &a, b"aaaa");
    put(&c, &b, b"bbbb");
    assert!(matches!(c.claim(&a, &"s3://b/k"), Claim::Ready(_)));
    put(&c, &d, b"dddd"); // over the cap: b is the least recently used
    assert_eq!(c.total(), 8);
    assert!(matches!(c.claim(&a, &"s3://b/k"), Claim::Ready(_)));
    assert!(!dir.path().join(&b).exists());
    // A new ETag is another object.
    assert_ne!(NodeCache::name("e", "b", "a", "other", 4), a);
    // Reopening takes the files in; a file of the wrong size is not reused.
    fs::write(dir.path().join(&d), b"short").unwrap();
    let c2 = NodeCache::open(dir.path(), 10).unwrap();
    assert!(matches!(c2.claim(&a, &"s3://b/k"), Claim::Ready(_)));
    assert!(matches!(c2.claim(&d, &"s3://b/k"), Claim::Fetch(_)));
    // Removing a copy deletes its file and frees its bytes.
    assert!(c2.remove(&a) && !dir.path().join(&a).exists());
    assert!(!c2.remove(&a));
}

#[test]
fn a_pinned_object_is_not_evicted_and_room_is_made_from_the_others() {
    let (dir, c) = opened(4);
    let (a, b) = (named("a"), named("b"));
    let pin = c.pin(&a);
    put(&c, &a, b"aaaa");
    put(&c, &b, b"bbbb"); // over the cap, but a is pinned: the cap is overrun
    assert!(dir.path().join(&a).exists() && dir.path().join(&b).exists());
    assert_eq!(c.total(), 8);
    drop(pin); // the cap holds again: a (least recently used) goes
    assert_eq!(c.total(), 4);
    assert!(!dir.path().join(&a).exists());
    // A full disk: room is made from what nobody pins.
    let _pin_b = c.pin(&b);
    assert_eq!(c.make_room(4), 0, "only a pinned object is left");
    drop(_pin_b);
    assert_eq!(c.make_room(4), 4);
    assert_eq!(c.total(), 0);
}

#[test]
fn an_entry_whose_bytes_changed_is_deleted_and_fetched_again_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let c = NodeCache::open(dir.path(), 100).unwrap();
    let a = NodeCache::name("e", "b", "a", "etag", 4);
    let b = NodeCache::name("e", "b", "b", "etag", 4);
    put(&c, &a, b"aaaa");
    put(&c, &b, b"bbbb");
    assert!(matches!(c.claim(&a, &"s3://b/k"), Claim::Ready(_)));
    // Same size, other bytes: the size check passes, the keyed hash does not.
    fs::write(dir.path().join(&a), b"aaab").unwrap();
    assert!(matches!(c.claim(&a, &"s3://b/k"), Claim::Fetch(_)));
    assert!(!dir.path().join(&a).exists() && c.total() == 4);
    // Changed while the daemon was down, or planted without a tag: not taken in.
    fs::write(dir.path().join(&b), b"bbbc").unwrap();
    let planted = NodeCache::name("e", "b", "p", "etag", 4);
    fs::write(dir.path().join(&planted), b"pppp").unwrap();
    let c2 = NodeCache::open(dir.path(), 100).unwrap();
    assert!(matches!(c2.claim(&b, &"s3://b/k"), Claim::Fetch(_)));
    assert!(matches!(c2.claim(&planted, &"s3://b/k"), Claim::Fetch(_)));
    assert!(!dir.path().join(&planted).exists());
}

#[test]
fn a_failed_download_wakes_waiters_with_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let c = NodeCache::open(dir.path(), 100).unwrap();
    let Claim::Fetch(p) = c.claim("x-y-3", &"s3://b/k") else {
        panic!("first claim fetches")
    };
    let Claim::Wait(w) = c.claim("x-y-3", &"s3://b/k") else {
        panic!("second claim waits")
    };
    let err = S3Error::local("s3://b/x", "boom".into());
    assert!(c.finish("x-y-3", &p, Err(err), "s3://b/x").is_err());
    assert!(w.wait().is_err());
    assert!(matches!(c.claim("x-y-3", &"s3://b/k"), Claim::Fetch(_)));
}

#[test]
fn the_folder_is_made_private_and_one_of_another_uid_refused() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("cache/objects");
    NodeCache::open(&objects, 10).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(&objects), 0o700);
    fs::set_permissions(&objects, fs::Permissions::from_mode(0o777)).unwrap();
    let e = NodeCache::open(&objects, 10).unwrap_err().to_string();
    assert!(
        e.contains(&objects.display().to_string()) && e.contains("may write"),
        "{e}"
    );
    if stoker_private::euid() == 0 {
        fs::set_permissions(&objects, fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&objects, Some(65534), Some(65534)).unwrap();
        let e = NodeCache::open(&objects, 10).unwrap_err().to_string();
        assert!(e.contains("belongs to uid 65534"), "{e}");
    }
}

#[test]
fn a_download_is_handed_over_from_memory_its_file_written_behind_then_checked() {
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(NodeCache::open(dir.path(), 8).unwrap());
    let a = NodeCache::name("e", "b", "a", "etag", 4);
    let b = NodeCache::name("e", "b", "b", "etag", 4);
    let d = NodeCache::name("e", "b", "d", "etag", 4);
    // While its file is being written, the entry is served from memory and neither removed
    // nor evicted.
    let pin = c.pin(&a);
    put_hot(&c, &a, b"aaaa", false);
    assert!(!dir.path().join(&a).exists());
    assert_eq!(c.make_room(4), 0, "an entry being written is not evicted");
    let Claim::Ready(Cached::Memory(m)) = c.claim(&a, &"s3://b/k") else {
        panic!("served from memory")
    };
    assert_eq!(&m[..], b"aaaa");
    // Written behind: the file and its tag are in place, with no read back.
    c.write_behind(&a, &m, &c.tags().tag_of_bytes(b"aaaa"));
    assert_eq!(fs::read(dir.path().join(&a)).unwrap(), b"aaaa");
    assert_eq!(c.file(&a), Some(dir.path().join(&a)));
    // Read, and its last pin gone: the next reader reads the checked file.
    drop(pin);
    assert!(matches!(
        c.claim(&a, &"s3://b/k"),
        Claim::Ready(Cached::File(_))
    ));
    fs::write(dir.path().join(&a), b"aaab").unwrap();
    assert!(
        matches!(c.claim(&a, &"s3://b/k"), Claim::Fetch(_)),
        "a changed file is never served"
    );
    // A hot copy nobody took stays until the cap pushes its entry out.
    put_hot(&c, &b, b"bbbb", true);
    put_hot(&c, &d, b"dddd", true);
    assert!(matches!(
        c.claim(&b, &"s3://b/k"),
        Claim::Ready(Cached::Memory(_))
    ));
    assert!(matches!(
        c.claim(&d, &"s3://b/k"),
        Claim::Ready(Cached::Memory(_))
    ));
    let g = NodeCache::name("e", "b", "g", "etag", 4);
    put_hot(&c, &g, b"gggg", true); // over the cap of 8: b, the least recently used, goes
    assert!(matches!(c.claim(&b, &"s3://b/k"), Claim::Fetch(_)));
    assert_eq!(c.file(&b), None);
}

#[test]
fn entries_spared_while_written_are_evicted_once_written_when_over_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(NodeCache::open(dir.path(), 4).unwrap());
    let p = NodeCache::name("e", "b", "p", "etag", 4);
    let q = NodeCache::name("e", "b", "q", "etag", 4);
    let bytes = [
        put_hot(&c, &p, b"pppp", false),
        put_hot(&c, &q, b"qqqq", false),
    ];
    assert_eq!(
        c.total(),
        8,
        "nothing could be evicted while both were being written"
    );
    for (name, b) in [&p, &q].into_iter().zip(&bytes) {
        c.write_behind(name, b, &c.tags().tag_of_bytes(b));
    }
    assert_eq!(c.total(), 4, "the cap holds once they are written");
    assert!(!dir.path().join(&p).exists() && dir.path().join(&q).exists());
}

/// Whether the file system of `dir` keeps user extended attributes (the tag's home).
fn has_xattrs(dir: &Path) -> bool {
    let probe = dir.join("probe");
    fs::write(&probe, b"").unwrap();
    let set = rustix::fs::setxattr(&probe, "user.probe", b"1", rustix::fs::XattrFlags::empty());
    fs::remove_file(&probe).unwrap();
    set.is_ok()
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = (fs::read_dir(dir).unwrap())
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn an_entry_is_one_file_with_its_tag_on_its_inode_and_old_entries_are_read() {
    let (dir, c) = opened(100);
    let (a, b) = (named("a"), named("b"));
    put_hot(&c, &a, b"aaaa", true); // written behind
    put(&c, &b, b"bbbb"); // received into its temporary file
    let tag_of = |bytes: &[u8]| c.tags().tag_of_bytes(bytes);
    let mut want = vec![a.clone(), b.clone(), integrity::KEY_FILE.to_owned()];
    if has_xattrs(dir.path()) {
        want.sort();
        assert_eq!(
            names_in(dir.path()),
            want,
            "one file per object, nothing beside"
        );
    } else {
        assert!(
            integrity::tag_path(&dir.path().join(&a)).exists(),
            "the tag file"
        );
    }
    assert_eq!(
        integrity::read_tag(&dir.path().join(&a)),
        Some(tag_of(b"aaaa"))
    );
    assert_eq!(
        integrity::read_tag(&dir.path().join(&b)),
        Some(tag_of(b"bbbb"))
    );
    // An entry an earlier version left (format 1: its tag in a file beside it) is taken in,
    // as are this version's.
    let old = named("old");
    fs::write(dir.path().join(&old), b"oooo").unwrap();
    integrity::write_tag(&dir.path().join(&old), &tag_of(b"oooo")).unwrap();
    let c2 = NodeCache::open(dir.path(), 100).unwrap();
    for n in [&a, &b, &old] {
        assert!(
            matches!(c2.claim(n, &"s3://b/k"), Claim::Ready(Cached::File(_))),
            "{n}"
        );
    }
    if !has_xattrs(dir.path()) {
        return;
    }
    // A tag of another format, or cut short, is broken: the entry is deleted, fetched again.
    let set = |n: &str, v: &[u8]| {
        let flags = rustix::fs::XattrFlags::empty();
        rustix::fs::setxattr(dir.path().join(n), integrity::TAG_XATTR, v, flags).unwrap();
    };
    set(&a, &[9; 33]);
    set(&b, &[integrity::TAG_FORMAT; 20]);
    let c3 = NodeCache::open(dir.path(), 100).unwrap();
    assert!(matches!(c3.claim(&a, &"s3://b/k"), Claim::Fetch(_)));
    assert!(matches!(c3.claim(&b, &"s3://b/k"), Claim::Fetch(_)));
    assert!(!dir.path().join(&a).exists() && !dir.path().join(&b).exists());
}

#[test]
fn a_file_written_by_another_process_meanwhile_is_replaced_not_doubled() {
    let (dir, c) = opened(100);
    let a = named("a");
    let got = put_hot(&c, &a, b"aaaa", false);
    // Another daemon sharing the folder put its copy (here torn) under the name first.
    fs::write(dir.path().join(&a), b"aa\0\0").unwrap();
    c.write_behind(&a, &got, &c.tags().tag_of_bytes(b"aaaa"));
    assert_eq!(fs::read(dir.path().join(&a)).unwrap(), b"aaaa");
    assert!(!names_in(dir.path()).iter().any(|n| n.contains(".tmp.")));
    let c2 = NodeCache::open(dir.path(), 100).unwrap();
    assert!(matches!(
        c2.claim(&a, &"s3://b/k"),
        Claim::Ready(Cached::File(_))
    ));
}

#[test]
fn where_unnamed_files_are_refused_a_temporary_name_moved_into_place_does_the_same() {
    let (dir, c) = opened(100);
    c.writer.named.store(true, Ordering::Relaxed);
    let a = named("a");
    put_hot(&c, &a, b"aaaa", true);
    assert_eq!(fs::read(dir.path().join(&a)).unwrap(), b"aaaa");
    let tag = c.tags().tag_of_bytes(b"aaaa");
    assert_eq!(integrity::read_tag(&dir.path().join(&a)), Some(tag));
    assert!(!names_in(dir.path()).iter().any(|n| n.contains(".tmp.")));
    let c2 = NodeCache::open(dir.path(), 100).unwrap();
    assert!(matches!(
        c2.claim(&a, &"s3://b/k"),
        Claim::Ready(Cached::File(_))
    ));
}
