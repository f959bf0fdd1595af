//! The node cache's writer: one thread per cache that writes the files of objects handed to
//! their readers from memory ([`super::NodeCache::write_behind`]), in the order they came.
//!
//! # Design
//! One thread, fed by a channel, rather than a blocking task per object: a burst of hundreds
//! of downloads would otherwise start as many threads (a stack each), which cost more CPU
//! than the writes (measured on the photos bench, issue 44). The thread holds the cache
//! weakly and ends when the cache goes (its sender with it).

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

use super::NodeCache;
use crate::source::integrity::Tag;

/// One file to write: the entry's name, its bytes and their tag.
type Job = (String, Bytes, Tag);

/// The sending end of a cache's writer thread, started at its first file.
#[derive(Debug, Default)]
pub(super) struct Writer(Mutex<Option<Sender<Job>>>);

impl Writer {
    /// Queues the file of `name` for `cache`'s writer thread (starting it if needed); writes
    /// it on this thread when no thread can be started.
    pub(super) fn queue(&self, cache: &Arc<NodeCache>, name: String, bytes: Bytes, tag: Tag) {
        let mut tx = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if tx.is_none() {
            *tx = start(cache);
        }
        let job = match tx.as_ref() {
            Some(t) => match t.send((name, bytes, tag)) {
                Ok(()) => return,
                Err(e) => e.0,
            },
            None => (name, bytes, tag),
        };
        drop(tx);
        cache.write_behind(&job.0, &job.1, &job.2);
    }
}

/// Starts the writer thread of `cache`; `None` (logged) when no thread can be started.
fn start(cache: &Arc<NodeCache>) -> Option<Sender<Job>> {
    let (tx, rx) = channel::<Job>();
    let weak: Weak<NodeCache> = Arc::downgrade(cache);
    let started = std::thread::Builder::new()
        .name("stoker-cache-w".into())
        .spawn(move || {
            while let Ok((name, bytes, tag)) = rx.recv() {
                let Some(cache) = weak.upgrade() else { return };
                cache.write_behind(&name, &bytes, &tag);
            }
        });
    match started {
        Ok(_) => Some(tx),
        Err(e) => {
            tracing::warn!(error = %e, "node cache: no writer thread; files are written on the request threads");
            None
        }
    }
}
