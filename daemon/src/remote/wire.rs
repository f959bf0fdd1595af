//! What crosses between a home daemon and a worker: length-prefixed frames over TCP.
//!
//! # Design
//! - A frame is a 4-byte little-endian length, then that many bytes of one JSON
//!   [`Message`] (at most [`MAX_MESSAGE_BYTES`]). Control messages are small and rare (one per
//!   unit of up to 16 samples), so JSON costs nothing that shows and keeps them debuggable.
//! - A unit's pixels follow its [`Message::Done`] as `bytes` raw bytes, outside any frame,
//!   so the home daemon reads them straight into the slot ([`read_exact_by`]).
//! - After the handshake every frame, and a unit's pixels, are followed by a 32-byte MAC
//!   under a key of that connection and direction ([`super::seal::Session`]); the
//!   handshake's own messages go through [`read_message`] and [`write_message`] untagged.
//! - Every read has a deadline where the reader waits on the other side's work.
//!
//! # Limitations
//! - Versioned by [`WIRE_VERSION`] in the handshake; both sides must speak the same one (a
//!   peer of another is refused with both versions named).

#![forbid(unsafe_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use stoker_wire::spec::PipelineSpec;

use stoker_pipeline::engine::BadSamplePolicy;

/// The version of this protocol, checked in the handshake.
/// 2: every frame after the handshake carries a MAC ([`super::seal`]).
/// 3: the MAC is keyed BLAKE3 (it was HMAC-SHA256).
pub(crate) const WIRE_VERSION: u32 = 3;
/// The largest control message (a unit's index list, a job's spec).
pub(crate) const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// One control message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// Worker → home, first: the worker's nonce (hex).
    Challenge {
        /// The worker's protocol version (`WIRE_VERSION`).
        version: u32,
        /// 32 random bytes, hex.
        nonce: String,
    },
    /// Home → worker: the home's nonce and its proof over both nonces (hex).
    Hello {
        /// The home's protocol version (`WIRE_VERSION`).
        version: u32,
        /// 32 random bytes, hex.
        nonce: String,
        /// HMAC-SHA256 of "home", the worker's nonce and the home's, hex.
        proof: String,
    },
    /// Worker → home: the worker's proof over both nonces (hex).
    Welcome {
        /// HMAC-SHA256 of "worker", the home's nonce and the worker's, hex.
        proof: String,
    },
    /// Home → worker: a job the following units name by `job`.
    Open(Box<OpenJob>),
    /// Worker → home: the job is open; `closed` are jobs of this connection the worker let
    /// go to make room (the home opens them again when it needs them).
    Opened {
        /// The job as the `Open` named it.
        job: u32,
        /// Jobs closed to make room, by their numbers on this connection.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        closed: Vec<u32>,
    },
    /// Home → worker: fill these samples of `epoch`.
    Unit {
        /// The unit's number on this connection, echoed by its `Done`.
        id: u64,
        /// The job, as an earlier `Open` numbered it.
        job: u32,
        /// The epoch whose permutation and crops the samples are drawn for.
        epoch: u64,
        /// Sample indices in the dataset's sorted index, in the slot's order.
        indices: Vec<u64>,
    },
    /// Worker → home: unit `id` done; `bytes` raw image bytes follow, one image per sample
    /// in order.
    Done {
        /// The `Unit` this answers.
        id: u64,
        /// What became of each sample, in the unit's order.
        samples: Vec<SampleResult>,
        /// Raw image bytes that follow the message.
        bytes: u64,
    },
    /// Either way: refused (the job, the unit, or the connection when both are `None`).
    Refused {
        /// The job refused, if the refusal is about one.
        job: Option<u32>,
        /// The unit refused, if the refusal is about one.
        unit: Option<u64>,
        /// Why, for a person: names the rule and the numbers it compared.
        reason: String,
    },
}

/// What a home daemon asks a worker to open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenJob {
    /// The number later messages of this connection name the job by, chosen by the home.
    pub job: u32,
    /// The dataset's path (or `s3://` URL) as the home daemon opened it.
    pub dataset: String,
    /// [`crate::remote::unit::fingerprint`] of the home's index.
    pub fingerprint: String,
    /// What a batch is; the worker makes each image exactly as the spec says.
    pub spec: PipelineSpec,
    /// The job's seed: crops, flips and replacements are drawn from (seed, epoch, index).
    pub seed: u64,
    /// What the worker does with a bad sample, as the home's engine would.
    pub policy: BadSamplePolicy,
    /// The home's decode limit on pixels per image; the worker decodes under it, and refuses
    /// the job when it is above its own.
    pub max_pixels: u64,
    /// The home's limit on one encoded file's bytes, applied like `max_pixels`.
    pub max_file_bytes: u64,
}

/// What became of one sample on the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleResult {
    /// Whether the sample, a replacement or nothing was decoded.
    pub status: SampleFate,
    /// The sample whose image is in its place (itself unless replaced).
    pub delivered: u64,
    /// Why it was bad (a reason code) and the full message; none when Ok.
    pub bad: Option<(String, String)>,
}

/// A sample's fate on the worker, as the engine would settle it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleFate {
    /// Decoded as asked.
    Ok,
    /// Bad; another sample's image (`delivered`) is in its place (policy `skip`).
    Replaced,
    /// Bad and not replaced; the home marks it failed in the slot.
    Failed,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The deadline passed, or the socket's timeout, before the bytes came.
    #[error("no answer in time")]
    Timeout,
    /// The peer closed or reset the connection.
    #[error("connection closed")]
    Closed,
    /// Any other socket error.
    #[error("{0}")]
    Io(std::io::Error),
    /// A frame announced (or a message needed) this many bytes, over `MAX_MESSAGE_BYTES`
    /// (1 MiB).
    #[error("a frame of {0} bytes, over the limit of {MAX_MESSAGE_BYTES}")]
    TooLarge(usize),
    /// The frame's body is not a message of this protocol (or a message could not be
    /// encoded).
    #[error("not a message: {0}")]
    Malformed(#[source] serde_json::Error),
    /// The MAC after the connection's piece number `frame` (in its direction, from 0) is not
    /// the one the link's key gives: the bytes were altered, replayed, reordered or cut in
    /// transit, or the peer holds another key.
    #[error(
        "frame {frame}'s MAC does not match: altered, replayed or reordered in transit \
         (dropping the connection)"
    )]
    BadMac {
        /// The piece's number in its direction on this connection.
        frame: u64,
    },
}

impl WireError {
    fn of(e: std::io::Error) -> WireError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => WireError::Timeout,
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe => WireError::Closed,
            _ => WireError::Io(e),
        }
    }
}

/// A connection messages cross: a TCP socket, or a TLS session over one
/// ([`super::tls::Link`]). Deadlines are set on the socket underneath.
pub trait Transport: Read + Write {
    /// The TCP socket underneath, where deadlines and socket options are set.
    fn tcp(&self) -> &TcpStream;
}

impl Transport for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

/// Reads exactly `buf.len()` bytes, by `deadline` if given.
pub fn read_exact_by(
    stream: &mut (impl Transport + ?Sized),
    buf: &mut [u8],
    deadline: Option<Instant>,
) -> Result<(), WireError> {
    read_with(stream, buf, deadline, |_| {})
}

/// As [`read_exact_by`], handing each chunk to `seen` as it lands (a MAC over pixels read
/// straight into a slot).
pub(crate) fn read_with(
    stream: &mut (impl Transport + ?Sized),
    buf: &mut [u8],
    deadline: Option<Instant>,
    mut seen: impl FnMut(&[u8]),
) -> Result<(), WireError> {
    let mut done = 0;
    while done < buf.len() {
        let wait = match deadline {
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(w) if !w.is_zero() => Some(w),
                _ => return Err(WireError::Timeout),
            },
            None => None,
        };
        stream.tcp().set_read_timeout(wait).map_err(WireError::Io)?;
        match stream.read(&mut buf[done..]) {
            Ok(0) => return Err(WireError::Closed),
            Ok(n) => {
                seen(&buf[done..done + n]);
                done += n;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(WireError::of(e)),
        }
    }
    Ok(())
}

/// Reads one frame, by `deadline` if given: its bytes as they crossed (the length prefix
/// included) and where its body starts.
pub(crate) fn read_frame(
    stream: &mut (impl Transport + ?Sized),
    deadline: Option<Instant>,
) -> Result<(Vec<u8>, usize), WireError> {
    let mut len = [0u8; 4];
    read_exact_by(stream, &mut len, deadline)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge(n));
    }
    let mut frame = vec![0u8; 4 + n];
    frame[..4].copy_from_slice(&len);
    read_exact_by(stream, &mut frame[4..], deadline)?;
    Ok((frame, 4))
}

/// Reads one message without a MAC (the handshake's), by `deadline` if given.
pub fn read_message(
    stream: &mut (impl Transport + ?Sized),
    deadline: Option<Instant>,
) -> Result<Message, WireError> {
    let (frame, body) = read_frame(stream, deadline)?;
    serde_json::from_slice(&frame[body..]).map_err(WireError::Malformed)
}

/// One message as a frame: its length, then its JSON.
pub(crate) fn encode(message: &Message) -> Result<Vec<u8>, WireError> {
    let body = serde_json::to_vec(message).map_err(WireError::Malformed)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l as usize <= MAX_MESSAGE_BYTES)
        .ok_or(WireError::TooLarge(body.len()))?;
    let mut frame = Vec::with_capacity(4 + body.len() + 32);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Writes one message without a MAC (the handshake's), and `then`, raw, right after it.
pub fn write_message(
    stream: &mut (impl Transport + ?Sized),
    message: &Message,
    then: &[u8],
) -> Result<(), WireError> {
    write_frame(stream, message, &[], then, &[])
}

/// Writes `message` followed by `tag`, then `then` followed by `then_tag`.
pub(crate) fn write_frame(
    stream: &mut (impl Transport + ?Sized),
    message: &Message,
    tag: &[u8],
    then: &[u8],
    then_tag: &[u8],
) -> Result<(), WireError> {
    let mut frame = encode(message)?;
    frame.extend_from_slice(tag);
    stream.write_all(&frame).map_err(WireError::of)?;
    if !then.is_empty() {
        stream.write_all(then).map_err(WireError::of)?;
        stream.write_all(then_tag).map_err(WireError::of)?;
    }
    // A TLS session holds what it has not sent yet.
    stream.flush().map_err(WireError::of)
}

/// How long the peer may go without acknowledging bytes sent, or without answering TCP
/// keepalive probes, before the connection is given up.
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Keepalive: the first probe after this long without traffic, then every
/// [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_PROBES`] times.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_PROBES: u32 = 3;

/// Sets a connection up for the protocol, on either side: no Nagle delay (a unit's request
/// is small and waited on), TCP keepalive (a peer partitioned away is noticed in
/// `KEEPALIVE_IDLE` + `KEEPALIVE_PROBES` x `KEEPALIVE_INTERVAL`, 30 s, even while the
/// connection is idle), and writes that fail once the peer takes no byte for
/// [`STALL_TIMEOUT`] (`SO_SNDTIMEO` and `TCP_USER_TIMEOUT`), so a stalled peer never holds a
/// writer forever.
pub(crate) fn tune(stream: &TcpStream) -> std::io::Result<()> {
    use rustix::net::sockopt;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(STALL_TIMEOUT))?;
    sockopt::set_socket_keepalive(stream, true)?;
    sockopt::set_tcp_keepidle(stream, KEEPALIVE_IDLE)?;
    sockopt::set_tcp_keepintvl(stream, KEEPALIVE_INTERVAL)?;
    sockopt::set_tcp_keepcnt(stream, KEEPALIVE_PROBES)?;
    let user_timeout = u32::try_from(STALL_TIMEOUT.as_millis()).unwrap_or(u32::MAX);
    sockopt::set_tcp_user_timeout(stream, user_timeout)?;
    Ok(())
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of lower- or upper-case hex `text`; `None` when it is not hex.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tuned_connection_has_keepalive_and_bounded_writes() {
        use rustix::net::sockopt;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        tune(&a).unwrap();
        assert!(sockopt::socket_keepalive(&a).unwrap());
        assert_eq!(sockopt::tcp_keepidle(&a).unwrap(), KEEPALIVE_IDLE);
        assert_eq!(sockopt::tcp_keepcnt(&a).unwrap(), KEEPALIVE_PROBES);
        assert_eq!(sockopt::tcp_user_timeout(&a).unwrap(), 30_000);
        assert_eq!(a.write_timeout().unwrap(), Some(STALL_TIMEOUT));
        assert!(a.nodelay().unwrap());
    }

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&bytes), "0001abff");
        assert_eq!(unhex("0001ABff").unwrap(), bytes);
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex("abc"), None);
    }

    #[test]
    fn a_frame_over_the_limit_or_not_json_is_refused_and_a_cut_one_times_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut b, _) = listener.accept().unwrap();
        let soon = || Some(Instant::now() + std::time::Duration::from_millis(200));
        a.write_all(&(u32::try_from(MAX_MESSAGE_BYTES).unwrap() + 1).to_le_bytes())
            .unwrap();
        assert!(matches!(
            read_message(&mut b, soon()),
            Err(WireError::TooLarge(_))
        ));
        a.write_all(&3u32.to_le_bytes()).unwrap();
        a.write_all(b"{x}").unwrap();
        assert!(matches!(
            read_message(&mut b, soon()),
            Err(WireError::Malformed(_))
        ));
        a.write_all(&10u32.to_le_bytes()).unwrap();
        a.write_all(b"{\"ty").unwrap();
        assert!(matches!(
            read_message(&mut b, soon()),
            Err(WireError::Timeout)
        ));
        // A fresh connection: the cut frame's missing bytes would be read first.
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut b, _) = listener.accept().unwrap();
        let unit = Message::Unit {
            id: 7,
            job: 1,
            epoch: 2,
            indices: vec![3, 4],
        };
        write_message(&mut a, &unit, &[]).unwrap();
        assert_eq!(read_message(&mut b, soon()).unwrap(), unit);
        drop(a);
        assert!(matches!(
            read_message(&mut b, soon()),
            Err(WireError::Closed)
        ));
    }
}
