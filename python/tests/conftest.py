"""Fixtures: a small JPEG dataset made with Pillow, and a real stokerd on a temp socket.

`stokerd` is `$STOKERD`, else the repository's `$CARGO_TARGET_DIR` / `target` build (debug,
then release). Without a working daemon the tests that need one are skipped, loudly, unless
STOKER_REQUIRE_DAEMON=1, which makes that a failure.
"""

import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from stoker._daemon import answers

REPO = Path(__file__).resolve().parents[2]
CLASSES = 3
PER_CLASS = 8


def find_stokerd():
    if os.environ.get("STOKERD"):
        return Path(os.environ["STOKERD"])
    dirs = [Path(os.environ["CARGO_TARGET_DIR"])] if os.environ.get("CARGO_TARGET_DIR") else []
    dirs.append(REPO / "target")
    for d in dirs:
        for profile in ("debug", "release"):
            if (d / profile / "stokerd").is_file():
                return d / profile / "stokerd"
    return None


def _unavailable(why):
    if os.environ.get("STOKER_REQUIRE_DAEMON") == "1":
        pytest.fail(f"no working stokerd (STOKER_REQUIRE_DAEMON=1): {why}")
    pytest.skip(f"no working stokerd: {why}")


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """An ImageFolder of CLASSES x PER_CLASS random JPEGs of assorted sizes; sample i is
    class i // PER_CLASS."""
    Image = pytest.importorskip("PIL.Image", reason="Pillow makes the test JPEGs")
    root = tmp_path_factory.mktemp("data") / "images"
    rng = random.Random(42)
    for c in range(CLASSES):
        d = root / f"class{c}"
        d.mkdir(parents=True)
        for i in range(PER_CLASS):
            w, h = rng.randint(40, 96), rng.randint(40, 96)
            img = Image.frombytes("RGB", (w, h), rng.randbytes(w * h * 3))
            img.save(d / f"{i:03}.jpg", quality=90)
    return root


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    """The socket path of a running stokerd (4 slots per ring)."""
    exe = find_stokerd()
    if exe is None or not exe.is_file():
        _unavailable("stokerd is not built (cargo build -p stoker-daemon), or set STOKERD")
    d = tmp_path_factory.mktemp("daemon")
    yield from serve_stokerd(d, ["--threads", "2", "--slots", "4"], timeout=60)


def serve_stokerd(d, args, env=None, timeout=60, what="stokerd"):
    """Starts `stokerd --socket d/stoker.sock ARGS` (stderr to d/stderr.log), yields the socket
    path once it serves, and kills the daemon after; unavailable (loudly) if it exits first or
    does not serve within `timeout` seconds."""
    sock = d / "stoker.sock"
    log = open(d / "stderr.log", "wb")
    proc = subprocess.Popen([str(find_stokerd()), "--socket", str(sock), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                            env=env)
    deadline = time.monotonic() + timeout
    try:
        while not answers(sock):
            if proc.poll() is not None:
                _unavailable(f"{what} exited with {proc.returncode}: "
                             f"{(d / 'stderr.log').read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                _unavailable(f"{what} did not serve within {timeout} s")
            time.sleep(0.02)
        yield str(sock)
    finally:
        proc.kill()
        proc.wait()
        log.close()
