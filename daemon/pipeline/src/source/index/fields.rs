//! Per-sample fields: the members of a WebDataset key other than its image (`key.txt`,
//! `key.json`, `key.cls`, any other bytes), found by the key's extension, read when a batch
//! asks for them.
//!
//! # Design
//! - The index records where each field lies in the sample's shard (offset, length) and its
//!   extension, never its bytes: indexing stays a walk over tar headers, and a field is read
//!   with the sample's own storage and the client's access rules when a batch is filled.
//! - Extensions are interned (a shard set has a handful) and matched as the key's suffix after
//!   its first dot, ASCII case folded to lowercase (`KEY.Seg.PNG` is field `seg.png`).
//! - Storage is compact and flat: per sample a start into one list of (extension id, offset,
//!   length) entries; datasets without fields (folders, file lists) hold nothing.
//!
//! - Folders (ImageFolder, Flat): a sample's fields are its sidecar files, `S.X` beside the
//!   image `S.E` in its folder (field `X`, the longest such `S` when names have several
//!   dots), each a file of the dataset read whole.
//!
//! # Limitations
//! - A file list's extra columns are not fields (yet). An `s3://` dataset carries none except
//!   a shard set indexed from a local copy. A sidecar rewritten in place with another size is
//!   not noticed by the index cache (a longer one is served cut at its indexed length).
//! - A key's image is its last image member; another image member of the same key is a field
//!   by its extension (a `png` mask beside a `jpg`).

#![forbid(unsafe_code)]

use std::collections::HashMap;

/// Longest field name (an extension after the key's first dot) the index records.
pub const MAX_FIELD_NAME: usize = 64;

/// Where one field of one sample lies: in the sample's own file (its shard), or in a file of
/// its own (a folder's sidecar file), by file id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldRef {
    /// The sidecar's file id; `None`: the sample's own file.
    pub file: Option<u32>,
    /// Byte offset of the field's bytes in that file.
    pub offset: u64,
    /// Length of the field's bytes.
    pub len: u64,
}

/// One field as an indexer records it: name, file (`None`: the sample's own), offset, length.
pub(super) type FieldEntry<'a> = (&'a [u8], Option<u32>, u64, u64);

/// `file` of an entry whose field lies in the sample's own file.
const OWN_FILE: u32 = u32::MAX;

/// The fields of every sample of a dataset (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SampleFields {
    /// Interned field names (lowercase extensions).
    names: Vec<Vec<u8>>,
    /// Per sample, where its entries start; one more than samples once any was pushed
    /// (empty: no sample has fields).
    starts: Vec<u64>,
    name_id: Vec<u16>,
    /// Per entry, the sidecar's file id, or [`OWN_FILE`].
    file: Vec<u32>,
    offset: Vec<u64>,
    len: Vec<u64>,
}

impl SampleFields {
    /// Records the fields of the next sample (sample `samples_before`). Samples pushed before
    /// without fields get none.
    pub(super) fn push_sample(&mut self, samples_before: usize, fields: &[FieldEntry<'_>]) {
        if fields.is_empty() && self.starts.is_empty() {
            return;
        }
        if self.starts.is_empty() {
            self.starts.push(0);
        }
        let end = self.name_id.len() as u64;
        while self.starts.len() < samples_before + 1 {
            self.starts.push(end);
        }
        for &(name, file, offset, len) in fields {
            let Some(id) = self.intern(name) else {
                continue;
            };
            self.name_id.push(id);
            self.file.push(file.unwrap_or(OWN_FILE));
            self.offset.push(offset);
            self.len.push(len);
        }
        self.starts.push(self.name_id.len() as u64);
    }

    fn intern(&mut self, name: &[u8]) -> Option<u16> {
        if name.is_empty() || name.len() > MAX_FIELD_NAME {
            return None;
        }
        let lower = name.to_ascii_lowercase();
        if let Some(i) = self.names.iter().position(|n| *n == lower) {
            return u16::try_from(i).ok();
        }
        let id = u16::try_from(self.names.len()).ok()?;
        self.names.push(lower);
        Some(id)
    }

    /// Field `name` (lowercase) of sample `i`, if it has one.
    pub fn get(&self, i: usize, name: &[u8]) -> Option<FieldRef> {
        let id = self.names.iter().position(|n| n == name)?;
        let (start, end) = (*self.starts.get(i)?, *self.starts.get(i + 1)?);
        // Entries are counted in a Vec: they fit a usize.
        #[allow(clippy::cast_possible_truncation)]
        (start as usize..end as usize)
            .find(|&e| usize::from(self.name_id[e]) == id)
            .map(|e| FieldRef {
                file: (self.file[e] != OWN_FILE).then_some(self.file[e]),
                offset: self.offset[e],
                len: self.len[e],
            })
    }

    /// The names of the fields any sample has, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .names
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        v.sort();
        v
    }

    /// Every field of sample `i`.
    pub(super) fn of(&self, i: usize) -> Vec<FieldEntry<'_>> {
        let (Some(&start), Some(&end)) = (self.starts.get(i), self.starts.get(i + 1)) else {
            return Vec::new();
        };
        #[allow(clippy::cast_possible_truncation)]
        (start as usize..end as usize)
            .map(|e| {
                let name = &self.names[usize::from(self.name_id[e])][..];
                let file = (self.file[e] != OWN_FILE).then_some(self.file[e]);
                (name, file, self.offset[e], self.len[e])
            })
            .collect()
    }

    /// Appends this index to a cache file's bytes.
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        let u64 = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
        u64(out, self.names.len() as u64);
        for n in &self.names {
            u64(out, n.len() as u64);
            out.extend_from_slice(n);
        }
        u64(out, self.starts.len() as u64);
        for &s in &self.starts {
            u64(out, s);
        }
        u64(out, self.name_id.len() as u64);
        for e in 0..self.name_id.len() {
            out.extend_from_slice(&self.name_id[e].to_le_bytes());
            out.extend_from_slice(&self.file[e].to_le_bytes());
            u64(out, self.offset[e]);
            u64(out, self.len[e]);
        }
    }

    /// Reads what [`Self::encode`] wrote at the start of `data`, for a dataset of `samples`
    /// samples and `files` files; returns it and the bytes after it, `None` when malformed.
    pub(super) fn decode(
        data: &[u8],
        samples: usize,
        files: usize,
    ) -> Option<(SampleFields, &[u8])> {
        let mut d = Bytes(data);
        let mut f = SampleFields::default();
        for _ in 0..d.u64()? {
            let n = usize::try_from(d.u64()?).ok()?;
            f.names.push(d.take(n)?.to_vec());
        }
        for _ in 0..d.u64()? {
            f.starts.push(d.u64()?);
        }
        let entries = d.u64()?;
        for _ in 0..entries {
            f.name_id
                .push(u16::from_le_bytes(d.take(2)?.try_into().ok()?));
            f.file.push(u32::from_le_bytes(d.take(4)?.try_into().ok()?));
            f.offset.push(d.u64()?);
            f.len.push(d.u64()?);
        }
        let sound = f.starts.is_empty()
            || (f.starts.len() <= samples + 1
                && f.starts[0] == 0
                && f.starts.windows(2).all(|w| w[0] <= w[1])
                && f.starts.last() == Some(&entries));
        let ids_known = f.name_id.iter().all(|&i| usize::from(i) < f.names.len())
            && f.file
                .iter()
                .all(|&i| i == OWN_FILE || (i as usize) < files);
        (sound && ids_known).then_some((f, d.0))
    }
}

/// A cursor over encoded bytes.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = self.0.split_at_checked(n)?;
        self.0 = b;
        Some(a)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Groups a shard's members by WebDataset key: the name up to the first dot of its last path
/// component, and the extension after that dot (`None` when there is no dot).
pub(super) fn key_and_ext(name: &[u8]) -> (&[u8], Option<&[u8]>) {
    let base = name.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    match name[base..].iter().position(|&b| b == b'.') {
        Some(dot) => (&name[..base + dot], Some(&name[base + dot + 1..])),
        None => (name, None),
    }
}

/// Per key (in order of first appearance), the members that are not its image.
#[derive(Debug, Default)]
pub(super) struct KeyMembers<'a> {
    by_key: HashMap<&'a [u8], usize>,
    /// Per key: (extension, member index).
    pub(super) members: Vec<Vec<(&'a [u8], usize)>>,
}

impl<'a> KeyMembers<'a> {
    /// The key's number, given in order of first appearance.
    pub(super) fn key(&mut self, key: &'a [u8]) -> usize {
        let members = &mut self.members;
        *self.by_key.entry(key).or_insert_with(|| {
            members.push(Vec::new());
            members.len() - 1
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_found_by_lowercase_name_per_sample() {
        let mut f = SampleFields::default();
        f.push_sample(0, &[]);
        f.push_sample(1, &[(b"TXT", None, 10, 3), (b"json", Some(4), 0, 5)]);
        f.push_sample(2, &[(b"txt", None, 40, 7)]);
        let at = |file, offset, len| Some(FieldRef { file, offset, len });
        assert_eq!(f.get(0, b"txt"), None);
        assert_eq!(f.get(1, b"txt"), at(None, 10, 3));
        assert_eq!(f.get(1, b"json"), at(Some(4), 0, 5));
        assert_eq!(f.get(2, b"txt"), at(None, 40, 7));
        assert_eq!(f.get(2, b"json"), None);
        assert_eq!(f.get(3, b"txt"), None);
        assert_eq!(f.names(), ["json", "txt"]);
        let mut bytes = Vec::new();
        f.encode(&mut bytes);
        bytes.extend_from_slice(b"rest");
        let (back, rest) = SampleFields::decode(&bytes, 3, 5).unwrap();
        assert_eq!((back, rest), (f.clone(), &b"rest"[..]));
        // More sample starts than samples, an unknown file, a cut encoding: refused.
        assert!(SampleFields::decode(&bytes, 1, 5).is_none());
        assert!(SampleFields::decode(&bytes, 3, 4).is_none());
        assert!(SampleFields::decode(&bytes[..bytes.len() - 10], 3, 5).is_none());
    }

    #[test]
    fn a_dataset_without_fields_holds_nothing() {
        let mut f = SampleFields::default();
        f.push_sample(0, &[]);
        f.push_sample(1, &[]);
        assert_eq!(f, SampleFields::default());
        // A later sample with fields leaves the earlier ones without.
        f.push_sample(2, &[(b"txt", None, 1, 1)]);
        assert_eq!(f.get(0, b"txt"), None);
        let want = FieldRef {
            file: None,
            offset: 1,
            len: 1,
        };
        assert_eq!(f.get(2, b"txt"), Some(want));
    }

    /// A folder's sidecar files are its images' fields, found again from the cache.
    #[test]
    #[allow(clippy::cast_possible_truncation)] // Offsets of a few bytes.
    fn folder_sidecars_are_fields_through_the_cache() {
        use crate::source::index::{Dataset, IndexOrigin, OpenOptions};
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("flat");
        std::fs::create_dir_all(&root).unwrap();
        for (name, bytes) in [
            ("a.jpg", &b"JPEG-a"[..]),
            ("a.txt", b"caption a"),
            ("a.JSON", b"{}"),
            ("b.2023.jpg", b"JPEG-b"),
            ("b.2023.txt", b"caption b"),
            ("b.txt", b"no image b"),
            ("c.png", b"PNG-c"),
            ("notes.md", b"not a sidecar"),
        ] {
            std::fs::write(root.join(name), bytes).unwrap();
        }
        let opts = OpenOptions {
            cache_dir: Some(t.path().join("cache")),
            ..OpenOptions::default()
        };
        std::thread::sleep(std::time::Duration::from_millis(150));
        let walked = Dataset::open_local(&root, &opts).unwrap();
        let cached = Dataset::open_local(&root, &opts).unwrap();
        assert_eq!(
            (walked.origin(), cached.origin()),
            (IndexOrigin::Walked, IndexOrigin::Cache)
        );
        for ds in [&walked, &cached] {
            assert_eq!(ds.len(), 3);
            assert_eq!(ds.field_names(), ["json", "txt"]);
            let read = |i: usize, name: &str| {
                let r = ds.field(i, name)?;
                let src = ds.field_source(i, r);
                let bytes = std::fs::read(src.path).unwrap();
                Some(bytes[src.offset as usize..][..src.len as usize].to_vec())
            };
            assert_eq!(read(0, "txt").as_deref(), Some(&b"caption a"[..]));
            assert_eq!(read(0, "json").as_deref(), Some(&b"{}"[..]));
            assert_eq!(read(1, "txt").as_deref(), Some(&b"caption b"[..]));
            assert_eq!(read(2, "txt"), None);
            assert_eq!(ds.sample(1).path.file_name().unwrap(), "b.2023.jpg");
        }
    }

    #[test]
    fn keys_split_at_the_first_dot_of_the_last_component() {
        assert_eq!(
            key_and_ext(b"a.b/x.seg.png"),
            (&b"a.b/x"[..], Some(&b"seg.png"[..]))
        );
        assert_eq!(key_and_ext(b"dir/noext"), (&b"dir/noext"[..], None));
    }
}
