//! Fetching a rank's objects ahead of its readers, in the order the rank reads them.
//!
//! # Design
//! Each rank's feed owns a [`Prefetch`] and tells it, as it starts each epoch, the rank's own
//! order for the rest of that epoch ([`Prefetch::schedule`], in the spirit of FFCV's
//! `schedule_epoch`): nothing here recomputes an order. The objects behind that order are
//! listed (each object once; the samples of objects read by ranged GETs one by one, see
//! `ranged`) and downloaded in that order in the background while they fit in the node cache.
//! A newer schedule of the same rank, or the rank's detach, stops the older one at its next
//! object.
//! The prefetcher holds at most half of the `max_in_flight` request slots (a share of its
//! own, shared by every job of its store) and takes each slot (as the rank's user and
//! dataset, see `slots`) only when a download can start, so a
//! worker's own requests (a chunk whose objects are not local yet) never wait behind a queue
//! of prefetches. Objects local or under way already are skipped.
//!
//! # Limitations
//! - An epoch is scheduled when the rank starts it, so its first objects may still be on
//!   their way when its first batches are read.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Semaphore;

use super::cache::NodeCache;
use super::ranged::{self, Piece};
use super::slots::Flow;
use super::storage::ObjectTable;
use super::{Fetcher, Held, ObjectRef, ObjectStore};
use crate::source::index::{Dataset, Storage};

/// One rank's prefetching: told the rank's order, stopped by the next order or by its drop.
#[derive(Debug, Default)]
pub struct Prefetch {
    /// Bumped by every schedule and by the drop; a run goes on while it holds the newest.
    generation: Arc<AtomicU64>,
}

impl Prefetch {
    /// Whether `ds` has objects to fetch ahead: an `s3://` dataset, with `s3.prefetch` on in
    /// its store. A feed asks this before it computes an order to schedule.
    pub fn wanted(ds: &Dataset) -> bool {
        ds.objects().is_some_and(|o| o.prefetches())
    }

    /// Starts fetching the objects of samples `order` of `ds` (global sample indices, in the
    /// order the rank reads them from now on, `epoch`'s) through the dataset's own store,
    /// stopping the previous schedule.
    pub fn schedule(&self, ds: &Arc<Dataset>, epoch: u64, order: Vec<u64>) {
        let mine = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let Some(objects) = ds.objects().filter(|o| o.prefetches()) else {
            return;
        };
        let generation = self.generation.clone();
        let current = move || generation.load(Ordering::Relaxed) == mine;
        objects.schedule(ds, epoch, order, Box::new(current));
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }
}

impl ObjectStore {
    /// Plans the objects behind `order` (of `table`, the objects of `ds`) off the caller's
    /// thread, then downloads them in order in the background while `current` holds.
    pub(super) fn schedule_prefetch(
        &self,
        ds: &Arc<Dataset>,
        table: &ObjectTable,
        epoch: u64,
        order: Vec<u64>,
        current: Box<dyn Fn() -> bool + Send + Sync>,
        flow: &Flow,
    ) {
        let ready = self.node_cache().and_then(|c| Ok((c, self.fetcher()?)));
        let Ok((cache, fetcher)) = ready else {
            return;
        };
        let share = self.prefetch_share();
        let (ds, table, flow) = (ds.clone(), table.clone(), flow.clone());
        let max_whole = self.config().whole_object_max_bytes;
        tracing::debug!(epoch, samples = order.len(), "prefetch scheduled");
        fetcher.rt.clone().spawn(async move {
            let plan = move || in_order(&ds, &order, &table, max_whole);
            let Ok(items) = tokio::task::spawn_blocking(plan).await else {
                return;
            };
            run(cache, &fetcher, &share, items, current, &flow).await;
        });
    }

    /// The prefetcher's share of the request permits, shared by every job of this store.
    fn prefetch_share(&self) -> Arc<Semaphore> {
        self.prefetch_share
            .get_or_init(|| Arc::new(Semaphore::new((self.config().max_in_flight / 2).max(1))))
            .clone()
    }
}

/// What the prefetcher fetches: a whole object, or one sample of a large one.
#[derive(Debug)]
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

/// The objects (or, for large ones, samples) of the samples `order` of `ds`, in that order,
/// each once; `objects` are its objects by file id.
fn in_order(
    ds: &Dataset,
    order: &[u64],
    objects: &[Option<ObjectRef>],
    max_whole: u64,
) -> Vec<Item> {
    let mut seen = HashSet::new();
    order
        .iter()
        .filter_map(|&i| {
            let s = ds.sample(usize::try_from(i).ok()?);
            if s.storage != Storage::Object {
                return None;
            }
            let o = objects.get(s.file as usize)?.as_ref()?;
            if ranged::is_piece(o, s.offset, s.len, max_whole) {
                return Some(Item::Piece(Piece::new(o.clone(), s.offset, s.len)));
            }
            seen.insert(s.file).then(|| Item::Whole(o.clone()))
        })
        .collect()
}

/// Downloads `items` in order while they fit in the cache's free space and `current` says
/// the schedule is still the rank's newest.
async fn run(
    cache: Arc<NodeCache>,
    fetcher: &Fetcher,
    share: &Arc<Semaphore>,
    items: Vec<Item>,
    current: impl Fn() -> bool,
    flow: &Flow,
) {
    let mut budget = cache.cap().saturating_sub(cache.total());
    for item in items {
        if !current() {
            return;
        }
        let (name, size) = item.name_and_size();
        if cache.known(&name) {
            continue;
        }
        if size > budget {
            break;
        }
        let Ok(mine) = share.clone().acquire_owned().await else {
            return;
        };
        let endpoint = match &item {
            Item::Whole(o) => o.endpoint(),
            Item::Piece(p) => p.endpoint(),
        };
        let Some(slot) = fetcher.slots.acquire(flow, &endpoint).await else {
            return;
        };
        budget -= size;
        // Local or under way by now: the share and slot are given back at once.
        let held = Held {
            _share: Some(mine),
            _slot: slot,
        };
        match &item {
            Item::Whole(o) => {
                fetcher.start(&cache, o, Some(held), flow);
            }
            Item::Piece(p) => ranged::prefetch_piece(fetcher, &cache, p, held, flow),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::index::DatasetKind;
    use crate::source::object::client::Remote;
    use crate::source::object::{Connection, S3Config};
    use crate::transform::sampler::Sampler;
    use std::path::Path;

    /// A flat `s3://` dataset of `n` objects (`i.jpg`, `1000 + i` bytes) and its listing.
    fn listed(n: usize) -> (Dataset, Vec<Option<ObjectRef>>) {
        let cfg = S3Config::default();
        let remote = Arc::new(Remote::new(&Connection::default(), "b", &cfg).unwrap());
        let mut ds = Dataset::remote(Path::new("s3://b/d"), DatasetKind::Flat);
        let mut objects = Vec::new();
        for i in 0..n {
            let key = format!("d/{i}.jpg");
            let size = 1000 + i as u64;
            ds.push_object(remote.url(&key).as_bytes(), size, -1)
                .unwrap();
            let obj = ObjectRef {
                remote: remote.clone(),
                key: key.clone(),
                size,
                etag: format!("e{i}"),
            };
            objects.push(Some(obj));
        }
        (ds, objects)
    }

    fn sizes(items: &[Item]) -> Vec<u64> {
        items.iter().map(|i| i.name_and_size().1).collect()
    }

    #[test]
    fn the_plan_follows_the_scheduled_rank_s_order() {
        let (ds, objects) = listed(40);
        // Rank 2 of 4, from its third batch on: what its feed schedules.
        let mut rank = Sampler::new(40, 9, 2, 4, 2, false).unwrap();
        let mut order = Vec::new();
        rank.rest_of_epoch_into(1, 2, &mut order);
        assert_eq!(order.len(), 6);
        let plan = in_order(&ds, &order, &objects, u64::MAX);
        let want: Vec<u64> = order.iter().map(|&i| 1000 + i).collect();
        assert_eq!(
            sizes(&plan),
            want,
            "exactly the rank's next objects, in its order"
        );
        // Another rank's order plans other objects: nothing comes from a global permutation.
        let mut other = Sampler::new(40, 9, 1, 4, 2, false).unwrap();
        other.rest_of_epoch_into(1, 2, &mut order);
        let theirs = sizes(&in_order(&ds, &order, &objects, u64::MAX));
        assert!(theirs.iter().all(|s| !want.contains(s)));
    }

    #[test]
    fn an_object_read_twice_is_planned_once() {
        let (ds, objects) = listed(5);
        let plan = in_order(&ds, &[3, 1, 3, 0, 1], &objects, u64::MAX);
        assert_eq!(sizes(&plan), [1003, 1001, 1000]);
    }
}
