//! Entry points: a crop decoded from the entry of the MCU row above it equals the same crop
//! decoded from the top, bit for bit, first from a walk and then from the kept entries; a
//! corrupt file gives the outcome it always gave.

#![allow(clippy::cast_possible_truncation)]

use super::super::restart::tests::{encode, random_crop, shared_data, Rng};
use super::super::sys::PixelFormat;
use super::super::{plan_region, probe, Limits};
use super::synthetic::Writer;
use super::*;

/// Decodes `crops` random crops of `jpeg` from the top and from the entries (twice: the second
/// from the kept entries) and asserts equal pixels; returns how many took the entry path.
fn assert_crops_equal(name: &str, jpeg: &[u8], crops: usize, seed: u64) -> usize {
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
            if dec.run_from_entry(jpeg, &plan, region, &mut b).unwrap() {
                took += usize::from(pass == 0);
                assert!(
                    a == b,
                    "{name} crop {i} {want:?} -> {out:?} (pass {pass}): entry path differs"
                );
            }
        }
    }
    took
}

/// Every photo, 8 random crops each: the entry path gives the same pixels, and takes most
/// crops (those starting two MCU rows or more down).
#[test]
fn every_shared_photo_crops_bit_identically_from_its_entries() {
    let Some(files) = shared_data("photos") else {
        return;
    };
    let (mut took, mut crops) = (0, 0);
    for path in &files {
        let jpeg = std::fs::read(path).unwrap();
        took += assert_crops_equal(&path.display().to_string(), &jpeg, 8, 0x5EED);
        crops += 8;
    }
    eprintln!("entry path: {took} of {crops} crops");
    assert!(
        took * 2 >= crops,
        "{took} of {crops} crops took the entry path"
    );
}

/// Every subsampling TurboJPEG writes, grayscale, and sizes off the MCU grid.
#[test]
fn every_subsampling_and_odd_sizes_crop_bit_identically() {
    let mut took = 0;
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
            took += assert_crops_equal(&name, &jpeg, 12, u64::from(w * h));
        }
    }
    assert!(took >= 60, "{took} crops took the entry path");
}

/// The entries found by walking equal those of a walk from the top to the last row, however
/// the walks were split (each crop extends the kept entries from the deepest row known).
#[test]
fn entries_do_not_depend_on_how_the_walk_was_split() {
    let jpeg = encode(517, 389, 2, PixelFormat::Rgb);
    let scan = Scan::parse(&jpeg).unwrap();
    let rows = scan.frame.mcu_rows() as usize;
    let first = RowEntry {
        byte: scan.frame.scan_at as u32,
        bit: 0,
        dc: [0; 3],
    };
    let mut whole = vec![first];
    scan.walk(&jpeg, (0, first), rows - 1, &mut whole).unwrap();
    let mut split = vec![first];
    for to in [3, 4, 9, rows - 1] {
        let from = (split.len() - 1, *split.last().unwrap());
        scan.walk(&jpeg, from, to, &mut split).unwrap();
    }
    assert_eq!(whole, split);
    for row in [rows - 1, 2, 7] {
        assert_eq!(entry(&jpeg, &scan, row, 0), Some(whole[row]), "row {row}");
    }
}

/// Two owners decoding the same bytes keep separate entries: neither reads the other's.
#[test]
fn owners_never_share_entries() {
    let jpeg = encode(333, 251, 1, PixelFormat::Rgb);
    let scan = Scan::parse(&jpeg).unwrap();
    let kept = |owner: u32| {
        let key = (owner, content_hash(&jpeg), jpeg.len());
        let t = table(key).lock().unwrap();
        t.get(&key).map(Vec::len)
    };
    assert_eq!(kept(4001), None);
    let e = entry(&jpeg, &scan, 5, 4001).unwrap();
    assert_eq!(kept(4001), Some(6));
    assert_eq!(
        kept(4002),
        None,
        "another owner sees the first one's entries"
    );
    assert_eq!(entry(&jpeg, &scan, 5, 4002), Some(e));
    assert_eq!(kept(4002), Some(6));
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
            let plan = plan_region(&header, want, out, &dec.factors).unwrap();
            let (mut a, mut b) = (RgbImage::default(), RgbImage::default());
            let today = dec
                .begin(&jpeg)
                .and_then(|_| dec.run(&jpeg, &header, &plan, &mut a))
                .map_err(|e| e.to_string());
            errors += usize::from(today.is_err());
            let entry = match plan
                .crop
                .map_or(Ok(false), |r| dec.run_from_entry(&jpeg, &plan, r, &mut b))
            {
                Ok(true) => Ok(()),
                Ok(false) => dec
                    .begin(&jpeg)
                    .and_then(|_| dec.run(&jpeg, &header, &plan, &mut b)),
                Err(e) => Err(e),
            }
            .map_err(|e| e.to_string());
            assert_eq!(today, entry, "{} byte {at}", path.display());
            if today.is_ok() {
                assert!(a == b, "{} byte {at}: pixels differ", path.display());
            }
        }
    }
    assert!(errors > 0, "no damage was ever seen");
}

/// The synthetic row reaches any DC predictors at any bit alignment with the usual tables,
/// and with a DC table that lacks category 0 (an optimised table can).
#[test]
fn the_synthetic_row_reaches_any_predictors_at_any_alignment() {
    let jpeg = encode(333, 251, 2, PixelFormat::Rgb);
    let mut scan = Scan::parse(&jpeg).unwrap();
    for no_zero in [false, true] {
        if no_zero {
            for t in &mut scan.dc {
                t.len[0] = 0;
            }
        }
        for bit in 0..8u8 {
            for dc in [[0, 0, 0], [1023, -1024, 5], [-3, 0, 700]] {
                let mut out = Vec::new();
                let mut w = Writer {
                    out: &mut out,
                    acc: 0,
                    n: 0,
                    total: 0,
                };
                let built = scan.synthetic_row(&mut w, dc, bit);
                assert!(
                    built.is_some(),
                    "{dc:?} at bit {bit}, no category 0: {no_zero}"
                );
                assert_eq!(w.total % 8, u64::from(bit));
            }
        }
    }
}

/// How fast the walk goes beside libjpeg's own entropy decoding (`EntropyDecoder`: every
/// coefficient, no IDCT), over every photo, whole files, alternating: what a file's first
/// epoch pays for the rows above its crop. `cargo test --release -p stoker-daemon --lib
/// walk_speed -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement"]
fn walk_speed_against_libjpegs_entropy_decoding() {
    let Some(files) = shared_data("photos") else {
        return;
    };
    let jpegs: Vec<Vec<u8>> = files.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let mut libjpeg = super::super::EntropyDecoder::new(Limits::default()).unwrap();
    let (mut walk_s, mut lib_s) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let mut found = Vec::new();
        for jpeg in &jpegs {
            let scan = Scan::parse(jpeg).unwrap();
            let first = RowEntry {
                byte: scan.frame.scan_at as u32,
                bit: 0,
                dc: [0; 3],
            };
            found.clear();
            let rows = scan.frame.mcu_rows() as usize - 1;
            scan.walk(jpeg, (0, first), rows, &mut found).unwrap();
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
