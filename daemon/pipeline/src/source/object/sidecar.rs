//! The shard index sidecar: `NAME.tar.idx` beside `NAME.tar`, written by `stoker pack` (and
//! `stoker synth --shards`), so an `s3://` dataset of shards is indexed by reading one small
//! object per shard instead of downloading the shard to walk its tar headers.
//!
//! Format (text, one line each):
//! ```text
//! stoker-tar-index 1 <shard size in bytes>
//! <data offset> <length> <label> <member name>
//! ```
//! one sample line per image member, in archive order; the label is -1 for none. The name runs
//! to the end of the line (pack's names hold no newline).
//!
//! # Design
//! The shard's size is in the first line: a sidecar whose shard has another size (rewritten
//! since) is ignored, and the shard is indexed from its headers instead.
//!
//! # Limitations
//! Shards from other tools have no sidecar: they are downloaded once to be indexed.

/// The sidecar's name suffix, appended to the shard's name.
pub const SUFFIX: &str = ".idx";
const MAGIC: &str = "stoker-tar-index 1";

pub use crate::source::index::IndexedSample;

/// The sidecar text of a shard of `shard_bytes` holding `samples`.
pub fn render(shard_bytes: u64, samples: &[IndexedSample]) -> String {
    let mut s = format!("{MAGIC} {shard_bytes}\n");
    for x in samples {
        s += &format!("{} {} {} {}\n", x.offset, x.len, x.label, x.name);
    }
    s
}

/// Why a shard's index sidecar cannot be used (the shard is then indexed by reading it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SidecarError {
    /// The first line is not this format's.
    #[error("not a stoker tar index (first line {first_line:?})")]
    NotAnIndex {
        /// The sidecar's first line.
        first_line: String,
    },
    /// The sidecar was written for a shard of another size.
    #[error("written for a shard of {written_for} bytes, the shard has {shard}")]
    Stale {
        /// The size the sidecar names.
        written_for: u64,
        /// The shard's size now.
        shard: u64,
    },
    /// A sample line that does not parse or lies outside the shard.
    #[error("line {line}: bad sample line {text:?}")]
    BadLine {
        /// Its line number (1 is the first line).
        line: usize,
        /// The line.
        text: String,
    },
}

/// The samples of a sidecar for a shard of `shard_bytes`; `Err` names what is wrong (a stale
/// sidecar included).
pub fn parse(text: &str, shard_bytes: u64) -> Result<Vec<IndexedSample>, SidecarError> {
    let mut lines = text.lines();
    let head = lines.next().unwrap_or_default();
    let size: u64 = head
        .strip_prefix(MAGIC)
        .and_then(|r| r.trim().parse().ok())
        .ok_or_else(|| SidecarError::NotAnIndex {
            first_line: head.to_owned(),
        })?;
    if size != shard_bytes {
        return Err(SidecarError::Stale {
            written_for: size,
            shard: shard_bytes,
        });
    }
    lines
        .enumerate()
        .map(|(i, line)| {
            let mut f = line.splitn(4, ' ');
            let mut num = || f.next().and_then(|v| v.parse::<i64>().ok());
            let (offset, len, label) = (num(), num(), num());
            let sample = match (offset, len, label, f.next()) {
                (Some(o), Some(l), Some(label), Some(name)) if o >= 0 && l >= 0 => {
                    let (offset, len) = (o.unsigned_abs(), l.unsigned_abs());
                    (offset.saturating_add(len) <= size).then(|| IndexedSample {
                        offset,
                        len,
                        label,
                        name: name.to_owned(),
                    })
                }
                _ => None,
            };
            sample.ok_or_else(|| SidecarError::BadLine {
                line: i + 2,
                text: line.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sidecar_reads_back_and_a_stale_or_broken_one_is_refused() {
        let samples = vec![
            IndexedSample {
                offset: 512,
                len: 100,
                label: 3,
                name: "000000001.jpg".into(),
            },
            IndexedSample {
                offset: 1536,
                len: 7,
                label: -1,
                name: "a b.jpg".into(),
            },
        ];
        let text = render(4096, &samples);
        assert_eq!(parse(&text, 4096).unwrap(), samples);
        assert!(parse(&text, 5000).unwrap_err().to_string().contains("4096"));
        assert!(parse("junk\n", 4096).is_err());
        let bad = format!("{MAGIC} 4096\n512 x 3 a.jpg\n");
        assert!(parse(&bad, 4096)
            .unwrap_err()
            .to_string()
            .contains("line 2"));
        let beyond = format!("{MAGIC} 4096\n4000 200 3 a.jpg\n");
        assert!(parse(&beyond, 4096).is_err());
    }
}
