//! A view's operations and RandomErasing on the GPU (docs/cuda.md, "Operations"): the steps
//! of each sample are drawn here by the CPU backend's code, lowered to the kernels'
//! parameters, uploaded with the batch's sample array, and applied by the `stoker_op_*`
//! kernels on the batch's stream.
//!
//! # Design
//! - The draws are the CPU backend's (`draw_steps` on `Stream::Ops`, `draw_erasing` on
//!   `Stream::Erasing`, keyed by the job's seed, the epoch and the sample index), so a sample
//!   gets the same parameters on either backend.
//! - A view with operations: `stoker_augment` crops into an 8-bit buffer with the view's pixel
//!   spec (as the CPU's `augment_into` does), one `op_step` launch per step position
//!   ping-pongs between two buffers (after `op_stats` when a sample's step there needs a
//!   per-image mean or table), `op_convert` normalises into the slot. Without operations the
//!   fused augment writes the slot as before. Then `op_erase` writes the erased boxes.
//! - One table per batch, uploaded from the batch's pinned staging: `n * max_steps` steps,
//!   then `n` heads, then a float pool: the blur weights, then the values of `value="random"`
//!   erasing. Samples the CPU route fills, and failed ones, are zero heads (the CPU route's
//!   upload, queued after, overwrites its places).
//! - `value="random"` erasing: the host draws each element's normal value from the sample's
//!   generator after its box, as the CPU's `erase_into` does (`random_erasing_values`), so
//!   both backends write the same values; `op_erase` reads them from the pool.
//!
//! # Limitations
//! - Random erasing's values travel in the table: 12 bytes per erased pixel per batch, drawn
//!   on the host (as the CPU backend draws them).
//! - Every step position launches over every sample (a copy where a sample has no step), and
//!   the statistics are one thread per image channel: simple, not fast (docs/cuda.md).

use stoker_kernels::augment::{AugmentBatch, KernelError};
use stoker_kernels::ops::{
    FinishBatch, OpStep, OpsBatch, OpsHead, PlainBytes, ERASE_FILL, ERASE_RANDOM, OP_AUTOCONTRAST,
    OP_CONTRAST, OP_EQUALIZE, OP_STATS_BYTES,
};
use stoker_nvidia::cuda::DeviceBuffer;
use stoker_wire::spec::ErasingValue;

use super::staging::HostStaging;
use super::CudaBackend;
use crate::engine::backend::{BackendFault, UnitWork};
use crate::transform::decode::routing::Route;
use crate::transform::ops::{
    draw_erasing, draw_steps, lower, random_erasing_values, ErasingBox, Step,
};
use crate::transform::rng::{KeyedRng, Stream};

/// The operations' buffers, reused between batches.
#[derive(Debug, Default)]
pub(super) struct OpsState {
    /// The ping-pong 8-bit crops.
    pixels: [Option<DeviceBuffer>; 2],
    stats: Option<DeviceBuffer>,
    table: Option<DeviceBuffer>,
    /// The table as uploaded: steps, heads, weights.
    host: Vec<u8>,
    steps: Vec<OpStep>,
    heads: Vec<OpsHead>,
    weights: Vec<f32>,
    /// The random erasing values of the batch, appended to `weights` (the pool uploaded with
    /// the table, which `ERASE_RANDOM` heads index) once the blur weights are in.
    erase_values: Vec<f32>,
    /// Each sample's drawn steps, one after another, and where each sample's end.
    drawn: Vec<Step>,
    ends: Vec<usize>,
    max_steps: usize,
    /// The batch has operations / erasing.
    ops: bool,
    erase: bool,
}

/// The head of a sample erasing `a` with `value`; `value="random"` draws the box's values
/// from `rng` (after the box, as the CPU's `erase_into`) onto `pool`, which the head indexes.
fn erasing_head(
    a: ErasingBox,
    value: &ErasingValue,
    rng: &mut KeyedRng,
    pool: &mut Vec<f32>,
) -> OpsHead {
    // Boxes lie inside the output (u32 sides); the values' index is checked against u32 once
    // the pool is whole (`launch_batch`).
    #[allow(clippy::cast_possible_truncation)]
    let [top, left, height, width, values] =
        [a.top, a.left, a.height, a.width, pool.len()].map(|v| v as u32);
    let (erase, value) = match value {
        ErasingValue::Fill(value) => (ERASE_FILL, *value),
        ErasingValue::Random(_) => {
            random_erasing_values(a, rng, pool);
            (ERASE_RANDOM, [0.0; 3])
        }
    };
    OpsHead {
        erase,
        top,
        left,
        height,
        width,
        value,
        values,
        ..OpsHead::default()
    }
}

impl CudaBackend {
    /// Draws the unit's operations and erasing for the samples the kernels fill and builds
    /// the table; returns its bytes (0: the view has neither).
    pub(super) fn plan_ops(&mut self, unit: &UnitWork<'_>) -> usize {
        let spec = &unit.job.view_specs[0];
        let st = &mut self.ops;
        st.ops = !spec.ops.is_empty();
        st.erase = spec.erasing.is_some();
        st.host.clear();
        if !st.ops && !st.erase {
            return 0;
        }
        let (h, w) = spec.crop.output_size();
        let (seed, epoch) = (unit.job.seed, unit.pos.epoch);
        st.drawn.clear();
        st.ends.clear();
        st.heads.clear();
        st.erase_values.clear();
        for (k, p) in self.plan.iter().enumerate() {
            let index = unit.indices[k];
            let on_gpu = matches!(p.route, Ok(Route::Hardware | Route::Hybrid));
            let mut head = OpsHead {
                zero: u32::from(!on_gpu),
                ..OpsHead::default()
            };
            if on_gpu && st.ops {
                let mut rng = KeyedRng::new(seed, epoch, index, Stream::Ops);
                draw_steps(&spec.ops, &mut rng, w, h, &mut st.drawn);
            }
            st.ends.push(st.drawn.len());
            if let (true, Some(erasing)) = (on_gpu, &spec.erasing) {
                let mut rng = KeyedRng::new(seed, epoch, index, Stream::Erasing);
                if let Some(a) = draw_erasing(erasing, &mut rng, h, w) {
                    head = erasing_head(a, &erasing.value, &mut rng, &mut st.erase_values);
                }
            }
            st.heads.push(head);
        }
        let mut start = 0;
        st.max_steps = st.ends.iter().fold(0, |m, &e| {
            let n = e - start;
            start = e;
            m.max(n)
        });
        st.steps.clear();
        st.weights.clear();
        let mut start = 0;
        for &end in &st.ends {
            for s in &st.drawn[start..end] {
                st.steps.push(lower(s, w, h, &mut st.weights));
            }
            let pad = st.max_steps - (end - start);
            st.steps.extend(std::iter::repeat_n(OpStep::default(), pad));
            start = end;
        }
        // The random erasing values go after the blur weights, in the same pool.
        let base = st.weights.len();
        for head in st.heads.iter_mut().filter(|h| h.erase == ERASE_RANDOM) {
            #[allow(clippy::cast_possible_truncation)]
            let moved = (base + head.values as usize) as u32;
            head.values = moved;
        }
        st.weights.extend_from_slice(&st.erase_values);
        st.host.extend_from_slice(OpStep::bytes(&st.steps));
        st.host.extend_from_slice(OpsHead::bytes(&st.heads));
        st.host.extend_from_slice(f32::bytes(&st.weights));
        st.host.len()
    }

    pub(super) fn launch_fault(&self, what: &str, e: KernelError) -> BackendFault {
        match e {
            KernelError::Cuda(c) => self.fault(what, &c),
            other => self.gpu.fault(what, &other, false),
        }
    }

    /// Queues the batch's kernels: the fused augment into the slot, or, with operations, the
    /// crop to 8 bits, the steps and the conversion; then the erasing. `batch` is the fused
    /// launch's parameters (the slot's first image, the sample array).
    pub(super) fn launch_batch(
        &mut self,
        unit: &UnitWork<'_>,
        staging: &mut HostStaging,
        batch: AugmentBatch,
    ) -> Result<(), BackendFault> {
        if !self.ops.ops && !self.ops.erase {
            // SAFETY: `batch` names the unit's images in the slot and this backend's sample
            // array and decoded images, replaced only after a synchronise (`enqueue`).
            let r = unsafe { self.gpu.kernels.augment(&self.stream, &batch) };
            return r.map_err(|e| self.launch_fault("augment launch", e));
        }
        let table = self.upload_table(staging)?;
        let spec = &unit.job.view_specs[0];
        let mut finish = FinishBatch {
            src: 0,
            dst: batch.dst,
            heads: table + (self.ops.steps.len() * size_of::<OpStep>()) as u64,
            image_bytes: batch.image_bytes,
            n: batch.n,
            out_w: batch.out_w,
            out_h: batch.out_h,
            dtype: batch.dtype,
            layout: batch.layout,
            pad: 0,
            mean: spec.mean,
            std: spec.std,
        };
        if self.ops.ops {
            finish.src = self.run_steps(unit, &batch, table)?;
            // SAFETY: `src` holds the n crops (run_steps), `dst` the unit's images, `heads`
            // the table; all live until a synchronise replaces them.
            let r = unsafe { self.gpu.kernels.op_convert(&self.stream, &finish) };
            r.map_err(|e| self.launch_fault("convert launch", e))?;
        } else {
            // SAFETY: as the fused launch above.
            let r = unsafe { self.gpu.kernels.augment(&self.stream, &batch) };
            r.map_err(|e| self.launch_fault("augment launch", e))?;
        }
        if self.ops.erase {
            if u32::try_from(self.ops.weights.len()).is_err() {
                let reason = "the batch's random erasing values overflow the kernel's index";
                return Err(self.gpu.fault("erase launch", &reason, false));
            }
            let steps_bytes = self.ops.steps.len() * size_of::<OpStep>();
            let heads_bytes = self.ops.heads.len() * size_of::<OpsHead>();
            finish.src = table + (steps_bytes + heads_bytes) as u64;
            // SAFETY: as the conversion; `src` is the table's float pool, which holds every
            // random head's values (plan_ops).
            let r = unsafe { self.gpu.kernels.op_erase(&self.stream, &finish) };
            r.map_err(|e| self.launch_fault("erase launch", e))?;
        }
        Ok(())
    }

    /// Grows the table's device buffer and queues its upload; returns its device address.
    fn upload_table(&mut self, staging: &mut HostStaging) -> Result<u64, BackendFault> {
        let bytes = self.ops.host.len();
        self.gpu
            .grow(&self.stream, &mut self.ops.table, bytes)
            .map_err(|e| self.fault("operations table", &e))?;
        let table = self.ops.table.as_ref().expect("grown").ptr();
        staging
            .upload(self.gpu.device(), &self.stream, table, &self.ops.host)
            .map_err(|e| self.fault("operations table upload", &e))?;
        Ok(table)
    }

    /// The crop to 8 bits and every step position; returns the buffer holding the result.
    fn run_steps(
        &mut self,
        unit: &UnitWork<'_>,
        batch: &AugmentBatch,
        table: u64,
    ) -> Result<u64, BackendFault> {
        let pixel_spec = unit.job.pixel_specs[0]
            .as_ref()
            .expect("a view with operations");
        let n = batch.n as usize;
        let image = pixel_spec.image_bytes();
        for buf in 0..2 {
            self.gpu
                .grow(&self.stream, &mut self.ops.pixels[buf], n * image)
                .map_err(|e| self.fault("operations buffer", &e))?;
        }
        self.gpu
            .grow(&self.stream, &mut self.ops.stats, n * OP_STATS_BYTES)
            .map_err(|e| self.fault("operations statistics", &e))?;
        let ptr = |b: &Option<DeviceBuffer>| b.as_ref().expect("grown").ptr();
        let pixels = [ptr(&self.ops.pixels[0]), ptr(&self.ops.pixels[1])];
        let crop = AugmentBatch::new(pixel_spec, pixels[0], batch.samples, batch.n);
        // SAFETY: pixels[0] holds n crops of the pixel spec; the samples as the fused launch.
        let r = unsafe { self.gpu.kernels.augment(&self.stream, &crop) };
        r.map_err(|e| self.launch_fault("augment launch", e))?;
        let st = &self.ops;
        let steps_bytes = st.steps.len() * size_of::<OpStep>();
        let heads_bytes = st.heads.len() * size_of::<OpsHead>();
        let mut ops = OpsBatch {
            steps: table,
            weights: table + (steps_bytes + heads_bytes) as u64,
            stats: ptr(&st.stats),
            n: batch.n,
            width: batch.out_w,
            height: batch.out_h,
            max_steps: u32::try_from(st.max_steps).unwrap_or(u32::MAX),
            ..OpsBatch::default()
        };
        let mut at = 0;
        for (pos, step) in (0..st.max_steps).zip(0u32..) {
            ops.src = pixels[at];
            ops.dst = pixels[1 - at];
            ops.step = step;
            let needs_stats = (0..n).any(|k| {
                let kind = st.steps[k * st.max_steps + pos].kind;
                matches!(kind, OP_CONTRAST | OP_EQUALIZE | OP_AUTOCONTRAST)
            });
            let stats = if needs_stats {
                // SAFETY: src and dst are the two crop buffers (n images each, distinct), the
                // table and statistics live in this backend's buffers until a synchronise.
                unsafe { self.gpu.kernels.op_stats(&self.stream, &ops) }
            } else {
                Ok(())
            };
            let r = stats.and_then(|()| {
                // SAFETY: as the statistics.
                unsafe { self.gpu.kernels.op_step(&self.stream, &ops) }
            });
            r.map_err(|e| self.launch_fault("operation launch", e))?;
            at = 1 - at;
        }
        Ok(pixels[at])
    }
}
