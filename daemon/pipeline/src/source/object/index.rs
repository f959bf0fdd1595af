//! Indexing an `s3://bucket/prefix` dataset: a paginated listing, then the layout's samples.
//!
//! # Design
//! Layout detection and order follow the local rules (`crate::source::index`), so a dataset gives
//! the same samples in the same order from a bucket as from a local copy.
//!
//! Shards are indexed from their sidecar index (`NAME.tar.idx`, which `stoker pack` writes
//! beside each shard), all sidecars requested at once through the node cache, so a second
//! open (another job, a restarted daemon) reads them from local disk; a shard without a
//! usable one is downloaded into the node cache and its tar headers walked there.
//!
//! # Limitations
//! Shards without a sidecar are downloaded whole to be indexed (no ranged header reads). The
//! index is kept on disk for `s3.index_ttl_s` (`index_cache`); after that an open lists the
//! prefix again (the sidecars come from the node cache).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::client::{ListBounds, ObjectInfo, Remote, S3Error};
use super::sidecar::{self, IndexedSample};
use super::slots::Flow;
use super::{ObjectRef, ObjectStore, S3Url};
use crate::source::index::{Dataset, DatasetError, DatasetKind, OpenOptions, IMAGE_EXTENSIONS};

/// Opens the dataset at the `s3://` URL `path`: lists the prefix, detects (or takes) the
/// layout, and for shards reads their tar headers from the node cache's copies.
pub(super) fn open_dataset(
    store: &ObjectStore,
    path: &Path,
    opts: &OpenOptions,
) -> Result<Dataset, DatasetError> {
    let wrong = |reason: String| DatasetError::WrongKind {
        path: path.to_owned(),
        reason,
    };
    let url = match S3Url::parse(path) {
        Some(Ok(u)) => u,
        Some(Err(e)) => return Err(wrong(e.to_string())),
        None => return Err(wrong("not an s3:// URL".into())),
    };
    let started = std::time::Instant::now();
    let remote = store.remote_for(&url).map_err(|e| refused(path, e))?;
    if let Some(ds) = super::index_cache::load(store, path, &url, &remote, opts) {
        tracing::info!(
            dataset = %path.display(), samples = ds.len(),
            "s3 dataset index loaded from cache (not listed)"
        );
        return Ok(ds);
    }
    let listed = list(store, path, &url, &remote, opts)?;
    let prefix_len = url.prefix.trim_end_matches('/').len();
    let rel = |o: &ObjectInfo| -> String {
        o.key[prefix_len.min(o.key.len())..]
            .trim_start_matches('/')
            .to_owned()
    };
    let visible: Vec<(String, ObjectInfo)> = listed
        .into_iter()
        .map(|o| (rel(&o), o))
        .filter(|(r, _)| !r.is_empty() && !r.split('/').any(|c| c.starts_with('.')))
        .collect();
    let kind = match opts.kind {
        Some(k) => k,
        None => detect(path, &visible)?,
    };
    let ds = match kind {
        DatasetKind::TarShards => index_shards(store, path, &remote, &visible)?,
        DatasetKind::ImageFolder | DatasetKind::Flat => {
            index_images(store, path, kind, &remote, &visible)?
        }
        DatasetKind::FileList => {
            return Err(DatasetError::WrongKind {
                path: path.to_owned(),
                reason: "file lists in object storage are not supported; name a prefix of \
                         shards or image objects"
                    .into(),
            })
        }
    };
    if ds.is_empty() {
        return Err(DatasetError::Empty {
            path: path.to_owned(),
            reason: format!("no images found as {} under the prefix", kind.as_str()),
        });
    }
    tracing::info!(
        dataset = %path.display(), kind = kind.as_str(), samples = ds.len(),
        seconds = started.elapsed().as_secs_f64(), "s3 dataset indexed"
    );
    super::index_cache::save(store, &url, opts, &ds);
    Ok(ds)
}

/// Every object under the prefix of `url`, within the listing's bounds (see
/// `Remote::list`); past `limits.max_index_entries` a `WalkLimit` error, as a folder walk.
fn list(
    store: &ObjectStore,
    path: &Path,
    url: &S3Url,
    remote: &Remote,
    opts: &OpenOptions,
) -> Result<Vec<ObjectInfo>, DatasetError> {
    let deadline_ms = store.config().list_deadline_ms;
    let bounds = ListBounds {
        max_objects: opts.limits.max_entries,
        deadline: std::time::Instant::now() + std::time::Duration::from_millis(deadline_ms),
        asker: opts.asker.as_ref(),
        deadline_ms,
    };
    store
        .block_on(remote.list(&folder(&url.prefix), &bounds))
        .map_err(|e| remote_error(path, "local".into(), e.to_string()))?
        .map_err(|e| match e.code.as_str() {
            "too_many_objects" => DatasetError::WalkLimit {
                path: path.to_owned(),
                reason: e.message,
            },
            _ => refused(path, e),
        })
}

/// What a prefix lists: it names a folder, so `data` lists `data/`, never a neighbour
/// `data2/`.
fn folder(prefix: &str) -> String {
    match prefix {
        "" => String::new(),
        p if p.ends_with('/') => p.to_owned(),
        p => format!("{p}/"),
    }
}

fn is_image(rel: &str) -> bool {
    rel.rsplit_once('.')
        .is_some_and(|(_, ext)| IMAGE_EXTENSIONS.iter().any(|e| ext.eq_ignore_ascii_case(e)))
}

fn is_tar(rel: &str) -> bool {
    rel.rsplit_once('.')
        .is_some_and(|(_, ext)| ext.eq_ignore_ascii_case("tar"))
}

/// As for a local folder: images at the top make it flat, else `.tar` objects make shards,
/// else sub-prefixes are classes.
fn detect(path: &Path, objects: &[(String, ObjectInfo)]) -> Result<DatasetKind, DatasetError> {
    let top = |f: fn(&str) -> bool| objects.iter().any(|(r, _)| !r.contains('/') && f(r));
    if top(is_image) {
        Ok(DatasetKind::Flat)
    } else if top(is_tar) {
        Ok(DatasetKind::TarShards)
    } else if objects.iter().any(|(r, _)| r.contains('/') && is_image(r)) {
        Ok(DatasetKind::ImageFolder)
    } else {
        Err(DatasetError::Empty {
            path: path.to_owned(),
            reason: "no image objects, class prefixes or .tar shards under the prefix".into(),
        })
    }
}

fn index_images(
    store: &ObjectStore,
    path: &Path,
    kind: DatasetKind,
    remote: &Arc<Remote>,
    objects: &[(String, ObjectInfo)],
) -> Result<Dataset, DatasetError> {
    let mut ds = Dataset::remote(path, kind);
    let mut used = Vec::new();
    // Objects come sorted by key: classes in sorted order, files by path within a class.
    for (rel, o) in objects {
        if !is_image(rel) {
            continue;
        }
        let label = match (kind, rel.split_once('/')) {
            (DatasetKind::ImageFolder, Some((class, _))) => ds.class_label(class),
            (DatasetKind::ImageFolder, None) => continue,
            (_, Some(_)) => continue,
            (_, None) => -1,
        };
        ds.push_object(remote.url(&o.key).as_bytes(), o.size, label)?;
        used.push(o.clone());
    }
    store.remember(remote, &used);
    Ok(ds)
}

fn index_shards(
    store: &ObjectStore,
    path: &Path,
    remote: &Arc<Remote>,
    objects: &[(String, ObjectInfo)],
) -> Result<Dataset, DatasetError> {
    let shards: Vec<ObjectInfo> = objects
        .iter()
        .filter(|(r, _)| !r.contains('/') && is_tar(r))
        .map(|(_, o)| o.clone())
        .collect();
    store.remember(remote, &shards);
    let listed: HashMap<&str, &ObjectInfo> =
        objects.iter().map(|(_, o)| (o.key.as_str(), o)).collect();
    let indexed = read_sidecars(store, remote, &shards, &listed);
    // Shards without a usable sidecar are downloaded (into the node cache) and walked.
    let refs: Vec<ObjectRef> = shards
        .iter()
        .zip(&indexed)
        .filter(|(_, i)| i.is_none())
        .map(|(o, _)| object_ref(remote, o))
        .collect();
    // Pinned until the shards are walked.
    let (fetched, _pins) = store.fetch_all(&refs, &Flow::own(&path.to_string_lossy()));
    let mut local = fetched.into_iter();
    let mut ds = Dataset::remote(path, DatasetKind::TarShards);
    let no_cache = OpenOptions {
        kind: Some(DatasetKind::TarShards),
        use_cache: false,
        cache_dir: None,
        threads: 1,
        ..OpenOptions::default()
    };
    for (o, samples) in shards.iter().zip(indexed) {
        let url = remote.url(&o.key);
        if let Some(samples) = samples {
            ds.append_indexed_shard(url.as_bytes(), &samples)?;
            continue;
        }
        let file = local
            .next()
            .expect("one download per shard without a sidecar")
            .map_err(|e| refused(path, e))?;
        let shard = Dataset::open(&file, &no_cache).map_err(|e| DatasetError::BadTar {
            path: url.clone().into(),
            offset: 0,
            reason: e.to_string(),
        })?;
        ds.append_shard(url.as_bytes(), &shard)?;
    }
    Ok(ds)
}

/// Each shard's samples from its sidecar index (`NAME.tar.idx`), fetched through the node
/// cache (all at once; a later open reads them from local disk, the ETag and size checked);
/// `None` for a shard without one, or whose sidecar is unreadable or stale (logged).
fn read_sidecars(
    store: &ObjectStore,
    remote: &Arc<Remote>,
    shards: &[ObjectInfo],
    listed: &HashMap<&str, &ObjectInfo>,
) -> Vec<Option<Vec<IndexedSample>>> {
    let wanted: Vec<(usize, ObjectRef)> = shards
        .iter()
        .enumerate()
        .filter_map(|(i, o)| {
            let key = format!("{}{}", o.key, sidecar::SUFFIX);
            listed.get(key.as_str()).map(|s| (i, object_ref(remote, s)))
        })
        .collect();
    let refs: Vec<ObjectRef> = wanted.iter().map(|(_, r)| r.clone()).collect();
    let mut out = vec![None; shards.len()];
    let (fetched, _pins) = store.fetch_all(&refs, &Flow::own(&remote.url("")));
    for ((i, r), file) in wanted.into_iter().zip(fetched) {
        let samples = file
            .map_err(|e| e.to_string())
            .and_then(|f| std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display())))
            .and_then(|text| sidecar::parse(&text, shards[i].size).map_err(|e| e.to_string()));
        match samples {
            Ok(s) => out[i] = Some(s),
            Err(reason) => {
                let url = remote.url(&r.key);
                tracing::warn!(%url, %reason, "shard index sidecar not used; reading the shard");
            }
        }
    }
    out
}

fn object_ref(remote: &Arc<Remote>, o: &ObjectInfo) -> ObjectRef {
    ObjectRef {
        remote: remote.clone(),
        key: o.key.clone(),
        size: o.size,
        etag: o.etag.clone(),
    }
}

fn refused(path: &Path, e: S3Error) -> DatasetError {
    remote_error(path, e.code, e.message)
}

fn remote_error(path: &Path, code: String, reason: String) -> DatasetError {
    DatasetError::Remote {
        path: path.to_owned(),
        code,
        reason,
    }
}
