//! A client and a daemon of different protocol versions (issue 24 item 8): whichever side is
//! newer, the user reads which side to upgrade and both versions, instead of a JSON error
//! (`unknown field 'offset'`) or a bare "protocol version 2". The daemon's side is the real
//! stokerd spoken to by hand; the client's side is the real client against a stand-in daemon
//! that answers as an older or a newer one would.

use super::*;
use std::path::PathBuf;
use stoker::protocol::{Attach, ErrorCode, HEADER_BYTES, PROTOCOL_VERSION, VERSION};
use stoker::socket::SeqPacketListener;
use stoker_testkit::attach::rank_options;

/// An ATTACH as a client of protocol `protocol` sends it: this build's JSON with the header's
/// version replaced and, for a newer client, its version `client_version` (an older client
/// sends none).
fn attach_in_protocol(protocol: u16, client_version: Option<&str>, data: &Path) -> Vec<u8> {
    let a = Attach {
        job: "versions".into(),
        rank: 0,
        world_size: 1,
        device: stoker::Device::Cpu,
        spec: spec(2),
        dataset: data.to_str().unwrap().into(),
        seed: 0,
        start: stoker::Position::default(),
        offset: None,
    };
    let bytes = Message::Attach(Box::new(a)).encode().unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&bytes[HEADER_BYTES..]).unwrap();
    let object = json.as_object_mut().unwrap();
    object.remove("client_version");
    if let Some(v) = client_version {
        object.insert("client_version".into(), v.into());
        // A field this daemon does not know, as a newer client would send.
        object.insert("colour".into(), "blue".into());
    }
    let mut out = bytes[..HEADER_BYTES].to_vec();
    out[2..4].copy_from_slice(&protocol.to_le_bytes());
    out.extend(serde_json::to_vec(&json).unwrap());
    out
}

/// The daemon's answer as its bytes say, whatever their protocol version: (the header's
/// version, the ERROR's code, its text). ERROR is laid out alike in every version.
fn read_error(answer: &[u8]) -> (u16, u16, String) {
    assert!(answer.len() >= HEADER_BYTES + 2, "{answer:?}");
    assert_eq!(&answer[..2], b"SK");
    let kind = u16::from_le_bytes([answer[4], answer[5]]);
    assert_eq!(kind, 7, "expected an ERROR, got type {kind}");
    (
        u16::from_le_bytes([answer[2], answer[3]]),
        u16::from_le_bytes([answer[8], answer[9]]),
        String::from_utf8(answer[HEADER_BYTES + 2..].to_vec()).unwrap(),
    )
}

fn ask_daemon(socket: &Path, request: &[u8]) -> (u16, u16, String) {
    let s = SeqPacket::connect(socket).unwrap();
    s.send(request, &[]).unwrap();
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let r = s.recv(&mut buf).unwrap().expect("an answer");
    read_error(&buf[..r.len])
}

#[test]
fn the_daemon_tells_a_newer_client_to_upgrade_the_daemon_in_the_clients_version() {
    let (dir, data, _) = temp_image_folder(2, 2);
    let daemon = Daemon::start(dir.path(), &["--threads", "1"]);
    let newer = PROTOCOL_VERSION + 1;
    let request = attach_in_protocol(newer, Some("99.1.0-7-gabcdef1234"), &data);
    let (protocol, code, text) = ask_daemon(daemon.socket(), &request);
    assert_eq!(
        protocol, newer,
        "answered in a version the client cannot read: {text}"
    );
    assert_eq!(code, ErrorCode::VersionMismatch as u16, "{text}");
    for want in [
        "upgrade the daemon (stokerd) to 99.1.0-7-gabcdef1234 or later",
        &format!("client stoker 99.1.0-7-gabcdef1234, protocol {newer}"),
        &format!("daemon stokerd {VERSION}, protocol {PROTOCOL_VERSION}"),
    ] {
        assert!(text.contains(want), "missing {want:?} in {text:?}");
    }
}

#[test]
fn the_daemon_tells_an_older_client_to_upgrade_the_client_in_the_clients_version() {
    let (dir, data, _) = temp_image_folder(2, 2);
    let daemon = Daemon::start(dir.path(), &["--threads", "1"]);
    let older = PROTOCOL_VERSION - 1;
    let (protocol, code, text) =
        ask_daemon(daemon.socket(), &attach_in_protocol(older, None, &data));
    assert_eq!(
        protocol, older,
        "answered in a version the client cannot read: {text}"
    );
    assert_eq!(code, ErrorCode::VersionMismatch as u16, "{text}");
    for want in [
        "upgrade the client (the stoker Python package, libstoker or the stoker tool)",
        &format!("to {VERSION} or later"),
        &format!("protocol {older}"),
    ] {
        assert!(text.contains(want), "missing {want:?} in {text:?}");
    }
}

/// A stand-in daemon at `<dir>/stoker.sock` that answers the first message with `answer`.
fn stand_in_daemon(dir: &Path, answer: Vec<u8>) -> (PathBuf, std::thread::JoinHandle<()>) {
    let socket = dir.join("stoker.sock");
    let listener = SeqPacketListener::bind(&socket).unwrap();
    let thread = std::thread::spawn(move || {
        let conn = listener.accept().unwrap();
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        let _ = conn.recv(&mut buf);
        conn.send(&answer, &[]).unwrap();
    });
    (socket, thread)
}

fn attach_error(socket: &Path) -> ClientError {
    let mut opts = rank_options("/nowhere", "versions", (0, 1), 0, spec(2));
    opts.connect_timeout = Duration::ZERO;
    Client::attach(socket, opts).expect_err("attached across protocol versions")
}

#[test]
fn the_client_tells_its_user_to_upgrade_an_older_daemon() {
    let dir = tempfile::tempdir().unwrap();
    // What a daemon of the previous protocol version answers a newer client.
    let older = PROTOCOL_VERSION - 1;
    let mut answer = b"SK\0\0\x07\0\0\0\x02\0".to_vec();
    answer[2..4].copy_from_slice(&older.to_le_bytes());
    answer.extend_from_slice(format!("protocol version {PROTOCOL_VERSION}").as_bytes());
    let (socket, daemon) = stand_in_daemon(dir.path(), answer);
    let text = attach_error(&socket).to_string();
    daemon.join().unwrap();
    for want in [
        "upgrade the daemon (stokerd)",
        &format!("to {VERSION} or later"),
        &format!("daemon stokerd of a version that does not report it, protocol {older}"),
        &socket.display().to_string(),
    ] {
        assert!(text.contains(want), "missing {want:?} in {text:?}");
    }
}

#[test]
fn the_client_tells_its_user_to_upgrade_itself_against_a_newer_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let newer = PROTOCOL_VERSION + 1;
    let mut answer = b"SK\0\0\x02\0\0\0".to_vec();
    answer[2..4].copy_from_slice(&newer.to_le_bytes());
    answer.extend_from_slice(br#"{"daemon_version":"99.2.0","slots":2,"hue":1}"#);
    let (socket, daemon) = stand_in_daemon(dir.path(), answer);
    let text = attach_error(&socket).to_string();
    daemon.join().unwrap();
    for want in [
        "upgrade the client",
        "to 99.2.0 or later",
        &format!("client stoker {VERSION}, protocol {PROTOCOL_VERSION}"),
        &format!("daemon stokerd 99.2.0, protocol {newer}"),
    ] {
        assert!(text.contains(want), "missing {want:?} in {text:?}");
    }
}
