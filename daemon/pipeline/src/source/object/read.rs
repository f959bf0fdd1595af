//! The reader's side of object storage: a chunk's requests for objects (found by file id in
//! their dataset's object table) turned into node-cache files (fetched first where needed),
//! then read by the usual reader.
//!
//! # Design
//! Requests for whole objects (images) and small objects fetch the object whole; requests for
//! one sample of an object larger than `s3.whole_object_max_bytes` (a tar shard) fetch that
//! sample's bytes alone ([`super::ranged`]) unless the whole object is local already. All of a
//! chunk's fetches are started before any is waited for, and each is pinned in the node cache
//! until it is read. The engine stages a batch first ([`ObjectStore::stage`]: fetches started,
//! nothing waited for) and reads it once it is settled or due; a read waits until the batch's
//! due time at most. A request names its object by URL in errors only.
//!
//! # Limitations
//! A request for an object its dataset's table lacks is `not_found`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cache::{Cached, Pending, Pin};
use super::client::{S3Error, S3ErrorKind};
use super::ranged::{self, Piece, Started};
use super::slots::Flow;
use super::{ObjectRef, ObjectStore};
use crate::source::index::{Dataset, Staged, Storage};
use crate::source::local::reader::{ReadError, ReadRequest, Reader};

/// Where one request's bytes are local: in memory (an object just received) or in a
/// node-cache file, and the offset there.
#[derive(Debug, Clone)]
struct Local {
    at: Cached,
    offset: u64,
}

/// Where one request for an object is local, or why it is not.
type LocalResult = Result<Local, ReadError>;

/// What one request needs fetched.
#[derive(Clone, Copy)]
enum Want {
    /// The whole object (index into the wholes).
    Whole(usize),
    /// One sample's bytes (index into the pieces).
    Piece(usize),
}

/// The fetches a list of requests needs: each object or piece once.
#[derive(Default)]
struct Plan {
    /// Per request: nothing to fetch (a local file), what to fetch, or why it cannot be.
    slot: Vec<Option<Result<Want, ReadError>>>,
    wholes: Vec<ObjectRef>,
    pieces: Vec<Piece>,
}

/// A plan's fetches, started: every claim, and the pins that keep them in the cache.
struct Claims {
    wholes: Vec<Started>,
    pieces: Vec<Started>,
    pins: Vec<Pin>,
}

/// A batch's objects on their way into the node cache ([`DatasetObjects::stage`]): pinned
/// while this lives.
pub(super) struct Staging {
    pending: Vec<Arc<Pending>>,
    due: Instant,
    _pins: Vec<Pin>,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("pending", &self.pending.len())
            .field("due", &self.due)
            .finish_non_exhaustive()
    }
}

impl Staged for Staging {
    fn settled(&self) -> bool {
        self.pending.iter().all(|p| p.is_done())
    }

    fn due(&self) -> Instant {
        self.due
    }
}

impl ObjectStore {
    /// What `reqs` (of objects of `table`) need fetched; `None` when none is an object.
    fn plan(&self, table: &[Option<ObjectRef>], reqs: &[ReadRequest<'_>]) -> Option<Plan> {
        if reqs.iter().all(|r| r.object.is_none()) {
            return None;
        }
        let max_whole = self.config().whole_object_max_bytes;
        let cache = self.node_cache().ok();
        let mut plan = Plan::default();
        let mut whole_at: HashMap<u32, usize> = HashMap::new();
        let mut piece_at: HashMap<(u32, u64, u64), usize> = HashMap::new();
        for r in reqs {
            let Some(id) = r.object else {
                plan.slot.push(None);
                continue;
            };
            let Some(o) = table.get(id as usize).and_then(Option::as_ref) else {
                plan.slot.push(Some(Err(ReadError::NotFound {
                    path: r.path.to_owned(),
                })));
                continue;
            };
            let piece = ranged::is_piece(o, r.offset, r.len, max_whole)
                && !cache.as_ref().is_some_and(|c| c.ready(&o.cache_name()));
            let want = if piece {
                Want::Piece(*piece_at.entry((id, r.offset, r.len)).or_insert_with(|| {
                    plan.pieces.push(Piece::new(o.clone(), r.offset, r.len));
                    plan.pieces.len() - 1
                }))
            } else {
                Want::Whole(*whole_at.entry(id).or_insert_with(|| {
                    plan.wholes.push(o.clone());
                    plan.wholes.len() - 1
                }))
            };
            plan.slot.push(Some(Ok(want)));
        }
        Some(plan)
    }

    /// Starts every fetch of `plan` at once (none is waited for), each pinned, as `flow`.
    fn claim_plan(&self, plan: &Plan, flow: &Flow) -> Claims {
        let ready = self
            .node_cache()
            .and_then(|c| Ok((c, self.fetcher()?)))
            .map_err(|e| e.to_string());
        let (pieces, mut pins) = ranged::start(
            ready.as_ref().map(|(c, f)| (c, f)).map_err(String::as_str),
            &plan.pieces,
            flow,
        );
        let (wholes, whole_pins) = self.start_all(&plan.wholes, flow);
        pins.extend(whole_pins);
        Claims {
            wholes,
            pieces,
            pins,
        }
    }

    /// Starts fetching the objects of `reqs` (of `table`) that are not local, pinned while the
    /// staging lives; `wake` is called once they all ended, or at the batch's due time (now
    /// plus `s3.fetch_deadline_ms`). `None` when no request is for an object.
    pub(super) fn stage(
        &self,
        table: &[Option<ObjectRef>],
        reqs: &[ReadRequest<'_>],
        wake: Arc<dyn Fn() + Send + Sync>,
        flow: &Flow,
    ) -> Option<Box<dyn Staged>> {
        let plan = self.plan(table, reqs)?;
        let claims = self.claim_plan(&plan, flow);
        let due = Instant::now() + Duration::from_millis(self.config().fetch_deadline_ms);
        let pending: Vec<Arc<Pending>> = (claims.wholes.iter())
            .chain(&claims.pieces)
            .filter_map(|s| match s {
                Started::Pending(p) => Some(p.clone()),
                _ => None,
            })
            .collect();
        let left = Arc::new(AtomicUsize::new(pending.len()));
        for p in &pending {
            let (count, wake) = (left.clone(), wake.clone());
            let last = move || {
                if count.fetch_sub(1, Ordering::AcqRel) == 1 {
                    wake();
                }
            };
            // One that ended already is counted here, without a wake: the caller looks.
            if !p.on_done(Box::new(last)) {
                left.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if left.load(Ordering::Acquire) > 0 {
            if let Ok(rt) = self.runtime() {
                rt.spawn(async move {
                    // Just past it: the feed then finds the batch due, not a hair early.
                    tokio::time::sleep_until((due + Duration::from_millis(2)).into()).await;
                    wake();
                });
            }
        }
        Some(Box::new(Staging {
            pending,
            due,
            _pins: claims.pins,
        }))
    }

    /// The local files of the requests for objects among `reqs` (objects of `table`),
    /// waited for until `due` at most, and the pins that keep them in the cache until they
    /// are read; `None` when there are none.
    fn localize(
        &self,
        table: &[Option<ObjectRef>],
        reqs: &[ReadRequest<'_>],
        due: Option<Instant>,
        flow: &Flow,
    ) -> Option<(Vec<Option<LocalResult>>, Vec<Pin>)> {
        let plan = self.plan(table, reqs)?;
        let claims = self.claim_plan(&plan, flow);
        let got_wholes = ranged::wait(claims.wholes, due);
        let got_pieces = ranged::wait(claims.pieces, due);
        let local = plan
            .slot
            .into_iter()
            .zip(reqs)
            .map(|(s, r)| {
                s.map(|s| {
                    let got = match s? {
                        Want::Whole(i) => got_wholes[i].clone().map(|at| Local {
                            at,
                            offset: r.offset,
                        }),
                        Want::Piece(i) => got_pieces[i].clone().map(|at| Local { at, offset: 0 }),
                    };
                    got.map_err(|e| read_error(r.path, e))
                })
            })
            .collect();
        Some((local, claims.pins))
    }

    /// The local file to read for `req` (of an object of `table`, or a local file): itself,
    /// or its object's node-cache copy (fetched first if needed).
    pub(super) fn local_file(
        &self,
        table: &[Option<ObjectRef>],
        req: ReadRequest<'_>,
        flow: &Flow,
    ) -> std::io::Result<PathBuf> {
        let req = [ReadRequest {
            offset: 0,
            len: 0,
            ..req
        }];
        let file = |at: Cached| {
            let o = req[0]
                .object
                .and_then(|id| table.get(id as usize)?.as_ref());
            let o = o.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
            let url = o.remote.url(&o.key);
            self.file_of(at, &o.cache_name(), &url)
                .map_err(|e| std::io::Error::other(e.to_string()))
        };
        match self
            .localize(table, &req, None, flow)
            .and_then(|(mut l, _)| l.pop().flatten())
        {
            None => Ok(req[0].path.to_owned()),
            Some(Ok(l)) => file(l.at),
            Some(Err(e)) => Err(match e {
                ReadError::NotFound { .. } => std::io::ErrorKind::NotFound.into(),
                ReadError::Permission { .. } => std::io::ErrorKind::PermissionDenied.into(),
                e => std::io::Error::other(e.to_string()),
            }),
        }
    }

    /// The local file to read for `path`: itself, or for the URL of an object this store
    /// listed or HEADed its node-cache copy (fetched first if needed). For tools that name
    /// samples by path; a dataset's reads find objects by file id instead.
    pub fn local_file_at(&self, path: &Path) -> std::io::Result<PathBuf> {
        let map = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let table = [map
            .get(path.to_string_lossy().as_ref())
            .map(|r| r.object.clone())];
        drop(map);
        let object = table[0].is_some().then_some(0);
        let request = ReadRequest {
            path,
            offset: 0,
            len: 0,
            object,
        };
        self.local_file(&table, request, &Flow::own(&path.to_string_lossy()))
    }

    /// Deletes the node-cache copies of the objects of `ds` and of its samples' pieces, so that
    /// the next read fetches them from the server: `stoker bench`'s cold rows. Returns how many
    /// copies were deleted.
    pub(super) fn evict(&self, table: &[Option<ObjectRef>], ds: &Dataset) -> usize {
        let Ok(cache) = self.node_cache() else {
            return 0;
        };
        let max_whole = self.config().whole_object_max_bytes;
        let mut removed = 0;
        let mut wholes = std::collections::HashSet::new();
        for i in 0..ds.len() {
            let s = ds.sample(i);
            let o = table.get(s.file as usize).and_then(Option::as_ref);
            let Some(o) = o.filter(|_| s.storage == Storage::Object) else {
                continue;
            };
            if wholes.insert(s.file) && cache.remove(&o.cache_name()) {
                removed += 1;
            }
            if ranged::is_piece(o, s.offset, s.len, max_whole)
                && cache.remove(&Piece::new(o.clone(), s.offset, s.len).cache_name())
            {
                removed += 1;
            }
        }
        removed
    }

    /// Reads `reqs` with `reader`: local files as they are, objects (of `table`) from their
    /// node-cache copies (fetched first where needed, all of the batch's fetches in flight at
    /// once, waited for until `due` at most, and kept in the cache until read); a request
    /// whose object could not be fetched (by `due`) gets that error and an empty buffer.
    pub(super) fn read(
        &self,
        table: &[Option<ObjectRef>],
        reader: &mut Reader,
        reqs: &[ReadRequest<'_>],
        bufs: &mut [Vec<u8>],
        due: Option<Instant>,
        flow: &Flow,
    ) -> Vec<Result<(), ReadError>> {
        let Some((local, _pins)) = self.localize(table, reqs, due, flow) else {
            return reader.read_batch(reqs, bufs);
        };
        let mut out: Vec<Option<Result<(), ReadError>>> = Vec::with_capacity(reqs.len());
        let mut which = Vec::new();
        let mut sub = Vec::new();
        let mut sub_bufs = Vec::new();
        for (i, (r, l)) in reqs.iter().zip(&local).enumerate() {
            let (path, offset) = match l {
                None => (r.path, r.offset),
                Some(Ok(Local {
                    at: Cached::File(path),
                    offset,
                })) => (path.as_path(), *offset),
                Some(Ok(Local {
                    at: Cached::Memory(bytes),
                    offset,
                })) => {
                    out.push(Some(from_memory(bytes, *offset, r, &mut bufs[i])));
                    continue;
                }
                Some(Err(_)) => {
                    out.push(None);
                    bufs[i].clear();
                    continue;
                }
            };
            out.push(None);
            which.push(i);
            sub.push(ReadRequest {
                path,
                offset,
                len: r.len,
                object: None,
            });
            sub_bufs.push(std::mem::take(&mut bufs[i]));
        }
        let results = reader.read_batch(&sub, &mut sub_bufs);
        for ((i, r), b) in which.into_iter().zip(results).zip(sub_bufs) {
            bufs[i] = b;
            // Errors name the URL, not the cache file.
            out[i] = Some(r.map_err(|e| rename_error(e, reqs[i].path)));
        }
        out.into_iter()
            .zip(local)
            .map(|(o, l)| match (o, l) {
                (Some(r), _) => r,
                (None, Some(Err(e))) => Err(e),
                (None, _) => Ok(()),
            })
            .collect()
    }
}

/// Copies the bytes of `req` (`len` at `offset` of an object received into memory) into
/// `buf`, as the reader would have read them from its file.
fn from_memory(
    bytes: &[u8],
    offset: u64,
    req: &ReadRequest<'_>,
    buf: &mut Vec<u8>,
) -> Result<(), ReadError> {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let end = usize::try_from(offset.saturating_add(req.len)).unwrap_or(usize::MAX);
    buf.clear();
    if end > bytes.len() {
        return Err(ReadError::ShortRead {
            path: req.path.to_owned(),
            offset,
            want: req.len,
            got: (bytes.len() - start) as u64,
        });
    }
    buf.extend_from_slice(&bytes[start..end]);
    Ok(())
}

fn rename_error(e: ReadError, url: &Path) -> ReadError {
    let path = url.to_owned();
    match e {
        ReadError::NotFound { .. } => ReadError::NotFound { path },
        ReadError::Permission { .. } => ReadError::Permission { path },
        ReadError::ShortRead {
            offset, want, got, ..
        } => ReadError::ShortRead {
            path,
            offset,
            want,
            got,
        },
        ReadError::Io { source, .. } => ReadError::Io { path, source },
        ReadError::NotRegular { source, .. } => ReadError::NotRegular { path, source },
        ReadError::Symlink { source, .. } => ReadError::Symlink { path, source },
        ReadError::Changed { source, .. } => ReadError::Changed { path, source },
        ReadError::Credentials { source, .. } => ReadError::Credentials { path, source },
        ReadError::ObjectChanged { detail, .. } => ReadError::ObjectChanged { path, detail },
        e @ ReadError::Setup(_) => e,
    }
}

fn read_error(path: &Path, e: S3Error) -> ReadError {
    let path = path.to_owned();
    match e.kind {
        S3ErrorKind::NotFound => ReadError::NotFound { path },
        S3ErrorKind::Permission => ReadError::Permission { path },
        S3ErrorKind::Changed => ReadError::ObjectChanged {
            path,
            detail: format!("S3 error {}: {}", e.code, e.message),
        },
        S3ErrorKind::Other => ReadError::Io {
            path,
            source: std::io::Error::other(format!("S3 error {}: {}", e.code, e.message)),
        },
    }
}
