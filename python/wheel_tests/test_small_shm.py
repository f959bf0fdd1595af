"""stoker needs no /dev/shm: with /dev/shm a 64 MB tmpfs (in a private mount namespace), four
ranks receive 224x224 float32 batches of 64 (38.5 MB each, more than half of that /dev/shm
per batch), because the rings are memfds."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import synth, user_socket

RANK = """
import json, os, stoker
import numpy as np
loader = stoker.Loader({data!r}, batch_size=64, crop=224, seed=0, job="shm")
shapes = []
for _ in range(2):
    b = loader.next_batch()
    x = np.from_dlpack(b.images)
    assert np.isfinite(x).all()  # every byte of the slot is read
    shapes.append(list(x.shape))
    del x, b
print(json.dumps({{"rank": loader.rank, "shapes": shapes}}))
"""

DRIVER = """
import json, os, subprocess, sys
shm = os.statvfs("/dev/shm")
size_mb = shm.f_blocks * shm.f_frsize / 2**20
procs = [subprocess.Popen([sys.executable, "-c", {rank!r}], stdout=subprocess.PIPE,
                          env=dict(os.environ, RANK=str(r), WORLD_SIZE="4"), text=True)
         for r in range(4)]
outs = [p.communicate(timeout=300)[0] for p in procs]
assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]
used = os.statvfs("/dev/shm")
used_mb = (used.f_blocks - used.f_bfree) * used.f_frsize / 2**20
print(json.dumps({{"shm_mb": size_mb, "shm_used_mb": used_mb,
                  "ranks": [json.loads(o) for o in outs]}}))
"""


def test_four_ranks_of_large_batches_with_a_64mb_dev_shm(env, shared_tmp):
    if os.geteuid() != 0:
        pytest.skip("SKIPPED small /dev/shm test: mounting a tmpfs needs root")
    if shutil.which("unshare") is None:
        pytest.skip("SKIPPED small /dev/shm test: unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"SKIPPED small /dev/shm test: no private mount namespace here "
                    f"({probe.stderr.strip()})")
    data = shared_tmp / "data256"
    if not data.exists():
        synth(data, 256)
    driver = DRIVER.format(rank=RANK.format(data=str(data)))
    script = ('mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" -c "$1"')
    e = dict(env, STOKER_DAEMON_ARGS="--slots 2 --threads 2")
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                          sys.executable, driver], env=e, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["shm_mb"] == 64, got
    assert got["shm_used_mb"] < 1, got
    assert sorted(r["rank"] for r in got["ranks"]) == [0, 1, 2, 3]
    for r in got["ranks"]:
        assert r["shapes"] == [[64, 3, 224, 224]] * 2, r
    assert "started stokerd" in out.stderr
    assert user_socket(env).exists()
