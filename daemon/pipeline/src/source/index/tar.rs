//! Tar shards (WebDataset-style): reading ustar / GNU / pax headers without extracting, and
//! pairing `key.jpg` with `key.cls` and the key's other members (its fields, see [`fields`]).
//!
//! # Design
//! - Only headers are read; member data is skipped by seeking, so indexing is cheap.
//!
//! # Limitations
//! - Uncompressed archives only.

#![forbid(unsafe_code)]

use super::*;

pub(super) fn index_tar_shards(root: &Path, threads: usize) -> Result<Dataset, DatasetError> {
    let mut ds = Dataset::empty(root, DatasetKind::TarShards);
    let meta = fs::metadata(root).map_err(|e| DatasetError::io(root, e))?;
    let shards: Vec<PathBuf> = if meta.is_dir() {
        ds.stamps
            .push(Stamp::of(root).map_err(|e| DatasetError::io(root, e))?);
        read_dir_sorted(root)?
            .into_iter()
            .filter(|e| is_tar_name(&e.file_name()) && !entry_is_dir(e))
            .map(|e| e.path())
            .collect()
    } else {
        vec![root.to_owned()]
    };
    for (shard, r) in shards
        .iter()
        .zip(read_shard_headers(root, &shards, threads))
    {
        let (stamp, members) = r?;
        ds.stamps.push(stamp);
        let id = ds.push_file(shard.as_os_str().as_bytes())?;
        for key in pair_members(shard, &members, &mut ds.skipped)? {
            if let Some(m) = key.image {
                let member = &members[m];
                let fields: Vec<fields::FieldEntry<'_>> = key
                    .fields
                    .iter()
                    .map(|&(ext, f)| (ext, None, members[f].offset, members[f].size))
                    .collect();
                ds.fields.push_sample(ds.len(), &fields);
                ds.push_sample(id, member.offset, member.size, key.label);
                ds.members.push(&member.name);
            }
        }
    }
    Ok(ds)
}

type ShardHeaders = Result<(Stamp, Vec<TarMember>), DatasetError>;

/// Each shard's stamp and members, in the order of `shards`; read in parallel, one shard per
/// task, in any order.
fn read_shard_headers(root: &Path, shards: &[PathBuf], threads: usize) -> Vec<ShardHeaders> {
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let per_worker: Vec<Vec<(usize, ShardHeaders)>> = std::thread::scope(|s| {
        let handles = (0..threads.min(shards.len()).max(1))
            .map(|_| {
                let (next, done) = (&next, &done);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(shard) = shards.get(i) else {
                            return mine;
                        };
                        let stamp = Stamp::of(shard).map_err(|e| DatasetError::io(shard, e));
                        mine.push((
                            i,
                            stamp.and_then(|st| Ok((st, read_tar_index(shard, done)?))),
                        ));
                    }
                })
            })
            .collect();
        wait_with_progress(root, "tar headers", &done, handles)
    });
    let mut indexed: Vec<(usize, ShardHeaders)> = per_worker.into_iter().flatten().collect();
    indexed.sort_unstable_by_key(|(i, _)| *i);
    indexed.into_iter().map(|(_, r)| r).collect()
}

/// One WebDataset key of a shard: its image member (if any), its label, and its other
/// members (the sample's fields: extension and member index).
pub(super) struct KeySample<'a> {
    pub(super) image: Option<usize>,
    pub(super) label: i64,
    pub(super) fields: Vec<(&'a [u8], usize)>,
}

/// The samples of one shard: per WebDataset key (the name up to the first dot of its last
/// component), in order of first appearance, the image member (if any), the label and the
/// other members. Members that are neither an image nor metadata (`skipped`'s rule) are
/// counted in `skipped` as `SHARD:MEMBER` (they are still fields of their key).
fn pair_members<'a>(
    shard: &Path,
    members: &'a [TarMember],
    skipped: &mut Skipped,
) -> Result<Vec<KeySample<'a>>, DatasetError> {
    let mut keys = fields::KeyMembers::default();
    let mut samples: Vec<KeySample<'a>> = Vec::new();
    for (m, member) in members.iter().enumerate() {
        let name = &member.name[..];
        let skip = |skipped: &mut Skipped| {
            let name = String::from_utf8_lossy(name);
            skipped.add(format!("{}:{name}", shard.display()));
        };
        let (key, Some(ext)) = fields::key_and_ext(name) else {
            skip(skipped);
            continue;
        };
        let is_image = IMAGE_EXTENSIONS
            .iter()
            .any(|e| ext.eq_ignore_ascii_case(e.as_bytes()));
        let is_cls = ext.eq_ignore_ascii_case(b"cls");
        let is_metadata = METADATA_EXTENSIONS
            .iter()
            .any(|e| ext.eq_ignore_ascii_case(e.as_bytes()));
        if !is_image && !is_metadata {
            skip(skipped);
        }
        let s = keys.key(key);
        if s == samples.len() {
            samples.push(KeySample {
                image: None,
                label: -1,
                fields: Vec::new(),
            });
        }
        let sample = &mut samples[s];
        if is_image {
            // The key's last image is its image; an earlier one is a field.
            if let Some(earlier) = sample.image.replace(m) {
                let (_, ext) = fields::key_and_ext(&members[earlier].name);
                sample.fields.push((ext.unwrap_or_default(), earlier));
            }
            continue;
        }
        sample.fields.push((ext, m));
        if is_cls {
            let text = member.data.as_deref().unwrap_or_default();
            sample.label = std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .ok_or_else(|| DatasetError::BadTar {
                    path: shard.to_owned(),
                    offset: member.offset,
                    reason: format!(
                        "member {} is not an integer label",
                        String::from_utf8_lossy(name)
                    ),
                })?;
        }
    }
    Ok(samples)
}

/// One regular-file member of a tar archive.
#[derive(Debug)]
pub(super) struct TarMember {
    pub(super) name: Vec<u8>,
    /// Byte offset of the member's data in the archive.
    pub(super) offset: u64,
    pub(super) size: u64,
    /// The contents, read only for small label members.
    pub(super) data: Option<Vec<u8>>,
}

pub(super) fn parse_octal(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        // GNU base-256: big-endian, the top bit of the first byte is the marker.
        let mut v: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(v);
    }
    let s = field
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0 && b != b' ');
    let mut v: u64 = 0;
    let mut any = false;
    for b in s {
        if !(b'0'..=b'7').contains(&b) {
            return None;
        }
        v = v.checked_mul(8)?.checked_add(u64::from(b - b'0'))?;
        any = true;
    }
    any.then_some(v)
}

pub(super) fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// Parses pax extended header records (`"<len> <key>=<value>\n"`), returning path and size.
pub(super) fn parse_pax(data: &[u8]) -> Option<(Option<Vec<u8>>, Option<u64>)> {
    let (mut path, mut size) = (None, None);
    let mut rest = data;
    while !rest.is_empty() {
        let sp = rest.iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..sp]).ok()?.parse().ok()?;
        if len <= sp + 1 || len > rest.len() {
            return None;
        }
        let rec = &rest[sp + 1..len];
        let rec = rec.strip_suffix(b"\n").unwrap_or(rec);
        let eq = rec.iter().position(|&b| b == b'=')?;
        let (k, v) = (&rec[..eq], &rec[eq + 1..]);
        match k {
            b"path" => path = Some(v.to_vec()),
            b"size" => size = Some(std::str::from_utf8(v).ok()?.parse().ok()?),
            _ => {}
        }
        rest = &rest[len..];
    }
    Some((path, size))
}

/// Why a header block's checksum does not hold.
#[derive(Debug, thiserror::Error)]
enum ChecksumError {
    /// The checksum field is not an octal number.
    #[error("bad checksum field")]
    Field,
    /// The field and the sum of the block's bytes differ.
    #[error("header checksum {want} != computed {sum}")]
    Mismatch { want: u64, sum: u64 },
}

/// Checks a header block's checksum (the sum of its bytes, the checksum field read as spaces).
fn check_checksum(header: &[u8; 512]) -> Result<(), ChecksumError> {
    let want = parse_octal(&header[148..156]).ok_or(ChecksumError::Field)?;
    let sum: u64 = header
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(b)
            }
        })
        .sum();
    if sum != want {
        return Err(ChecksumError::Mismatch { want, sum });
    }
    Ok(())
}

/// A preceding pax header's path and size override the ustar header's.
fn apply_pax(pax: Option<(Option<Vec<u8>>, Option<u64>)>, name: &mut Vec<u8>, size: &mut u64) {
    let Some((path, len)) = pax else {
        return;
    };
    if let Some(p) = path {
        *name = p;
    }
    if let Some(s) = len {
        *size = s;
    }
}

/// A header's member name, with the ustar prefix when there is one.
fn header_name(header: &[u8; 512]) -> Vec<u8> {
    let name = cstr(&header[0..100]).to_vec();
    if &header[257..263] == b"ustar\0" {
        let prefix = cstr(&header[345..500]);
        if !prefix.is_empty() {
            return [prefix, b"/", &name[..]].concat();
        }
    }
    name
}

/// Reads the headers of a tar archive (ustar, GNU long names, pax), skipping member data.
pub(super) fn read_tar_index(
    path: &Path,
    done: &AtomicU64,
) -> Result<Vec<TarMember>, DatasetError> {
    let file = open_regular(path)?;
    let file_len = file
        .metadata()
        .map_err(|e| DatasetError::io(path, e))?
        .len();
    let mut r = BufReader::with_capacity(64 * 1024, file);
    let mut members = Vec::new();
    let mut pos: u64 = 0;
    let mut long_name: Option<Vec<u8>> = None;
    let mut pax: Option<(Option<Vec<u8>>, Option<u64>)> = None;
    let mut header = [0u8; 512];
    loop {
        if pos == file_len {
            break; // No end-of-archive blocks: accepted, as GNU tar does with a warning.
        }
        if pos + 512 > file_len {
            return Err(bad_tar(path, pos, "truncated header".into()));
        }
        r.read_exact(&mut header)
            .map_err(|e| DatasetError::io(path, e))?;
        if header.iter().all(|&b| b == 0) {
            break; // End of archive.
        }
        let (name, size) =
            member_header(&header, path, pos, file_len, long_name.take(), pax.take())?;
        let data_off = pos + 512;
        let padded = size.div_ceil(512) * 512;
        let skip = || {
            i64::try_from(padded)
                .map_err(|_| bad_tar(path, pos, format!("member of {size} bytes is too large")))
        };
        match header[156] {
            b'L' => long_name = Some(cstr(&read_meta(&mut r, path, pos, size)?).to_vec()),
            b'x' => {
                let data = read_meta(&mut r, path, pos, size)?;
                let parsed = parse_pax(&data);
                pax =
                    Some(parsed.ok_or_else(|| bad_tar(path, pos, "malformed pax header".into()))?);
            }
            b'0' | 0 | b'7' => {
                let data = if has_ext(&name, &["cls"]) && size <= 64 {
                    Some(read_meta(&mut r, path, pos, size)?)
                } else {
                    r.seek_relative(skip()?)
                        .map_err(|e| DatasetError::io(path, e))?;
                    None
                };
                members.push(TarMember {
                    name,
                    offset: data_off,
                    size,
                    data,
                });
            }
            _ => {
                // Directories, links, global pax headers, GNU long link names: skipped.
                r.seek_relative(skip()?)
                    .map_err(|e| DatasetError::io(path, e))?;
            }
        }
        pos = data_off + padded;
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(members)
}

/// The name and data size of the member whose header is at `pos`, after the long name or pax
/// record that came before it; errors when the header is corrupt or its data runs past
/// `file_len`.
fn member_header(
    header: &[u8; 512],
    path: &Path,
    pos: u64,
    file_len: u64,
    long_name: Option<Vec<u8>>,
    pax: Option<(Option<Vec<u8>>, Option<u64>)>,
) -> Result<(Vec<u8>, u64), DatasetError> {
    check_checksum(header).map_err(|e| bad_tar(path, pos, e.to_string()))?;
    let mut size = parse_octal(&header[124..136])
        .ok_or_else(|| bad_tar(path, pos, "bad size field".into()))?;
    let mut name = header_name(header);
    apply_pax(pax, &mut name, &mut size);
    if let Some(l) = long_name {
        name = l;
    }
    if pos + 512 + size > file_len {
        let reason = format!("member data of {size} bytes runs past the end of the file");
        return Err(bad_tar(path, pos, reason));
    }
    Ok((name, size))
}

/// Reads the `size` bytes of the metadata member whose header is at `pos` (a long name, a pax
/// record, a class label), at most 1 MiB.
fn read_meta(
    r: &mut BufReader<File>,
    path: &Path,
    pos: u64,
    size: u64,
) -> Result<Vec<u8>, DatasetError> {
    const MAX_META: u64 = 1 << 20;
    if size > MAX_META {
        let reason = format!("metadata member of {size} bytes is too large");
        return Err(bad_tar(path, pos, reason));
    }
    // `size` is at most the metadata limit checked above.
    #[allow(clippy::cast_possible_truncation)]
    let mut buf = vec![0u8; (size.div_ceil(512) * 512) as usize];
    r.read_exact(&mut buf)
        .map_err(|e| DatasetError::io(path, e))?;
    #[allow(clippy::cast_possible_truncation)]
    let size = size as usize;
    buf.truncate(size);
    Ok(buf)
}

fn bad_tar(path: &Path, offset: u64, reason: String) -> DatasetError {
    DatasetError::BadTar {
        path: path.to_owned(),
        offset,
        reason,
    }
}
