//! The split decode: a batch's engine-decodable images shared between the hardware engines and
//! nvJPEG's GPU-hybrid decoder (`cuda.hw_decode_share`), as nvImageCodec shares a batch
//! (`hw_decoder_load`).
//!
//! # Design
//! - After routing, the first `ceil(share * n)` of the batch's `n` hardware images stay on the
//!   engines; the others go to the GPU-hybrid decoder where it takes them with their region
//!   (else they stay). Both decoders write the same scratch layout, so the kernel and the
//!   pixels' tolerance (PSNR >= 40 dB against the CPU decoder) do not change.
//!
//! # Limitations
//! - The hybrid share is decoded one image at a time with a stream synchronise after each
//!   (the decoupled state's pinned buffer is reused), on the worker's thread, after the
//!   engines' batch is enqueued: not yet nvImageCodec's pool of threads with double-buffered
//!   pinned inputs, so a share below 1 pays only where the engines are the limit. The default
//!   stays 1.0 until a GPU measures it (docs/decisions.md).

#![forbid(unsafe_code)]

use super::CudaBackend;
use crate::transform::decode::routing::Route;

impl CudaBackend {
    /// Moves the batch's hardware images past `hw_share` to the GPU-hybrid decoder.
    pub(super) fn split_hardware(&mut self) {
        if self.hw_share >= 1.0 {
            return;
        }
        let hw = self.routed(Route::Hardware);
        // A share in [0, 1] of a batch's count (config-checked): within usize.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let keep = (hw.len() as f64 * self.hw_share.max(0.0)).ceil() as usize;
        for &k in hw.iter().skip(keep) {
            let roi = self.plan[k].roi;
            let takes = self.decoder.hybrid_supports(&self.cpu.bufs[k], roi, false);
            if takes.unwrap_or(false) {
                self.plan[k].route = Ok(Route::Hybrid);
            }
        }
    }
}
