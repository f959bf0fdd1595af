//! The protocol spoken by hand, for tests that send what no client would.

#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::path::Path;

use stoker::protocol::{Attach, Message, MAX_MESSAGE_BYTES};
use stoker::socket::SeqPacket;

/// Connects to `socket`, sends `a` and returns the connection, the fd passed with the answer
/// (the ring, when attached) and the answer.
pub fn raw_attach(socket: &Path, a: &Attach) -> (SeqPacket, Option<OwnedFd>, Message) {
    let s = SeqPacket::connect(socket).expect("connect to the daemon");
    let request = Message::Attach(Box::new(a.clone()))
        .encode()
        .expect("encode ATTACH");
    s.send(&request, &[]).expect("send ATTACH");
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let r = s
        .recv(&mut buf)
        .expect("receive the answer")
        .expect("an answer");
    let msg = Message::decode(&buf[..r.len]).expect("decode the answer");
    (s, r.fds.into_iter().next(), msg)
}
