//! WebDataset shard sets with fields for tests: per key a JPEG, a caption (`txt`) and a JSON
//! record (`json`), written by a tar writer of the test's own (plain ustar).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use crate::images::{encode_jpeg, synthetic_rgb};

/// A shard set and what each sample's fields are, by global sample index.
#[derive(Debug)]
pub struct CaptionShards {
    /// The folder of shards.
    pub root: PathBuf,
    /// Per sample: its caption's bytes.
    pub captions: Vec<Vec<u8>>,
    /// Per sample: its JSON record's bytes.
    pub jsons: Vec<Vec<u8>>,
    /// The sample whose JPEG is not a JPEG (a bad sample, replaced under policy `skip`).
    pub bad: usize,
    /// The sample whose caption is [`LONG_CAPTION`] bytes long.
    pub long: usize,
}

/// Bytes of the one long caption: over a `field_max_bytes` of 256, under the default 4096.
pub const LONG_CAPTION: usize = 600;

/// The caption of sample `i`: UTF-8 with multi-byte characters, of a length that varies.
pub fn caption(i: usize) -> Vec<u8> {
    format!(
        "sample {i}: a caf\u{e9} \u{2014} {}\n",
        "word ".repeat(i % 7)
    )
    .into_bytes()
}

/// Writes `shards` shards of `per_shard` keys under `root` (keys `s{shard}-{k:03}`); sample
/// `bad` gets a JPEG that is not one, sample `long` a caption of [`LONG_CAPTION`] bytes.
pub fn write_caption_shards(
    root: &Path,
    shards: usize,
    per_shard: usize,
    bad: usize,
    long: usize,
) -> CaptionShards {
    std::fs::create_dir_all(root).unwrap();
    let (mut captions, mut jsons) = (Vec::new(), Vec::new());
    for s in 0..shards {
        let mut tar = Vec::new();
        for k in 0..per_shard {
            let i = s * per_shard + k;
            let key = format!("s{s}-{k:03}");
            let jpeg = if i == bad {
                b"this is not a JPEG".to_vec()
            } else {
                let side = 40 + (i as u32 % 5) * 8;
                encode_jpeg(&synthetic_rgb(side, side, i as u32), side, side, 90)
            };
            let mut text = caption(i);
            if i == long {
                text.resize(LONG_CAPTION, b'z');
            }
            let json = format!("{{\"i\": {i}, \"key\": \"{key}\"}}").into_bytes();
            tar_member(&mut tar, &format!("{key}.jpg"), &jpeg);
            tar_member(&mut tar, &format!("{key}.txt"), &text);
            tar_member(&mut tar, &format!("{key}.json"), &json);
            tar_member(
                &mut tar,
                &format!("{key}.cls"),
                format!("{}", i % 3).as_bytes(),
            );
            captions.push(text);
            jsons.push(json);
        }
        tar.resize(tar.len() + 1024, 0);
        std::fs::write(root.join(format!("train-{s:03}.tar")), tar).unwrap();
    }
    CaptionShards {
        root: root.to_owned(),
        captions,
        jsons,
        bad,
        long,
    }
}

/// Appends one regular-file member (a ustar header, the data, padding to 512 bytes).
fn tar_member(out: &mut Vec<u8>, name: &str, data: &[u8]) {
    assert!(name.len() < 100, "{name} does not fit a plain ustar name");
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}
