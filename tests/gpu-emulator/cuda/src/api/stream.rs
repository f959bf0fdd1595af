//! Streams and events: the calls, on the workers and events of [`crate::stream`].
//!
//! # Limitations
//! - Blocking streams (flags 0) do not synchronise with the null stream: every stream behaves
//!   as `CU_STREAM_NON_BLOCKING` (stoker creates only those). The null stream (0,
//!   `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) is one more in-order worker per context.
//! - Stream priorities are recorded and clamped to the range, never used to schedule; graph
//!   capture is not emulated.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::{api, Api};
use crate::boundary::{out, HandleKind};
use crate::state::spawn_worker;
use crate::status::{self, CUresult};
use crate::stream::{EventState, Recorded, StreamEntry, Worker, GREATEST_PRIORITY, LEAST_PRIORITY};

const CU_EVENT_DISABLE_TIMING: u32 = 0x2;
const CU_EVENT_BLOCKING_SYNC: u32 = 0x1;

fn event(a: &Api, e: u64) -> Result<(usize, Arc<EventState>), CUresult> {
    let emu = a.lock();
    let dev = emu.current()?;
    match emu.events.get(&e) {
        Some((d, ev)) if *d == dev => Ok((dev, ev.clone())),
        Some(_) => Err(status::INVALID_CONTEXT),
        None => Err(status::INVALID_HANDLE),
    }
}

fn create_stream(
    a: &Api,
    out_stream: *mut *mut c_void,
    flags: u32,
    priority: i32,
) -> Result<(), CUresult> {
    let mut e = a.lock();
    let dev = e.current()?;
    if flags > 1 {
        return Err(status::INVALID_VALUE);
    }
    let h = e.new_handle(HandleKind::Stream);
    let worker = spawn_worker(dev, e.machine.op_delay_us);
    // SAFETY: out-parameter from the caller.
    unsafe { out(out_stream, h as *mut c_void) }?;
    // "If the specified priority is outside the numerical range returned by
    // cuCtxGetStreamPriorityRange, it will automatically be clamped".
    let priority = priority.clamp(GREATEST_PRIORITY, LEAST_PRIORITY);
    e.streams.insert(
        h,
        StreamEntry {
            dev,
            worker,
            priority,
        },
    );
    Ok(())
}

/// Creates a stream (`CUstream`) of priority 0 in the current context: a worker thread that runs
/// its work in order.
#[no_mangle]
pub extern "C" fn cuStreamCreate(out_stream: *mut *mut c_void, flags: u32) -> CUresult {
    api("cuStreamCreate", |a| create_stream(a, out_stream, flags, 0))
}

/// Creates a stream as `cuStreamCreate` does, with the given priority.
#[no_mangle]
pub extern "C" fn cuStreamCreateWithPriority(
    out_stream: *mut *mut c_void,
    flags: u32,
    priority: i32,
) -> CUresult {
    api("cuStreamCreateWithPriority", |a| {
        create_stream(a, out_stream, flags, priority)
    })
}

/// The priority range of the current context's device: [greatest, least].
#[no_mangle]
pub extern "C" fn cuCtxGetStreamPriorityRange(least: *mut i32, greatest: *mut i32) -> CUresult {
    api("cuCtxGetStreamPriorityRange", |a| {
        a.lock().current()?;
        // "A NULL may be passed in for *leastPriority or *greatestPriority if the value is not
        // desired."
        for (p, v) in [(least, LEAST_PRIORITY), (greatest, GREATEST_PRIORITY)] {
            if !p.is_null() {
                // SAFETY: a non-null out-parameter from the caller.
                unsafe { p.write(v) };
            }
        }
        Ok(())
    })
}

/// Writes a stream's priority (0 for the null and per-thread default streams).
#[no_mangle]
pub extern "C" fn cuStreamGetPriority(stream: *mut c_void, priority: *mut i32) -> CUresult {
    api("cuStreamGetPriority", |a| {
        let e = a.lock();
        let dev = e.current()?;
        let p = match stream as u64 {
            0..=2 => 0,
            h => match e.streams.get(&h) {
                Some(s) if s.dev == dev => s.priority,
                Some(_) => return Err(status::INVALID_CONTEXT),
                None => return Err(status::INVALID_HANDLE),
            },
        };
        // SAFETY: out-parameter from the caller.
        unsafe { out(priority, p) }
    })
}

/// Destroys a stream of the current context without waiting; work already enqueued still runs.
#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: *mut c_void) -> CUresult {
    api("cuStreamDestroy_v2", |a| {
        let mut e = a.lock();
        let dev = e.current()?;
        let h = stream as u64;
        match e.streams.get(&h) {
            Some(s) if s.dev == dev => {}
            Some(_) => return Err(status::INVALID_CONTEXT),
            None => return Err(status::INVALID_HANDLE),
        }
        let s = e.streams.remove(&h).expect("checked above");
        s.worker.close();
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Waits until the work enqueued on `stream` so far has run; returns the context's sticky error,
/// if any.
#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: *mut c_void) -> CUresult {
    api("cuStreamSynchronize", |a| {
        let (dev, w, blocks) = {
            let mut e = a.lock();
            let dev = e.current()?;
            let blocks = e.devices[dev].ctx.blocks();
            (dev, e.stream(stream as u64, dev)?, blocks)
        };
        // The primary context's default scheduling (`CU_CTX_SCHED_AUTO`) spins while there are
        // no more contexts than processors, as here; `CU_CTX_SCHED_BLOCKING_SYNC` blocks.
        if blocks {
            w.wait(w.tail());
        } else {
            w.spin(w.tail());
        }
        a.lock().usable(dev)
    })
}

/// `CUDA_SUCCESS` once the work enqueued on `stream` has run, `CUDA_ERROR_NOT_READY` before.
#[no_mangle]
pub extern "C" fn cuStreamQuery(stream: *mut c_void) -> CUresult {
    api("cuStreamQuery", |a| {
        let mut e = a.lock();
        let dev = e.current()?;
        let w = e.stream(stream as u64, dev)?;
        if w.is_done(w.tail()) {
            Ok(())
        } else {
            Err(status::NOT_READY)
        }
    })
}

/// `cuCtxSynchronize`: waits for every stream of the current context.
#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    api("cuCtxSynchronize", |a| {
        let (dev, workers, blocks) = {
            let mut e = a.lock();
            let dev = e.current()?;
            let mut w: Vec<Arc<Worker>> = e
                .streams
                .values()
                .filter(|s| s.dev == dev)
                .map(|s| s.worker.clone())
                .collect();
            w.push(e.null_stream(dev));
            (dev, w, e.devices[dev].ctx.blocks())
        };
        for w in workers {
            if blocks {
                w.wait(w.tail());
            } else {
                w.spin(w.tail());
            }
        }
        a.lock().usable(dev)
    })
}

/// Makes later work on `stream` wait for the event's last record, which may be on another
/// device.
#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: *mut c_void, ev: *mut c_void, flags: u32) -> CUresult {
    api("cuStreamWaitEvent", |a| {
        // `CU_EVENT_WAIT_EXTERNAL` (1) "is invalid outside of stream capture", which the
        // emulator does not have: `CUDA_ERROR_ILLEGAL_STATE` on an H100 (docs/results/
        // gpu-check-2026-11-26-h100/probe.json); other flags are undefined.
        match flags {
            0 => {}
            1 => return Err(status::ILLEGAL_STATE),
            _ => return Err(status::INVALID_VALUE),
        }
        // "hEvent may be from a different context or device than hStream."
        let e = {
            let emu = a.lock();
            emu.current()?;
            emu.events.get(&(ev as u64)).map(|(_, e)| e.clone())
        }
        .ok_or(status::INVALID_HANDLE)?;
        let w = {
            let mut emu = a.lock();
            let dev = emu.current()?;
            emu.stream(stream as u64, dev)?
        };
        if let Some(r) = e.recorded() {
            w.submit(Box::new(move || {
                r.worker.wait(r.ticket);
                Ok(())
            }));
        }
        Ok(())
    })
}

/// `CUhostFn`.
pub type HostFn = unsafe extern "C" fn(*mut c_void);

/// Enqueues a call of `f(user_data)` on `stream`, run on its worker in order.
#[no_mangle]
pub extern "C" fn cuLaunchHostFunc(
    stream: *mut c_void,
    f: Option<HostFn>,
    user_data: *mut c_void,
) -> CUresult {
    api("cuLaunchHostFunc", |a| {
        let f = f.ok_or(status::INVALID_VALUE)?;
        let mut e = a.lock();
        let dev = e.current()?;
        let w = e.stream(stream as u64, dev)?;
        let data = user_data as usize;
        w.submit(Box::new(move || {
            // SAFETY: the caller's function, called with the caller's pointer, in stream
            // order, as the driver does.
            unsafe { f(data as *mut c_void) };
            Ok(())
        }));
        Ok(())
    })
}

/// Creates an event (`CUevent`) in the current context, with its `CU_EVENT_*` flags.
#[no_mangle]
pub extern "C" fn cuEventCreate(out_event: *mut *mut c_void, flags: u32) -> CUresult {
    api("cuEventCreate", |a| {
        let mut e = a.lock();
        let dev = e.current()?;
        if flags & !0x7 != 0 {
            return Err(status::INVALID_VALUE);
        }
        let h = e.new_handle(HandleKind::Event);
        // SAFETY: out-parameter from the caller.
        unsafe { out(out_event, h as *mut c_void) }?;
        let state = EventState {
            flags,
            rec: Mutex::new(None),
        };
        e.events.insert(h, (dev, Arc::new(state)));
        Ok(())
    })
}

/// Destroys an event.
#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(ev: *mut c_void) -> CUresult {
    api("cuEventDestroy_v2", |a| {
        event(a, ev as u64)?;
        let mut e = a.lock();
        e.events.remove(&(ev as u64));
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Records an event at the current end of `stream`: it completes when the work before it has
/// run.
#[no_mangle]
pub extern "C" fn cuEventRecord(ev: *mut c_void, stream: *mut c_void) -> CUresult {
    api("cuEventRecord", |a| {
        let (dev, e) = event(a, ev as u64)?;
        let w = a.lock().stream(stream as u64, dev)?;
        let at: Arc<Mutex<Option<Instant>>> = Arc::default();
        let mark = at.clone();
        let ticket = w.submit(Box::new(move || {
            *mark.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            Ok(())
        }));
        *e.rec.lock().unwrap_or_else(|p| p.into_inner()) = Some(Recorded {
            worker: w,
            ticket,
            at,
        });
        Ok(())
    })
}

/// `CUDA_SUCCESS` once the event's last record has completed (or it was never recorded),
/// `CUDA_ERROR_NOT_READY` before.
#[no_mangle]
pub extern "C" fn cuEventQuery(ev: *mut c_void) -> CUresult {
    api("cuEventQuery", |a| {
        let (_, e) = event(a, ev as u64)?;
        match e.recorded() {
            Some(r) if !r.worker.is_done(r.ticket) => Err(status::NOT_READY),
            _ => Ok(()),
        }
    })
}

/// Waits until the event's record has completed.
#[no_mangle]
pub extern "C" fn cuEventSynchronize(ev: *mut c_void) -> CUresult {
    api("cuEventSynchronize", |a| {
        let (dev, e) = event(a, ev as u64)?;
        if let Some(r) = e.recorded() {
            if e.flags & CU_EVENT_BLOCKING_SYNC != 0 {
                r.worker.wait(r.ticket);
            } else {
                r.worker.spin(r.ticket);
            }
        }
        a.lock().usable(dev)
    })
}

/// Writes the milliseconds between two events' records: `CUDA_ERROR_NOT_READY` until both
/// completed, `CUDA_ERROR_INVALID_HANDLE` for one never recorded or made with
/// `CU_EVENT_DISABLE_TIMING`.
#[no_mangle]
pub extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> CUresult {
    api("cuEventElapsedTime", |a| {
        let (_, s) = event(a, start as u64)?;
        let (_, e) = event(a, end as u64)?;
        if (s.flags | e.flags) & CU_EVENT_DISABLE_TIMING != 0 {
            return Err(status::INVALID_HANDLE);
        }
        let time = |ev: &EventState| -> Result<Instant, CUresult> {
            let r = ev.recorded().ok_or(status::INVALID_HANDLE)?;
            if !r.worker.is_done(r.ticket) {
                return Err(status::NOT_READY);
            }
            let t = *r.at.lock().unwrap_or_else(|p| p.into_inner());
            t.ok_or(status::NOT_READY)
        };
        let (t0, t1) = (time(&s)?, time(&e)?);
        let d = if t1 >= t0 {
            t1.duration_since(t0).as_secs_f32()
        } else {
            -t0.duration_since(t1).as_secs_f32()
        };
        // SAFETY: out-parameter from the caller.
        unsafe { out(ms, d * 1000.0) }
    })
}
