//! The split decode: a batch's engine-decodable images shared between the hardware engines and
//! the pool of nvJPEG decoupled decoders (`pool`), as nvImageCodec shares a batch
//! (`hw_decoder_load`), set by `cuda.hw_decode_share`.
//!
//! # Design
//! - After routing, the first `ceil(share * n)` of the batch's `n` hardware images stay on the
//!   engines; the others go to the pool where nvJPEG's decoupled decoder for them takes them
//!   with their region (else they stay). Both write the same scratch layout, so the kernel and
//!   the pixels' tolerance (PSNR >= 40 dB against the CPU decoder) do not change.
//! - The engines' batch is enqueued first and the pool decodes meanwhile (`pool`).
//!
//! # Limitations
//! - The default stays 1.0 until a GPU measures the engines' and the pool's rates
//!   (docs/decisions.md).

#![forbid(unsafe_code)]

use super::CudaBackend;
use crate::transform::decode::routing::Route;

impl CudaBackend {
    /// Moves the batch's hardware images past `hw_share` to the pool (`pool`).
    pub(super) fn split_hardware(&mut self) {
        if self.hw_share >= 1.0 {
            return;
        }
        let hw = self.routed(Route::Hardware);
        let keep = engines_keep(hw.len(), self.hw_share);
        for &k in hw.iter().skip(keep) {
            let roi = self.plan[k].roi;
            let takes = self.decoder.hybrid_supports(&self.cpu.bufs[k], roi, false);
            if takes.unwrap_or(false) {
                self.plan[k].route = Ok(Route::Hybrid);
            }
        }
    }
}

/// How many of a batch's `n` engine-decodable images stay on the engines at `share`: `ceil(share
/// * n)`, all of them at 1 or more, none at 0 or less.
fn engines_keep(n: usize, share: f64) -> usize {
    // A share in [0, 1] of a batch's count (config-checked): within usize.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let keep = (n as f64 * share.clamp(0.0, 1.0)).ceil() as usize;
    keep.min(n)
}

#[cfg(test)]
mod tests {
    use super::engines_keep;

    #[test]
    fn the_engines_keep_the_share_rounded_up() {
        assert_eq!(engines_keep(4, 1.0), 4);
        assert_eq!(engines_keep(4, 0.65), 3, "ceil(2.6)");
        assert_eq!(engines_keep(4, 0.5), 2);
        assert_eq!(engines_keep(4, 0.0), 0);
        assert_eq!(engines_keep(256, 0.65), 167, "ceil(166.4)");
        // One image and any share above 0: the engines take it.
        assert_eq!(engines_keep(1, 0.01), 1);
        assert_eq!(engines_keep(0, 0.65), 0);
        // Out of range (the config refuses it): clamped.
        assert_eq!(engines_keep(4, 1.5), 4);
        assert_eq!(engines_keep(4, -1.0), 0);
    }
}
