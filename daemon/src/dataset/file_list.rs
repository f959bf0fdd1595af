//! The file-list layout: `path<TAB>label` lines, relative paths resolved against the list's
//! folder.
//!
//! # Design
//! - Empty lines and `#` comments are skipped; a bad line is an error naming its number.
//!
//! # Limitations
//! - Listed files are not re-checked by the cache.
use super::*;

pub(super) fn index_file_list(list: &Path, threads: usize) -> Result<Dataset, DatasetError> {
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
    let base = list.parent().unwrap_or(Path::new("/"));
    let mut paths = Vec::new();
    let mut labels = Vec::new();
    let mut lines = Vec::new();
    for (n, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line_no = n + 1;
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        if line.iter().all(u8::is_ascii_whitespace) || line.first() == Some(&b'#') {
            continue;
        }
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
        paths.push(if p.is_absolute() {
            p.to_owned()
        } else {
            base.join(p)
        });
        labels.push(label);
        lines.push(line_no);
    }
    for (i, size) in stat_sizes(list, &paths, threads).into_iter().enumerate() {
        let size = size.map_err(|(p, e)| DatasetError::BadListLine {
            path: list.to_owned(),
            line: lines[i],
            reason: format!("cannot stat {}: {e}", p.display()),
        })?;
        let id = ds.push_file(paths[i].as_os_str().as_bytes())?;
        ds.push_sample(id, 0, size, labels[i]);
    }
    Ok(ds)
}
