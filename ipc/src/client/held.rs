//! The batches a client holds, and the one warning a caller gets when it waits for a batch
//! while holding every slot of its ring: the daemon cannot fill a slot until one comes back,
//! so such a wait never ends (a loop that keeps every batch's tensors, `total = total + loss`
//! in PyTorch, does this without meaning to).

use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::sync::Mutex;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};

/// How long a wait with every slot held goes on before the warning.
pub(super) const ALL_HELD_WARN_AFTER: Duration = Duration::from_secs(5);

/// The (epoch, step) of every batch received and not yet released.
#[derive(Debug, Default)]
pub(super) struct HeldLeases {
    held: Mutex<BTreeSet<(u64, u64)>>,
}

impl HeldLeases {
    pub(super) fn take(&self, epoch: u64, step: u64) {
        self.lock().insert((epoch, step));
    }

    pub(super) fn give_back(&self, epoch: u64, step: u64) {
        self.lock().remove(&(epoch, step));
    }

    pub(super) fn count(&self) -> usize {
        self.lock().len()
    }

    /// What the warning says when `slots` slots are all held.
    pub(super) fn warning(&self, slots: usize) -> String {
        let held: Vec<String> = self
            .lock()
            .iter()
            .map(|(e, s)| format!("{e}:{s}"))
            .collect();
        format!(
            "stoker: waiting for a batch while this process holds all {slots} slots of its \
             ring (the batches at epoch:step {}); the daemon cannot fill a slot until one of \
             them is released, so this wait does not end. Drop the batches and the tensors \
             made from them once used, and copy what must be kept (x.clone(), float(loss)): \
             see docs/python.md, \"Leases: free what you are done with\".",
            held.join(", ")
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<(u64, u64)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `fd` has something to read within `wait` (an error counts as readable: the
/// receive that follows reports it).
pub(super) fn readable_within(fd: impl AsFd, wait: Duration) -> bool {
    let mut pfds = [PollFd::new(&fd, PollFlags::IN)];
    let timeout = Timespec::try_from(wait).ok();
    loop {
        match rustix::event::poll(&mut pfds, timeout.as_ref()) {
            Ok(n) => return n > 0,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return true,
        }
    }
}
