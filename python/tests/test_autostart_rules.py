"""Which socket a Loader uses and when it may start a daemon (no daemon needed)."""

import os

import pytest

import stoker
from stoker import _daemon


def test_an_explicit_socket_or_stoker_socket_is_used_as_given(monkeypatch, tmp_path):
    monkeypatch.delenv("STOKER_SOCKET", raising=False)
    assert _daemon.resolve(tmp_path / "s.sock", True) == (str(tmp_path / "s.sock"), False)
    monkeypatch.setenv("STOKER_SOCKET", "/elsewhere/s.sock")
    assert _daemon.resolve(None, True) == ("/elsewhere/s.sock", False)


def test_the_user_socket_comes_from_libstoker_under_xdg_runtime_dir_else_tmp(monkeypatch,
                                                                           tmp_path):
    # Which socket is libstoker's rule (unit-tested in ipc/src/socket/path.rs, with a system
    # daemon answering too); this checks that the package asks it.
    if os.path.exists("/run/stoker/stoker.sock"):
        pytest.skip("SKIPPED: a system daemon's socket exists on this host")
    monkeypatch.delenv("STOKER_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert _daemon.resolve(None, True) == (str(tmp_path / "stoker" / "stoker.sock"), True)
    assert _daemon.resolve(None, False) == (str(tmp_path / "stoker" / "stoker.sock"), False)
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert _daemon.resolve(None, True) == (f"/tmp/stoker-{os.getuid()}/stoker.sock", True)


def test_a_daemon_folder_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("SKIPPED: chown to another user needs root")
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(stoker.ConnectError, match="belongs to uid 65534"):
        _daemon.private_dir(d)


def test_the_daemon_folder_is_made_private(tmp_path):
    d = tmp_path / "mine"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    _daemon.private_dir(d)
    assert os.stat(d).st_mode & 0o777 == 0o700
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(stoker.ConnectError, match="not a directory"):
        _daemon.private_dir(link)


def test_idle_exit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("STOKER_IDLE_EXIT", raising=False)
    assert _daemon.idle_exit() == _daemon.DEFAULT_IDLE_EXIT
    monkeypatch.setenv("STOKER_IDLE_EXIT", "7")
    assert _daemon.idle_exit() == 7
    monkeypatch.setenv("STOKER_IDLE_EXIT", "soon")
    with pytest.raises(ValueError, match="STOKER_IDLE_EXIT"):
        _daemon.idle_exit()


def test_a_daemon_of_another_user_gets_nothing_from_a_loader(dataset):
    # A neighbour (uid 65534) runs its own stokerd in a folder it made in a shared sticky
    # folder, as it could at /tmp/stoker-<our uid>: libstoker checks the daemon's uid
    # (SO_PEERCRED) before sending the ATTACH, so the Loader refuses it by its uid.
    if os.geteuid() != 0:
        pytest.skip("SKIPPED: running a daemon as uid 65534 needs root")
    import subprocess
    import tempfile
    import time

    from conftest import find_stokerd

    top = tempfile.mkdtemp(prefix="stoker-neighbour-")
    os.chmod(top, 0o1777)
    theirs = os.path.join(top, "stoker")
    subprocess.run(["mkdir", theirs], user=65534, group=65534, check=True)
    sock = os.path.join(theirs, "stoker.sock")
    proc = subprocess.Popen([str(find_stokerd()), "--socket", sock],
                            user=65534, group=65534, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "XDG_CACHE_HOME": os.path.join(theirs, "cache")})
    try:
        deadline = time.monotonic() + 30
        while not _daemon.answers(sock):
            assert proc.poll() is None and time.monotonic() < deadline, "stokerd did not serve"
            time.sleep(0.02)
        loader = stoker.Loader(dataset, batch_size=2, crop=16, socket=sock, job="victim-job")
        with pytest.raises(stoker.ConnectError, match="runs as uid 65534"):
            next(iter(loader))
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["rm", "-rf", top])
