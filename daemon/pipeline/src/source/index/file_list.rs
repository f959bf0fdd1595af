//! The file-list layout: `path<TAB>label` lines, relative paths resolved against the list's
//! folder.
//!
//! # Design
//! - Empty lines and `#` comments are skipped; a bad line is an error naming its number.
//! - A line may name an `s3://bucket/key` URL instead of a path (mixed freely): its size and
//!   ETag come from a HEAD request (all at once, through
//!   [`ObjectStorage::head`]), and a missing
//!   or unreadable object refuses the list, naming the line and the URL. Such entries are
//!   read with the daemon's credentials, so only [`OpenOptions::s3_entries`] allows them.
//!
//! # Limitations
//! - Listed files are not re-checked by the cache.
//! - A list with `s3://` entries is not kept in the index cache (each open HEADs them).

#![forbid(unsafe_code)]

use super::*;

pub(super) fn index_file_list(
    list: &Path,
    threads: usize,
    opts: &OpenOptions,
) -> Result<Dataset, DatasetError> {
    let mut ds = Dataset::empty(list, DatasetKind::FileList);
    if !fs::metadata(list)
        .map_err(|e| DatasetError::io(list, e))?
        .is_file()
    {
        return Err(DatasetError::WrongKind {
            path: list.to_owned(),
            reason: "a file list must be a text file".into(),
        });
    }
    ds.stamps
        .push(Stamp::of(list).map_err(|e| DatasetError::io(list, e))?);
    let mut text = Vec::new();
    open_regular(list)?
        .read_to_end(&mut text)
        .map_err(|e| DatasetError::io(list, e))?;
    let mut paths = Vec::new();
    let mut labels = Vec::new();
    let mut lines = Vec::new();
    for (n, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        if line.iter().all(u8::is_ascii_whitespace) || line.first() == Some(&b'#') {
            continue;
        }
        let (path, label) = parse_line(list, n + 1, line, opts.s3_entries)?;
        paths.push(path);
        labels.push(label);
        lines.push(n + 1);
    }
    let objects = opts.objects.as_deref();
    for (i, found) in sizes(list, &paths, threads, objects)
        .into_iter()
        .enumerate()
    {
        let found = found.map_err(|e| DatasetError::BadListLine {
            path: list.to_owned(),
            line: lines[i],
            reason: e.to_string(),
        })?;
        let id = ds.push_file(&found.path)?;
        if found.object {
            ds.mark_object(id);
        }
        ds.push_sample(id, 0, found.size, labels[i]);
    }
    if let Some(store) = opts.objects.clone().filter(|_| ds.has_objects()) {
        ds.objects = Some(store.bind(&ds));
    }
    Ok(ds)
}

/// Line `line_no` of the list `list`: the path it names (relative ones resolved against the
/// list's folder) and its label.
fn parse_line(
    list: &Path,
    line_no: usize,
    line: &[u8],
    s3_entries: bool,
) -> Result<(PathBuf, i64), DatasetError> {
    let bad = |reason: String| DatasetError::BadListLine {
        path: list.to_owned(),
        line: line_no,
        reason,
    };
    let Some(tab) = line.iter().rposition(|&b| b == b'\t') else {
        return Err(bad("expected `path<TAB>label`, found no tab".into()));
    };
    let (p, l) = (&line[..tab], &line[tab + 1..]);
    if p.is_empty() {
        return Err(bad("empty path".into()));
    }
    let label: i64 = std::str::from_utf8(l)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| {
            bad(format!(
                "label {:?} is not an integer",
                String::from_utf8_lossy(l)
            ))
        })?;
    let p = Path::new(OsStr::from_bytes(p));
    if crate::source::url::is_url(p) && !s3_entries {
        return Err(bad(format!(
            "{}: s3:// entries are read with the daemon's credentials, so only registered \
             datasets and the daemon's own uid (or root) may list them",
            p.display()
        )));
    }
    let path = if p.is_absolute() || crate::source::url::is_url(p) {
        p.to_owned()
    } else {
        list.parent().unwrap_or(Path::new("/")).join(p)
    };
    Ok((path, label))
}

/// A listed file's path as the reader knows it (an URL normalised) and its size.
struct Found {
    path: Vec<u8>,
    size: u64,
    /// Whether it is an object (HEADed), not a local file (stat'ed).
    object: bool,
}

/// Why one entry of a file list cannot be used.
#[derive(Debug, thiserror::Error)]
enum EntryError {
    /// A local file that cannot be stat'ed.
    #[error("cannot stat {}: {source}", path.display())]
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An object the store cannot HEAD.
    #[error("cannot read the object: {0}")]
    Object(HeadError),
    /// An `s3://` entry with no object store to read it from.
    #[error("cannot read the object: no object storage was given to read it from")]
    NoStorage,
    /// An entry neither stat'ed nor HEADed (never happens: each is one or the other).
    #[error("not looked up")]
    NotLookedUp,
}

/// Stats the local paths and HEADs the `s3://` ones, in list order.
fn sizes(
    list: &Path,
    paths: &[PathBuf],
    threads: usize,
    objects: Option<&dyn ObjectStorage>,
) -> Vec<Result<Found, EntryError>> {
    let (remote, local): (Vec<usize>, Vec<usize>) =
        (0..paths.len()).partition(|&i| crate::source::url::is_url(&paths[i]));
    let mut out: Vec<Option<Result<Found, EntryError>>> = (0..paths.len()).map(|_| None).collect();
    let local_paths: Vec<PathBuf> = local.iter().map(|&i| paths[i].clone()).collect();
    for (&i, size) in local.iter().zip(stat_sizes(list, &local_paths, threads)) {
        out[i] = Some(
            size.map(|size| Found {
                path: paths[i].as_os_str().as_bytes().to_vec(),
                size,
                object: false,
            })
            .map_err(|(path, source)| EntryError::Stat { path, source }),
        );
    }
    if !remote.is_empty() {
        let urls: Vec<&Path> = remote.iter().map(|&i| paths[i].as_path()).collect();
        let heads: Vec<Result<RemoteFile, EntryError>> = match objects {
            Some(o) => o
                .head(&urls)
                .into_iter()
                .map(|h| h.map_err(EntryError::Object))
                .collect(),
            None => urls.iter().map(|_| Err(EntryError::NoStorage)).collect(),
        };
        for (&i, head) in remote.iter().zip(heads) {
            out[i] = Some(head.map(|e| Found {
                path: e.url.into_bytes(),
                size: e.size,
                object: true,
            }));
        }
    }
    out.into_iter()
        .map(|f| f.unwrap_or(Err(EntryError::NotLookedUp)))
        .collect()
}
