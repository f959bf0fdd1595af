//! Streaming (non-temporal) stores of an output row: a batch slot is far larger than the
//! caches and is read next by another process, so writing it through the cache costs a read
//! of every line before it is written (read for ownership) and evicts the augmenter's own rows.
//!
//! # Design
//! - x86_64 only (`_mm_stream_ps`, SSE: every x86_64 CPU has it; `_mm256_stream_ps` for a
//!   32-byte aligned row where the CPU has AVX); elsewhere, and for a destination that is not
//!   16-byte aligned, the caller stores as before.
//! - Streaming stores are weakly ordered: [`fence`] (`sfence`) after the last one of an image
//!   orders them before whatever publishes the slot (an atomic store or a futex wake).

/// Stores `values` into `dst` (native byte order, `dst.len() == 4 * values.len()`) with
/// streaming stores; false, with nothing written, where it cannot (another architecture, an
/// unaligned `dst`).
///
/// # Safety
/// The calling thread must call [`fence`] after its last store of the image and before the
/// image is read by, or published to, another thread or process (streaming stores are not
/// ordered with later stores without it).
#[inline]
pub(super) unsafe fn store_f32(values: &[f32], dst: &mut [u8]) -> bool {
    debug_assert_eq!(dst.len(), values.len() * 4);
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        if !(dst.as_ptr() as usize).is_multiple_of(16) || dst.len() != values.len() * 4 {
            return false;
        }
        if (dst.as_ptr() as usize).is_multiple_of(32) && std::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX (checked just above); `dst` is 32-byte aligned and
            // `4 * values.len()` long (checked above); the caller fences.
            unsafe { store_f32_avx(values, dst) };
            return true;
        }
        let lanes = values.len() / 4 * 4;
        let (head, tail) = values.split_at(lanes);
        for (k, four) in head.chunks_exact(4).enumerate() {
            // SAFETY: `four` is 4 f32s (an unaligned load is allowed); the destination is
            // bytes 16k..16k+16 of `dst`, inside it (its length is 4 * values.len()) and
            // 16-byte aligned (its start is, checked above), as `_mm_stream_ps` requires.
            unsafe {
                let v = _mm_loadu_ps(four.as_ptr());
                _mm_stream_ps(dst.as_mut_ptr().add(16 * k).cast::<f32>(), v);
            }
        }
        for (d, v) in dst[lanes * 4..].chunks_exact_mut(4).zip(tail) {
            d.copy_from_slice(&v.to_ne_bytes());
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (values, dst);
        false
    }
}

/// [`store_f32`] in 32-byte streaming stores, half as many instructions.
///
/// # Safety
/// The CPU must have AVX; `dst` must be 32-byte aligned and `4 * values.len()` bytes long; the
/// caller must [`fence`] as [`store_f32`] says.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn store_f32_avx(values: &[f32], dst: &mut [u8]) {
    use std::arch::x86_64::{_mm256_loadu_ps, _mm256_stream_ps};
    let lanes = values.len() / 8 * 8;
    let (head, tail) = values.split_at(lanes);
    for (k, eight) in head.chunks_exact(8).enumerate() {
        // SAFETY: `eight` is 8 f32s (an unaligned load is allowed); the destination is bytes
        // 32k..32k+32 of `dst`, inside it and 32-byte aligned, as `_mm256_stream_ps` requires.
        unsafe {
            let v = _mm256_loadu_ps(eight.as_ptr());
            _mm256_stream_ps(dst.as_mut_ptr().add(32 * k).cast::<f32>(), v);
        }
    }
    for (d, v) in dst[lanes * 4..].chunks_exact_mut(4).zip(tail) {
        d.copy_from_slice(&v.to_ne_bytes());
    }
}

/// Orders every streaming store made so far before later stores (`sfence`).
#[inline]
pub(super) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no operands and no precondition (SSE, present on every x86_64).
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}
