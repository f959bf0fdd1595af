//! Fuzzing the JPEG header parsing with proptest: `decode::probe` (the marker walk that
//! recognises non-JPEG data and odd frames, then libjpeg's header reader), and a limited
//! decode, fed arbitrary bytes, bytes behind a JPEG SOI, and real small JPEGs (baseline and
//! progressive) with bytes flipped, cut or repeated. Nothing may panic; whatever is accepted
//! must have a sane size; a rejected file has a reason code.
//!
//! Short mode (CI): [`fuzz_cases::DEFAULT_CASES`] cases per property (the decode property a tenth of it).
//! Long mode: `STOKER_FUZZ_CASES=200000 cargo test -p stoker-daemon --release --test
//! fuzz_jpeg_header`. proptest saves failing inputs under `proptest-regressions/` and replays
//! them first; a crash found becomes a named test below too.

use proptest::prelude::*;
use stoker_kernels::reference::{CropBox, RgbImage};
use stoker_pipeline::transform::decode::{
    probe, CpuDecoder, EncodeOptions, JpegEncoder, Limits, Subsampling,
};

use stoker_testkit::fuzz_cases;

use fuzz_cases::cases;

fn seeds() -> Vec<Vec<u8>> {
    let mut enc = JpegEncoder::new().unwrap();
    let (w, h) = (24u32, 16u32);
    let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
    let mut out = Vec::new();
    for (subsampling, progressive, restart_rows) in [
        (Subsampling::S420, false, 0),
        (Subsampling::S444, true, 0),
        (Subsampling::S422, false, 1),
    ] {
        let opts = EncodeOptions {
            quality: 80,
            subsampling,
            progressive,
            restart_rows,
            arithmetic: false,
        };
        out.push(enc.encode_rgb(&rgb, w, h, &opts).unwrap());
    }
    out
}

/// Small limits, so a mutated header claiming a huge image is refused before any decoding.
const LIMITS: Limits = Limits {
    max_pixels: 1 << 20,
    max_file_bytes: 1 << 20,
};

fn check_probe(bytes: &[u8]) {
    match probe(bytes) {
        Ok(h) => {
            assert!(h.width > 0 && h.height > 0, "{h:?}");
        }
        Err(e) => assert!(!e.reason().is_empty()),
    }
}

fn check_decode(dec: &mut CpuDecoder, bytes: &[u8]) {
    let mut img = RgbImage::default();
    match dec.decode_full(bytes, &mut img) {
        Ok(()) => {
            assert_eq!(img.data.len(), img.width as usize * img.height as usize * 3);
            assert!(img.width as u64 * img.height as u64 <= LIMITS.max_pixels);
        }
        Err(e) => assert!(!e.reason().is_empty()),
    }
    let _ = dec.decode_for_crop(bytes, CropBox::new(1.0, 1.0, 8.0, 8.0), (4, 4), &mut img);
}

fn mutate(
    seed: &[u8],
    flips: &[(prop::sample::Index, u8)],
    cut: Option<prop::sample::Index>,
) -> Vec<u8> {
    let mut b = seed.to_vec();
    for (at, v) in flips {
        let i = at.index(b.len());
        b[i] ^= v;
    }
    if let Some(c) = cut {
        b.truncate(c.index(b.len() + 1));
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn probe_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_probe(&bytes);
    }

    #[test]
    fn probe_never_panics_behind_a_jpeg_soi(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = vec![0xFF, 0xD8, 0xFF];
        bytes.extend_from_slice(&body);
        check_probe(&bytes);
    }

    #[test]
    fn probe_never_panics_on_mutated_jpegs(
        which in 0usize..3,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let bytes = mutate(&seeds()[which], &flips, cut);
        check_probe(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases((cases() / 10).max(1)))]

    #[test]
    fn decode_never_panics_on_mutated_jpegs(
        which in 0usize..3,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let bytes = mutate(&seeds()[which], &flips, cut);
        let mut dec = CpuDecoder::new(LIMITS).unwrap();
        check_decode(&mut dec, &bytes);
    }
}

#[test]
fn the_seeds_themselves_decode() {
    let mut dec = CpuDecoder::new(LIMITS).unwrap();
    for s in seeds() {
        let h = probe(&s).unwrap();
        assert_eq!((h.width, h.height), (24, 16));
        let mut img = RgbImage::default();
        dec.decode_full(&s, &mut img).unwrap();
    }
}

#[test]
fn degenerate_inputs_are_errors() {
    for bytes in [
        &[][..],
        &[0xFF][..],
        &[0xFF, 0xD8][..],
        &[0xFF, 0xD8, 0xFF][..],
        &[0xFF, 0xD8, 0xFF, 0xD9][..],
        &[0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x00][..],
        &[0xFF, 0xD8, 0xFF, 0xC0, 0xFF, 0xFF][..],
    ] {
        assert!(probe(bytes).is_err(), "{bytes:?}");
    }
}
