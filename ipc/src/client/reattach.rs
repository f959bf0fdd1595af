//! Surviving the daemon's restart inside [`Client::next_batch`]: the option
//! [`AttachOptions::reattach`].
//!
//! # Design
//! - The daemon going away is end of file or a reset on the socket, or ERROR(STOPPING) while
//!   it drains. The batches it had announced before come first (they are queued on the
//!   socket, and the ring stays mapped); then the client attaches again at
//!   [`Client::position`] with its offset, to the same socket (never another), and receives
//!   on. Every batch is a pure function of (seed, epoch, index), so they are the batches an
//!   uninterrupted run gets.
//! - It waits for the daemon for at most the option's bound: attempts after 50 ms, doubling
//!   up to 1 s, each one's own connect retry cut to the time left; then
//!   [`ClientError::StayedAway`] names the socket, the wait and the last attempt's error. Only
//!   "not back yet" errors are retried (nothing listening, STOPPING, gone during the attach);
//!   any other refusal is returned at once.
//! - The stall clock ([`Client::stall`]) goes on across the re-attach.
//!
//! # Limitations
//! - Batches still held from before keep the old ring mapped; their releases go nowhere (the
//!   old daemon is gone).
//! - A socket held open by systemd (socket activation) accepts while the daemon restarts: an
//!   attempt then waits for the new daemon's answer, bounded by systemd's start timeout rather
//!   than by this option.

use std::time::{Duration, Instant};

use super::{Batch, Client, ClientError};
use crate::protocol::ErrorCode;

/// First pause between re-attach attempts; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// True when `e` says the daemon is gone or going (so a later attach may find it back).
fn daemon_away(e: &ClientError) -> bool {
    e.code() == Some(ErrorCode::Stopping)
        || (e.is_disconnected() && !matches!(e, ClientError::StayedAway { .. }))
}

impl Client {
    /// [`Client::receive`], attaching again whenever the daemon went away, if the options
    /// ask for it.
    pub(super) fn receive_or_reattach(&mut self) -> Result<Option<Batch>, ClientError> {
        loop {
            match self.receive() {
                Err(e) if self.opts.reattach.is_some() && daemon_away(&e) => self.reattach(e)?,
                got => return got,
            }
        }
    }

    /// Attaches again at this client's position, to the same socket, waiting for the daemon
    /// there for at most the `reattach` bound; replaces this client's connection on success.
    fn reattach(&mut self, gone: ClientError) -> Result<(), ClientError> {
        let bound = self.opts.reattach.unwrap_or_default();
        let started = Instant::now();
        let mut pause = FIRST_PAUSE;
        loop {
            let left = bound.saturating_sub(started.elapsed());
            let mut opts = self.opts.clone();
            opts.start = self.position;
            opts.offset = self.offset;
            opts.connect_timeout = left;
            let last = match Client::attach(&self.socket, opts) {
                Ok(mut fresh) => {
                    tracing::info!(socket = %self.socket.display(), %gone,
                        waited_s = started.elapsed().as_secs_f64(), "re-attached");
                    std::mem::swap(&mut fresh.clock, &mut self.clock);
                    // The names told so far stay until the new daemon tells its own.
                    std::mem::swap(&mut fresh.bad, &mut self.bad);
                    // The old client's drop sends DETACH on the dead socket: it fails at once.
                    drop(std::mem::replace(self, fresh));
                    return Ok(());
                }
                Err(e) if daemon_away(&e) => e,
                Err(e) => return Err(e),
            };
            let left = bound.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(ClientError::StayedAway {
                    socket: self.socket.clone(),
                    gone: Box::new(gone),
                    waited: started.elapsed(),
                    last: Box::new(last),
                });
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }
}
