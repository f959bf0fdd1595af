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
    # Which socket is libstoker's rule (unit-tested in ipc/wire/src/socket/path.rs, with a system
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


# What uid 65534 runs in test_a_refusing_system_socket_is_said_and_no_daemon_is_started: a
# Loader with no socket given, then whether a daemon of its own appeared.
_REFUSED_CHILD = """
import os, sys, stoker
try:
    next(iter(stoker.Loader(sys.argv[1], batch_size=2, crop=16, epochs=1)))
    print("served")
except stoker.StokerError as e:
    print(type(e).__name__, e)
own = os.path.join(os.environ["XDG_RUNTIME_DIR"], "stoker", "stoker.sock")
print("own daemon:", os.path.exists(own))
"""


def _python_for_nobody():
    """`PYTHONPATH=<this stoker's folder> <python>` that uid 65534 can run and that imports
    this stoker: this interpreter, else the system's (a venv's may live under /root)."""
    import shutil
    import subprocess
    import sys

    site = os.path.dirname(os.path.dirname(stoker.__file__))
    for python in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if not python:
            continue
        probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                "env", f"PYTHONPATH={site}", python, "-c",
                                f"import stoker; assert stoker.__file__ == {stoker.__file__!r}"],
                               capture_output=True)
        if probe.returncode == 0:
            return f"PYTHONPATH={site} {python}"
    return None


def test_a_refusing_system_socket_is_said_and_no_daemon_is_started(dataset):
    # A root stokerd at /run/stoker/stoker.sock (a private mount namespace's own /run), its
    # socket 0660 root:root: uid 65534 may not connect. Its Loader must say which socket
    # refused it and why, and start no daemon of its own unless STOKER_PRIVATE_DAEMON=1.
    import shutil
    import subprocess
    import sys
    import tempfile

    from conftest import find_stokerd

    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        pytest.skip("SKIPPED: needs root, unshare and setpriv (a second uid, a private /run)")
    top = tempfile.mkdtemp(prefix="stoker-refused-")
    try:
        os.chmod(top, 0o755)
        data = os.path.join(top, "data")
        shutil.copytree(dataset, data)
        subprocess.run(["chmod", "-R", "a+rX", data], check=True)
        xdg = os.path.join(top, "xdg")
        os.mkdir(xdg, 0o700)
        os.chown(xdg, 65534, 65534)
        child = os.path.join(top, "child.py")
        with open(child, "w") as f:
            f.write(_REFUSED_CHILD)
        python = _python_for_nobody()
        if python is None:
            pytest.skip("SKIPPED: no Python interpreter uid 65534 may run that imports stoker")
        as_nobody = (f"setpriv --reuid=65534 --regid=65534 --clear-groups env -u STOKER_SOCKET "
                     f"XDG_RUNTIME_DIR={xdg} STOKER_IDLE_EXIT=3 {python} {child} {data}")
        script = f"""set -eu
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -m 0755 /run/stoker
{find_stokerd()} --socket /run/stoker/stoker.sock --detach >/dev/null 2>&1
echo "== asked nothing"; {as_nobody}
echo "== asked for its own"; STOKER_PRIVATE_DAEMON=1 {as_nobody}
{find_stokerd().with_name("stoker")} status --json | sed -n 's/^ *"pid": *\\([0-9]*\\),*$/\\1/p' \
    > /run/stoker/pid
kill $(cat /run/stoker/pid)
"""
        out = subprocess.run(["unshare", "--mount", "bash", "-c", script], capture_output=True,
                             text=True, timeout=120)
        text = out.stdout + out.stderr
        assert out.returncode == 0, text
        refused, own = text.split("== asked nothing")[1].split("== asked for its own")
        assert "RefusedError" in refused and "/run/stoker/stoker.sock" in refused, text
        assert "refuses this user" in refused and "STOKER_PRIVATE_DAEMON=1" in refused, text
        assert "own daemon: False" in refused, f"a daemon was started unasked:\n{text}"
        assert "served" in own and "own daemon: True" in own, text
    finally:
        subprocess.run(["rm", "-rf", top])
