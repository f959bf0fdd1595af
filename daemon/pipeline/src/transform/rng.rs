//! Deterministic randomness keyed by (seed, epoch, index).
//!
//! Every random choice stoker makes (the epoch's permutation, each sample's crop box and flip,
//! the replacement for a bad sample) is drawn from a [`KeyedRng`] built from the job seed, the
//! epoch, a sample index and a [`Stream`] that separates unrelated uses. The generator is
//! SplitMix64 over a key mixed from those four values: no state is shared between threads, so
//! thread counts, backends and restarts cannot change what is drawn.

#![forbid(unsafe_code)]

/// Separates independent uses of the same (seed, epoch, index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Stream {
    /// The epoch's permutation (index is unused: 0).
    Permutation = 1,
    /// A sample's crop box and flip.
    Augment = 2,
    /// The replacement chosen for a bad sample.
    Replacement = 3,
    /// A view's per-sample operations (the spec's `ops`).
    Ops = 4,
    /// A view's `RandomErasing`.
    Erasing = 5,
    /// A batch's MixUp / CutMix draw (index: the batch's number, not a sample's).
    BatchMix = 6,
}

/// The SplitMix64 finaliser: a bijective 64-bit mix.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// A small, fast generator whose whole output is a function of its key.
#[derive(Debug, Clone)]
pub struct KeyedRng {
    state: u64,
}

impl KeyedRng {
    /// The generator of sample `index` in `epoch` of the job seeded `seed`, for one `stream`
    /// of draws (the same key gives the same draws on every rank, host and backend).
    pub fn new(seed: u64, epoch: u64, index: u64, stream: Stream) -> KeyedRng {
        let mut k = mix64(seed ^ GOLDEN);
        k = mix64(k ^ epoch.wrapping_mul(GOLDEN));
        k = mix64(k ^ index.wrapping_add(0x632b_e59b_d9b4_e019));
        k = mix64(k ^ (stream as u64).wrapping_mul(0xd6e8_feb8_6659_fd93));
        KeyedRng { state: k }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// Uniform in `[0, 1)` with 53 bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)`.
    #[inline]
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// Uniform integer in `[0, n)` (Lemire's method, unbiased). `n` must be > 0.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        loop {
            let m = (self.next_u64() as u128) * (n as u128);
            // The product's low half, by design.
            #[allow(clippy::cast_possible_truncation)]
            let low = m as u64;
            if low >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_possible_wrap
    )]

    use super::*;

    #[test]
    fn same_key_same_stream_different_keys_differ() {
        let a: Vec<u64> = {
            let mut r = KeyedRng::new(7, 1, 42, Stream::Augment);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let mut r = KeyedRng::new(7, 1, 42, Stream::Augment);
        assert!(a.iter().all(|&v| v == r.next_u64()));
        for other in [
            KeyedRng::new(8, 1, 42, Stream::Augment),
            KeyedRng::new(7, 2, 42, Stream::Augment),
            KeyedRng::new(7, 1, 43, Stream::Augment),
            KeyedRng::new(7, 1, 42, Stream::Replacement),
        ] {
            let mut o = other;
            assert_ne!(o.next_u64(), a[0]);
        }
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = KeyedRng::new(1, 0, 0, Stream::Permutation);
        let mut seen = [0u32; 5];
        for _ in 0..5000 {
            seen[r.below(5) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
        let f = r.next_f64();
        assert!((0.0..1.0).contains(&f));
    }
}
