//! Every function the emulated driver exports, and the wrapper each one goes through
//! (initialisation check, fault injection, panics caught).
//!
//! Files: `mod` (the wrapper, [`api`]), `device` (`cuInit`, devices, primary contexts, the
//! current context, the emulator's device queries), `memory` (device and pinned memory,
//! copies), `vmm` (`cuMemCreate`, export and import, reserve / map / set access), `stream`
//! (streams and events), `module` (cubins and launches), `faults` (`stoker_emu_inject_fault`),
//! `stats` (`stoker_emu_live`).
//!
//! # Design
//! The calls sit above the state they use: the process-wide [`crate::state::Emu`], each
//! subsystem's state in the module of the same name at the crate's root ([`crate::memory`],
//! [`crate::stream`], ...), and the boundary's handles and out-parameters
//! ([`crate::boundary`]), none of which knows the calls. Each file here is the `extern "C"`
//! side of one subsystem: argument checks, the statuses, the stats file rewritten after a
//! change ([`crate::stats::changed`]).

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};

use crate::boundary::BOUNDARY;
use crate::state::{emu, lock, Emu, CURRENT};
use crate::status::{self, CUresult, Stickiness};

pub mod device;
pub mod faults;
pub mod memory;
pub mod module;
pub mod stats;
pub mod stream;
pub mod vmm;

/// What an exported call gets: the state, and a fault to raise from its stream work.
pub(crate) struct Api {
    pub(crate) emu: &'static Mutex<Emu>,
    async_fault: Cell<Option<CUresult>>,
}

impl Api {
    pub(crate) fn lock(&self) -> MutexGuard<'static, Emu> {
        lock(self.emu)
    }

    /// A sticky fault injected into this call, which its stream work must raise when it runs
    /// (a GPU reports a kernel's illegal address at the next synchronisation, not at launch).
    pub(crate) fn take_async_fault(&self) -> Option<CUresult> {
        self.async_fault.take()
    }
}

/// Calls that enqueue stream work: a sticky fault injected into them surfaces asynchronously.
const STREAM_CALLS: &[&str] = &[
    "cuLaunchKernel",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
];

/// Runs one exported call: checks `cuInit` happened, injects a configured fault, catches
/// panics (a bug here must not unwind into C).
pub(crate) fn api(name: &'static str, f: impl FnOnce(&Api) -> Result<(), CUresult>) -> CUresult {
    let run = || -> Result<(), CUresult> {
        let api = Api {
            emu: emu()?,
            async_fault: Cell::new(None),
        };
        let fault = api.lock().faults.hit(name);
        if let Some(code) = fault {
            let sticky = status::stickiness(code) != Stickiness::Call;
            if sticky && STREAM_CALLS.contains(&name) {
                api.async_fault.set(Some(code));
            } else {
                let mut e = api.lock();
                if let Ok(dev) = e.ctx_device(CURRENT.with(Cell::get)) {
                    e.break_with(dev, code);
                }
                return Err(code);
            }
        }
        f(&api)
    };
    BOUNDARY.guarded(name, run)
}
