"""A training loop survives what happens around it: Ctrl-C while it waits for a batch, and its
daemon restarting (SIGTERM, as systemd restarts it, or kill -9) under a running 2-rank job.
Each rank is a real process (loader_client_proc.py); what every rank saw, batch by batch
(epoch, step, indices, labels, a hash of the pixels), must equal an uninterrupted run's."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import CLASSES, PER_CLASS

HERE = Path(__file__).resolve().parent
N = CLASSES * PER_CLASS
BATCH = 4
SIDE = 16


def start_rank(tmp_path, name, socket, dataset, **orders):
    """Starts one rank's process; returns (process, path of its output)."""
    out = tmp_path / f"{name}.jsonl"
    o = {"socket": str(socket), "dataset": str(dataset), "job": name, "rank": 0,
         "world_size": 1, "seed": 7, "batch_size": BATCH, "crop": SIDE, "out": str(out)}
    o.update(orders)
    proc = subprocess.Popen([sys.executable, str(HERE / "loader_client_proc.py"), json.dumps(o)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, out


def finish(proc, timeout=30):
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        raise AssertionError(f"rank did not finish in {timeout} s: "
                             f"{output.decode(errors='replace')}") from None
    assert proc.returncode == 0, output.decode(errors="replace")
    return output.decode(errors="replace")


def lines(out):
    return [json.loads(line) for line in Path(out).read_text().splitlines()]


def batches(out):
    return [x for x in lines(out) if "interrupted" not in x]


def run_rank(tmp_path, name, socket, dataset, **orders):
    proc, out = start_rank(tmp_path, name, socket, dataset, **orders)
    finish(proc)
    return lines(out)


def test_ctrl_c_while_waiting_in_next_loses_no_batch(dataset, daemon, tmp_path):
    # 10 batches: past the first epoch's 6; SIGINT arrives while the 6th waits in next().
    want = run_rank(tmp_path, "plain", daemon, dataset, batches=10)
    got = run_rank(tmp_path, "ctrl-c", daemon, dataset, batches=10, interrupt_after=5)
    interrupts = [x["interrupted"] for x in got if "interrupted" in x]
    assert len(interrupts) == 1, "the SIGINT came out of the loop as a KeyboardInterrupt"
    # The position caught with the KeyboardInterrupt names the batch not yet seen.
    assert (interrupts[0]["epoch"], interrupts[0]["step"]) == (0, 5)
    seen = [x for x in got if "interrupted" not in x]
    assert [(b["epoch"], b["step"]) for b in seen] == [(b["epoch"], b["step"]) for b in want]
    assert seen == want, "the same batches, pixels included, as the uninterrupted run"
