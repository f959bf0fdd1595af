//! What the caches check before they trust a file: the keyed hash (HMAC-SHA256) of its bytes,
//! recorded when this uid's daemon or tool wrote it (node-cache entries, dataset index caches),
//! and, for the node cache, the file's identity at its last check.
//!
//! # Design
//! - The key is 32 random bytes in `<cache folder>/key` (mode 0600, made once by the first
//!   daemon or tool that opens the folder, shared by all of them). A node-cache entry carries
//!   its tag on its own inode, in the extended attribute [`TAG_XATTR`] (format 2: the byte
//!   [`TAG_FORMAT`], then the 32 bytes), set before the entry gets its name: one file per
//!   entry. Where the file system has no user extended attributes, and for the dataset index
//!   caches, the tag is in `NAME.sum` (64 hex digits, format 1) beside the entry, written
//!   before the entry is moved into place; an entry of either format is read.
//!   A download is tagged as it is received ([`Tagger`]), in the pass that receives it.
//! - A file is hashed again whenever its [`Stamp`] (device, inode, size, modification and
//!   change times) differs from the one of its last good check: after a restart (no stamp
//!   yet) and after any write to it, which no user can make without changing its change time.
//!   Reads of an unchanged file cost one `stat`, not a hash. A stamp is kept only once the
//!   file's change time is [`SETTLED`] old: file times come from a coarse clock, so a write
//!   in the same tick as a check could leave the stamp unchanged ("racily clean", as git
//!   calls it); until then every claim hashes the file again.
//! - An entry without a tag, with a tag that is not 64 hex digits, or whose bytes do not give
//!   its tag is never served: the cache deletes it and fetches the object again.
//!
//! # Limitations
//! A change made below the file system (a disk that flips a bit without the kernel noticing)
//! keeps the stamp and is not seen until the next restart.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The suffix of an entry's tag file.
pub(crate) const TAG_SUFFIX: &str = ".sum";
/// The extended attribute that holds an entry's tag on its inode.
pub(crate) const TAG_XATTR: &str = "user.stoker.tag";
/// The first byte of [`TAG_XATTR`]'s value: its format (1 is the tag file). Any other value,
/// or another length, is a broken tag: the entry is not served.
pub(crate) const TAG_FORMAT: u8 = 2;
/// The key's file name in the cache folder.
pub(crate) const KEY_FILE: &str = "key";
const KEY_BYTES: usize = 32;

/// An entry's keyed hash.
pub(crate) type Tag = [u8; 32];

/// A file's identity as `stat` gives it: equal stamps mean no write reached the file between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

/// How old a file's change time must be for its stamp to be trusted: well above the coarse
/// clock's tick (1 to 10 ms).
pub(crate) const SETTLED: std::time::Duration = std::time::Duration::from_millis(100);

impl Stamp {
    /// The stamp of a file whose metadata is `m`, if it has [`SETTLED`].
    pub(crate) fn settled(m: &fs::Metadata) -> Option<Stamp> {
        let changed = std::time::UNIX_EPOCH
            + std::time::Duration::new(
                u64::try_from(m.ctime()).unwrap_or(0),
                u32::try_from(m.ctime_nsec()).unwrap_or(0),
            );
        let age = std::time::SystemTime::now().duration_since(changed).ok()?;
        (age >= SETTLED).then(|| Stamp::of(m))
    }

    pub(crate) fn of(m: &fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            modified: (m.mtime(), m.mtime_nsec()),
            changed: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The cache folder's key.
pub(crate) struct TagKey(hmac::Key);

impl std::fmt::Debug for TagKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TagKey(..)")
    }
}

impl TagKey {
    /// The key of the (private) folder `dir`, made there if it has none or a broken one.
    pub(crate) fn open(dir: &Path) -> std::io::Result<TagKey> {
        let path = dir.join(KEY_FILE);
        for _ in 0..2 {
            match fs::read(&path) {
                Ok(bytes) if bytes.len() == KEY_BYTES => return Ok(TagKey::from(&bytes)),
                Ok(_) => {
                    tracing::warn!(key = %path.display(), "node cache: a broken key file is replaced; every entry will be fetched again");
                    fs::remove_file(&path)?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let mut bytes = [0u8; KEY_BYTES];
            SystemRandom::new()
                .fill(&mut bytes)
                .map_err(|_| std::io::Error::other("no random bytes for the node cache's key"))?;
            match stoker_private::create_file(&path) {
                Ok(mut f) => {
                    f.write_all(&bytes)?;
                    f.sync_all()?;
                    return Ok(TagKey::from(&bytes));
                }
                // Another process made it first: read theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other(format!(
            "{}: the node cache's key could not be read or made",
            path.display()
        )))
    }

    fn from(bytes: &[u8]) -> TagKey {
        TagKey(hmac::Key::new(hmac::HMAC_SHA256, bytes))
    }

    /// The tag of `data`.
    pub(crate) fn tag_of_bytes(&self, data: &[u8]) -> Tag {
        let mut tag = [0u8; 32];
        tag.copy_from_slice(hmac::sign(&self.0, data).as_ref());
        tag
    }

    /// The tag of the bytes of the file at `path`.
    pub(crate) fn tag_of(&self, path: &Path) -> std::io::Result<Tag> {
        let mut f = fs::File::open(path)?;
        let mut tagger = self.tagger();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            tagger.update(&buf[..n]);
        }
        Ok(tagger.finish())
    }

    /// A tag computed piece by piece, as the bytes arrive: a download is tagged while it is
    /// received, in the one pass that receives it, never by reading its copy back.
    pub(crate) fn tagger(&self) -> Tagger {
        Tagger(hmac::Context::with_key(&self.0))
    }
}

/// The tag of bytes given in pieces ([`TagKey::tagger`]): the same as [`TagKey::tag_of_bytes`]
/// of their concatenation.
pub(crate) struct Tagger(hmac::Context);

impl Tagger {
    /// Adds the next piece.
    pub(crate) fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    /// The tag of every piece added, in order.
    pub(crate) fn finish(self) -> Tag {
        let mut tag = [0u8; 32];
        tag.copy_from_slice(self.0.sign().as_ref());
        tag
    }
}

/// The tag file of the entry at `path`.
pub(crate) fn tag_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(TAG_SUFFIX);
    PathBuf::from(p)
}

/// Writes `tag` as the tag of the entry at `path` (mode 0600).
pub(crate) fn write_tag(path: &Path, tag: &Tag) -> std::io::Result<()> {
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    stoker_private::replace_file(&tag_path(path))?.write_all(hex.as_bytes())
}

/// Records `tag` as the tag of the entry `path` whose bytes `file` holds (not in place yet):
/// on `file`'s inode ([`TAG_XATTR`]), or in the tag file beside `path` where the file system
/// has no user extended attributes.
pub(crate) fn record_tag(file: &fs::File, path: &Path, tag: &Tag) -> std::io::Result<()> {
    let mut value = [TAG_FORMAT; 33];
    value[1..].copy_from_slice(tag);
    match rustix::fs::fsetxattr(file, TAG_XATTR, &value, rustix::fs::XattrFlags::empty()) {
        Err(rustix::io::Errno::OPNOTSUPP) => write_tag(path, tag),
        r => r.map_err(std::io::Error::from),
    }
}

/// The tag recorded for the entry at `path` (on its inode, else in its tag file); `None` if
/// there is none or it is broken.
pub(crate) fn read_tag(path: &Path) -> Option<Tag> {
    let mut value = [0u8; 34];
    match rustix::fs::getxattr(path, TAG_XATTR, &mut value[..]) {
        Ok(33) if value[0] == TAG_FORMAT => return value[1..33].try_into().ok(),
        Ok(_) | Err(rustix::io::Errno::RANGE) => return None,
        Err(_) => {}
    }
    let text = fs::read_to_string(tag_path(path)).ok()?;
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    let mut tag = [0u8; 32];
    for (i, t) in tag.iter_mut().enumerate() {
        *t = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_keyed_recorded_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let key = TagKey::open(dir.path()).unwrap();
        let again = TagKey::open(dir.path()).unwrap();
        let f = dir.path().join("entry");
        fs::write(&f, b"some bytes").unwrap();
        let tag = key.tag_of(&f).unwrap();
        let mut pieces = key.tagger();
        pieces.update(b"some ");
        pieces.update(b"bytes");
        assert_eq!(
            pieces.finish(),
            tag,
            "tagged in pieces as received: the file's tag"
        );
        assert_eq!(key.tag_of_bytes(b"some bytes"), tag);
        assert_eq!(again.tag_of(&f).unwrap(), tag, "one key per folder");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(TagKey::open(other.path()).unwrap().tag_of(&f).unwrap(), tag);
        write_tag(&f, &tag).unwrap();
        assert_eq!(read_tag(&f), Some(tag));
        fs::write(tag_path(&f), "zz").unwrap();
        assert_eq!(read_tag(&f), None);
        fs::write(&f, b"some bytez").unwrap();
        assert_ne!(key.tag_of(&f).unwrap(), tag);
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
