//! The backend trait: how a unit of work is filled, and when it is complete.
//!
//! The engine (jobs, the fair-share scheduler, in-order publishing, backpressure, bad-sample
//! policy, metrics) is one; a backend is what differs between hardware:
//! - the **CPU backend** ([`super::cpu`]) takes units of up to [`super::CPU_UNIT_SAMPLES`] samples, one
//!   per worker thread at a time, and is complete when `fill` returns;
//! - the **CUDA backend** ([`super::cuda`]) takes whole batches ([`UnitSize::Batch`]), enqueues
//!   decode and the fused kernel on a stream, and returns [`Completion::Pending`] holding the
//!   batch's CUDA event. The engine publishes the slot only once that completion has been
//!   waited for.
//!
//! # Design
//! - A [`BackendFactory`] says the unit size and makes one [`Backend`] per worker thread (a
//!   backend value owns its reader, decoder and scratch memory, so no buffer for bytes or
//!   pixels is allocated per unit in steady state; see the engine's Limitations).
//! - `fill` reports one [`SampleOutcome`] per sample as soon as it knows it (a sample that
//!   cannot be read or decoded is known on the host); the engine then applies the bad-sample
//!   policy, asking the backend to fill deterministic replacements one at a time
//!   ([`Backend::fill_sample`]), and writes labels, indices and status into the slot's host
//!   part. Backends write images only.
//! - A [`Completion::Pending`] is waited for on the engine's completion thread, in the order
//!   the units were filled; a failed wait is a [`BackendFault`] that fails the rank's feed.
//!
//! # Limitations
//! - `fill_sample` and `clear_sample` must be complete when they return (a GPU backend decodes
//!   a replacement on the CPU and uploads it synchronously); replacements are rare.
//! - A backend must not write a sample's images after reporting it bad, since the engine may
//!   write a replacement there.

#![forbid(unsafe_code)]

use std::time::Instant;

use stoker_wire::ring::{ImageMemory, SlotLayout};

use super::job::Job;
use super::stats::StageStats;
use super::{EngineConfig, PipelineError, Position};
use crate::transform::badsample::BadSample;
use crate::transform::mix::MixDraw;

/// What became of one sample a backend was asked to fill.
pub type SampleOutcome = Result<(), BadSample>;

/// How many samples of one batch a unit of work holds at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitSize {
    /// Up to this many samples (the CPU backend: [`super::CPU_UNIT_SAMPLES`]).
    Samples(usize),
    /// The whole batch (a GPU backend).
    Batch,
}

impl UnitSize {
    /// The unit's size in samples for a batch of `batch_len` samples (at least 1).
    pub fn samples(self, batch_len: usize) -> usize {
        match self {
            UnitSize::Samples(n) => n.max(1),
            UnitSize::Batch => batch_len.max(1),
        }
    }
}

/// Where one slot's images are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotImages {
    /// Host memory, valid for `layout().slot.image_slot_bytes` bytes.
    Host(*mut u8),
    /// A device address (CUDA `CUdeviceptr`) on the ring's GPU, valid for
    /// `layout().slot.image_slot_bytes` bytes.
    Device(u64),
}

/// One unit of work as a backend sees it: samples `start..start + indices.len()` of the batch
/// at `pos` of `job`, to be written into the slot whose images are at `images`.
pub struct UnitWork<'a> {
    /// The job whose batch this is (its dataset, spec and seed).
    pub job: &'a Job,
    /// The batch's position: with the job's seed and a sample's index it draws the sample's
    /// crop and flip (see [`crate::transform::augment::sample_params`]).
    pub pos: Position,
    /// Position within the batch of the unit's first sample.
    pub start: usize,
    /// Global dataset indices of the unit's samples, in batch order.
    pub indices: &'a [u64],
    /// The slot's images (its first image, not the unit's).
    pub images: SlotImages,
    /// The ring's slot layout (image size, dtype, memory order).
    pub layout: SlotLayout,
    /// The engine's configuration (reader, limits, bad-sample policy).
    pub config: &'a EngineConfig,
    /// Where the worker records its stage times and counts.
    pub stats: &'a StageStats,
    /// When the batch is due: a read waits for an object no longer (see
    /// [`crate::source::read_batch`]); `None` for a batch with no object to wait for.
    pub due: Option<Instant>,
}

impl std::fmt::Debug for UnitWork<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnitWork")
            .field("pos", &self.pos)
            .field("start", &self.start)
            .field("samples", &self.indices.len())
            .field("images", &self.images)
            .finish_non_exhaustive()
    }
}

/// One sample filled on its own (a replacement for a bad one): sample `index` into position
/// `at` of the batch at `pos`.
pub struct SampleWork<'a> {
    /// The job whose batch this is.
    pub job: &'a Job,
    /// The batch's position (draws the sample's crop and flip with `index`).
    pub pos: Position,
    /// Global dataset index of the sample to fill.
    pub index: u64,
    /// Position within the batch to fill.
    pub at: usize,
    /// The slot's images (its first image).
    pub images: SlotImages,
    /// The ring's slot layout.
    pub layout: SlotLayout,
    /// The engine's configuration.
    pub config: &'a EngineConfig,
    /// Where the worker records its stage times and counts.
    pub stats: &'a StageStats,
    /// When the batch is due (see [`UnitWork::due`]).
    pub due: Option<Instant>,
}

impl std::fmt::Debug for SampleWork<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SampleWork")
            .field("pos", &self.pos)
            .field("index", &self.index)
            .field("at", &self.at)
            .field("images", &self.images)
            .finish_non_exhaustive()
    }
}

/// A whole batch a backend filled into device memory, to be mixed there ([`Backend::mix`]): the
/// whole batch, every sample settled (`engine::mix`).
#[derive(Debug, Clone, Copy)]
pub struct MixWork<'a> {
    /// The job's spec (the dtype and layout of the images).
    pub spec: &'a stoker_wire::spec::PipelineSpec,
    /// What the batch drew: the same as the CPU backend draws for it.
    pub draw: MixDraw,
    /// The slot's images (its first image).
    pub images: SlotImages,
    /// The ring's slot layout (each view's place and size).
    pub layout: SlotLayout,
    /// Samples served in the batch (the padding of a short batch is not mixed).
    pub n: usize,
}

/// A GPU (or other hardware) failure that leaves a unit's images unwritten.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{device}: {reason}")]
pub struct BackendFault {
    /// The device, as users know it (e.g. "GPU 0 (GPU-6f1c...)").
    pub device: String,
    /// What failed, as the device's library said it (a CUDA or nvJPEG error's text).
    pub reason: String,
}

/// Work a backend enqueued and that completes later (a CUDA event).
pub trait PendingWork: Send {
    /// Blocks until the work is complete; an error says why it never will be.
    fn wait(self: Box<Self>) -> Result<(), BackendFault>;
}

/// When a filled unit's images are complete.
pub enum Completion {
    /// When `fill` returned (the CPU backend).
    Done,
    /// When this completes; the slot is published only after.
    Pending(Box<dyn PendingWork>),
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Completion::Done => f.write_str("Done"),
            Completion::Pending(_) => f.debug_tuple("Pending").finish_non_exhaustive(),
        }
    }
}

/// Fills units of work into ring slots. One value per worker thread.
pub trait Backend: Send {
    /// Which backend this is (metrics labels, status).
    fn kind(&self) -> BackendKind;

    /// Starts filling the unit's images, pushes one outcome per sample in order onto
    /// `outcomes` (which is empty on entry), and says when the images are complete.
    fn fill(&mut self, unit: &UnitWork<'_>, outcomes: &mut Vec<SampleOutcome>) -> Completion;

    /// Fills one sample, complete on return.
    fn fill_sample(&mut self, work: &SampleWork<'_>) -> SampleOutcome;

    /// Zeroes the images of position `at` (a sample reported failed), complete on return.
    fn clear_sample(&mut self, images: SlotImages, layout: &SlotLayout, at: usize);

    /// Mixes a whole batch this backend filled into device memory (every sample settled),
    /// after the work `filled` stands for; says when the mixed batch is complete. A backend
    /// that writes device memory must override it; host images keep the default (the engine
    /// mixes them itself, `engine::mix`).
    fn mix(&mut self, work: &MixWork<'_>, filled: Completion) -> Completion {
        let _ = work;
        filled
    }
}

/// Which backend serves (each backend says which it is; the `--backend` choice in
/// `stoker_pipeline::engine::choice` resolves to one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// libjpeg-turbo and the CPU augmenter into host memory.
    Cpu,
    /// nvJPEG and the augment kernel on one GPU, into device memory.
    Cuda,
}

impl BackendKind {
    /// The name in metrics labels, logs and status.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// Makes the backends of an engine and says how their work is cut.
pub trait BackendFactory: Send + Sync {
    /// Which backend it makes.
    fn kind(&self) -> BackendKind;
    /// The unit of work.
    fn unit_size(&self) -> UnitSize;
    /// Where the backend writes images (rings given to the engine must hold them there).
    fn image_memory(&self) -> ImageMemory;
    /// One worker thread's backend.
    fn make(&self, config: &EngineConfig) -> Result<Box<dyn Backend>, PipelineError>;
}
