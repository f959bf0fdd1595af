"""Fixtures for the installed-wheel tests (python/wheel-tests runs them).

These tests run in a fresh virtual environment where the built wheel is the only stoker:
no cargo on PATH, no checkout target/ in reach. Each test gets its own `XDG_RUNTIME_DIR`, so
the daemon `stoker.Loader` starts for it is its own, and every daemon a test started is
killed when the test ends (most exit by themselves after the short idle time set here).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import stoker

# Short, so that daemons the tests start go away soon; the idle test sets its own.
IDLE_EXIT = 20


def pytest_report_header(config):
    return (f"stoker {stoker.__version__} from {Path(stoker.__file__).parent}; "
            f"libstoker: {stoker.library_path()}")


def bundled_stokerd():
    return str(Path(stoker.__file__).resolve().parent / "bin" / "stokerd")


def daemons(socket_path=None):
    """PIDs of running (not zombie) stokerd processes from this wheel, optionally only those
    serving `socket_path`."""
    exe = os.path.realpath(bundled_stokerd())
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.path.realpath(f"/proc/{pid}/exe") != exe:
                continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if socket_path is None or str(socket_path).encode() in argv:
            found.append(int(pid))
    return sorted(found)


def kill_daemons(socket_path):
    for pid in daemons(socket_path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="session")
def shared_tmp():
    """A folder every user may read (the second-user test runs a process as another user)."""
    d = tempfile.mkdtemp(prefix="stoker-wheel-tests-")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def synth(path, images, classes=4, scale=0.15):
    subprocess.run(["stoker", "synth", str(path), "--images", str(images), "--classes",
                    str(classes), "--scale", str(scale), "--threads", "2"],
                   check=True, capture_output=True)
    for root, dirs, files in os.walk(path):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return path


@pytest.fixture(scope="session")
def dataset(shared_tmp):
    """64 small JPEGs in 4 classes (ImageFolder), made by the wheel's own `stoker synth`."""
    return synth(shared_tmp / "data", 64)


@pytest.fixture
def runtime(tmp_path):
    """A private XDG_RUNTIME_DIR; the per-user daemon of this test lives in it."""
    d = tmp_path / "xdg"
    d.mkdir(mode=0o700)
    sock = d / "stoker" / "stoker.sock"
    yield d
    kill_daemons(sock)


@pytest.fixture
def env(runtime):
    """The environment for client processes of this test: its own runtime dir, no
    STOKER_SOCKET, a short idle exit."""
    e = dict(os.environ)
    for var in ("STOKER_SOCKET", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID",
                "MASTER_ADDR", "MASTER_PORT", "STOKER_DAEMON_ARGS"):
        e.pop(var, None)
    e["XDG_RUNTIME_DIR"] = str(runtime)
    e["STOKER_IDLE_EXIT"] = str(IDLE_EXIT)
    return e


def user_socket(env):
    return Path(env["XDG_RUNTIME_DIR"]) / "stoker" / "stoker.sock"


def run_py(code, env, timeout=120, **kw):
    """Runs `code` in a fresh interpreter of this venv; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout, **kw)


def status_json(env, socket_path=None):
    cmd = ["stoker", "status", "--json"]
    if socket_path:
        cmd += ["--socket", str(socket_path)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wait_gone(pid, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pid not in daemons():
            return True
        time.sleep(0.2)
    return False
