//! Integrity of the link after the handshake: every frame carries a MAC under a key of this
//! connection and direction, checked before the frame is acted on.
//!
//! # Design
//! - Keys: once the handshake ([`super::auth`]) has proved both sides hold the secret, each
//!   derives one 32-byte key per direction, `HMAC-SHA256(secret, "stoker link v2" | home
//!   nonce | worker nonce | direction)` with direction `"home->worker"` or `"worker->home"`.
//!   Both nonces are fresh, so no two connections (and no two directions) share a key: a
//!   frame of one connection is worthless in another, and a side's own frames cannot be
//!   reflected back to it.
//! - Tags: after each control message, and after a unit's pixels, come 32 bytes: BLAKE3 in
//!   its keyed mode, `BLAKE3(key; counter | bytes)`, where `counter` (8 bytes,
//!   little-endian) numbers the tagged pieces of that direction from 0 and `bytes` is the
//!   piece as it crossed (a message with its length prefix, or the raw pixels). Keyed
//!   BLAKE3 is a PRF, hence a MAC, under a uniformly random 256-bit key (the derived one
//!   is HMAC output); it takes input in pieces, so the pixels are still MACed as they
//!   arrive, and it costs a third of HMAC-SHA256 here (0.18 against 0.55 CPU-s per GB, with
//!   SHA-NI: docs/decisions.md, "The link's MAC"). The counter is never sent: a piece
//!   dropped, repeated or reordered within the connection makes every later tag wrong. The
//!   full 32 bytes, not 16: a unit's answer carries two tags next to kilobytes to megabytes
//!   of pixels, so truncating saves nothing that shows, and there is no bound to argue.
//! - A message's tag is checked before it is parsed. A unit's pixels are MACed as they are
//!   read into the slot (no staging copy, one pass over bytes already in cache), and the
//!   tag checked before the unit is reported done; a bad tag leaves bytes in the slot that
//!   the local fill then overwrites.
//! - A tag that does not match is [`WireError::BadMac`]: the connection is dropped (the
//!   home fills the unit locally, the worker closes and logs it once), as for any
//!   malformed frame. Tags are compared in constant time.
//!
//! # Limitations
//! - Integrity and authenticity, not confidentiality: without TLS a listener reads the
//!   pixels and the jobs' paths.
//! - Without a shared secret (mutual TLS proved the peer) there is no key to derive, and
//!   the frames carry no tag: TLS's own record MACs protect them then.

#![forbid(unsafe_code)]

use std::time::Instant;

use ring::hmac;

use super::wire::{read_exact_by, read_frame, write_frame, Message, Transport, WireError};

/// The bytes of a frame's tag.
pub const TAG_BYTES: usize = 32;

/// The label that starts every link key's derivation (a new derivation gets a new label;
/// v1's keys were HMAC-SHA256 keys).
const LABEL: &[u8] = b"stoker link v2";

/// One direction's key and the number of the next piece it tags.
struct Direction {
    key: [u8; TAG_BYTES],
    counter: u64,
}

impl Direction {
    /// The MAC of the next piece, its counter already in.
    fn context(&self) -> Mac {
        let mut ctx = blake3::Hasher::new_keyed(&self.key);
        ctx.update(&self.counter.to_le_bytes());
        Mac(ctx)
    }
}

/// A piece's MAC being computed (keyed BLAKE3).
struct Mac(blake3::Hasher);

impl Mac {
    fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn sign(&self) -> [u8; TAG_BYTES] {
        *self.0.finalize().as_bytes()
    }
}

/// What a connection needs after its handshake to tag what it sends and check what it
/// reads: both directions' keys and counters (none without a secret, see the Limitations).
pub struct Session {
    keys: Option<(Direction, Direction)>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.keys {
            Some((send, read)) => {
                write!(f, "Session(sent {}, read {})", send.counter, read.counter)
            }
            None => f.write_str("Session(untagged)"),
        }
    }
}

/// Which side of the link this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Home,
    Worker,
}

impl Session {
    /// A session whose frames carry no tag (mutual TLS without a secret).
    pub(crate) fn untagged() -> Session {
        Session { keys: None }
    }

    /// The session of `side` after a handshake of `home` and `worker` nonces under `secret`.
    pub(crate) fn keyed(secret: &hmac::Key, side: Side, home: &[u8], worker: &[u8]) -> Session {
        let key = |direction: &[u8]| {
            let mut ctx = hmac::Context::with_key(secret);
            for part in [LABEL, home, worker, direction] {
                ctx.update(part);
            }
            let mut key = [0u8; TAG_BYTES];
            key.copy_from_slice(ctx.sign().as_ref());
            Direction { key, counter: 0 }
        };
        let (to_worker, to_home) = (key(b"home->worker"), key(b"worker->home"));
        let keys = match side {
            Side::Home => (to_worker, to_home),
            Side::Worker => (to_home, to_worker),
        };
        Session { keys: Some(keys) }
    }

    /// Writes one message, its tag, and `then` (raw, with a tag of its own when not empty).
    pub fn write(
        &mut self,
        stream: &mut (impl Transport + ?Sized),
        message: &Message,
        then: &[u8],
    ) -> Result<(), WireError> {
        let Some((send, _)) = &mut self.keys else {
            return write_frame(stream, message, &[], then, &[]);
        };
        let frame = super::wire::encode(message)?;
        let mut ctx = send.context();
        ctx.update(&frame);
        let tag = ctx.sign();
        send.counter += 1;
        let mut then_tag = None;
        if !then.is_empty() {
            let mut ctx = send.context();
            ctx.update(then);
            then_tag = Some(ctx.sign());
            send.counter += 1;
        }
        let then_tag = then_tag.as_ref().map_or(&[][..], |t| &t[..]);
        write_frame(stream, message, &tag, then, then_tag)
    }

    /// Reads one message, by `deadline` if given, once its tag is checked.
    pub fn read(
        &mut self,
        stream: &mut (impl Transport + ?Sized),
        deadline: Option<Instant>,
    ) -> Result<Message, WireError> {
        let (frame, body) = read_frame(stream, deadline)?;
        if let Some((_, read)) = &mut self.keys {
            let mut ctx = read.context();
            ctx.update(&frame);
            expect(read, ctx, stream, deadline)?;
        }
        serde_json::from_slice(&frame[body..]).map_err(WireError::Malformed)
    }

    /// Reads exactly `buf.len()` raw bytes (a unit's pixels) and their tag, MACing them as
    /// they arrive, by `deadline` if given.
    pub fn read_into(
        &mut self,
        stream: &mut (impl Transport + ?Sized),
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> Result<(), WireError> {
        let Some((_, read)) = &mut self.keys else {
            return super::wire::read_with(stream, buf, deadline, |_| {});
        };
        if buf.is_empty() {
            return Ok(());
        }
        let mut ctx = read.context();
        super::wire::read_with(stream, buf, deadline, |chunk| ctx.update(chunk))?;
        expect(read, ctx, stream, deadline)
    }
}

/// Reads the tag of the piece `ctx` MACed and checks it; the direction's counter moves on.
fn expect(
    read: &mut Direction,
    ctx: Mac,
    stream: &mut (impl Transport + ?Sized),
    deadline: Option<Instant>,
) -> Result<(), WireError> {
    let mut tag = [0u8; TAG_BYTES];
    read_exact_by(stream, &mut tag, deadline)?;
    let frame = read.counter;
    read.counter += 1;
    // In constant time: how much of a forged tag matched must not show in the timing.
    let differ = ctx
        .sign()
        .iter()
        .zip(&tag)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    if std::hint::black_box(differ) == 0 {
        Ok(())
    } else {
        Err(WireError::BadMac { frame })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    #[test]
    fn a_frame_replayed_or_altered_fails_its_mac_and_a_good_one_passes() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut home_end = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut worker_end, _) = listener.accept().unwrap();
        let secret = hmac::Key::new(hmac::HMAC_SHA256, b"a-test-secret-of-some-length");
        let (h, w) = ([1u8; 32], [2u8; 32]);
        let mut home = Session::keyed(&secret, Side::Home, &h, &w);
        let mut worker = Session::keyed(&secret, Side::Worker, &h, &w);
        let soon = || Some(Instant::now() + Duration::from_secs(5));
        let unit = Message::Unit {
            id: 1,
            job: 0,
            epoch: 0,
            indices: vec![3],
        };
        home.write(&mut home_end, &unit, &[]).unwrap();
        assert_eq!(worker.read(&mut worker_end, soon()).unwrap(), unit);
        // Pixels come back tagged, and are checked as read.
        let done = Message::Done {
            id: 1,
            samples: Vec::new(),
            bytes: 5,
        };
        worker.write(&mut worker_end, &done, b"abcde").unwrap();
        assert_eq!(home.read(&mut home_end, soon()).unwrap(), done);
        let mut pixels = [0u8; 5];
        home.read_into(&mut home_end, &mut pixels, soon()).unwrap();
        assert_eq!(&pixels, b"abcde");
        // The same frame again (a session whose count starts over): frame 1 fails.
        let mut replay = Session::keyed(&secret, Side::Home, &h, &w);
        replay.write(&mut home_end, &unit, &[]).unwrap();
        let e = worker.read(&mut worker_end, soon()).unwrap_err();
        assert!(matches!(e, WireError::BadMac { frame: 1 }), "{e:?}");
        // Altered pixels fail too.
        let mut frame = super::super::wire::encode(&done).unwrap();
        let mut ctx = Direction::context(&worker.keys.as_ref().unwrap().0);
        ctx.update(&frame);
        frame.extend_from_slice(&ctx.sign());
        std::io::Write::write_all(&mut worker_end, &frame).unwrap();
        std::io::Write::write_all(&mut worker_end, b"abcdX").unwrap();
        std::io::Write::write_all(&mut worker_end, &[0u8; TAG_BYTES]).unwrap();
        assert_eq!(home.read(&mut home_end, soon()).unwrap(), done);
        let e = home
            .read_into(&mut home_end, &mut pixels, soon())
            .unwrap_err();
        assert!(matches!(e, WireError::BadMac { frame: 3 }), "{e}");
    }
}
