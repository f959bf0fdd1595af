//! The parts of a node-cache file name: `<hash of service, bucket, key>-<hash of ETag>-<size>`.

/// The size at the end of a cache file name.
pub(super) fn size_of_name(name: &str) -> Option<u64> {
    let mut parts = name.split('-');
    let (_, _, size) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    size.parse().ok()
}

pub(super) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
