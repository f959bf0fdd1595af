//! The reader's side of object storage: a chunk's requests for objects (found by file id in
//! their dataset's object table) turned into node-cache files (fetched first where needed),
//! then read by the usual reader.
//!
//! # Design
//! Requests for whole objects (images) and small objects fetch the object whole; requests for
//! one sample of an object larger than `s3.whole_object_max_bytes` (a tar shard) fetch that
//! sample's bytes alone ([`super::ranged`]) unless the whole object is local already. All of a
//! chunk's fetches are started before any is waited for. A request names its object by URL
//! in errors only.
//!
//! # Limitations
//! A request for an object its dataset's table lacks is `not_found`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::client::{S3Error, S3ErrorKind};
use super::ranged::{self, Piece};
use super::{ObjectRef, ObjectStore};
use crate::source::index::{Dataset, Storage};
use crate::source::local::reader::{ReadError, ReadRequest, Reader};

/// Where one request's bytes are local: a node-cache file and the offset in it.
#[derive(Debug, Clone)]
struct Local {
    pub path: PathBuf,
    pub offset: u64,
}

/// What one request needs fetched.
enum Want {
    /// The whole object (index into the wholes).
    Whole(usize),
    /// One sample's bytes (index into the pieces).
    Piece(usize),
}

impl ObjectStore {
    /// The local files of the requests for objects among `reqs` (objects of `table`); `None`
    /// when there are none.
    fn localize(
        &self,
        table: &[Option<ObjectRef>],
        reqs: &[ReadRequest<'_>],
    ) -> Option<Vec<Option<Result<Local, ReadError>>>> {
        if reqs.iter().all(|r| r.object.is_none()) {
            return None;
        }
        let max_whole = self.config().whole_object_max_bytes;
        let ready = self.node_cache().and_then(|c| Ok((c, self.fetcher()?)));
        let cache = ready.as_ref().ok().map(|(c, _)| c);
        let mut wholes: Vec<ObjectRef> = Vec::new();
        let mut pieces: Vec<Piece> = Vec::new();
        let mut whole_at: HashMap<u32, usize> = HashMap::new();
        let mut piece_at: HashMap<(u32, u64, u64), usize> = HashMap::new();
        let mut slot: Vec<Option<Result<Want, ReadError>>> = Vec::with_capacity(reqs.len());
        for r in reqs {
            let Some(id) = r.object else {
                slot.push(None);
                continue;
            };
            let Some(o) = table.get(id as usize).and_then(Option::as_ref) else {
                slot.push(Some(Err(ReadError::NotFound {
                    path: r.path.to_owned(),
                })));
                continue;
            };
            let piece = ranged::is_piece(o, r.offset, r.len, max_whole)
                && !cache.is_some_and(|c| c.ready(&o.cache_name()));
            let want = if piece {
                Want::Piece(*piece_at.entry((id, r.offset, r.len)).or_insert_with(|| {
                    pieces.push(Piece::new(o.clone(), r.offset, r.len));
                    pieces.len() - 1
                }))
            } else {
                Want::Whole(*whole_at.entry(id).or_insert_with(|| {
                    wholes.push(o.clone());
                    wholes.len() - 1
                }))
            };
            slot.push(Some(Ok(want)));
        }
        let started = ranged::start(
            ready.as_ref().map(|(c, f)| (c, f)).map_err(String::as_str),
            &pieces,
        );
        let got_wholes = self.fetch_all(&wholes);
        let got_pieces = ranged::wait(started, &pieces);
        Some(
            slot.into_iter()
                .zip(reqs)
                .map(|(s, r)| {
                    s.map(|s| {
                        let got = match s? {
                            Want::Whole(i) => got_wholes[i].clone().map(|path| Local {
                                path,
                                offset: r.offset,
                            }),
                            Want::Piece(i) => {
                                got_pieces[i].clone().map(|path| Local { path, offset: 0 })
                            }
                        };
                        got.map_err(|e| read_error(r.path, e))
                    })
                })
                .collect(),
        )
    }

    /// The local file to read for `req` (of an object of `table`, or a local file): itself,
    /// or its object's node-cache copy (fetched first if needed).
    pub(super) fn local_file(
        &self,
        table: &[Option<ObjectRef>],
        req: ReadRequest<'_>,
    ) -> std::io::Result<PathBuf> {
        let req = [ReadRequest {
            offset: 0,
            len: 0,
            ..req
        }];
        match self
            .localize(table, &req)
            .and_then(|mut l| l.pop().flatten())
        {
            None => Ok(req[0].path.to_owned()),
            Some(Ok(l)) => Ok(l.path),
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
        let table = [map.get(path.to_string_lossy().as_ref()).cloned()];
        drop(map);
        let object = table[0].is_some().then_some(0);
        self.local_file(
            &table,
            ReadRequest {
                path,
                offset: 0,
                len: 0,
                object,
            },
        )
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
    /// once); a request whose object could not be fetched gets that error and an empty buffer.
    pub(super) fn read(
        &self,
        table: &[Option<ObjectRef>],
        reader: &mut Reader,
        reqs: &[ReadRequest<'_>],
        bufs: &mut [Vec<u8>],
    ) -> Vec<Result<(), ReadError>> {
        let Some(local) = self.localize(table, reqs) else {
            return reader.read_batch(reqs, bufs);
        };
        let mut out: Vec<Option<Result<(), ReadError>>> = Vec::with_capacity(reqs.len());
        let mut which = Vec::new();
        let mut sub = Vec::new();
        let mut sub_bufs = Vec::new();
        for (i, (r, l)) in reqs.iter().zip(&local).enumerate() {
            let (path, offset) = match l {
                None => (r.path, r.offset),
                Some(Ok(l)) => (l.path.as_path(), l.offset),
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
        e @ ReadError::Setup(_) => e,
    }
}

fn read_error(path: &Path, e: S3Error) -> ReadError {
    let path = path.to_owned();
    match e.kind {
        S3ErrorKind::NotFound => ReadError::NotFound { path },
        S3ErrorKind::Permission => ReadError::Permission { path },
        S3ErrorKind::Other => ReadError::Io {
            path,
            source: std::io::Error::other(format!("S3 error {}: {}", e.code, e.message)),
        },
    }
}
