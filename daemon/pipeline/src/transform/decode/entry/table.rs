//! The process's table of entry points, per owner (scope): what each owner's files hold is
//! counted in bytes against a budget per owner, the owner's oldest files go first when it is
//! over, and an owner's entries go a grace period after the last job holding them ends
//! ([`EntryHold`], [`set_entry_grace`]).
//!
//! # Design
//! - Lookups take one shard's lock (a file's key picks it). Keeping and letting go take the
//!   scopes' lock, then shard locks: always in that order, so a scope's byte count is exact
//!   (it changes only under the scopes' lock, with the shard's change it counts).
//! - An owner over its budget loses its own oldest files (by when they were first kept),
//!   never another owner's, and never the file being kept. A file whose entries alone would
//!   exceed the budget is not kept (it decodes by walking, as a file past [`MAX_ENTRIES`] does).
//! - Every job holds its owner's scope ([`EntryHold`], in the job): when the owner's last job
//!   goes (after its last decode: the decode holds the job), the owner's entries stay for the
//!   grace period (`limits.entry_grace_s`), so a job that follows soon after (the next run of
//!   a script, a benchmark's next round) finds them instead of walking every file again; a
//!   new hold within it keeps them. When the grace passes with no hold, one thread
//!   (`stoker-entry-grace`, started with the daemon's grace) drops them and, where much was
//!   freed, asks the allocator to return free pages to the system (glibc keeps freed memory
//!   in its arenas otherwise). An idle owner's entries are still within its budget: the
//!   grace bounds how long they stay, not how much.
//! - A one-epoch job's first sight of a file keeps only a mark that it was seen (one entry's
//!   worth of bytes): the walk waits for a second sight (see `entry.rs`).
//!
//! # Limitations
//! - Eviction is by first keeping, not by last use: a file read every epoch may go before one
//!   read once. Eviction needs only the scope's queue, and a lookup no shared write.
//! - Entries kept for an owner no job holds (a tool, a test) are bounded by the budget but
//!   kept until the process ends.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::{Grid, Kept, Key, RowEntry, KEPT, MAX_ENTRIES};
use crate::sync::{lock, wait, wait_timeout};

/// Bytes of entries one owner may keep, by default (`limits.entry_bytes_per_uid`): about
/// 5,000 files of 1,000 entries, or ImageNet's files at one entry per row for 2 MCU rows each.
pub const DEFAULT_ENTRY_BYTES_PER_SCOPE: usize = 64 << 20;

/// How long an owner's entries stay after its last job ends, by default
/// (`limits.entry_grace_s`): long enough for the next job of a script or a benchmark round.
pub const DEFAULT_ENTRY_GRACE: Duration = Duration::from_secs(300);

/// Freed bytes past which dropping a scope asks the allocator to give free pages back.
const TRIM_AFTER: usize = 1 << 20;

const SHARDS: usize = 64;

/// The budget per owner in force (see [`set_entry_budget`]).
static BUDGET: AtomicUsize = AtomicUsize::new(DEFAULT_ENTRY_BYTES_PER_SCOPE);

/// The grace in force, in milliseconds (see [`set_entry_grace`]).
static GRACE_MS: AtomicUsize = AtomicUsize::new(300_000);

/// Bytes every scope holds, together (updated under the scopes' lock).
static BYTES: AtomicUsize = AtomicUsize::new(0);

/// One owner's share of the table.
#[derive(Debug, Default)]
struct Scope {
    /// Bytes its files hold ([`footprint`]).
    bytes: usize,
    /// Its files (hash and length), in the order they were first kept.
    order: VecDeque<(u64, usize)>,
    /// Jobs holding it ([`EntryHold`]).
    holders: usize,
    /// When its entries go, once no job holds it (the grace after its last job).
    idle_until: Option<Instant>,
}

/// The scopes, and the condition the grace thread waits on.
fn scopes_lock() -> &'static (Mutex<HashMap<u32, Scope>>, Condvar) {
    static SCOPES: OnceLock<(Mutex<HashMap<u32, Scope>>, Condvar)> = OnceLock::new();
    SCOPES.get_or_init(Default::default)
}

fn scopes() -> MutexGuard<'static, HashMap<u32, Scope>> {
    lock(&scopes_lock().0)
}

/// The shard of the table that holds `key`.
pub(super) fn table(key: Key) -> MutexGuard<'static, HashMap<Key, Kept>> {
    static TABLES: OnceLock<Vec<Mutex<HashMap<Key, Kept>>>> = OnceLock::new();
    let all = TABLES.get_or_init(|| (0..SHARDS).map(|_| Mutex::default()).collect());
    #[allow(clippy::cast_possible_truncation)]
    let shard = &all[key.1 as usize % SHARDS];
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes a file with room for `entries` entries holds: its list and its slot in the table.
pub(super) fn bytes_of(entries: usize) -> usize {
    std::mem::size_of::<(Key, Kept)>() + entries * std::mem::size_of::<RowEntry>()
}

fn footprint(k: &Kept) -> usize {
    bytes_of(k.list.capacity())
}

/// Whether a file of `entries` entries fits an owner's budget.
pub(super) fn fits_budget(entries: usize) -> bool {
    bytes_of(entries) <= BUDGET.load(Ordering::Relaxed)
}

/// Sets the bytes of entries one owner may keep (`limits.entry_bytes_per_uid`); an owner over
/// it loses its oldest files as it keeps more.
pub fn set_entry_budget(bytes: usize) {
    BUDGET.store(bytes, Ordering::Relaxed);
}

/// Sets how long an owner's entries stay after its last job ends (`limits.entry_grace_s`;
/// zero: they go with the last job). A grace starts the thread that ends graces now, so a
/// daemon's threads are the same before its first job and after its last.
pub fn set_entry_grace(grace: Duration) {
    let ms = usize::try_from(grace.as_millis()).unwrap_or(usize::MAX);
    GRACE_MS.store(ms, Ordering::Relaxed);
    if !grace.is_zero() {
        start_grace_thread();
    }
}

fn grace() -> Duration {
    Duration::from_millis(GRACE_MS.load(Ordering::Relaxed) as u64)
}

/// Bytes the table holds, every owner's entries together (the `stoker_entry_table_bytes`
/// gauge).
pub fn entry_table_bytes() -> usize {
    BYTES.load(Ordering::Relaxed)
}

/// Removes the file `key` from its shard; returns the bytes it held.
fn remove(key: Key) -> usize {
    let Some(k) = table(key).remove(&key) else {
        return 0;
    };
    KEPT.fetch_sub(k.list.len().max(1), Ordering::Relaxed);
    footprint(&k)
}

/// Whether this is the first sight of file `key` (no entries, nor a mark that it was seen):
/// if so it is marked as seen, within its owner's budget, and the caller decodes it plainly.
/// A table too full even for the mark answers `true` every time: a walk whose entries could
/// not be kept would be paid at every decode.
pub(super) fn first_sight(key: Key) -> bool {
    let budget = BUDGET.load(Ordering::Relaxed);
    let mut all = scopes();
    let scope = all.entry(key.0).or_default();
    let mut t = table(key);
    if t.contains_key(&key) {
        return false;
    }
    if KEPT.load(Ordering::Relaxed) < MAX_ENTRIES && bytes_of(0) <= budget {
        KEPT.fetch_add(1, Ordering::Relaxed);
        let mark = Kept::seen();
        let bytes = footprint(&mark);
        t.insert(key, mark);
        drop(t);
        scope.bytes += bytes;
        BYTES.fetch_add(bytes, Ordering::Relaxed);
        scope.order.push_back((key.1, key.2));
        evict(scope, key, budget);
    }
    true
}

/// Keeps what a walk in `grid` found after entry `from.1 - 1` of file `key` (`walked`:
/// whether it succeeded; `from.0` is the file's first entry), or that the file has no
/// entries: new entries only while the table is under [`MAX_ENTRIES`] and the file fits its
/// owner's budget, and only where they extend the kept ones (another thread may have walked
/// them meanwhile). Then the owner's oldest other files go while it is over its budget.
pub(super) fn keep(
    key: Key,
    grid: Grid,
    from: (RowEntry, usize),
    walked: bool,
    found: &[RowEntry],
) {
    let budget = BUDGET.load(Ordering::Relaxed);
    keep_within(key, grid, from, walked, found, budget);
}

/// [`keep`] with the owner's budget `budget`.
pub(super) fn keep_within(
    key: Key,
    grid: Grid,
    from: (RowEntry, usize),
    walked: bool,
    found: &[RowEntry],
    budget: usize,
) {
    let room = |n: usize| KEPT.load(Ordering::Relaxed) + n <= MAX_ENTRIES && bytes_of(n) <= budget;
    let mut all = scopes();
    let scope = all.entry(key.0).or_default();
    let mut t = table(key);
    let before = t.get(&key).map_or(0, footprint);
    // The mark of a first sight gives way to what the walk found (it is in the order already).
    let marked = t.get(&key).is_some_and(Kept::is_seen);
    if marked {
        t.remove(&key);
        KEPT.fetch_sub(1, Ordering::Relaxed);
    }
    let mut added = false;
    match t.get_mut(&key) {
        None if walked && from.1 == 1 && room(1 + found.len()) => {
            KEPT.fetch_add(1 + found.len(), Ordering::Relaxed);
            let mut list = Vec::with_capacity(1 + found.len());
            list.push(from.0);
            list.extend_from_slice(found);
            t.insert(key, Kept { grid, list });
            added = true;
        }
        // An empty list: no entries (counted as one, and kept as long as its owner's).
        None if !walked && room(1) => {
            KEPT.fetch_add(1, Ordering::Relaxed);
            let list = Vec::new();
            t.insert(key, Kept { grid, list });
            added = true;
        }
        None => {}
        Some(k) if !walked => {
            KEPT.fetch_sub(k.list.len().saturating_sub(1), Ordering::Relaxed);
            k.list = Vec::new();
        }
        Some(k) if k.grid == grid && k.list.len() == from.1 && room(from.1 + found.len()) => {
            KEPT.fetch_add(found.len(), Ordering::Relaxed);
            k.list.reserve_exact(found.len());
            k.list.extend_from_slice(found);
        }
        Some(_) => {}
    }
    let after = t.get(&key).map_or(0, footprint);
    drop(t);
    scope.bytes = scope.bytes + after - before;
    BYTES.fetch_add(after, Ordering::Relaxed);
    BYTES.fetch_sub(before, Ordering::Relaxed);
    if added && !marked {
        scope.order.push_back((key.1, key.2));
    }
    evict(scope, key, budget);
}

/// Drops the oldest files of `scope` (the owner of `key`) but `key` while it is over `budget`.
fn evict(scope: &mut Scope, key: Key, budget: usize) {
    let file = (key.1, key.2);
    while scope.bytes > budget && scope.order.len() > 1 {
        let Some(mut old) = scope.order.pop_front() else {
            break;
        };
        if old == file {
            scope.order.push_back(old);
            old = scope.order.pop_front().unwrap_or(file);
        }
        let freed = remove((key.0, old.0, old.1));
        scope.bytes -= freed;
        BYTES.fetch_sub(freed, Ordering::Relaxed);
    }
}

/// Bytes the files of `owner` hold.
#[cfg(test)]
pub(super) fn scope_bytes(owner: u32) -> usize {
    scopes().get(&owner).map_or(0, |s| s.bytes)
}

/// A job's hold on its owner's entries (see the module): the owner's entries go the grace
/// period after its last hold does.
#[derive(Debug)]
pub struct EntryHold {
    scope: u32,
    grace: Duration,
}

impl EntryHold {
    /// Holds the entries of `owner` (the job owner's uid, as `CpuDecoder::set_entry_scope`)
    /// under the grace in force ([`set_entry_grace`]).
    pub fn new(owner: u32) -> EntryHold {
        EntryHold::with_grace(owner, grace())
    }

    /// Holds the entries of `owner`; they go `grace` after its last hold does.
    pub fn with_grace(owner: u32, grace: Duration) -> EntryHold {
        let mut all = scopes();
        let scope = all.entry(owner).or_default();
        scope.holders += 1;
        scope.idle_until = None;
        EntryHold {
            scope: owner,
            grace,
        }
    }
}

impl Drop for EntryHold {
    fn drop(&mut self) {
        let mut all = scopes();
        let Some(scope) = all.get_mut(&self.scope) else {
            return;
        };
        scope.holders -= 1;
        if scope.holders > 0 {
            return;
        }
        if self.grace.is_zero() {
            let freed = release(&mut all, self.scope);
            drop(all);
            if freed >= TRIM_AFTER {
                trim();
            }
            return;
        }
        // A grace too long for the clock: kept until exit (still within the budget).
        scope.idle_until = Instant::now().checked_add(self.grace);
        drop(all);
        start_grace_thread();
        scopes_lock().1.notify_all();
    }
}

/// Drops the entries of `owner` (under the scopes' lock `all`); returns the bytes freed.
fn release(all: &mut HashMap<u32, Scope>, owner: u32) -> usize {
    let Some(scope) = all.remove(&owner) else {
        return 0;
    };
    let mut freed = 0;
    for (hash, len) in scope.order {
        freed += remove((owner, hash, len));
    }
    BYTES.fetch_sub(freed, Ordering::Relaxed);
    freed
}

/// Starts, once per process, the thread that drops idle owners' entries when their grace
/// passes (at the first grace set, or the first idle owner).
fn start_grace_thread() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("stoker-entry-grace".into())
            .spawn(grace_loop);
        if let Err(e) = spawned {
            tracing::warn!("entry points: no thread to end their grace ({e}); kept until exit");
        }
    });
}

/// Drops the entries of every owner whose grace has passed, then sleeps until the next one's
/// does (or a hold ends).
fn grace_loop() {
    let (m, cv) = scopes_lock();
    let mut all = lock(m);
    loop {
        let now = Instant::now();
        let due: Vec<u32> = all
            .iter()
            .filter(|(_, s)| s.holders == 0 && s.idle_until.is_some_and(|t| t <= now))
            .map(|(&owner, _)| owner)
            .collect();
        let freed: usize = due.iter().map(|&owner| release(&mut all, owner)).sum();
        if freed >= TRIM_AFTER {
            drop(all);
            trim();
            all = lock(m);
            continue;
        }
        let next = all
            .values()
            .filter(|s| s.holders == 0)
            .filter_map(|s| s.idle_until)
            .min();
        all = match next {
            Some(t) => wait_timeout(cv, all, t.saturating_duration_since(now)).0,
            None => wait(cv, all),
        };
    }
}

/// Asks the allocator to give its free pages back to the system.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory the allocator holds free; it takes no pointer.
    unsafe {
        libc::malloc_trim(0);
    }
}
