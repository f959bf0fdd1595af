//! The CPU backend: reads a unit's files with one batched read, then decodes (JPEG with
//! libjpeg-turbo, only the crop region; PNG and WebP whole) and augments each sample straight into its place in the slot.
//!
//! # Design
//! - Units of up to [`CPU_UNIT_SAMPLES`] samples, complete when `fill` returns.
//! - Each worker thread owns one [`CpuBackend`]: its reader, decoder, augmenter and buffers,
//!   so steady state allocates no byte or pixel buffer per unit (the unit's read requests
//!   and results are small per-unit lists: see the engine's Limitations).
//! - A sample over the size limit is never read (it is read as 0 bytes and reported as
//!   `file_too_large`).
//!
//! # Limitations
//! - Host memory only: a ring with device images is refused when the unit is filled (the
//!   engine never pairs the two).

use std::sync::atomic::Ordering;
use std::time::Instant;

use stoker_kernels::image::RgbImage;
use stoker_wire::ring::{ImageMemory, SlotLayout};

use super::backend::SlotImages;
use super::backend::{
    Backend, BackendFactory, Completion, SampleOutcome, SampleWork, UnitSize, UnitWork,
};
use super::job::Job;
use super::stats::StageStats;
use super::{EngineConfig, PipelineError, Position, CPU_UNIT_SAMPLES};
use crate::engine::backend::BackendKind;
use crate::source::index::Dataset;
use crate::source::local::reader::{ReadRequest, Reader};
use crate::transform::augment::sample_params;
use crate::transform::badsample::BadSample;
use crate::transform::decode::{probe_image, CpuDecoder, DecodeError};
use crate::transform::orient::Orientation;
use views::view_out;

mod finish;
mod views;

/// Makes [`CpuBackend`]s.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackendFactory;

impl BackendFactory for CpuBackendFactory {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn unit_size(&self) -> UnitSize {
        UnitSize::Samples(CPU_UNIT_SAMPLES)
    }
    fn image_memory(&self) -> ImageMemory {
        ImageMemory::Host
    }
    fn make(&self, config: &EngineConfig) -> Result<Box<dyn Backend>, PipelineError> {
        Ok(Box::new(CpuBackend::new(config)?))
    }
}

/// One worker thread's tools, reused for every unit.
pub struct CpuBackend {
    pub(super) reader: Reader,
    pub(super) decoder: CpuDecoder,

    /// The augmenter and the operations' buffers.
    finisher: finish::Finisher,
    /// One read buffer per sample of a unit (grown for a GPU backend's whole batches).
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) image: RgbImage,
    /// `image` turned to its EXIF orientation (when the spec asks and the file has one).
    pub(super) turned: RgbImage,
    replacement_buf: Vec<Vec<u8>>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("bufs", &self.bufs.len())
            .finish_non_exhaustive()
    }
}

/// The sample in position `at` of a slot whose images start at `images`.
///
/// # Safety
/// `images` must be the slot's host images, valid for `layout.image_slot_bytes` bytes, and no
/// one else may touch position `at` while the slice lives (the worker holds the unit).
unsafe fn sample_out<'a>(images: SlotImages, layout: &SlotLayout, at: usize) -> &'a mut [u8] {
    let SlotImages::Host(base) = images else {
        panic!("the CPU backend writes host memory only, got {images:?}");
    };
    assert!(
        at < layout.batch_size,
        "sample {at} of {}",
        layout.batch_size
    );
    // SAFETY: at < batch_size, so the image lies inside the slot's image part (SlotLayout);
    // the caller guarantees exclusive access.
    unsafe {
        std::slice::from_raw_parts_mut(
            base.add(layout.images + at * layout.image_bytes),
            layout.image_bytes,
        )
    }
}

impl CpuBackend {
    /// A backend with its reader, decoder and augmenter set up for `config`.
    pub fn new(config: &EngineConfig) -> Result<CpuBackend, PipelineError> {
        Ok(CpuBackend {
            reader: Reader::new(config.reader, CPU_UNIT_SAMPLES)?,
            decoder: CpuDecoder::new(config.limits)?,
            finisher: finish::Finisher::default(),
            bufs: (0..CPU_UNIT_SAMPLES).map(|_| Vec::new()).collect(),
            image: RgbImage::default(),
            turned: RgbImage::default(),
            replacement_buf: vec![Vec::new()],
        })
    }

    /// Reads every sample of the unit with one batched read into `bufs`; records read stats.
    pub(super) fn read_unit(
        &mut self,
        unit: &UnitWork<'_>,
    ) -> Vec<Result<(), crate::source::local::reader::ReadError>> {
        let count = unit.indices.len();
        if self.bufs.len() < count {
            self.bufs.resize_with(count, Vec::new);
        }
        let t0 = Instant::now();
        let max_file_bytes = unit.config.limits.max_file_bytes;
        let requests: Vec<ReadRequest<'_>> = unit
            .indices
            .iter()
            .map(|&i| capped(request(&unit.job.dataset, i), max_file_bytes))
            .collect();
        self.reader.set_rules(&unit.job.rules);
        let results = crate::source::read_batch(
            &unit.job.dataset,
            &mut self.reader,
            &requests,
            &mut self.bufs[..count],
            unit.due,
        );
        if let Some(t) = unit.config.throttle {
            std::thread::sleep(t.read_delay * u32::try_from(count).unwrap_or(u32::MAX));
        }
        drop(requests);
        let bytes: u64 = (0..count)
            .filter(|&k| results[k].is_ok())
            .map(|k| self.bufs[k].len() as u64)
            .sum();
        let read_ok = results.iter().filter(|r| r.is_ok()).count() as u64;
        unit.stats.read.record_ns(elapsed_ns(t0));
        unit.stats.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        unit.stats.images_read.fetch_add(read_ok, Ordering::Relaxed);
        results
    }

    /// Decodes and augments one sample into `out`; the error says why it is bad.
    pub(super) fn process(
        &mut self,
        sample: Sample<'_>,
        data: &[u8],
        out: &mut [u8],
    ) -> Result<(), BadSample> {
        let job = sample.job;
        let t0 = Instant::now();
        if let Some(t) = sample.config.throttle {
            std::thread::sleep(t.decode_delay);
        }
        let header = probe_image(data)?;
        // The crop is drawn on the image as shown, and only its region is turned.
        let turn = Orientation::applied(job.spec.exif_orientation, header.orientation);
        let (width, height) = turn.shown_size(header.width, header.height);
        let (crop, flip) = sample_params(
            &job.spec,
            width,
            height,
            job.seed,
            sample.pos.epoch,
            sample.index,
        );
        let (out_h, out_w) = job.spec.crop.output_size();
        self.decoder.set_entry_scope(job.owner);
        self.decoder
            .set_entry_reads_once(job.spec.epochs == Some(1));
        let within = self.decoder.decode_for_crop(
            data,
            turn.to_stored(crop, header.width, header.height),
            turn.shown_size(out_h, out_w),
            &mut self.image,
        )?;
        let (image, within) = if turn == Orientation::STORED {
            (&self.image, within)
        } else {
            turn.turn(&self.image, &mut self.turned);
            let shown = turn.to_shown(within, self.image.width, self.image.height);
            (&self.turned, shown)
        };
        let t1 = Instant::now();
        let key = finish::ViewKey {
            spec: &job.view_specs[0],
            pixels: job.pixel_specs[0].as_ref(),
            seed: job.seed,
            epoch: sample.pos.epoch,
            index: sample.index,
        };
        self.finisher.finish_view(image, within, flip, key, out);
        let decode_ns = u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX);
        let augment_ns = elapsed_ns(t1);
        // The decode and augment counts of the metrics are these histograms' counts.
        sample.stats.decode.record_ns(decode_ns);
        sample.stats.augment.record_ns(augment_ns);
        Ok(())
    }
}

impl CpuBackend {
    /// Decodes and augments one sample into position `at` of the slot: one view as
    /// [`CpuBackend::process`], several as [`CpuBackend::process_views`].
    ///
    /// # Safety
    /// As [`sample_out`] for position `at` of `images`.
    unsafe fn process_at(
        &mut self,
        sample: Sample<'_>,
        data: &[u8],
        images: SlotImages,
        layout: &SlotLayout,
        at: usize,
    ) -> Result<(), BadSample> {
        if layout.views > 1 {
            // SAFETY: the caller's guarantee.
            return unsafe { self.process_views(sample, data, images, layout, at) };
        }
        // SAFETY: the caller's guarantee.
        let out = unsafe { sample_out(images, layout, at) };
        self.process(sample, data, out)
    }
}

/// What `process` needs to know of the sample beyond its bytes.
#[derive(Clone, Copy)]
pub(super) struct Sample<'a> {
    pub(super) job: &'a Job,
    pub(super) pos: Position,
    pub(super) index: u64,
    pub(super) config: &'a EngineConfig,
    pub(super) stats: &'a StageStats,
}

impl Backend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn fill(&mut self, unit: &UnitWork<'_>, outcomes: &mut Vec<SampleOutcome>) -> Completion {
        let results = self.read_unit(unit);
        let max_file_bytes = unit.config.limits.max_file_bytes;
        for (k, read) in results.into_iter().enumerate() {
            let index = unit.indices[k];
            let outcome = match (too_large(&unit.job.dataset, index, max_file_bytes), read) {
                (Some(bad), _) => Err(bad),
                (None, Ok(())) => {
                    let data = std::mem::take(&mut self.bufs[k]);
                    let sample = Sample {
                        job: unit.job,
                        pos: unit.pos,
                        index,
                        config: unit.config,
                        stats: unit.stats,
                    };
                    // SAFETY: the slot's images are host memory of image_slot_bytes
                    // (SlotMemory), and the worker holds this unit, so no one else writes
                    // position start + k.
                    let r = unsafe {
                        self.process_at(sample, &data, unit.images, &unit.layout, unit.start + k)
                    };
                    self.bufs[k] = data;
                    r
                }
                (None, Err(e)) => Err(BadSample::from(&e)),
            };
            outcomes.push(outcome);
        }
        Completion::Done
    }

    fn fill_sample(&mut self, work: &SampleWork<'_>) -> SampleOutcome {
        let max_file_bytes = work.config.limits.max_file_bytes;
        if let Some(bad) = too_large(&work.job.dataset, work.index, max_file_bytes) {
            return Err(bad);
        }
        let req = [request(&work.job.dataset, work.index)];
        self.reader.set_rules(&work.job.rules);
        let read = crate::source::read_batch(
            &work.job.dataset,
            &mut self.reader,
            &req,
            &mut self.replacement_buf[..1],
            work.due,
        );
        if let Some(Err(e)) = read.into_iter().next() {
            return Err(BadSample::from(&e));
        }
        let data = std::mem::take(&mut self.replacement_buf[0]);
        let sample = Sample {
            job: work.job,
            pos: work.pos,
            index: work.index,
            config: work.config,
            stats: work.stats,
        };
        // SAFETY: as in `fill`: host images, and the worker holds the sample's unit.
        let r = unsafe { self.process_at(sample, &data, work.images, &work.layout, work.at) };
        self.replacement_buf[0] = data;
        r
    }

    fn clear_sample(&mut self, images: SlotImages, layout: &SlotLayout, at: usize) {
        for view in 0..layout.views {
            // SAFETY: as in `fill`.
            unsafe { view_out(images, layout, view, at) }.fill(0);
        }
    }
}

pub(super) fn request(dataset: &Dataset, index: u64) -> ReadRequest<'_> {
    // Sample indices are below the dataset's length, a usize.
    #[allow(clippy::cast_possible_truncation)]
    dataset.sample(index as usize).request()
}

/// `file_too_large` when the indexed length of sample `index` is over `max_file_bytes`.
pub(super) fn too_large(dataset: &Dataset, index: u64, max_file_bytes: u64) -> Option<BadSample> {
    #[allow(clippy::cast_possible_truncation)]
    let len = dataset.sample(index as usize).len;
    (len > max_file_bytes).then(|| {
        BadSample::from(DecodeError::FileTooLarge {
            len,
            limit: max_file_bytes,
        })
    })
}

/// `req`, or an empty read of it when it is over `max_file_bytes`.
fn capped(req: ReadRequest<'_>, max_file_bytes: u64) -> ReadRequest<'_> {
    if req.len > max_file_bytes {
        ReadRequest { len: 0, ..req }
    } else {
        req
    }
}

pub(super) fn elapsed_ns(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
