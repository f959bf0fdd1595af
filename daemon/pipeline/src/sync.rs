//! The daemon's one lock policy (docs/decisions.md, "Locks recover from poison"): a mutex
//! whose holder panicked is taken as it is, not turned into a second panic. A worker that
//! panics fails its own job (the engine reports it); it must not take every other rank and
//! the daemon down through the locks it held. The engine's locks go through these three
//! functions, as do some of the other rooms' and the `stoker` tool's; the rest (most of serve,
//! parts of source and transform, every `RwLock`) write the same recovery inline
//! (`unwrap_or_else(|e| e.into_inner())`). Either way no lock outside tests panics on poison.
#![forbid(unsafe_code)]

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, WaitTimeoutResult};
use std::time::Duration;

/// Locks `m`, recovering the guard if a holder panicked.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `guard`, recovering the guard if a holder panicked meanwhile.
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `guard` up to `timeout`, recovering the guard if a holder panicked.
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
    cv.wait_timeout(guard, timeout)
        .unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_poisoned_lock_is_recovered_with_its_value() {
        let m = Arc::new(Mutex::new(1));
        let held = Arc::clone(&m);
        let panicked = std::thread::spawn(move || {
            let mut g = held.lock().unwrap();
            *g = 2;
            panic!("a worker panics while holding the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 2);
        let cv = Condvar::new();
        let (g, timed_out) = wait_timeout(&cv, lock(&m), Duration::from_millis(1));
        assert!(timed_out.timed_out());
        assert_eq!(*g, 2);
    }
}
