//! The emulated driver's process-wide state: [`Emu`], which holds each subsystem's state
//! (devices and their primary contexts, streams, events, modules, memory, faults), the current
//! context of each thread, and `cuInit`'s decision. The calls that use it are in
//! [`crate::api`].
//!
//! # Design
//! One mutex guards the state. It is held only for bookkeeping, never while waiting for a
//! stream: stream workers take it too (to mark a context broken), so a caller that waited
//! with it held would deadlock.
//!
//! Primary contexts: one per device, its handle fixed for the life of the process (as the
//! real driver's is). `cuDevicePrimaryCtxRetain` counts up; the release that brings the count
//! to 0 destroys everything made in the context (streams drained, modules unloaded, memory
//! freed); a context-sticky error stays for the life of the process.
//!
//! Each subsystem's state lives in its own module below this one ([`crate::memory`],
//! [`crate::stream`], ...) and knows nothing of `Emu`: a stream worker reports a failed
//! operation through the hook [`spawn_worker`] gives it.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::boundary::{ctx_handle, handle, HandleKind};
use crate::config::Machine;
use crate::faults::Faults;
use crate::memory::MemState;
use crate::module::ModuleEntry;
use crate::status::{self, CUresult, Stickiness};
use crate::stream::{EventState, StreamEntry, Worker};

#[derive(Debug, Default)]
pub(crate) struct CtxState {
    pub(crate) refs: u32,
    /// The status every call in this context returns after a sticky error.
    pub(crate) sticky: Option<CUresult>,
    /// `cuDevicePrimaryCtxSetFlags_v2`'s flags (0: `CU_CTX_SCHED_AUTO`).
    pub(crate) flags: u32,
}

/// `CU_CTX_SCHED_BLOCKING_SYNC`: "Instruct CUDA to block the CPU thread on a synchronization
/// primitive when waiting for the GPU to finish work." (`cuDevicePrimaryCtxSetFlags`)
pub(crate) const CU_CTX_SCHED_BLOCKING_SYNC: u32 = 0x04;

impl CtxState {
    /// Whether the driver's waits in this context sleep (`CU_CTX_SCHED_BLOCKING_SYNC`) rather
    /// than spin.
    pub(crate) fn blocks(&self) -> bool {
        self.flags & CU_CTX_SCHED_BLOCKING_SYNC != 0
    }
}

pub(crate) struct DeviceState {
    pub(crate) ctx: CtxState,
    /// Bytes of device memory in use (`cuMemAlloc`, `cuMemCreate`).
    pub(crate) used: u64,
    /// The status every call on this device returns after it was lost.
    pub(crate) broken: Option<CUresult>,
    /// The legacy default stream (handle 0) of the context, made on first use.
    pub(crate) null_stream: Option<Arc<Worker>>,
}

pub(crate) struct Emu {
    pub(crate) machine: Machine,
    pub(crate) devices: Vec<DeviceState>,
    pub(crate) faults: Faults,
    pub(crate) streams: HashMap<u64, StreamEntry>,
    pub(crate) events: HashMap<u64, (usize, Arc<EventState>)>,
    pub(crate) modules: HashMap<u64, ModuleEntry>,
    /// Function handle -> (module handle, kernel name).
    pub(crate) functions: HashMap<u64, (u64, String)>,
    pub(crate) mem: MemState,
    next: u64,
}

impl Emu {
    pub(crate) fn new_handle(&mut self, kind: HandleKind) -> u64 {
        self.next += 1;
        handle(kind, self.next)
    }

    /// The device of the calling thread's current context, if that context is usable.
    pub(crate) fn current(&self) -> Result<usize, CUresult> {
        let h = CURRENT.with(Cell::get);
        if h == 0 {
            return Err(status::INVALID_CONTEXT);
        }
        let dev = self.ctx_device(h)?;
        self.usable(dev)?;
        Ok(dev)
    }

    /// The device a context handle belongs to.
    pub(crate) fn ctx_device(&self, h: u64) -> Result<usize, CUresult> {
        (0..self.devices.len())
            .find(|&d| ctx_handle(d) == h)
            .ok_or(status::INVALID_CONTEXT)
    }

    /// Whether work may be done on `dev`'s context: it is alive and not broken.
    pub(crate) fn usable(&self, dev: usize) -> Result<(), CUresult> {
        let d = &self.devices[dev];
        if let Some(s) = d.broken {
            return Err(s);
        }
        if d.ctx.refs == 0 {
            return Err(status::CONTEXT_IS_DESTROYED);
        }
        if let Some(s) = d.ctx.sticky {
            return Err(s);
        }
        Ok(())
    }

    /// Records a sticky error on `dev`'s context or on the whole device.
    pub(crate) fn break_with(&mut self, dev: usize, code: CUresult) {
        match status::stickiness(code) {
            Stickiness::Call => {}
            Stickiness::Context => self.devices[dev].ctx.sticky = Some(code),
            Stickiness::Device => self.devices[dev].broken = Some(code),
        }
    }

    /// The null stream's worker of `dev`, made on first use. It runs without the configured
    /// delay: synchronous copies go there, and a read that overtook the delayed work of
    /// another stream is exactly what the delay is meant to expose.
    pub(crate) fn null_stream(&mut self, dev: usize) -> Arc<Worker> {
        self.devices[dev]
            .null_stream
            .get_or_insert_with(|| spawn_worker(dev, 0))
            .clone()
    }

    /// The worker of `stream` (0 or the legacy/per-thread markers: the null stream), which
    /// must belong to `dev`.
    pub(crate) fn stream(&mut self, stream: u64, dev: usize) -> Result<Arc<Worker>, CUresult> {
        if stream <= 2 {
            return Ok(self.null_stream(dev));
        }
        match self.streams.get(&stream) {
            Some(s) if s.dev == dev => Ok(s.worker.clone()),
            Some(_) => Err(status::INVALID_CONTEXT),
            None => Err(status::INVALID_HANDLE),
        }
    }

    /// Counts `bytes` more of `dev`'s memory in use (`cuMemAlloc`, `cuMemCreate`);
    /// `CUDA_ERROR_OUT_OF_MEMORY` past the device's configured size.
    pub(crate) fn account(&mut self, dev: usize, bytes: u64) -> Result<(), CUresult> {
        let total = self.machine.devices[dev].config.memory_mib << 20;
        let used = self.devices[dev].used;
        if used + bytes > total {
            return Err(status::OUT_OF_MEMORY);
        }
        self.devices[dev].used = used + bytes;
        Ok(())
    }

    /// Gives back `bytes` of `dev`'s memory.
    pub(crate) fn unaccount(&mut self, dev: usize, bytes: u64) {
        self.devices[dev].used = self.devices[dev].used.saturating_sub(bytes);
    }
}

thread_local! {
    /// The calling thread's current context handle (0: none).
    pub(crate) static CURRENT: Cell<u64> = const { Cell::new(0) };
}

static EMU: OnceLock<Result<Mutex<Emu>, CUresult>> = OnceLock::new();

/// Environment variable that must be `1` for the emulator to initialise.
pub(crate) const GATE_ENV: &str = "STOKER_GPU_EMULATOR";

fn init() -> Result<Mutex<Emu>, CUresult> {
    if std::env::var(GATE_ENV).as_deref() != Ok("1") {
        eprintln!(
            "stoker GPU emulator: refusing to initialise: {GATE_ENV}=1 is not set (this \
             library is a stand-in for libcuda, for tests only)"
        );
        return Err(status::STUB_LIBRARY);
    }
    let machine = crate::config::load().map_err(|e| {
        eprintln!("stoker GPU emulator: bad configuration: {e}");
        status::INVALID_VALUE
    })?;
    let devices = machine
        .devices
        .iter()
        .map(|_| DeviceState {
            ctx: CtxState::default(),
            used: 0,
            broken: None,
            null_stream: None,
        })
        .collect();
    Ok(Mutex::new(Emu {
        faults: Faults::new(&machine.faults),
        machine,
        devices,
        streams: HashMap::new(),
        events: HashMap::new(),
        modules: HashMap::new(),
        functions: HashMap::new(),
        mem: MemState::default(),
        next: 0,
    }))
}

/// `cuInit`: the first call decides for the whole process.
pub(crate) fn initialize() -> CUresult {
    match EMU.get_or_init(init) {
        Ok(_) => status::SUCCESS,
        Err(e) => *e,
    }
}

/// The state, once `cuInit` succeeded.
pub(crate) fn emu() -> Result<&'static Mutex<Emu>, CUresult> {
    match EMU.get() {
        Some(Ok(m)) => Ok(m),
        _ => Err(status::NOT_INITIALIZED),
    }
}

pub(crate) fn lock(m: &Mutex<Emu>) -> MutexGuard<'_, Emu> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A new stream worker on `dev` (see [`Worker::spawn`]); an operation of it that fails breaks
/// `dev`'s context, or the whole device, as its status says.
pub(crate) fn spawn_worker(dev: usize, delay_us: u64) -> Arc<Worker> {
    Worker::spawn(dev, delay_us, stream_failed)
}

/// What a worker does with a failed operation (an injected sticky fault surfacing when the
/// stream reaches it, or a kernel that failed).
fn stream_failed(dev: usize, code: CUresult) {
    if let Ok(m) = emu() {
        lock(m).break_with(dev, code);
    }
}
