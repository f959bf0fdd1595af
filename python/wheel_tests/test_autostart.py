"""The per-user daemon: started on first use from the wheel, under a lock, shared by every
process of the user, gone after its idle time, and private to its user."""

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import uuid

import pytest

import stoker
from conftest import daemons, kill_daemons, run_py, status_json, user_socket, wait_gone

TAKE_BATCHES = """
import json, os, stoker
loader = stoker.Loader({data!r}, batch_size=8, crop=32, seed=1)
seen = []
for images, labels in loader:
    assert images.shape == (8, 3, 32, 32), images.shape
    seen.append(int(labels.numpy()[0]))
print(json.dumps({{"batches": len(seen), "lib": stoker.library_path()}}))
"""


def test_the_environment_is_the_wheel_alone():
    assert shutil.which("cargo") is None, "cargo is on PATH: the test would not prove much"
    lib = stoker.library_path()
    assert lib.startswith(sys.prefix), f"libstoker.so from outside the venv: {lib}"
    assert "target" not in lib.split(os.sep), lib


def test_a_script_with_no_daemon_gets_batches(env, dataset):
    sock = user_socket(env)
    assert not sock.exists()
    out = run_py(TAKE_BATCHES.format(data=str(dataset)), env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["batches"] == 8  # 64 images / 8
    # The first message names the socket and the log file.
    assert f"started stokerd for this user at {sock}" in out.stderr, out.stderr
    log = sock.parent / "stokerd.log"
    assert f"its log: {log}" in out.stderr
    assert "stokerd serving" in log.read_text()
    assert oct(sock.stat().st_mode & 0o777) == oct(0o600)
    assert oct(sock.parent.stat().st_mode & 0o777) == oct(0o700)
    assert len(daemons(sock)) == 1
    # A second script finds it and starts nothing.
    again = run_py(TAKE_BATCHES.format(data=str(dataset)), env)
    assert again.returncode == 0, again.stderr
    assert "started stokerd" not in again.stderr
    assert len(daemons(sock)) == 1


RANK = """
import json, os, sys, stoker
sys.stdin.readline()  # the start gate: every rank leaves it at once
loader = stoker.Loader({data!r}, batch_size=4, crop=32, seed=3, job="four-ranks")
indices = []
for batch in loader.batches():
    indices += [int(i) for i in batch.indices.numpy()]
    if batch.step + 1 == len(loader):
        break
print(json.dumps({{"rank": loader.rank, "indices": indices}}))
"""


def test_four_ranks_started_at_once_share_one_daemon(env, dataset):
    sock = user_socket(env)
    procs = []
    for rank in range(4):
        e = dict(env, RANK=str(rank), WORLD_SIZE="4")
        procs.append(subprocess.Popen([sys.executable, "-c", RANK.format(data=str(dataset))],
                                      env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    started = [err for _, err in results if "started stokerd" in err]
    assert len(started) == 1, f"{len(started)} ranks started a daemon: {started}"
    pids = daemons(sock)
    assert len(pids) == 1, f"stokerd processes serving {sock}: {pids}"
    shares = {json.loads(out)["rank"]: json.loads(out)["indices"] for out, _ in results}
    assert sorted(shares) == [0, 1, 2, 3]
    # DistributedSampler shares of one permutation: disjoint, together the whole dataset.
    flat = [i for r in range(4) for i in shares[r]]
    assert sorted(flat) == list(range(64)), shares
    assert all(len(shares[r]) == 16 for r in range(4))
    # Every rank attached to that one daemon: it served the one job's four ranks.
    assert status_json(env, sock)["pid"] == pids[0]


def test_the_daemon_exits_after_the_idle_time(env, dataset):
    env = dict(env, STOKER_IDLE_EXIT="2")
    sock = user_socket(env)
    out = run_py(TAKE_BATCHES.format(data=str(dataset)), env)
    assert out.returncode == 0, out.stderr
    [pid] = daemons(sock)
    assert wait_gone(pid, timeout=20), "the daemon did not exit after its idle time"
    assert not sock.exists(), "the idle daemon left its socket behind"
    log = (sock.parent / "stokerd.log").read_text()
    assert "idle-exit" in log, log
    # The next script starts a new one.
    again = run_py(TAKE_BATCHES.format(data=str(dataset)), env)
    assert again.returncode == 0, again.stderr
    assert "started stokerd" in again.stderr


def test_autostart_false_and_an_explicit_socket_start_nothing(env, dataset, tmp_path):
    code = f"""
import stoker
for kw in ({{"autostart": False}}, {{"socket": {str(tmp_path / "none.sock")!r}}}):
    try:
        len(stoker.Loader({str(dataset)!r}, batch_size=8, crop=32, **kw))
    except stoker.ConnectError as e:
        print("refused:", e)
    else:
        raise SystemExit("attached without a daemon")
"""
    out = run_py(code, dict(env, STOKER_CONNECT_TIMEOUT="0"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("refused: ") == 2, out.stdout
    assert daemons(user_socket(env)) == []


SECOND_USER = """
import json, os, socket, stoker
theirs = {theirs!r}
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    s.connect(theirs)
    refused = None
except OSError as e:
    refused = e.strerror
try:
    len(stoker.Loader({data!r}, batch_size=8, crop=32, socket=theirs, autostart=False))
    loader_refused = None
except (stoker.ConnectError, stoker.RefusedError) as e:
    loader_refused = str(e)
loader = stoker.Loader({data!r}, batch_size=8, crop=32)
n = sum(1 for _ in loader)
print(json.dumps({{"refused": refused, "loader_refused": loader_refused, "batches": n}}))
"""


def open_to_others(path):
    """Whether every folder above `path` lets other users through and `path` is readable."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        if not os.stat(os.sep.join(parts[:i])).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o004)


def test_a_second_user_gets_a_daemon_of_their_own(env, dataset):
    if os.geteuid() != 0:
        pytest.skip("SKIPPED second-user test: needs root to create a user (useradd)")
    if shutil.which("useradd") is None:
        pytest.skip("SKIPPED second-user test: useradd is not installed")
    for path in (sys.executable, stoker.__file__, os.path.join(sys.base_prefix, "lib")):
        if not open_to_others(path):
            pytest.skip(f"SKIPPED second-user test: {path} is not readable by other users "
                        "(make the venv from a system-wide python, as python/wheel-tests does)")
    ours = user_socket(env)
    first = run_py(TAKE_BATCHES.format(data=str(dataset)), env)
    assert first.returncode == 0, first.stderr
    [our_pid] = daemons(ours)
    name = f"stk{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", name],
                   check=True, capture_output=True)
    uid = pwd.getpwnam(name).pw_uid
    theirs = f"/tmp/stoker-{uid}/stoker.sock"
    try:
        e = {k: v for k, v in env.items() if k != "XDG_RUNTIME_DIR"}
        e.update(HOME="/tmp", USER=name, LOGNAME=name, STOKER_CONNECT_TIMEOUT="0")
        code = SECOND_USER.format(theirs=str(ours), data=str(dataset))
        out = subprocess.run([sys.executable, "-c", code], env=e, user=uid, cwd="/tmp",
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["refused"] == "Permission denied", got
        assert got["loader_refused"], got
        assert got["batches"] == 8, got
        assert f"started stokerd for this user at {theirs}" in out.stderr, out.stderr
        [their_pid] = daemons(theirs)
        assert their_pid != our_pid
        assert os.stat(f"/proc/{their_pid}").st_uid == uid
        assert daemons(ours) == [our_pid]
    finally:
        kill_daemons(theirs)
        shutil.rmtree(f"/tmp/stoker-{uid}", ignore_errors=True)
        subprocess.run(["userdel", name], capture_output=True)
