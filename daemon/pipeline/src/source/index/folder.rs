//! Folder layouts (ImageFolder, Flat): listing class folders and images, stat'ing sizes in
//! parallel, recording folder stamps for the cache.
//!
//! # Design
//! - Class folders are listed in parallel threads, files stat'ed in parallel chunks.
//!
//! # Limitations
//! - A file rewritten in place with another size is not noticed (see the cache).

#![forbid(unsafe_code)]

use super::walk::Listing;
use super::*;

/// Sizes of `paths`, statted in parallel chunks.
pub(super) fn stat_sizes(
    root: &Path,
    paths: &[PathBuf],
    threads: usize,
) -> Vec<Result<u64, (PathBuf, io::Error)>> {
    let done = AtomicU64::new(0);
    let chunk = paths.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let handles = paths
            .chunks(chunk)
            .map(|c| {
                let done = &done;
                s.spawn(move || {
                    c.iter()
                        .map(|p| {
                            let r = fs::metadata(p).map(|m| m.len()).map_err(|e| (p.clone(), e));
                            done.fetch_add(1, Ordering::Relaxed);
                            r
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        wait_with_progress(root, "stat", &done, handles)
            .into_iter()
            .flatten()
            .collect()
    })
}

pub(super) fn index_folder(
    root: &Path,
    kind: DatasetKind,
    threads: usize,
    budget: &WalkBudget,
) -> Result<Dataset, DatasetError> {
    let mut ds = Dataset::empty(root, kind);
    let done = AtomicU64::new(0);
    // (class label, folder, recurse)
    let mut work: Vec<(i64, PathBuf, bool)> = Vec::new();
    if kind == DatasetKind::ImageFolder {
        for e in read_dir_sorted(root)? {
            if entry_is_dir(&e) {
                let label = i64::try_from(ds.classes.len()).unwrap_or(i64::MAX);
                ds.classes
                    .push(e.file_name().to_string_lossy().into_owned());
                work.push((label, e.path(), true));
            }
        }
        ds.stamps
            .push(Stamp::of(root).map_err(|e| DatasetError::io(root, e))?);
    } else {
        work.push((-1, root.to_owned(), false));
    }
    let next = AtomicUsize::new(0);
    type Listed = Vec<(usize, Listing)>;
    let per_worker: Vec<Result<Listed, DatasetError>> = std::thread::scope(|s| {
        let handles = (0..threads.min(work.len()).max(1))
            .map(|_| {
                let (next, work, done) = (&next, &work, &done);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    loop {
                        let w = next.fetch_add(1, Ordering::Relaxed);
                        let Some((_, dir, recurse)) = work.get(w) else {
                            return Ok(mine);
                        };
                        let mut found = Listing::default();
                        let depth = u32::from(*recurse);
                        Walk::new(budget, root)
                            .list_images(dir, *recurse, depth, &mut found, done)?;
                        found.files.sort_unstable_by(|a, b| {
                            a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes())
                        });
                        mine.push((w, found));
                    }
                })
            })
            .collect();
        wait_with_progress(root, "listing", &done, handles)
    });
    let mut listed: Vec<(usize, Listing)> = Vec::with_capacity(work.len());
    for r in per_worker {
        listed.extend(r?);
    }
    listed.sort_unstable_by_key(|(w, _)| *w);
    let mut all = Vec::new();
    let mut others = Vec::new();
    let mut labels = Vec::new();
    for (w, found) in listed {
        if found.files.is_empty() && kind == DatasetKind::ImageFolder {
            tracing::warn!(class = %ds.classes[w], dataset = %root.display(), "class folder has no images");
        }
        labels.resize(labels.len() + found.files.len(), work[w].0);
        all.extend(found.files);
        others.extend(found.others);
        ds.stamps.extend(found.stamps);
        ds.skipped.extend(found.skipped);
    }
    for (i, size) in stat_sizes(root, &all, threads).into_iter().enumerate() {
        let size = size.map_err(|(p, e)| DatasetError::io(&p, e))?;
        let id = ds.push_file(all[i].as_os_str().as_bytes())?;
        ds.push_sample(id, 0, size, labels[i]);
    }
    add_sidecars(&mut ds, root, &all, &others, threads)?;
    Ok(ds)
}

/// Records each image's sidecar files as its fields: `S.X` beside the image `S.E` is field `X`
/// of that image's sample (the longest `S` that is an image's, when a name has several dots).
/// Sidecars are files of the dataset of their own, statted for their length.
fn add_sidecars(
    ds: &mut Dataset,
    root: &Path,
    images: &[PathBuf],
    others: &[PathBuf],
    threads: usize,
) -> Result<(), DatasetError> {
    if others.is_empty() {
        return Ok(()); // No image has a sidecar: no map of a million stems for nothing.
    }
    let stems: HashMap<&[u8], usize> = images
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let b = p.as_os_str().as_bytes();
            Some((&b[..b.iter().rposition(|&c| c == b'.')?], i))
        })
        .rev() // The first image of a stem wins.
        .collect();
    // (sample, field name, sidecar) per sidecar, in walk order.
    let mut found: Vec<(usize, &[u8], &PathBuf)> = Vec::new();
    for path in others {
        let b = path.as_os_str().as_bytes();
        let base = b.iter().rposition(|&c| c == b'/').map_or(0, |i| i + 1);
        let dots = b[base..].iter().enumerate().filter(|(_, &c)| c == b'.');
        let stem = dots.map(|(k, _)| base + k).rev().find_map(|dot| {
            let i = *stems.get(&b[..dot])?;
            Some((i, &b[dot + 1..]))
        });
        if let Some((i, name)) = stem.filter(|(_, name)| !name.is_empty()) {
            found.push((i, name, path));
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    found.sort_by_key(|&(i, _, _)| i);
    let paths: Vec<PathBuf> = found.iter().map(|&(_, _, p)| p.clone()).collect();
    let mut per_sample: Vec<Vec<fields::FieldEntry<'_>>> = vec![Vec::new(); images.len()];
    let mut ids = Vec::with_capacity(paths.len());
    for (k, size) in stat_sizes(root, &paths, threads).into_iter().enumerate() {
        let size = size.map_err(|(p, e)| DatasetError::io(&p, e))?;
        ids.push((ds.push_file(paths[k].as_os_str().as_bytes())?, size));
    }
    for (&(i, name, _), &(id, size)) in found.iter().zip(&ids) {
        per_sample[i].push((name, Some(id), 0, size));
    }
    for (i, fields) in per_sample.iter().enumerate() {
        ds.fields.push_sample(i, fields);
    }
    Ok(())
}
