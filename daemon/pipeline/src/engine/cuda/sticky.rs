//! A sticky CUDA error ends the process: NVIDIA documents that after an illegal address, a
//! launch failure and the other sticky errors "any further CUDA work will return the same
//! error. To continue using CUDA, the process must be terminated and relaunched", and nvJPEG's
//! runtime keeps the primary context alive, so a context rebuilt in-process does not recover.
//!
//! # Design
//! - [`record`] keeps the first sticky cause (GPU and status) for the life of the process;
//!   [`Gpu::fault`](super::Gpu::fault) calls it.
//! - The service registers what to do about it ([`on_restart`]: start the drain). It runs
//!   once, after the fault has reached the affected ranks' feeds ([`fire_if_recorded`], called
//!   by the engine after a unit's fault is recorded on its feed), so those ranks are told the
//!   cause before the others are told the daemon stops.
//! - The daemon then exits with `Exit::GpuRestart` (75), which systemd's unit and the
//!   auto-started per-user daemon's clients restart on; ranks resume at their position.
//!
//! # Limitations
//! Process-wide by nature: one sticky error on any GPU restarts the whole daemon, its other
//! GPUs and CPU ranks included (drained, they re-attach after the restart).

use std::sync::{Mutex, OnceLock};

type Hook = Box<dyn Fn(&str) + Send + Sync>;

static CAUSE: OnceLock<String> = OnceLock::new();
static HOOK: OnceLock<Hook> = OnceLock::new();
static FIRED: Mutex<bool> = Mutex::new(false);

/// Keeps `cause` (the first one wins) as the reason the process must restart.
pub fn record(gpu: &str, cause: &str) {
    let reason = format!("GPU {gpu}: {cause}");
    if CAUSE.set(reason.clone()).is_ok() {
        tracing::error!(
            %reason,
            "a sticky CUDA error: the process must be terminated and relaunched (NVIDIA); \
             the affected ranks are told, the others drained, then the daemon exits to restart"
        );
    }
}

/// The sticky cause this process must restart for, if any.
pub fn cause() -> Option<&'static str> {
    CAUSE.get().map(String::as_str)
}

/// What to do once a sticky error happened (the service: start the drain). Set once.
pub fn on_restart(hook: impl Fn(&str) + Send + Sync + 'static) {
    let _ = HOOK.set(Box::new(hook));
}

/// Runs the hook once, if a sticky cause was recorded.
pub fn fire_if_recorded() {
    let Some(cause) = cause() else { return };
    let mut fired = FIRED.lock().unwrap_or_else(|e| e.into_inner());
    if std::mem::replace(&mut *fired, true) {
        return;
    }
    drop(fired);
    if let Some(hook) = HOOK.get() {
        hook(cause);
    }
}
