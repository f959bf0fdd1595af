//! Entry points: a crop decoded from the entry of the MCU row above it equals the same crop
//! decoded from the top, bit for bit, first from a walk and then from the kept entries; a
//! corrupt file gives the outcome it always gave.

#![allow(clippy::cast_possible_truncation)]

use super::super::restart::tests::{encode, random_crop, shared_data, Rng};
use super::super::sys::PixelFormat;
use super::super::{plan_region, probe, Limits};
use super::synthetic::Writer;
use super::*;
use std::time::{Duration, Instant};
use stoker_kernels::reference::CropBox;

thread_local! {
    /// Decodes on this thread that took a stream of column groups.
    pub(super) static COLUMN_DECODES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Walks on this thread (`entries` finding rows the table did not know).
    pub(super) static WALKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The file's entries from the top to the first of row `rows` in `grid`, by one walk.
fn walk_all(scan: &Scan, jpeg: &[u8], grid: Grid, rows: usize) -> Vec<RowEntry> {
    let first = RowEntry {
        byte: scan.frame.scan_at as u32,
        bit: 0,
        dc: [0; 3],
    };
    let mut all = vec![first];
    scan.walk(jpeg, grid, (0, first), rows, &mut all).unwrap();
    all
}

/// Decodes `crops` random crops of `jpeg` from the top and from the entries (twice: the second
/// from the kept entries) and asserts equal pixels; returns how many took the entry path, and
/// how many of those a stream of column groups.
fn assert_crops_equal(name: &str, jpeg: &[u8], crops: usize, seed: u64) -> (usize, usize) {
    let decodes = || COLUMN_DECODES.with(std::cell::Cell::get);
    let mut columns = 0;
    let header = probe(jpeg).unwrap();
    let mut dec = CpuDecoder::new(Limits::default()).unwrap();
    let (mut a, mut b) = (RgbImage::default(), RgbImage::default());
    let mut rng = Rng(seed ^ jpeg.len() as u64 | 1);
    let mut took = 0;
    for i in 0..crops {
        let (want, out) = random_crop(&mut rng, header.width, header.height);
        let plan = plan_region(&header, want, out, &dec.factors).unwrap();
        dec.begin(jpeg).unwrap();
        dec.run(jpeg, &header, &plan, &mut a).unwrap();
        let Some(region) = plan.crop else {
            continue;
        };
        for pass in 0..2 {
            let before = decodes();
            if dec.run_from_entry(jpeg, &plan, region, &mut b).unwrap() {
                took += usize::from(pass == 0);
                columns += usize::from(pass == 0) * (decodes() - before);
                assert!(
                    a == b,
                    "{name} crop {i} {want:?} -> {out:?} (pass {pass}): entry path differs"
                );
            }
        }
    }
    (took, columns)
}

/// Every photo, 8 random crops each: the entry path gives the same pixels, and takes most
/// crops (those starting two MCU rows or more down, or leaving columns out), most of those by
/// their column groups.
#[test]
fn every_shared_photo_crops_bit_identically_from_its_entries() {
    let Some(files) = shared_data("photos") else {
        return;
    };
    let (mut took, mut columns, mut crops) = (0, 0, 0);
    for path in &files {
        let jpeg = std::fs::read(path).unwrap();
        let (t, c) = assert_crops_equal(&path.display().to_string(), &jpeg, 8, 0x5EED);
        (took, columns, crops) = (took + t, columns + c, crops + 8);
    }
    eprintln!("entry path: {took} of {crops} crops, {columns} by column groups");
    assert!(
        took * 2 >= crops && columns * 2 >= took,
        "{took} of {crops} crops took the entry path, {columns} by column groups"
    );
}

/// Every subsampling TurboJPEG writes, grayscale, and sizes off the MCU grid.
#[test]
fn every_subsampling_and_odd_sizes_crop_bit_identically() {
    let (mut took, mut columns) = (0, 0);
    for (subsamp, format) in [
        (0, PixelFormat::Rgb),
        (1, PixelFormat::Rgb),
        (2, PixelFormat::Rgb),
        (4, PixelFormat::Rgb),
        (5, PixelFormat::Rgb),
        (3, PixelFormat::Gray),
    ] {
        for (w, h) in [(333, 251), (64, 200), (517, 389)] {
            let jpeg = encode(w, h, subsamp, format);
            let name = format!("{w}x{h} subsampling {subsamp}");
            let (t, c) = assert_crops_equal(&name, &jpeg, 12, u64::from(w * h));
            (took, columns) = (took + t, columns + c);
        }
    }
    assert!(
        took >= 60 && columns >= 30,
        "{took} crops took the entry path, {columns} by column groups"
    );
}

/// The entries found by walking equal those of a walk from the top to the end, however the
/// walks were split (each crop extends the kept entries from the deepest row known), in
/// either grid; the last is where the scan's data ends.
#[test]
fn entries_do_not_depend_on_how_the_walk_was_split() {
    let jpeg = encode(517, 389, 2, PixelFormat::Rgb);
    let scan = Scan::parse(&jpeg).unwrap();
    let rows = scan.frame.mcu_rows() as usize;
    for grid in [Grid::rows(&scan.frame), Grid::columns(&scan.frame)] {
        let whole = walk_all(&scan, &jpeg, grid, rows);
        let per_row = grid.per_row as usize;
        assert_eq!(whole.len(), rows * per_row + 1);
        let end = whole[whole.len() - 1];
        assert!(ends_data(&jpeg, end), "{grid:?}: {end:?}");
        assert!(end.byte as usize >= jpeg.len() - 4, "{grid:?}: {end:?}");
        let mut split = vec![whole[0]];
        for to in [3, 4, 9, rows] {
            let from = (split.len() - 1, *split.last().unwrap());
            scan.walk(&jpeg, grid, from, to, &mut split).unwrap();
        }
        assert_eq!(whole, split, "{grid:?}");
    }
    let whole = walk_all(&scan, &jpeg, Grid::columns(&scan.frame), rows);
    let per_row = Grid::columns(&scan.frame).per_row as usize;
    let mut found = Vec::new();
    for (r0, r1) in [(rows - 1, rows - 1), (2, 5), (7, rows), (0, 3)] {
        let grid = entries(&jpeg, &scan, (r0, r1), 0, &mut found);
        assert_eq!(grid, Some(Grid::columns(&scan.frame)));
        assert_eq!(found, whole[r0 * per_row..=r1 * per_row], "rows {r0}..{r1}");
    }
}

/// A one-epoch job's first sight of a file decodes plainly and keeps only the mark that it
/// was seen (no walk); a second sight walks and takes the column stream, with the same
/// pixels. A job of more epochs walks at the first sight.
#[test]
fn a_one_epoch_jobs_first_sight_decodes_plainly_and_a_second_walks() {
    let jpeg = encode(517, 389, 2, PixelFormat::Rgb);
    let header = probe(&jpeg).unwrap();
    let mut dec = CpuDecoder::new(Limits::default()).unwrap();
    let kept = |owner: u32| {
        let key = (owner, content_hash(&jpeg), jpeg.len());
        table::table(key)
            .get(&key)
            .map(|k| (k.is_seen(), k.list.len()))
    };
    let (walks, columns) = (
        || WALKS.with(std::cell::Cell::get),
        || COLUMN_DECODES.with(std::cell::Cell::get),
    );
    // The middle of the right half: below the first rows, beside the first column groups.
    let want = CropBox::new(258.0, 120.0, 250.0, 190.0);
    let plan = plan_region(&header, want, (224, 224), &dec.factors).unwrap();
    let region = plan.crop.unwrap();
    let (mut a, mut b) = (RgbImage::default(), RgbImage::default());
    dec.begin(&jpeg).unwrap();
    dec.run(&jpeg, &header, &plan, &mut a).unwrap();
    for (owner, once) in [(4301, true), (4302, false)] {
        dec.set_entry_scope(owner);
        dec.set_entry_reads_once(once);
        let (w, c) = (walks(), columns());
        let took = dec.run_from_entry(&jpeg, &plan, region, &mut b).unwrap();
        if once {
            assert!(
                !took && walks() == w,
                "a one-epoch job walked at the first sight"
            );
            assert_eq!(
                kept(owner),
                Some((true, 0)),
                "the first sight kept more than a mark"
            );
            assert!(dec.run_from_entry(&jpeg, &plan, region, &mut b).unwrap());
        } else {
            assert!(took, "a job of more epochs did not walk at the first sight");
        }
        assert!(a == b, "reads once {once}: the pixels differ");
        assert_eq!((walks(), columns()), (w + 1, c + 1), "reads once {once}");
        let (seen, walked) = kept(owner).unwrap();
        assert!(
            !seen && walked > 1,
            "reads once {once}: no entries were kept"
        );
    }
}

/// Two owners decoding the same bytes keep separate entries: neither reads the other's.
#[test]
fn owners_never_share_entries() {
    let jpeg = encode(333, 251, 1, PixelFormat::Rgb);
    let scan = Scan::parse(&jpeg).unwrap();
    let kept = |owner: u32| {
        let key = (owner, content_hash(&jpeg), jpeg.len());
        table::table(key).get(&key).map(|k| k.list.len())
    };
    let per_row = Grid::columns(&scan.frame).per_row as usize;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    assert_eq!(kept(4001), None);
    entries(&jpeg, &scan, (5, 5), 4001, &mut a).unwrap();
    assert_eq!(kept(4001), Some(5 * per_row + 1));
    assert_eq!(
        kept(4002),
        None,
        "another owner sees the first one's entries"
    );
    entries(&jpeg, &scan, (5, 5), 4002, &mut b).unwrap();
    assert_eq!(a, b);
    assert_eq!(kept(4002), Some(5 * per_row + 1));
}

/// An owner over its budget loses its own oldest files, never another owner's and never the
/// file being kept; its entries go with its last hold, and the bytes counted with them.
#[test]
fn owners_over_their_budget_lose_only_their_own_oldest_files() {
    let e = RowEntry {
        byte: 0,
        bit: 0,
        dc: [0; 3],
    };
    let grid = Grid {
        group: 1,
        per_row: 1,
    };
    // Files of 100 entries; a budget of three of them.
    let found = vec![e; 99];
    let budget = table::bytes_of(100) * 3;
    let (a, b) = (4101, 4102);
    // No grace: the entries go with the last hold (the grace has its own test).
    let hold = |owner| EntryHold::with_grace(owner, Duration::ZERO);
    let (hold_a, hold_b) = (hold(a), hold(b));
    let kept = |owner: u32, file: u64| {
        let key = (owner, file, 1000);
        table::table(key).get(&key).map(|k| k.list.len())
    };
    for f in 0..3 {
        table::keep_within((b, f, 1000), grid, (e, 1), true, &found, budget);
    }
    for f in 0..10 {
        table::keep_within((a, f, 1000), grid, (e, 1), true, &found, budget);
        assert_eq!(kept(a, f), Some(100), "file {f} was not kept");
    }
    let a_kept: Vec<u64> = (0..10).filter(|&f| kept(a, f).is_some()).collect();
    assert_eq!(
        a_kept,
        [7, 8, 9],
        "owner {a} kept other than its newest files"
    );
    assert_eq!(table::scope_bytes(a), budget);
    for f in 0..3 {
        assert_eq!(kept(b, f), Some(100), "owner {a} took owner {b}'s file {f}");
    }
    // A file larger than the budget alone is not kept, and takes nothing from the others.
    let big = vec![e; 400];
    table::keep_within((a, 99, 1000), grid, (e, 1), true, &big, budget);
    assert_eq!(kept(a, 99), None);
    assert_eq!(table::scope_bytes(a), budget);
    drop(hold_a);
    assert!(
        (0..10).all(|f| kept(a, f).is_none()),
        "entries outlived the last hold"
    );
    assert_eq!(table::scope_bytes(a), 0);
    assert_eq!(
        kept(b, 0),
        Some(100),
        "owner {b} lost entries with {a}'s hold"
    );
    drop(hold_b);
    assert_eq!(kept(b, 0), None);
}

/// An owner's entries stay the grace after its last hold ends, and a new hold within it finds
/// them without walking again; an owner whose grace passes with no hold loses them.
#[test]
fn an_owners_entries_stay_for_the_grace_after_its_last_hold() {
    let jpeg = encode(333, 251, 1, PixelFormat::Rgb);
    let scan = Scan::parse(&jpeg).unwrap();
    let walks = || WALKS.with(std::cell::Cell::get);
    let kept = |owner: u32| {
        let key = (owner, content_hash(&jpeg), jpeg.len());
        table::table(key).get(&key).map(|k| k.list.len())
    };
    let mut found = Vec::new();
    // Owner a: a long grace; its next job comes within it.
    let a = 4401;
    let hold = EntryHold::with_grace(a, Duration::from_secs(600));
    entries(&jpeg, &scan, (9, 9), a, &mut found).unwrap();
    let (walked, before) = (kept(a), walks());
    drop(hold);
    assert_eq!(
        kept(a),
        walked,
        "the entries went with the last hold, grace or not"
    );
    let _next = EntryHold::with_grace(a, Duration::from_secs(600));
    entries(&jpeg, &scan, (9, 9), a, &mut found).unwrap();
    assert_eq!(walks(), before, "the next job walked the file again");
    // Owner b: a short grace, and no job after it.
    let b = 4402;
    let hold = EntryHold::with_grace(b, Duration::from_millis(50));
    entries(&jpeg, &scan, (9, 9), b, &mut found).unwrap();
    assert!(kept(b).is_some());
    drop(hold);
    let deadline = Instant::now() + Duration::from_secs(30);
    while kept(b).is_some() {
        assert!(
            Instant::now() < deadline,
            "the entries outlived their grace"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(table::scope_bytes(b), 0);
    assert_eq!(
        kept(a),
        walked,
        "owner {b}'s grace took owner {a}'s entries"
    );
}

/// Decodes `want` of `jpeg` from the top and by the entry path (or the plain decode where
/// it declines) and asserts the same outcome: the same error, or the same pixels. Returns
/// whether it was an error.
fn assert_same_outcome(
    name: &str,
    dec: &mut CpuDecoder,
    jpeg: &[u8],
    want: CropBox,
    out: (u32, u32),
) -> bool {
    let header = probe(jpeg).unwrap();
    let plan = plan_region(&header, want, out, &dec.factors).unwrap();
    let (mut a, mut b) = (RgbImage::default(), RgbImage::default());
    let today = dec
        .begin(jpeg)
        .and_then(|_| dec.run(jpeg, &header, &plan, &mut a))
        .map_err(|e| e.to_string());
    let entry = match plan
        .crop
        .map_or(Ok(false), |r| dec.run_from_entry(jpeg, &plan, r, &mut b))
    {
        Ok(true) => Ok(()),
        Ok(false) => dec
            .begin(jpeg)
            .and_then(|_| dec.run(jpeg, &header, &plan, &mut b)),
        Err(e) => Err(e),
    }
    .map_err(|e| e.to_string());
    assert_eq!(today, entry, "{name}");
    if today.is_ok() {
        assert!(a == b, "{name}: pixels differ");
    }
    today.is_err()
}

/// What follows the scan: a crop reaching the last row makes libjpeg read on to EOI, so
/// another scan header, stray bytes (a few, which libjpeg may or may not report, or many) or
/// a comment there give the outcome they always gave, and a clean end still takes the stream
/// of columns.
#[test]
fn what_follows_the_scan_gives_the_outcome_it_always_gave() {
    let Some(files) = shared_data("photos") else {
        return;
    };
    let tails: [(&str, &[u8], Option<bool>); 5] = [
        ("EOI", &[], Some(false)),
        (
            "a second SOS",
            &[0xFF, 0xDA, 0, 8, 1, 1, 0, 0, 0x3F, 0],
            Some(true),
        ),
        ("3 stray bytes", &[0x00, 0x11, 0x22], None),
        ("64 stray bytes", &[0x11; 64], Some(true)),
        ("a comment", &[0xFF, 0xFE, 0, 4, 0x41, 0x42], Some(false)),
    ];
    let mut dec = CpuDecoder::new(Limits::default()).unwrap();
    let decodes = || COLUMN_DECODES.with(std::cell::Cell::get);
    let (before, mut errors) = (decodes(), [0; 5]);
    for path in files.iter().take(20) {
        let original = std::fs::read(path).unwrap();
        let Some(body) = original.strip_suffix(&[0xFF, 0xD9]) else {
            continue;
        };
        let header = probe(&original).unwrap();
        let (w, h) = (f64::from(header.width), f64::from(header.height));
        // The bottom right quarter, beyond the first column group and reaching the last row.
        let want = CropBox::new(w * 0.5, h * 0.5, w * 0.5, h * 0.5);
        for (k, (what, tail, _)) in tails.iter().enumerate() {
            let jpeg = [body, tail, &[0xFF, 0xD9]].concat();
            let name = format!("{} with {what}", path.display());
            errors[k] += usize::from(assert_same_outcome(
                &name,
                &mut dec,
                &jpeg,
                want,
                (224, 224),
            ));
        }
    }
    for (k, (what, _, fails)) in tails.iter().enumerate() {
        if let Some(fails) = fails {
            assert_eq!(errors[k] > 0, *fails, "{what}: {} errors", errors[k]);
        }
    }
    assert!(decodes() > before, "no crop took the stream of columns");
}

/// Damage inside the scan: whatever the crop, the entry path's outcome is today's (the same
/// error, or the same pixels where today's decode does not read the damage).
#[test]
fn damaged_scans_give_the_outcome_they_always_gave() {
    let Some(files) = shared_data("photos") else {
        return;
    };
    let mut rng = Rng(0x00DA_4A6E);
    let mut errors = 0;
    for path in files.iter().take(40) {
        let original = std::fs::read(path).unwrap();
        let scan_at = Scan::parse(&original).unwrap().frame.scan_at;
        let mut jpeg = original.clone();
        let at = scan_at + (rng.next() as usize) % (jpeg.len() - scan_at - 2) / 2;
        jpeg[at] ^= 1 << (rng.next() % 8);
        let header = probe(&jpeg).unwrap();
        let mut dec = CpuDecoder::new(Limits::default()).unwrap();
        for _ in 0..6 {
            let (want, out) = random_crop(&mut rng, header.width, header.height);
            let name = format!("{} byte {at}", path.display());
            errors += usize::from(assert_same_outcome(&name, &mut dec, &jpeg, want, out));
        }
    }
    assert!(errors > 0, "no damage was ever seen");
}

/// The synthetic row, and a single synthetic MCU written on from any bit of a byte, move the
/// DC predictors by any amount and end at any bit alignment, with the usual tables and with
/// a DC table that lacks category 0 (an optimised table can; a single MCU then needs a
/// nonzero change in each chroma component).
#[test]
fn the_synthetic_row_reaches_any_predictors_at_any_alignment() {
    let jpeg = encode(333, 251, 2, PixelFormat::Rgb);
    let mut scan = Scan::parse(&jpeg).unwrap();
    let per_row = scan.frame.mcus_per_row() as usize;
    for no_zero in [false, true] {
        if no_zero {
            for t in &mut scan.dc {
                t.len[0] = 0;
            }
        }
        for (bit, held) in (0..8u8).flat_map(|b| (0..8u32).map(move |h| (b, h))) {
            for dc in [[0, 0, 0], [1023, -1024, 5], [-3, 0, 700], [-2047, 2047, -1]] {
                for mcus in [per_row, 1] {
                    let mut out = Vec::new();
                    let mut w = Writer::new(&mut out);
                    w.put(0, held);
                    let built = scan.synthetic(&mut w, mcus, dc, bit);
                    let codable = mcus > 1 || !no_zero || (dc[1] != 0 && dc[2] != 0);
                    assert_eq!(
                        built.is_some(),
                        codable,
                        "{dc:?} to bit {bit} from {held}, {mcus} MCUs, no category 0: {no_zero}"
                    );
                    if codable {
                        assert_eq!(w.total % 8, u64::from(bit));
                    }
                }
            }
        }
    }
}

/// The bytes of every shared photo, or `None` where the data is absent.
fn shared_photos() -> Option<Vec<Vec<u8>>> {
    let files = shared_data("photos")?;
    Some(files.iter().map(|p| std::fs::read(p).unwrap()).collect())
}

/// How fast the walk goes beside libjpeg's own entropy decoding (`EntropyDecoder`: every
/// coefficient, no IDCT), over every photo, whole files, alternating: what a file's first
/// epoch pays for the rows above its crop. `cargo test --release -p stoker-daemon --lib
/// walk_speed -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement"]
fn walk_speed_against_libjpegs_entropy_decoding() {
    let Some(jpegs) = shared_photos() else {
        return;
    };
    let mut libjpeg = super::super::EntropyDecoder::new(Limits::default()).unwrap();
    let (mut walk_s, mut lib_s) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = std::time::Instant::now();
        for jpeg in &jpegs {
            let scan = Scan::parse(jpeg).unwrap();
            let rows = scan.frame.mcu_rows() as usize - 1;
            walk_all(&scan, jpeg, Grid::rows(&scan.frame), rows);
        }
        walk_s.push(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        for jpeg in &jpegs {
            libjpeg.decode(jpeg).unwrap();
        }
        lib_s.push(t.elapsed().as_secs_f64());
    }
    walk_s.sort_by(f64::total_cmp);
    lib_s.sort_by(f64::total_cmp);
    let per = |s: f64| s * 1e3 / jpegs.len() as f64;
    eprintln!(
        "{} photos, medians of 5: walk (all rows but the last) {:.3} ms/file, libjpeg entropy \
         decoding {:.3} ms/file, ratio {:.2}",
        jpegs.len(),
        per(walk_s[2]),
        per(lib_s[2]),
        walk_s[2] / lib_s[2]
    );
}

/// What a training crop (`random_crop`'s box, out at 224) of each photo costs, passes in
/// turn on a fresh owner each round, medians of 5: libjpeg's plain decode of the crop (no
/// entries), then through `decode_for_crop` a one-epoch job's first sight (a plain decode
/// and the mark), the second (the walk, then a decode from the entries: every first sight
/// of a job of more epochs) and a later one (kept entries). `cargo test --release -p
/// stoker-pipeline --lib first_sight_costs -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement"]
fn first_sight_costs_against_plain_decode() {
    let Some(jpegs) = shared_photos() else {
        return;
    };
    let mut rng = Rng(0xF1_257);
    let crops: Vec<CropBox> = jpegs
        .iter()
        .map(|j| {
            let h = probe(j).unwrap();
            random_crop(&mut rng, h.width, h.height).0
        })
        .collect();
    let mut dec = CpuDecoder::new(Limits::default()).unwrap();
    let mut out = RgbImage::default();
    let mut passes = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    dec.set_entry_reads_once(true);
    for round in 0..5 {
        dec.set_entry_scope(4500 + round);
        for (pass, times) in passes.iter_mut().enumerate() {
            let t = Instant::now();
            for (jpeg, &want) in jpegs.iter().zip(&crops) {
                if pass == 0 {
                    let header = dec.begin(jpeg).unwrap();
                    let plan = plan_region(&header, want, (224, 224), &dec.factors).unwrap();
                    dec.run(jpeg, &header, &plan, &mut out).unwrap();
                } else {
                    dec.decode_for_crop(jpeg, want, (224, 224), &mut out)
                        .unwrap();
                }
            }
            times.push(t.elapsed().as_secs_f64() * 1e3 / jpegs.len() as f64);
        }
    }
    let [plain, first, second, later] = passes.map(|mut t| {
        t.sort_by(f64::total_cmp);
        t[2]
    });
    eprintln!(
        "{} photos, ms per crop, medians of 5: plain decode {plain:.3}; first sight {first:.3}, \
         second {second:.3}, later {later:.3}",
        jpegs.len()
    );
}
