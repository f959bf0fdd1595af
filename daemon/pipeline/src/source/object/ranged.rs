//! Per-sample ranged GETs: the samples of a large object (a tar shard) are fetched one by one,
//! each into its own node-cache file, nearby ones of a chunk merged into one request.
//!
//! # Design
//! A sample of an object over `s3.whole_object_max_bytes` is a *piece*: its own cache entry
//! (named by the object, the range, the ETag and the length), claimed like an object, so one
//! download per piece at a time and later askers wait. The pieces of a chunk that nobody is
//! fetching are sorted by object and offset; runs whose gaps are at most [`MERGE_GAP`] and
//! whose span is at most [`MERGE_MAX`] become one ranged GET, split into the pieces' files when
//! it lands. Every GET of a chunk is in flight at once (within `max_in_flight`).
//!
//! # Limitations
//! - A merged GET also downloads the gaps between its pieces (at most [`MERGE_GAP`] each).
//! - Every piece is a file: a shard read sample by sample holds as many files as samples.

use std::ops::Range;
use std::sync::Arc;

use std::time::Instant;

use super::cache::{Cached, Claim, Fetched, NodeCache, Pending, Pin};
use super::client::{S3Error, S3ErrorKind};
use super::slots::Flow;
use super::{metric, Fetcher, Held, ObjectRef};

/// Pieces of one object at most this far apart are fetched by one GET.
pub(crate) const MERGE_GAP: u64 = 64 << 10;
/// The most bytes one merged GET spans.
pub(crate) const MERGE_MAX: u64 = 8 << 20;

/// One sample's bytes of a large object.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    obj: ObjectRef,
    offset: u64,
    len: u64,
}

impl std::fmt::Display for Piece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o = &self.obj;
        let end = self.offset + self.len;
        write!(f, "{} bytes {}..{end}", o.remote.url(&o.key), self.offset)
    }
}

impl Piece {
    pub(crate) fn new(obj: ObjectRef, offset: u64, len: u64) -> Piece {
        Piece { obj, offset, len }
    }

    pub(crate) fn cache_name(&self) -> String {
        let o = &self.obj;
        let key = format!("{}#{}+{}", o.key, self.offset, self.len);
        NodeCache::name(&o.remote.origin, o.remote.bucket(), &key, &o.etag, self.len)
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(super) fn url(&self) -> String {
        self.obj.remote.url(&self.obj.key)
    }

    pub(super) fn endpoint(&self) -> String {
        self.obj.endpoint()
    }
}

/// Whether a read of `len` bytes at `offset` of `o` is fetched as a piece, not with the
/// whole object: `o` is larger than `max_whole` and the read is a part of it.
pub(crate) fn is_piece(o: &ObjectRef, offset: u64, len: u64, max_whole: u64) -> bool {
    o.size > max_whole && len > 0 && len < o.size && offset.saturating_add(len) <= o.size
}

/// One claim on an object or piece: local, on its way, or failed before it could start.
#[derive(Debug)]
pub(crate) enum Started {
    Ready(Cached),
    Pending(Arc<Pending>),
    Failed(S3Error),
}

/// Claims (and pins, while the pins returned live) every piece and starts the GETs of those
/// nobody is fetching, merged.
pub(super) fn start(
    ready: Result<(&Arc<NodeCache>, &Fetcher), &str>,
    pieces: &[Piece],
    flow: &Flow,
) -> (Vec<Started>, Vec<Pin>) {
    let (cache, fetcher) = match ready {
        Ok(r) => r,
        Err(e) => {
            let e = |p: &Piece| S3Error::local(&p.url(), e.to_owned());
            return (
                pieces.iter().map(|p| Started::Failed(e(p))).collect(),
                Vec::new(),
            );
        }
    };
    let pins = pieces.iter().map(|p| cache.pin(&p.cache_name())).collect();
    let mut fetch: Vec<(usize, String, Arc<Pending>)> = Vec::new();
    let started = pieces
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let name = p.cache_name();
            let claim = cache.claim(&name, p);
            let hit = !matches!(claim, Claim::Fetch(_));
            let result = if hit { "hit" } else { "miss" };
            metrics::counter!(metric::CACHE_REQUESTS_TOTAL, "result" => result).increment(1);
            if hit {
                metrics::counter!(metric::BYTES_TOTAL, "source" => "cache").increment(p.len);
            }
            match claim {
                Claim::Ready(path) => Started::Ready(path),
                Claim::Wait(w) => Started::Pending(w),
                Claim::Fetch(f) => {
                    fetch.push((i, name, f.clone()));
                    Started::Pending(f)
                }
            }
        })
        .collect();
    fetch.sort_by(|a, b| {
        let (pa, pb) = (&pieces[a.0], &pieces[b.0]);
        (&pa.obj.key, pa.offset).cmp(&(&pb.obj.key, pb.offset))
    });
    let spans: Vec<Span<'_>> = fetch
        .iter()
        .map(|(i, _, _)| {
            (
                pieces[*i].obj.key.as_str(),
                pieces[*i].offset,
                pieces[*i].len,
            )
        })
        .collect();
    for run in merge_runs(&spans) {
        let group = fetch[run]
            .iter()
            .map(|(i, name, pending)| (pieces[*i].clone(), name.clone(), pending.clone()))
            .collect();
        spawn_group(fetcher, cache, group, None, flow);
    }
    (started, pins)
}

/// A piece as merging sees it: object key, offset, length.
type Span<'a> = (&'a str, u64, u64);

/// The runs of `spans` (sorted by key, then offset) that one GET each fetches: same object,
/// gaps of at most [`MERGE_GAP`], at most [`MERGE_MAX`] bytes from the first to the last.
fn merge_runs(spans: &[Span<'_>]) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=spans.len() {
        let joins = spans.get(i).is_some_and(|&(key, offset, len)| {
            let (first, prev) = (spans[start], spans[i - 1]);
            key == first.0
                && offset <= prev.1 + prev.2 + MERGE_GAP
                && offset + len - first.1 <= MERGE_MAX
        });
        if !joins {
            runs.push(start..i);
            start = i;
        }
    }
    runs
}

/// Waits for every claim, until `due` at most (`None`: until each fetch ends, within its
/// own deadline); where each one's bytes are, or why they are not (`timeout` for one still
/// on its way at `due`).
pub(crate) fn wait(started: Vec<Started>, due: Option<Instant>) -> Vec<Result<Cached, S3Error>> {
    started
        .into_iter()
        .map(|s| match s {
            Started::Ready(p) => Ok(p),
            Started::Pending(p) => p.wait_until(due).unwrap_or_else(|| {
                Err(S3Error {
                    url: String::new(),
                    kind: S3ErrorKind::Other,
                    code: "timeout".into(),
                    message: "not fetched by the time its batch was due".into(),
                })
            }),
            Started::Failed(e) => Err(e),
        })
        .collect()
}

/// Claims `piece` for the prefetcher, which holds `held` (its share and a slot, for
/// `flow`): starts its GET if nobody is fetching it (the slot goes with the GET), else gives
/// them back.
pub(super) fn prefetch_piece(
    fetcher: &Fetcher,
    cache: &Arc<NodeCache>,
    piece: &Piece,
    held: Held,
    flow: &Flow,
) {
    let name = piece.cache_name();
    if let Claim::Fetch(pending) = cache.claim(&name, piece) {
        spawn_group(
            fetcher,
            cache,
            vec![(piece.clone(), name, pending)],
            Some(held),
            flow,
        );
    }
}

/// One ranged GET covering the pieces of `group` (one object, sorted by offset), split into
/// their cache files; every piece's waiters wake with its outcome.
fn spawn_group(
    fetcher: &Fetcher,
    cache: &Arc<NodeCache>,
    group: Vec<(Piece, String, Arc<Pending>)>,
    held: Option<Held>,
    flow: &Flow,
) {
    let cache = cache.clone();
    let fail_all = |cache: &NodeCache, group: &[(Piece, String, Arc<Pending>)], e: &S3Error| {
        for (p, name, pending) in group {
            let _ = cache.finish(name, pending, Err(e.clone()), &p.url());
        }
    };
    let (fetcher, flow) = (fetcher.clone(), flow.clone());
    let downloaded = fetcher.downloaded.clone();
    let deadline = fetcher.deadline;
    fetcher.rt.clone().spawn(async move {
        let Some(_held) = fetcher.take_slot(held, &flow, &group[0].0.obj).await else {
            let err = S3Error::local(&group[0].0.url(), "the request slots are closed".into());
            fail_all(&cache, &group, &err);
            return;
        };
        let first = &group[0].0;
        let end = group.iter().map(|(p, _, _)| p.offset + p.len).max();
        let range: Range<u64> = first.offset..end.unwrap_or(first.offset);
        metrics::gauge!(metric::IN_FLIGHT).increment(1.0);
        let fetch =
            (first.obj.remote).get_range(&first.obj.key, range.clone(), first.obj.expected());
        let got = super::within(deadline, &first.url(), fetch).await;
        metrics::gauge!(metric::IN_FLIGHT).decrement(1.0);
        if super::e_stalled(&got) {
            fetcher.slots.stalled(&first.obj.endpoint());
        }
        let bytes = match got {
            Ok(b) => b,
            Err(e) => return fail_all(&cache, &group, &e),
        };
        for (p, name, pending) in &group {
            // Offsets inside the range just read into memory: they fit a usize.
            #[allow(clippy::cast_possible_truncation)]
            let (at, len) = ((p.offset - range.start) as usize, p.len as usize);
            // The piece's own bytes of the range, tagged from memory, handed to its readers
            // from there and written behind.
            let piece = bytes.slice(at..at + len);
            let tag = cache.tags().tag_of_bytes(&piece);
            metrics::counter!(metric::BYTES_TOTAL, "source" => "s3").increment(p.len);
            downloaded.fetch_add(p.len, std::sync::atomic::Ordering::Relaxed);
            let fetched = Fetched::Memory {
                bytes: piece.clone(),
                tag,
            };
            let _ = cache.finish(name, pending, Ok(fetched), &p.url());
            super::write_behind(&cache, name, piece, tag);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearby_pieces_of_one_object_are_merged_far_ones_are_not() {
        let spans = [
            ("a", 0, 100),
            ("a", 612, 100),                // gap 512: merged
            ("a", 712 + MERGE_GAP + 1, 10), // gap over MERGE_GAP: new GET
            ("b", 0, 10),                   // another object
            ("b", 10, MERGE_MAX),           // would span more than MERGE_MAX
        ];
        assert_eq!(merge_runs(&spans), vec![0..2, 2..3, 3..4, 4..5]);
        assert!(merge_runs(&[]).is_empty());
    }
}
