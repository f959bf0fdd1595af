"""A wheel and a daemon of different protocol versions (issue 24 item 8): the Loader's error
says which side to upgrade and both versions. The daemon is a stand-in answering as a newer
or an older stokerd would (the real daemon's side is tests/serve/versions.rs)."""

import socket
import struct
import threading

import pytest

import stoker

ERROR, ATTACHED = 7, 2


def stand_in_daemon(path, protocol, kind, body):
    """Listens at `path` and answers the first message with one datagram in `protocol`."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.send(b"SK" + struct.pack("<HHH", protocol, kind, 0) + body)
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def attach_error(tmp_path, monkeypatch, protocol, kind, body):
    monkeypatch.setenv("STOKER_CONNECT_TIMEOUT", "0")
    sock = tmp_path / "stoker.sock"
    thread = stand_in_daemon(sock, protocol, kind, body)
    loader = stoker.Loader(tmp_path, batch_size=2, crop=16, socket=sock)
    with pytest.raises(stoker.ProtocolError) as e:
        next(iter(loader))
    thread.join(5)
    return str(e.value)


def test_a_newer_daemon_tells_the_user_to_upgrade_the_wheel(tmp_path, monkeypatch):
    newer = stoker.protocol_version() + 1
    text = attach_error(tmp_path, monkeypatch, newer, ATTACHED,
                        b'{"daemon_version":"99.2.0","slots":2}')
    assert "upgrade the client (the stoker Python package" in text, text
    assert "to 99.2.0 or later" in text, text
    assert f"client stoker {stoker.__version__}, protocol {newer - 1}" in text, text
    assert f"daemon stokerd 99.2.0, protocol {newer}" in text, text


def test_an_older_daemon_tells_the_user_to_upgrade_the_daemon(tmp_path, monkeypatch):
    older = stoker.protocol_version() - 1
    # What a daemon of the previous protocol answers: an ERROR (VERSION_MISMATCH) in its own.
    text = attach_error(tmp_path, monkeypatch, older, ERROR,
                        struct.pack("<H", 2) + b"protocol version 2 (this build speaks 1)")
    assert "upgrade the daemon (stokerd)" in text, text
    assert f"to {stoker.__version__} or later" in text, text
    assert f"protocol {older}" in text, text
