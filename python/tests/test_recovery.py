"""A training loop survives what happens around it: Ctrl-C while it waits for a batch, and its
daemon restarting (SIGTERM, as systemd restarts it, or kill -9) under a running 2-rank job.
Each rank is a real process (loader_client_proc.py); what every rank saw, batch by batch
(epoch, step, indices, labels, a hash of the pixels), must equal an uninterrupted run's."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CLASSES, PER_CLASS, find_stokerd
from stoker._daemon import answers

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


class Stokerd:
    """A stokerd on `socket` that a test stops (SIGTERM, or kill -9) and starts again there,
    as systemd restarts it."""

    def __init__(self, d):
        self.d, self.socket, self.proc, self.starts = d, d / "stoker.sock", None, 0

    def start(self):
        self.starts += 1
        log = open(self.d / f"stderr-{self.starts}.log", "wb")
        self.proc = subprocess.Popen([str(find_stokerd()), "--socket", str(self.socket),
                                      "--threads", "2", "--slots", "4"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=log)
        log.close()
        deadline = time.monotonic() + 30
        while not answers(self.socket):
            assert self.proc.poll() is None, f"stokerd exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, "stokerd did not serve within 30 s"
            time.sleep(0.02)

    def stop(self, sig):
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=20)
        assert rc == (0 if sig == signal.SIGTERM else -signal.SIGKILL), rc

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def stokerd(tmp_path):
    if find_stokerd() is None:
        pytest.skip("stokerd is not built")
    d = Stokerd(tmp_path)
    yield d
    d.kill()


def two_ranks(tmp_path, name, socket, dataset, **orders):
    """Starts ranks 0 and 1 of job `name`; returns [(process, output path)]."""
    return [start_rank(tmp_path, f"{name}-{r}", socket, dataset, job=name, rank=r, world_size=2,
                       **orders) for r in (0, 1)]


# 3 steps per epoch at world size 2: 8 batches per rank cross two epoch ends, and the restart
# comes after each rank's 4th batch, with up to 4 more already published into its ring.
RESTART_BATCHES = 8


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_a_2_rank_job_survives_its_daemon_restarting(dataset, daemon, stokerd, tmp_path, stop):
    ref = two_ranks(tmp_path, "ref", daemon, dataset, batches=RESTART_BATCHES)
    want = [(finish(p), batches(out))[1] for p, out in ref]

    stokerd.start()
    gate = tmp_path / "gate"
    ranks = two_ranks(tmp_path, "job", stokerd.socket, dataset, batches=RESTART_BATCHES,
                      hold_after=4, gate=str(gate))
    deadline = time.monotonic() + 30
    while not all(Path(str(out) + ".held").exists() for _, out in ranks):
        assert time.monotonic() < deadline, "the ranks did not take their first batches"
        assert all(p.poll() is None for p, _ in ranks), [finish(p) for p, _ in ranks]
        time.sleep(0.02)
    stokerd.stop(stop)
    gate.touch()  # the ranks ask for more while no daemon serves: they wait for it
    time.sleep(0.7)
    stokerd.start()
    outputs = [finish(p) for p, _ in ranks]
    got = [batches(out) for _, out in ranks]
    for r in (0, 1):
        assert [(b["epoch"], b["step"]) for b in got[r]] == \
            [(b["epoch"], b["step"]) for b in want[r]], outputs[r]
        assert got[r] == want[r], f"rank {r}: the same indices, labels and pixels"
        assert "waiting up to" in outputs[r] and "re-attached" in outputs[r], outputs[r]
