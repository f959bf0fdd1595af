//! Fetching a job's objects ahead of its readers, in the order its epoch reads them.
//!
//! # Design
//! When a rank starts ([`prefetch_job`], called by the engine), the objects of its dataset are
//! listed in the order of the epoch's permutation (each object once; the samples of objects
//! read by ranged GETs one by one, see `ranged`) and downloaded in that order in the background while they fit in the node cache.
//! The prefetcher holds at most half of the `max_in_flight` request permits (a share of its
//! own, shared by every job) and takes each permit only when a download can start, so a
//! worker's own requests (a chunk whose objects are not local yet) never wait behind a queue
//! of prefetches. Objects local or under way already are skipped.
//!
//! # Limitations
//! - The order is the epoch's global permutation: with several ranks each reads its own part
//!   of it, so a rank's next objects may come later than another's.
//! - Only the starting epoch is fetched ahead; later epochs find the objects in the cache
//!   while they fit, and fetch on demand otherwise.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;

use super::cache::NodeCache;
use super::ranged::{self, Piece};
use super::{config, hub, is_url, node_cache, permits, runtime, start_fetch, ObjectRef};
use crate::source::index::Dataset;

/// The prefetcher's share of the request permits, shared by every job.
fn share() -> Arc<Semaphore> {
    static SHARE: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SHARE
        .get_or_init(|| Arc::new(Semaphore::new((config().max_in_flight / 2).max(1))))
        .clone()
}

/// Starts fetching the objects of `ds` (an `s3://` dataset; others are left alone) in the
/// order epoch `epoch` of a job with `seed` reads them, unless `s3.prefetch` is off.
pub fn prefetch_job(ds: &Arc<Dataset>, seed: u64, epoch: u64) {
    if !is_url(ds.root()) || !config().prefetch {
        return;
    }
    let (Ok(cache), Ok(rt)) = (node_cache(), runtime()) else {
        return;
    };
    let ds = ds.clone();
    rt.spawn(async move {
        let Ok(objects) = tokio::task::spawn_blocking(move || in_order(&ds, seed, epoch)).await
        else {
            return;
        };
        run(cache, objects).await;
    });
}

/// What the prefetcher fetches: a whole object, or one sample of a large one.
enum Item {
    Whole(ObjectRef),
    Piece(Piece),
}

impl Item {
    fn name_and_size(&self) -> (String, u64) {
        match self {
            Item::Whole(o) => (o.cache_name(), o.size),
            Item::Piece(p) => (p.cache_name(), p.len()),
        }
    }
}

/// The dataset's objects (or, for large ones, samples) in the order of the epoch's
/// permutation, each once.
fn in_order(ds: &Dataset, seed: u64, epoch: u64) -> Vec<Item> {
    let mut order = Vec::new();
    crate::sampler::permutation_into(ds.len() as u64, seed, epoch, &mut order);
    let max_whole = config().whole_object_max_bytes;
    let map = hub().objects.read().unwrap_or_else(|e| e.into_inner());
    let mut seen = HashSet::new();
    order
        .iter()
        .filter_map(|&i| {
            let s = ds.sample(i as usize);
            let o = map.get(s.path.to_string_lossy().as_ref())?;
            if ranged::is_piece(o, s.offset, s.len, max_whole) {
                return Some(Item::Piece(Piece::new(o.clone(), s.offset, s.len)));
            }
            seen.insert(s.path).then(|| Item::Whole(o.clone()))
        })
        .collect()
}

/// Downloads `items` in order while they fit in the cache's free space.
async fn run(cache: Arc<NodeCache>, items: Vec<Item>) {
    let mut budget = cache.cap().saturating_sub(cache.total());
    for item in items {
        let (name, size) = item.name_and_size();
        if cache.known(&name) {
            continue;
        }
        if size > budget {
            break;
        }
        let Ok(mine) = share().acquire_owned().await else {
            return;
        };
        let Ok(request) = permits().acquire_owned().await else {
            return;
        };
        budget -= size;
        // Local or under way by now: the permits are given back at once.
        let held = vec![mine, request];
        match &item {
            Item::Whole(o) => {
                if start_fetch(&cache, o, Some(held)).is_err() {
                    return;
                }
            }
            Item::Piece(p) => ranged::prefetch_piece(&cache, p, held),
        }
    }
}
