//! Tests for `dataset`: each layout built in a temp dir, the tar parser, the cache.

#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use super::*;
use crate::source::integrity;
use std::time::Duration;

fn opts(cache: &Path) -> OpenOptions {
    OpenOptions {
        cache_dir: Some(cache.to_owned()),
        ..OpenOptions::default()
    }
}

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

/// Classes `a` and `b` of three (tiny) images each under `root`, settled (see [`settle`]).
fn two_classes_of_three(root: &Path) {
    for c in ["a", "b"] {
        for i in 0..3 {
            write(&root.join(format!("{c}/{i}.jpg")), b"xx");
        }
    }
    settle();
}

/// Lets folder mtimes leave the cache's racy window, so a reopen may trust the cache.
fn settle() {
    std::thread::sleep(Duration::from_millis(150));
}

/// A tar header block for `name` (plain ustar, name must fit in 100 bytes).
fn tar_header(name: &[u8], size: u64, typeflag: u8) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name);
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0001750");
    h[116..123].copy_from_slice(b"0001750");
    h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    h[136..147].copy_from_slice(b"14000000000");
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

fn tar_data(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

enum LongName {
    Plain,
    Gnu,
    Pax,
}

/// Appends one member; returns the offset of its data.
fn tar_member(out: &mut Vec<u8>, name: &str, data: &[u8], how: LongName) -> u64 {
    match how {
        LongName::Plain => {}
        LongName::Gnu => {
            let mut n = name.as_bytes().to_vec();
            n.push(0);
            out.extend_from_slice(&tar_header(b"././@LongLink", n.len() as u64, b'L'));
            tar_data(out, &n);
        }
        LongName::Pax => {
            let body = |len: usize| format!("{len} path={name}\n");
            let mut len = body(0).len();
            while body(len).len() != len {
                len = body(len).len();
            }
            let rec = body(len);
            out.extend_from_slice(&tar_header(b"PaxHeader/x", rec.len() as u64, b'x'));
            tar_data(out, rec.as_bytes());
        }
    }
    let short = &name.as_bytes()[..name.len().min(99)];
    out.extend_from_slice(&tar_header(short, data.len() as u64, b'0'));
    let off = out.len() as u64;
    tar_data(out, data);
    off
}

fn tar_end(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0u8; 1024]);
}

#[test]
fn image_folder_labels_by_sorted_class_and_sorted_files() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("data");
    write(&root.join("zebra/b.jpg"), b"zb");
    write(&root.join("zebra/a.JPEG"), b"zaa");
    write(&root.join("ant/x.jpeg"), b"ax");
    write(&root.join("ant/nested/y.jpg"), b"ayyy");
    write(&root.join("ant/notes.txt"), b"not an image");
    write(&root.join("ant/.hidden.jpg"), b"hidden");
    fs::create_dir_all(root.join("empty_class")).unwrap();
    let ds = Dataset::open(&root, &opts(&t.path().join("cache"))).unwrap();
    assert_eq!(ds.kind(), DatasetKind::ImageFolder);
    assert_eq!(ds.classes(), &["ant", "empty_class", "zebra"]);
    let got: Vec<(String, u64, i64)> = (0..ds.len())
        .map(|i| {
            let s = ds.sample(i);
            let rel = s.path.strip_prefix(ds.root()).unwrap();
            (rel.display().to_string(), s.len, s.label)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("ant/nested/y.jpg".into(), 4, 0),
            ("ant/x.jpeg".into(), 2, 0),
            ("zebra/a.JPEG".into(), 3, 2),
            ("zebra/b.jpg".into(), 2, 2),
        ]
    );
    assert_eq!(ds.sample(0).offset, 0);
    assert_eq!(
        ds.display_name(1),
        root.canonicalize()
            .unwrap()
            .join("ant/x.jpeg")
            .display()
            .to_string()
    );
}

#[test]
fn a_folder_walk_counts_and_names_the_files_it_skips_and_the_cache_keeps_them() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("data");
    write(&root.join("cat/a.jpg"), b"a");
    write(&root.join("cat/b.gif"), b"GIF89a");
    write(&root.join("cat/deep/c.avif"), b"....ftypavif");
    write(&root.join("cat/labels.txt"), b"metadata, not a sample");
    write(&root.join("dog/d.png"), b"png");
    write(&root.join("dog/e.heic"), b"....ftypheic");
    write(&root.join("dog/.f.avif"), b"hidden");
    // Issue 43: BMP, TIFF, PPM and PGM are samples, as in torchvision's ImageFolder.
    for name in ["g.bmp", "h.tif", "i.TIFF", "j.ppm", "k.pgm"] {
        write(&root.join("dog").join(name), b"image");
    }
    let cache = t.path().join("cache");
    let ds = Dataset::open(&root, &opts(&cache)).unwrap();
    assert_eq!(ds.len(), 7);
    let want = Skipped {
        count: 3,
        first: vec![
            "cat/b.gif".into(),
            "cat/deep/c.avif".into(),
            "dog/e.heic".into(),
        ],
    };
    assert_eq!(ds.skipped(), &want);
    assert_eq!(
        ds.skipped().summary().unwrap(),
        "3 files skipped (not a supported image format): cat/b.gif, cat/deep/c.avif, dog/e.heic"
    );
    settle();
    let _ = Dataset::open(&root, &opts(&cache)).unwrap();
    let cached = Dataset::open(&root, &opts(&cache)).unwrap();
    assert_eq!(cached.origin(), IndexOrigin::Cache);
    assert_eq!(cached.skipped(), &want);
}

#[test]
fn flat_folder_has_no_labels() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("flat");
    // A GIF is no sample (a PNG is, since PNG decodes): counted and named as skipped.
    for (n, b) in [("b.jpg", &b"bb"[..]), ("a.jpg", b"a"), ("c.gif", b"c")] {
        write(&root.join(n), b);
    }
    let ds = Dataset::open(&root, &opts(&t.path().join("cache"))).unwrap();
    assert_eq!(ds.kind(), DatasetKind::Flat);
    assert_eq!(ds.len(), 2);
    assert_eq!(
        (ds.skipped().count, &ds.skipped().first[..]),
        (1, &["c.gif".to_owned()][..])
    );
    assert!(ds.classes().is_empty());
    assert_eq!(ds.sample(0).path.file_name().unwrap(), "a.jpg");
    assert_eq!((ds.sample(1).len, ds.sample(1).label), (2, -1));
}

#[test]
fn file_list_resolves_relative_paths_and_names_bad_lines() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("lists");
    write(&dir.join("imgs/one.jpg"), b"111");
    write(&t.path().join("abs.jpg"), b"22");
    let list = dir.join("train.tsv");
    let abs = t.path().join("abs.jpg");
    write(
        &list,
        format!("# comment\nimgs/one.jpg\t3\r\n\n{}\t-1\n", abs.display()).as_bytes(),
    );
    let ds = Dataset::open(&list, &opts(&t.path().join("cache"))).unwrap();
    assert_eq!(ds.kind(), DatasetKind::FileList);
    assert_eq!(ds.len(), 2);
    assert_eq!(
        ds.sample(0).path,
        dir.canonicalize().unwrap().join("imgs/one.jpg")
    );
    assert_eq!((ds.sample(0).len, ds.sample(0).label), (3, 3));
    assert_eq!((ds.sample(1).path, ds.sample(1).label), (abs.as_path(), -1));

    write(&list, b"imgs/one.jpg\t1\nimgs/one.jpg 2\n");
    let e = Dataset::open(&list, &opts(&t.path().join("cache"))).unwrap_err();
    assert!(
        matches!(e, DatasetError::BadListLine { line: 2, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("line 2"), "{e}");
    write(&list, b"imgs/one.jpg\tcat\n");
    let e = Dataset::open(&list, &opts(&t.path().join("cache"))).unwrap_err();
    assert!(
        matches!(e, DatasetError::BadListLine { line: 1, .. }),
        "{e}"
    );
    write(&list, b"imgs/one.jpg\t1\nimgs/missing.jpg\t1\n");
    let e = Dataset::open(&list, &opts(&t.path().join("cache"))).unwrap_err();
    assert!(e.to_string().contains("missing.jpg"), "{e}");
}

#[test]
fn tar_shards_index_members_by_offset_with_long_names() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("shards");
    fs::create_dir_all(&root).unwrap();
    let long_dir = "d".repeat(120);
    let mut a = Vec::new();
    let a0 = tar_member(&mut a, "s000.jpg", b"JPEG-zero", LongName::Plain);
    tar_member(&mut a, "s000.cls", b"7\n", LongName::Plain);
    let a1 = tar_member(
        &mut a,
        &format!("{long_dir}/s001.jpeg"),
        b"JPEG-one!",
        LongName::Gnu,
    );
    tar_member(
        &mut a,
        &format!("{long_dir}/s001.cls"),
        b"12",
        LongName::Gnu,
    );
    tar_member(&mut a, "s002.json", b"{}", LongName::Plain);
    tar_end(&mut a);
    let mut b = Vec::new();
    let pax_name = format!("{}/s100.jpg", "p".repeat(150));
    let b0 = tar_member(&mut b, &pax_name, b"JPEG-pax", LongName::Pax);
    tar_member(
        &mut b,
        &format!("{}/s100.cls", "p".repeat(150)),
        b"4",
        LongName::Pax,
    );
    let b1 = tar_member(&mut b, "nolabel.jpg", &vec![9u8; 1000], LongName::Plain);
    tar_end(&mut b);
    write(&root.join("train-000.tar"), &a);
    write(&root.join("train-001.tar"), &b);
    write(&root.join("README.md"), b"x");

    let ds = Dataset::open(&root, &opts(&t.path().join("cache"))).unwrap();
    assert_eq!(ds.kind(), DatasetKind::TarShards);
    assert_eq!(ds.len(), 4);
    let want = [
        ("train-000.tar", a0, 9, 7, &a),
        ("train-000.tar", a1, 9, 12, &a),
        ("train-001.tar", b0, 8, 4, &b),
        ("train-001.tar", b1, 1000, -1, &b),
    ];
    for (i, (shard, off, len, label, bytes)) in want.iter().enumerate() {
        let s = ds.sample(i);
        assert_eq!(s.path.file_name().unwrap(), *shard);
        assert_eq!(
            (s.offset, s.len, s.label),
            (*off, *len, *label),
            "sample {i}"
        );
        let got = &bytes[s.offset as usize..(s.offset + s.len) as usize];
        assert!(got.starts_with(b"JPEG") || got == &[9u8; 1000][..]);
    }
    assert!(ds
        .display_name(1)
        .ends_with(&format!("train-000.tar:{long_dir}/s001.jpeg")));
    assert!(ds
        .display_name(2)
        .ends_with(&format!("train-001.tar:{pax_name}")));

    // One shard opened directly.
    let one = Dataset::open(&root.join("train-001.tar"), &opts(&t.path().join("cache"))).unwrap();
    assert_eq!(one.len(), 2);
    assert_eq!(one.sample(0).offset, b0);
}

/// Members that are neither an image nor metadata are counted and named, shard first.
#[test]
fn tar_members_of_no_supported_format_are_counted_and_named() {
    let t = tempfile::tempdir().unwrap();
    let shard = t.path().join("s.tar");
    let mut a = Vec::new();
    tar_member(&mut a, "k0.jpg", b"JPEG", LongName::Plain);
    tar_member(&mut a, "k0.cls", b"1", LongName::Plain);
    tar_member(&mut a, "k0.txt", b"a caption", LongName::Plain);
    tar_member(&mut a, "k1.gif", b"GIF89a", LongName::Plain);
    tar_member(&mut a, "README", b"no extension", LongName::Plain);
    tar_end(&mut a);
    fs::write(&shard, &a).unwrap();
    let ds = Dataset::open(&shard, &opts(&t.path().join("cache"))).unwrap();
    assert_eq!(ds.len(), 1);
    let skipped = ds.skipped();
    assert_eq!(skipped.count, 2, "{skipped:?}");
    let named = |m: &str| format!("{}:{m}", shard.canonicalize().unwrap().display());
    assert_eq!(skipped.first, [named("k1.gif"), named("README")]);
}

/// A key's other members are its fields, by extension, found again from the cache; an
/// earlier image member of the key is a field too.
#[test]
fn tar_keys_carry_their_other_members_as_fields_through_the_cache() {
    let t = tempfile::tempdir().unwrap();
    let shard = t.path().join("s.tar");
    let mut a = Vec::new();
    tar_member(&mut a, "k0.jpg", b"JPEG0", LongName::Plain);
    let cap0 = tar_member(&mut a, "k0.txt", b"a cat", LongName::Plain);
    let json0 = tar_member(&mut a, "k0.JSON", b"{\"w\": 1}", LongName::Plain);
    let mask1 = tar_member(&mut a, "d/k1.png", b"PNG-mask", LongName::Plain);
    tar_member(&mut a, "d/k1.jpg", b"JPEG1", LongName::Plain);
    let seg1 = tar_member(&mut a, "d/k1.seg.npy", b"NPY", LongName::Plain);
    tar_member(
        &mut a,
        "k2.txt",
        b"a caption without an image",
        LongName::Plain,
    );
    tar_end(&mut a);
    fs::write(&shard, &a).unwrap();
    let cache = t.path().join("cache");
    settle();
    let walked = Dataset::open(&shard, &opts(&cache)).unwrap();
    let cached = Dataset::open(&shard, &opts(&cache)).unwrap();
    assert_eq!(walked.origin(), IndexOrigin::Walked);
    assert_eq!(cached.origin(), IndexOrigin::Cache);
    for ds in [&walked, &cached] {
        assert_eq!(ds.len(), 2);
        assert_eq!(ds.field_names(), ["json", "png", "seg.npy", "txt"]);
        let at = |off: u64, len: u64| {
            Some(FieldRef {
                file: None,
                offset: off,
                len,
            })
        };
        assert_eq!(ds.field(0, "txt"), at(cap0, 5));
        assert_eq!(ds.field(0, "json"), at(json0, 8));
        assert_eq!(ds.field(0, "png"), None);
        assert_eq!(ds.field(1, "png"), at(mask1, 8));
        assert_eq!(ds.field(1, "seg.npy"), at(seg1, 3));
        assert_eq!(ds.field(1, "txt"), None);
        let s = ds.sample(1);
        assert_eq!(&a[s.offset as usize..][..s.len as usize], b"JPEG1");
    }
}

#[test]
fn bad_tar_is_an_error_naming_the_shard() {
    let t = tempfile::tempdir().unwrap();
    let mut a = Vec::new();
    tar_member(&mut a, "s.jpg", b"abc", LongName::Plain);
    tar_end(&mut a);
    a[10] ^= 0x55; // Breaks the first header's checksum.
    let p = t.path().join("bad.tar");
    write(&p, &a);
    let e = Dataset::open(&p, &opts(&t.path().join("cache"))).unwrap_err();
    assert!(matches!(e, DatasetError::BadTar { offset: 0, .. }), "{e}");
    assert!(e.to_string().contains("bad.tar"), "{e}");
    let mut a = Vec::new();
    tar_member(&mut a, "s.jpg", &[1u8; 2000], LongName::Plain);
    a.truncate(1024);
    write(&p, &a);
    let e = Dataset::open(&p, &opts(&t.path().join("cache"))).unwrap_err();
    assert!(e.to_string().contains("past the end"), "{e}");
}

#[test]
fn missing_and_empty_datasets_are_errors() {
    let t = tempfile::tempdir().unwrap();
    let e = Dataset::open(&t.path().join("nope"), &OpenOptions::default()).unwrap_err();
    assert!(matches!(e, DatasetError::NotFound { .. }), "{e}");
    let empty = t.path().join("empty");
    fs::create_dir_all(empty.join("class_a")).unwrap();
    let e = Dataset::open(&empty, &opts(&t.path().join("cache"))).unwrap_err();
    assert!(matches!(e, DatasetError::Empty { .. }), "{e}");
}

#[test]
fn cache_hits_when_unchanged_and_reindexes_on_change() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("data");
    let cache = t.path().join("cache");
    two_classes_of_three(&root);
    let first = Dataset::open(&root, &opts(&cache)).unwrap();
    assert_eq!(first.origin(), IndexOrigin::Walked);
    let again = Dataset::open(&root, &opts(&cache)).unwrap();
    assert_eq!(again.origin(), IndexOrigin::Cache);
    assert_eq!(again.len(), 6);
    for i in 0..6 {
        assert_eq!(again.sample(i), first.sample(i));
    }
    assert_eq!(again.classes(), first.classes());

    // A file added in a class folder changes that folder's mtime.
    write(&root.join("b/new.jpg"), b"n");
    let changed = Dataset::open(&root, &opts(&cache)).unwrap();
    assert_eq!(changed.origin(), IndexOrigin::Walked);
    assert_eq!(changed.len(), 7);
    settle();
    let _ = Dataset::open(&root, &opts(&cache)).unwrap();
    assert_eq!(
        Dataset::open(&root, &opts(&cache)).unwrap().origin(),
        IndexOrigin::Cache
    );
    fs::remove_file(root.join("a/0.jpg")).unwrap();
    let removed = Dataset::open(&root, &opts(&cache)).unwrap();
    assert_eq!((removed.origin(), removed.len()), (IndexOrigin::Walked, 6));

    // A corrupt cache is ignored and rewritten.
    settle();
    let _ = Dataset::open(&root, &opts(&cache)).unwrap();
    let file = cache.join(cache_file_name(
        &root.canonicalize().unwrap(),
        DatasetKind::ImageFolder,
    ));
    let mut bytes = fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    fs::write(&file, &bytes).unwrap();
    let healed = Dataset::open(&root, &opts(&cache)).unwrap();
    assert_eq!((healed.origin(), healed.len()), (IndexOrigin::Walked, 6));
    fs::write(&file, b"junk").unwrap();
    assert_eq!(
        Dataset::open(&root, &opts(&cache)).unwrap().origin(),
        IndexOrigin::Walked
    );
    assert_eq!(
        Dataset::open(&root, &opts(&cache)).unwrap().origin(),
        IndexOrigin::Cache
    );
}

/// A well-formed index planted in the cache folder (labels swapped, stamps still fresh) is not
/// used: it does not carry the folder key's hash of its bytes; neither does an unsigned one.
#[test]
fn a_planted_or_unsigned_index_cache_is_not_used() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("data");
    let cache = t.path().join("cache");
    two_classes_of_three(&root);
    let first = Dataset::open(&root, &opts(&cache)).unwrap();
    let canonical = root.canonicalize().unwrap();
    let file = cache.join(cache_file_name(&canonical, DatasetKind::ImageFolder));
    let (mut planted, written_at) = decode(
        &fs::read(&file).unwrap(),
        &canonical,
        DatasetKind::ImageFolder,
    )
    .unwrap();
    for l in planted.label.iter_mut() {
        *l = 1 - *l;
    }
    fs::write(&file, encode(&planted, written_at)).unwrap();
    let again = Dataset::open(&root, &opts(&cache)).unwrap();
    assert_eq!(
        again.origin(),
        IndexOrigin::Walked,
        "the planted index was used"
    );
    for i in 0..first.len() {
        assert_eq!(again.sample(i), first.sample(i));
    }
    assert_eq!(
        Dataset::open(&root, &opts(&cache)).unwrap().origin(),
        IndexOrigin::Cache,
        "the rewritten cache is signed"
    );
    fs::remove_file(integrity::tag_path(&file)).unwrap();
    assert_eq!(
        Dataset::open(&root, &opts(&cache)).unwrap().origin(),
        IndexOrigin::Walked,
        "an unsigned index was used"
    );
}

#[test]
fn cache_of_file_lists_and_shards_follows_mtime_and_size() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    write(&t.path().join("x.jpg"), b"x");
    let list = t.path().join("list.txt");
    write(&list, b"x.jpg\t0\n");
    let mut a = Vec::new();
    tar_member(&mut a, "k.jpg", b"abc", LongName::Plain);
    tar_end(&mut a);
    let shard = t.path().join("one.tar");
    write(&shard, &a);
    settle();
    for p in [&list, &shard] {
        assert_eq!(
            Dataset::open(p, &opts(&cache)).unwrap().origin(),
            IndexOrigin::Walked
        );
        assert_eq!(
            Dataset::open(p, &opts(&cache)).unwrap().origin(),
            IndexOrigin::Cache
        );
    }
    write(&list, b"x.jpg\t0\nx.jpg\t1\n");
    let ds = Dataset::open(&list, &opts(&cache)).unwrap();
    assert_eq!((ds.origin(), ds.len()), (IndexOrigin::Walked, 2));
    a.truncate(a.len() - 1024);
    tar_member(&mut a, "k2.jpg", b"abcd", LongName::Plain);
    tar_end(&mut a);
    write(&shard, &a);
    let ds = Dataset::open(&shard, &opts(&cache)).unwrap();
    assert_eq!((ds.origin(), ds.len()), (IndexOrigin::Walked, 2));
}

#[test]
fn unwritable_cache_is_a_warning_not_an_error() {
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("d/a.jpg"), b"a");
    // The cache "directory" is a file: creating it fails.
    write(&t.path().join("cachefile"), b"");
    let ds = Dataset::open(&t.path().join("d"), &opts(&t.path().join("cachefile"))).unwrap();
    assert_eq!(ds.len(), 1);
}

#[test]
fn explicit_kind_overrides_detection() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("d");
    write(&root.join("top.jpg"), b"t");
    write(&root.join("cls/x.jpg"), b"x");
    let o = opts(&t.path().join("cache"));
    assert_eq!(Dataset::open(&root, &o).unwrap().kind(), DatasetKind::Flat);
    let ds = Dataset::open(
        &root,
        &OpenOptions {
            kind: Some(DatasetKind::ImageFolder),
            ..o
        },
    )
    .unwrap();
    assert_eq!(
        (ds.kind(), ds.len(), ds.sample(0).label),
        (DatasetKind::ImageFolder, 1, 0)
    );
}

#[test]
fn pax_parser_reads_path_and_size() {
    let (p, s) = parse_pax(b"18 path=a/b/c.jpg\n11 size=42\n").unwrap();
    assert_eq!(p.as_deref(), Some(&b"a/b/c.jpg"[..]));
    assert_eq!(s, Some(42));
    assert!(parse_pax(b"99 path=x\n").is_none());
    assert_eq!(parse_octal(b"0000012\0"), Some(10));
    assert_eq!(
        parse_octal(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
        Some(256)
    );
}

/// Index time for a generated tree of 20,000 small files (run with --ignored --nocapture;
/// `STOKER_MEASURE_FILES=100000` for another size).
#[test]
#[ignore = "measurement"]
fn measure_index_20k_files() {
    let n: usize = std::env::var("STOKER_MEASURE_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("tree");
    for c in 0..100 {
        let d = root.join(format!("class{c:03}"));
        fs::create_dir_all(&d).unwrap();
        for i in 0..n / 100 {
            fs::write(d.join(format!("{i:05}.jpg")), b"small file").unwrap();
        }
    }
    settle();
    let o = opts(&t.path().join("cache"));
    let t0 = Instant::now();
    let ds = Dataset::open(&root, &o).unwrap();
    let walk = t0.elapsed();
    assert_eq!(
        (ds.origin(), ds.len()),
        (IndexOrigin::Walked, n / 100 * 100)
    );
    let t1 = Instant::now();
    let ds = Dataset::open(&root, &o).unwrap();
    let cached = t1.elapsed();
    assert_eq!(ds.origin(), IndexOrigin::Cache);
    println!(
        "index {} files: walk {:.1} ms, cache load {:.1} ms, ratio {:.1}x",
        ds.len(),
        walk.as_secs_f64() * 1e3,
        cached.as_secs_f64() * 1e3,
        walk.as_secs_f64() / cached.as_secs_f64()
    );
}

#[test]
fn parallel_indexing_keeps_a_deterministic_order() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("many");
    for c in (0..40).rev() {
        for i in (0..5).rev() {
            write(&root.join(format!("c{c:02}/{i}.jpg")), &[c as u8; 3]);
        }
    }
    let shards = t.path().join("shards");
    for s in (0..12).rev() {
        let mut a = Vec::new();
        for k in 0..3 {
            tar_member(&mut a, &format!("s{s:02}k{k}.jpg"), b"j", LongName::Plain);
            tar_member(
                &mut a,
                &format!("s{s:02}k{k}.cls"),
                format!("{s}").as_bytes(),
                LongName::Plain,
            );
        }
        tar_end(&mut a);
        write(&shards.join(format!("shard-{s:02}.tar")), &a);
    }
    let mut orders = Vec::new();
    for threads in [1, 3, 8] {
        let o = OpenOptions {
            threads,
            use_cache: false,
            ..OpenOptions::default()
        };
        let ds = Dataset::open(&root, &o).unwrap();
        assert_eq!(ds.len(), 200);
        let paths: Vec<PathBuf> = (0..ds.len())
            .map(|i| ds.sample(i).path.to_owned())
            .collect();
        assert!(
            paths.windows(2).all(|w| w[0] < w[1]),
            "sorted paths, {threads} threads"
        );
        assert!((0..200).all(|i| ds.sample(i).label == (i / 5) as i64));
        let sh = Dataset::open(&shards, &o).unwrap();
        assert_eq!(sh.len(), 36);
        assert!(
            (0..36).all(|i| sh.sample(i).label == (i / 3) as i64),
            "{threads} threads"
        );
        assert!(sh.display_name(35).ends_with("shard-11.tar:s11k2.jpg"));
        orders.push((
            paths,
            (0..36).map(|i| sh.sample(i).offset).collect::<Vec<_>>(),
        ));
    }
    assert!(orders.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn dataset_is_send_and_sync() {
    fn shared<T: Send + Sync>() {}
    shared::<Dataset>();
}
