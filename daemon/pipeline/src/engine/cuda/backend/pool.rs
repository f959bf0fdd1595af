//! The batched non-engine decode: the images of a batch that the hardware engines do not
//! decode (the share past `cuda.hw_decode_share`, progressive files, other files the engines
//! refuse) go to a pool of host threads per worker, each with its own nvJPEG decoupled
//! decoders, two pinned buffers used in turn and its own stream (`stoker_nvidia::nvjpeg::
//! HybridLane`), as nvImageCodec's nvJPEG CUDA decoder works.
//!
//! # Design
//! - `cuda.hybrid_threads` threads per worker (default [`DEFAULT_HYBRID_THREADS`]), started at
//!   the worker's first image for the pool. The engines' batch is enqueued first; the pool
//!   then decodes while the engines run. A batch's images are shared out by size (the largest
//!   bitstream to the least loaded thread), so the threads finish close together.
//! - Each image goes to the host-Huffman (hybrid) or GPU-Huffman (GPU-hybrid) decoder by its
//!   pixel count against `cuda.hybrid_huffman_threshold` (progressive files: always hybrid).
//! - A thread records an event on its stream after its images; the worker's stream waits for
//!   those events (`cuStreamWaitEvent`) before the batch's kernels, so no pixel is read
//!   before it is written, and the host never waits on the pool's GPU work.
//! - The bitstreams are moved to the threads and back (no copy); the worker waits for every
//!   thread's report before it goes on, so each image's outcome settles as a single image's
//!   does: an image nvJPEG refuses or fails on goes to the CPU decoder (`settle_nvjpeg`), a
//!   CUDA error fails the batch.
//!
//! # Limitations
//! - The worker waits for the pool's host phases before it plans the kernel (it needs each
//!   image's outcome); the engines' decode and the pool's device phases still overlap.

use std::sync::mpsc;
use std::thread::JoinHandle;

use stoker_nvidia::cuda::{Device, Event, Stream};
use stoker_nvidia::nvjpeg::{DecoupledBackend, DeviceImage, HybridLane, NvjpegDecoder};
use stoker_nvidia::nvjpeg::{NvjpegError, Roi};

use super::CudaBackend;
use crate::engine::backend::BackendFault;
use crate::transform::decode::routing::Route;

/// `cuda.hybrid_threads`' default: two threads per worker (four per GPU), so one thread's
/// host phase runs while another's waits on a pinned buffer.
pub const DEFAULT_HYBRID_THREADS: usize = 2;

/// The most `cuda.hybrid_threads` accepts.
pub const MAX_HYBRID_THREADS: usize = 64;

/// One image for the pool: its place in the batch, its bitstream (moved there and back),
/// its region, its decoder and where it is decoded to.
pub(super) struct PoolImage {
    k: usize,
    jpeg: Vec<u8>,
    roi: Option<Roi>,
    backend: DecoupledBackend,
    out: DeviceImage,
}

/// One image's outcome, with its bitstream back.
struct Decoded {
    k: usize,
    jpeg: Vec<u8>,
    result: Result<(), NvjpegError>,
}

/// A thread's share of a batch, and the event it records after it.
struct Job {
    images: Vec<PoolImage>,
    done: Event,
}

/// What a thread did with a job: each image's outcome, the event back, and whether it was
/// recorded.
struct Report {
    images: Vec<Decoded>,
    done: Event,
    finished: Result<(), NvjpegError>,
}

/// One pool thread: where its jobs go, where its reports come from, its event between jobs.
struct Thread {
    jobs: Option<mpsc::Sender<Job>>,
    reports: mpsc::Receiver<Report>,
    done: Option<Event>,
    handle: Option<JoinHandle<()>>,
}

/// A worker's pool of decode threads (see the module's Design).
pub(super) struct HybridPool {
    threads: Vec<Thread>,
}

impl HybridPool {
    /// `threads` threads, each with a lane of `decoder`'s library on `device`.
    pub(super) fn new(
        decoder: &NvjpegDecoder,
        device: &Device,
        threads: usize,
        label: &str,
    ) -> Result<HybridPool, NvjpegError> {
        let mut pool = HybridPool {
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads.max(1) {
            let lane = decoder.hybrid_lane()?;
            let done = device.event(false)?;
            let (jobs, job_rx) = mpsc::channel::<Job>();
            let (report_tx, reports) = mpsc::channel::<Report>();
            let handle = std::thread::Builder::new()
                .name(format!("stoker-hybrid-{label}-{i}"))
                .spawn(move || run(lane, &job_rx, &report_tx))
                .map_err(|e| NvjpegError::Invalid(format!("cannot start a decode thread: {e}")))?;
            pool.threads.push(Thread {
                jobs: Some(jobs),
                reports,
                done: Some(done),
                handle: Some(handle),
            });
        }
        Ok(pool)
    }

    /// Decodes `images` on the pool's threads into `decoded` (every image comes back, with
    /// its outcome), then makes `stream` wait for each thread's event. An error is the pool's
    /// own (a CUDA error, a thread gone): the batch's fault.
    ///
    /// # Safety
    /// Each image's `out` must name `height * pitch` writable device bytes that stay valid
    /// until `stream`'s work queued after this call has run.
    unsafe fn decode(
        &mut self,
        images: Vec<PoolImage>,
        stream: &Stream,
        decoded: &mut Vec<Decoded>,
    ) -> Result<(), NvjpegError> {
        let mut shares: Vec<(usize, Vec<PoolImage>)> =
            self.threads.iter().map(|_| (0, Vec::new())).collect();
        let mut images = images;
        images.sort_by_key(|i| std::cmp::Reverse(i.jpeg.len()));
        for image in images {
            let least = (0..shares.len()).min_by_key(|&t| shares[t].0).unwrap_or(0);
            shares[least].0 += image.jpeg.len();
            shares[least].1.push(image);
        }
        let mut sent = Vec::new();
        let mut outcome = Ok(());
        for (t, (_, share)) in shares.into_iter().enumerate() {
            if share.is_empty() {
                continue;
            }
            let thread = &mut self.threads[t];
            let (Some(jobs), Some(done)) = (thread.jobs.as_ref(), thread.done.take()) else {
                decoded.extend(share.into_iter().map(|i| i.lost(t)));
                outcome = Err(gone(t));
                continue;
            };
            if let Err(mpsc::SendError(job)) = jobs.send(Job {
                images: share,
                done,
            }) {
                // The thread has exited: its images come back unread, and the pool fails.
                thread.done = Some(job.done);
                decoded.extend(job.images.into_iter().map(|i| i.lost(t)));
                outcome = Err(gone(t));
                continue;
            }
            sent.push(t);
        }
        for t in sent {
            let thread = &mut self.threads[t];
            let Ok(report) = thread.reports.recv() else {
                outcome = Err(gone(t));
                continue;
            };
            decoded.extend(report.images);
            // The pixels are read on `stream` only after the thread's work on its own.
            let waited = report
                .finished
                .and_then(|()| Ok(stream.wait_event(&report.done)?));
            thread.done = Some(report.done);
            outcome = outcome.and(waited);
        }
        outcome
    }
}

fn gone(t: usize) -> NvjpegError {
    NvjpegError::Invalid(format!("hybrid decode thread {t} has exited"))
}

impl PoolImage {
    /// The image of a job a thread never took (it had exited).
    fn lost(self, t: usize) -> Decoded {
        Decoded {
            k: self.k,
            jpeg: self.jpeg,
            result: Err(gone(t)),
        }
    }
}

/// A pool thread: decodes each job's images with its lane, records the job's event after
/// them, reports.
fn run(mut lane: HybridLane, jobs: &mpsc::Receiver<Job>, reports: &mpsc::Sender<Report>) {
    let bound = lane.bind();
    for job in jobs {
        let images = job
            .images
            .into_iter()
            .map(|i| {
                let result = bound.clone().and_then(|()| {
                    // SAFETY: the worker's promise for `out` (`HybridPool::decode`).
                    unsafe { lane.decode(&i.jpeg, i.roi, i.backend, i.out) }
                });
                Decoded {
                    k: i.k,
                    jpeg: i.jpeg,
                    result,
                }
            })
            .collect();
        let finished = lane.finish(&job.done);
        let report = Report {
            images,
            done: job.done,
            finished,
        };
        if reports.send(report).is_err() {
            break;
        }
    }
}

impl Drop for HybridPool {
    fn drop(&mut self) {
        // Closing each channel ends its thread, which waits for its stream as its lane drops.
        for t in &mut self.threads {
            t.jobs = None;
        }
        for t in &mut self.threads {
            if let Some(h) = t.handle.take() {
                let _ = h.join();
            }
        }
    }
}

impl CudaBackend {
    /// Decodes the batch's hybrid-route images on the pool (started on first use), after the
    /// engines' batch was enqueued; an image nvJPEG refuses or fails on goes to the CPU path.
    pub(super) fn decode_on_pool(&mut self) -> Result<(), BackendFault> {
        let ks = self.routed(Route::Hybrid);
        if ks.is_empty() {
            return Ok(());
        }
        if self.pool.is_none() {
            let made = HybridPool::new(
                &self.decoder,
                self.gpu.device(),
                self.hybrid_threads,
                &self.gpu.label,
            );
            self.pool = Some(made.map_err(|e| self.nvjpeg_fault(e))?);
        }
        let threshold = self.huffman_threshold;
        let images: Vec<PoolImage> = ks
            .iter()
            .map(|&k| {
                let p = &self.plan[k];
                PoolImage {
                    k,
                    jpeg: std::mem::take(&mut self.cpu.bufs[k]),
                    roi: p.roi,
                    backend: DecoupledBackend::for_image(p.progressive, p.pixels, threshold),
                    out: self.out(k),
                }
            })
            .collect();
        let mut decoded = Vec::with_capacity(images.len());
        let pool = self.pool.as_mut().expect("started above");
        // SAFETY: each output is its image's region of the batch's scratch (`place`), which is
        // replaced only after a synchronise of the worker's stream, which waits for the pool's
        // events; the kernels of this slot's last batch have read it (`wait_for_scratch`).
        let waited = unsafe { pool.decode(images, &self.stream, &mut decoded) };
        for d in &mut decoded {
            self.cpu.bufs[d.k] = std::mem::take(&mut d.jpeg);
        }
        waited.map_err(|e| self.nvjpeg_fault(e))?;
        for d in decoded {
            self.settle_nvjpeg(d.result, &[d.k], Route::Hybrid)?;
        }
        Ok(())
    }
}
