//! Several views of one image on the CPU: the sample is read once and decoded once, and every
//! view is cropped, resized, flipped and normalised from those pixels into its own tensor of
//! the slot.
//!
//! # Design
//! - View `v` draws its crop box and flip from `sample_params(view_spec(v), .., view_seed(seed,
//!   v), epoch, index)`: view 0 draws what a one-view job of the same spec draws, and every
//!   view is a pure function of (seed, epoch, index), so resumes and replacements see the
//!   same views. A replacement is one sample: all its views come from the replacement.
//! - One decode ([`CpuDecoder::decode_for_views`]) covers every view's box at the scale the
//!   most demanding view needs; the decode and augment histograms count one entry per image,
//!   so the metrics' (and the bench's) decode count stays images, not images x views.
//! - EXIF orientation turns the decoded region once; each view's box is mapped into it.
//!
//! # Limitations
//! - A view's pixels equal a one-view job's only where both decode at the same DCT scale
//!   (always when no view downscales by 2 or more).

use stoker_kernels::image::CropBox;
use stoker_wire::ring::SlotLayout;
use stoker_wire::spec::{view_seed, MAX_VIEWS};

use super::finish::ViewKey;
use super::{elapsed_ns, CpuBackend, Sample};
use crate::engine::backend::SlotImages;
use crate::transform::augment::sample_params;
use crate::transform::badsample::BadSample;
use crate::transform::decode::probe_image;
use crate::transform::orient::Orientation;

/// View `view` of the sample in position `at` of a slot whose images start at `images`.
///
/// # Safety
/// As `cpu::sample_out`: `images` must be the slot's host images, valid for
/// `layout.image_slot_bytes` bytes, and no one else may touch position `at` while the slice
/// lives.
pub(super) unsafe fn view_out<'a>(
    images: SlotImages,
    layout: &SlotLayout,
    view: usize,
    at: usize,
) -> &'a mut [u8] {
    let SlotImages::Host(base) = images else {
        panic!("the CPU backend writes host memory only, got {images:?}");
    };
    let offset = layout.view_image(view, at);
    // SAFETY: view_image checked view < views and at < batch_size, so the image lies inside
    // the slot's image part (SlotLayout); the caller guarantees exclusive access.
    unsafe { std::slice::from_raw_parts_mut(base.add(offset), layout.view(view).image_bytes) }
}

impl CpuBackend {
    /// Decodes one sample once and writes each of its views into position `at` of the slot;
    /// the error says why the sample is bad (no view is then written).
    ///
    /// # Safety
    /// As [`view_out`] for every view of position `at`.
    pub(super) unsafe fn process_views(
        &mut self,
        sample: Sample<'_>,
        data: &[u8],
        images: SlotImages,
        layout: &SlotLayout,
        at: usize,
    ) -> Result<(), BadSample> {
        let job = sample.job;
        let t0 = std::time::Instant::now();
        if let Some(t) = sample.config.throttle {
            std::thread::sleep(t.decode_delay);
        }
        let header = probe_image(data)?;
        let turn = Orientation::applied(job.spec.exif_orientation, header.orientation);
        let (width, height) = turn.shown_size(header.width, header.height);
        let n = job.view_specs.len();
        // Per view: its box in stored pixels with its stored output size, and its flip.
        let mut wants = [(CropBox::full(0, 0), (0, 0)); MAX_VIEWS];
        let mut flips = [false; MAX_VIEWS];
        for (v, spec) in job.view_specs.iter().enumerate() {
            let seed = view_seed(job.seed, v);
            let (crop, flip) =
                sample_params(spec, width, height, seed, sample.pos.epoch, sample.index);
            let (out_h, out_w) = spec.crop.output_size();
            let stored = turn.to_stored(crop, header.width, header.height);
            wants[v] = (stored, turn.shown_size(out_h, out_w));
            flips[v] = flip;
        }
        self.decoder.set_entry_scope(job.owner);
        self.decoder
            .set_entry_reads_once(job.spec.epochs == Some(1));
        let region = self
            .decoder
            .decode_for_views(data, &wants[..n], &mut self.image)?;
        let (dw, dh) = (self.image.width, self.image.height);
        let image = if turn == Orientation::STORED {
            &self.image
        } else {
            turn.turn(&self.image, &mut self.turned);
            &self.turned
        };
        let t1 = std::time::Instant::now();
        for (v, spec) in job.view_specs.iter().enumerate() {
            let placed = region.place(wants[v].0);
            let within = if turn == Orientation::STORED {
                placed
            } else {
                turn.to_shown(placed, dw, dh)
            };
            // SAFETY: the caller's guarantee for position `at`.
            let out = unsafe { view_out(images, layout, v, at) };
            let key = ViewKey {
                spec,
                pixels: job.pixel_specs[v].as_ref(),
                seed: view_seed(job.seed, v),
                epoch: sample.pos.epoch,
                index: sample.index,
            };
            self.finisher.finish_view(image, within, flips[v], key, out);
        }
        // One decode and one augment per image, whatever the number of views.
        let decode_ns = u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX);
        sample.stats.decode.record_ns(decode_ns);
        sample.stats.augment.record_ns(elapsed_ns(t1));
        Ok(())
    }
}
