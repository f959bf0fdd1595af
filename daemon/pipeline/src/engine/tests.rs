//! The engine with a backend whose completion the test controls (standing in for a GPU's
//! CUDA event): a slot is published only once its work completed, whole-batch units reach
//! the backend whole, and a fault fails the rank's feed with the backend's reason.

#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use stoker_wire::ring::{ImageMemory, SampleStatus, SlotLayout};
use stoker_wire::spec::PipelineSpec;

use super::*;
use crate::source::index::{Dataset, OpenOptions};
use stoker_tool::synth::{generate, SynthOptions};

/// Opened by the test; counts fills and the largest unit seen.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    fills: Mutex<usize>,
    filled: Condvar,
    largest_unit: AtomicUsize,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
    fn wait_fills(&self, n: usize) {
        let mut fills = self.fills.lock().unwrap();
        while *fills < n {
            fills = self.filled.wait(fills).unwrap();
        }
    }
}

struct GatedFactory {
    gate: Arc<Gate>,
    fault: Option<&'static str>,
}

struct GatedBackend {
    gate: Arc<Gate>,
    fault: Option<&'static str>,
}

struct GatedWork {
    gate: Arc<Gate>,
    fault: Option<&'static str>,
}

impl PendingWork for GatedWork {
    fn wait(self: Box<Self>) -> Result<(), BackendFault> {
        let mut open = self.gate.open.lock().unwrap();
        while !*open {
            open = self.gate.opened.wait(open).unwrap();
        }
        match self.fault {
            None => Ok(()),
            Some(reason) => Err(BackendFault {
                device: "test GPU 0".into(),
                reason: reason.into(),
            }),
        }
    }
}

impl Backend for GatedBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn fill(&mut self, unit: &UnitWork<'_>, outcomes: &mut Vec<SampleOutcome>) -> Completion {
        let SlotImages::Host(base) = unit.images else {
            panic!("host ring expected")
        };
        for (k, &index) in unit.indices.iter().enumerate() {
            let at = unit.start + k;
            // SAFETY: at < batch_size, inside the slot's host images, held by this worker.
            unsafe {
                base.add(at * unit.layout.image_bytes)
                    .write(index as u8 + 1)
            };
            outcomes.push(Ok(()));
        }
        self.gate
            .largest_unit
            .fetch_max(unit.indices.len(), Ordering::Relaxed);
        *self.gate.fills.lock().unwrap() += 1;
        self.gate.filled.notify_all();
        Completion::Pending(Box::new(GatedWork {
            gate: self.gate.clone(),
            fault: self.fault,
        }))
    }
    fn fill_sample(&mut self, _work: &SampleWork<'_>) -> SampleOutcome {
        Ok(())
    }
    fn clear_sample(&mut self, _images: SlotImages, _layout: &SlotLayout, _at: usize) {}
}

impl BackendFactory for GatedFactory {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn unit_size(&self) -> UnitSize {
        UnitSize::Batch
    }
    fn image_memory(&self) -> ImageMemory {
        ImageMemory::Host
    }
    fn make(&self, _config: &EngineConfig) -> Result<Box<dyn Backend>, PipelineError> {
        Ok(Box::new(GatedBackend {
            gate: self.gate.clone(),
            fault: self.fault,
        }))
    }
}

fn job(dir: &std::path::Path, batch: u32) -> Arc<Job> {
    let opts = SynthOptions {
        images: 40,
        classes: 2,
        size_scale: 0.1,
        threads: 1,
        ..SynthOptions::default()
    };
    generate(dir, &opts).unwrap();
    let open = OpenOptions {
        use_cache: false,
        ..OpenOptions::default()
    };
    let dataset = Arc::new(Dataset::open(dir, &open).unwrap());
    Job::new(dataset, PipelineSpec::train(batch, 16), 7, 1).unwrap()
}

fn gated_engine(gate: &Arc<Gate>, fault: Option<&'static str>) -> Arc<Engine> {
    let factory = GatedFactory {
        gate: gate.clone(),
        fault,
    };
    let config = EngineConfig {
        threads: 1,
        ..EngineConfig::default()
    };
    Engine::with_backend(config, &factory).unwrap()
}

#[test]
fn a_batch_is_published_only_after_its_work_completes() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path(), 20);
    let gate = Arc::new(Gate::default());
    let engine = gated_engine(&gate, None);
    let ring = Arc::new(HeapRing::new(&job.spec, 2));
    let feed = engine
        .start_feed(job.clone(), 0, ring.clone(), Position::default())
        .unwrap();
    // Both slots are filled, and `fill` has returned for each, but nothing completed.
    gate.wait_fills(2);
    assert_eq!(feed.recv_timeout(Duration::from_millis(100)).unwrap(), None);
    // Whole batches reach the backend as one unit (the CPU backend cuts units of 16 samples).
    assert_eq!(gate.largest_unit.load(Ordering::Relaxed), 20);
    gate.open();
    let FeedEvent::Ready(r) = feed.recv().unwrap() else {
        panic!("expected a batch")
    };
    assert_eq!((r.epoch, r.step, r.n), (0, 0, 20));
    let l = ring.layout().slot;
    let (images, host) = (ring.images_of(r.slot), ring.host_of(r.slot));
    for at in 0..20 {
        let index = u64::from_ne_bytes(host[l.indices + 8 * at..][..8].try_into().unwrap());
        let label = i64::from_ne_bytes(host[l.labels + 8 * at..][..8].try_into().unwrap());
        assert_eq!(images[at * l.image_bytes], index as u8 + 1, "sample {at}");
        assert_eq!(label, job.dataset.sample(index as usize).label);
        assert_eq!(host[l.status + at], SampleStatus::Ok as u8);
    }
    feed.release(r.slot, r.generation).unwrap();
}

#[test]
fn a_backend_fault_fails_the_feed_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path(), 8);
    let gate = Arc::new(Gate::default());
    let engine = gated_engine(&gate, Some("an illegal memory access was encountered"));
    let ring = Arc::new(HeapRing::new(&job.spec, 2));
    let feed = engine
        .start_feed(job, 0, ring, Position::default())
        .unwrap();
    gate.wait_fills(1);
    gate.open();
    let err = feed.recv().unwrap_err().to_string();
    assert!(
        err.contains("test GPU 0") && err.contains("illegal memory access"),
        "{err}"
    );
}

#[test]
fn a_ring_in_the_wrong_memory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path(), 4);
    let engine = Engine::new(EngineConfig {
        threads: 1,
        ..EngineConfig::default()
    })
    .unwrap();
    let layout = stoker_wire::ring::RingLayout::with_device_images(&job.spec, 2, 4096, 2 << 20);
    assert_eq!(layout.slot, SlotLayout::new(&job.spec));
    struct DeviceRing(stoker_wire::ring::RingLayout);
    // SAFETY: never written: the engine refuses the ring before any worker sees it.
    unsafe impl SlotMemory for DeviceRing {
        fn layout(&self) -> &stoker_wire::ring::RingLayout {
            &self.0
        }
        fn images(&self, _slot: usize) -> SlotImages {
            SlotImages::Device(0)
        }
        fn host_ptr(&self, _slot: usize) -> *mut u8 {
            std::ptr::null_mut()
        }
    }
    let err = engine
        .start_feed(job, 0, Arc::new(DeviceRing(layout)), Position::default())
        .expect_err("refused")
        .to_string();
    assert!(err.contains("cpu backend writes Host memory"), "{err}");
}
