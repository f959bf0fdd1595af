//! Download buffers kept for reuse: an object received into memory goes into a buffer an
//! earlier download left, so its pages are already the process's, not fresh ones the kernel
//! must fault in and clear for every object.
//!
//! # Design
//! One pool per process, a mutex-guarded stack of buffers. A buffer comes back when the last
//! [`Bytes`] of its object goes (its readers had it and its node-cache file was written); one
//! that finds the pool full ([`POOL_MAX_BUFFERS`]), or is larger than [`POOL_MAX_BUFFER_BYTES`],
//! is freed. Sizes are rounded up to [`ROUND`], so buffers fit objects of about their size.
//! Measured on the photos bench (issue 44): page faults of the memory each download landed
//! in were about a tenth of a cold epoch's CPU.
//!
//! # Limitations
//! The pool keeps at most `POOL_MAX_BUFFERS x POOL_MAX_BUFFER_BYTES` after a burst of large
//! objects, until the process ends.

use std::sync::Mutex;

use bytes::Bytes;

/// The most buffers the pool keeps.
const POOL_MAX_BUFFERS: usize = 64;
/// The largest buffer the pool keeps (larger ones are freed).
const POOL_MAX_BUFFER_BYTES: usize = 1 << 20;
/// Buffer sizes are rounded up to a multiple of this.
const ROUND: usize = 64 << 10;

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// An empty buffer that holds `size` bytes without growing: one from the pool if one fits.
pub(crate) fn take(size: usize) -> Vec<u8> {
    if size <= POOL_MAX_BUFFER_BYTES {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = pool.iter().rposition(|b| b.capacity() >= size) {
            return pool.swap_remove(i);
        }
    }
    Vec::with_capacity(size.div_ceil(ROUND).saturating_mul(ROUND).max(size))
}

/// `buf`'s bytes, its memory given back to the pool when the last of them goes.
pub(crate) fn freeze(buf: Vec<u8>) -> Bytes {
    Bytes::from_owner(Pooled(buf))
}

/// A buffer that goes back to the pool when dropped.
struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.0);
        if buf.capacity() > POOL_MAX_BUFFER_BYTES {
            return;
        }
        buf.clear();
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < POOL_MAX_BUFFERS {
            pool.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_to_the_pool_when_its_last_bytes_go() {
        let mut buf = take(100_000);
        assert!(buf.capacity() >= 100_000);
        buf.extend_from_slice(&[7; 100_000]);
        let addr = buf.as_ptr();
        let bytes = freeze(buf);
        let clone = bytes.clone();
        drop(bytes);
        assert_eq!(&clone[..3], &[7, 7, 7], "alive while a clone is");
        drop(clone);
        // Other tests may take buffers meanwhile: look for ours among a few.
        let again: Vec<Vec<u8>> = (0..POOL_MAX_BUFFERS).map(|_| take(100_000)).collect();
        assert!(again.iter().any(|b| b.as_ptr() == addr && b.is_empty()));
        let big = take(POOL_MAX_BUFFER_BYTES + 1);
        assert!(big.capacity() > POOL_MAX_BUFFER_BYTES);
    }
}
