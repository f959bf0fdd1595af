"""The package's DLPack, lease, epoch and stall machinery against a real stokerd (what
fake_daemon.py, a stand-in speaking the wire format, used to serve)."""

import ctypes
import gc
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import stoker
from conftest import CLASSES, PER_CLASS, serve_stokerd

SIDE = 8
STEPS = CLASSES * PER_CLASS // 4  # batches of 4 per epoch


def loader(dataset, daemon, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("crop", SIDE)
    return stoker.Loader(dataset, socket=daemon, **kw)


def test_epochs_iterate_and_len_is_steps_per_epoch(dataset, daemon):
    with loader(dataset, daemon, epochs=2) as ld:
        assert len(ld) == STEPS
        first = [np.from_dlpack(im.batch.indices).tolist() for im, _ in ld]
        assert len(first) == STEPS
        assert sorted(i for b in first for i in b) == list(range(CLASSES * PER_CLASS))
        assert ld.epoch == 1
        assert sum(1 for _ in ld) == STEPS
        assert list(ld) == [] and ld.next_batch() is None


def test_leases_return_when_the_last_view_dies(dataset, daemon):
    with loader(dataset, daemon) as ld:
        kept = np.from_dlpack(ld.next_batch().images)
        snapshot = kept.copy()
        gc.collect()
        # 4 slots, one held by `kept`: 30 more batches flow only if every other one returns.
        for _ in range(30):
            np.from_dlpack(ld.next_batch().images).sum()
        assert np.array_equal(kept, snapshot)
        del kept
        for _ in range(10):
            ld.next_batch()


def test_holding_every_slot_blocks_until_one_is_freed(dataset, daemon):
    with loader(dataset, daemon) as ld:
        held = [ld.next_batch() for _ in range(4)]
        got = []
        t = threading.Thread(target=lambda: got.append(ld.next_batch()))
        t.start()
        t.join(0.5)
        assert t.is_alive(), "a fifth batch arrived while all 4 slots were held"
        held.pop(0)  # the Batch dies: its slot goes back
        t.join(30)
        assert not t.is_alive() and got[0].step == 4


def test_unconsumed_capsules_release_their_share(dataset, daemon):
    is_valid = ctypes.pythonapi.PyCapsule_IsValid
    is_valid.restype = ctypes.c_int
    is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    with loader(dataset, daemon) as ld:
        for _ in range(12):
            b = ld.next_batch()
            legacy = b.images.__dlpack__()
            versioned = b.labels.__dlpack__(max_version=(1, 0))
            assert is_valid(legacy, b"dltensor") == 1
            assert is_valid(versioned, b"dltensor_versioned") == 1
            del legacy, versioned, b


def test_a_released_batch_refuses_new_exports(dataset, daemon):
    with loader(dataset, daemon) as ld:
        b = ld.next_batch()
        images = b.images
        b.release()
        with pytest.raises(stoker.StokerError, match="after release"):
            np.from_dlpack(images)


def test_a_daemon_that_stays_away_ends_the_wait_with_the_socket_and_the_bound(dataset, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("STOKER_RECONNECT_TIMEOUT", "0.5")
    served = serve_stokerd(tmp_path, ["--threads", "1", "--slots", "2"])
    sock = next(served)
    ld = loader(dataset, sock)
    assert ld.reconnect_timeout == 0.5
    ld.next_batch()
    ld.next_batch()
    served.close()  # kills the daemon
    t0 = time.monotonic()
    with pytest.raises(stoker.DaemonGone) as e:
        for _ in range(10):  # READYs already queued on the socket still arrive first
            ld.next_batch()
    assert time.monotonic() - t0 >= 0.5, "it waited for the daemon to come back"
    assert isinstance(e.value, ConnectionError)
    assert f"the daemon at {sock} went away" in str(e.value), e.value
    assert "within 0.5 s" in str(e.value) and "STOKER_RECONNECT_TIMEOUT" in str(e.value)
    state = ld.state_dict()
    assert state["epoch"] == 0 and state["step"] >= 2
    # Trying again waits again (no spin), as does a resume from the state.
    for again in (ld.next_batch, lambda: (ld.load_state_dict(state), ld.next_batch())):
        t0 = time.monotonic()
        with pytest.raises(stoker.DaemonGone, match="did not come back within 0.5 s"):
            again()
        assert time.monotonic() - t0 >= 0.5


def test_a_loader_attaches_again_only_where_it_first_attached(dataset, daemon, monkeypatch):
    ld = loader(dataset, daemon)
    first = ld.next_batch().indices.numpy().tolist()
    # Whichever socket the rule would name now (another user daemon, a system one coming back),
    # the loader goes back to its own daemon.
    monkeypatch.setattr(stoker._daemon, "resolve", lambda *a: pytest.fail("resolved again"))
    state = ld.state_dict()
    ld.close()
    second = ld.next_batch().indices.numpy().tolist()
    ld.load_state_dict(state)
    assert ld.next_batch().indices.numpy().tolist() == second != first
    ld.close()


def test_stats_split_waiting_from_the_loops_own_time(dataset, daemon):
    with loader(dataset, daemon, epochs=1) as ld:
        assert ld.stats() == {"wait_s": 0.0, "compute_s": 0.0, "batches": 0,
                              "bad_samples": 0, "bad_sample_names": [],
                              "wait_fraction": 0.0}
        while (b := ld.next_batch()) is not None:
            del b
            time.sleep(0.02)
        s = ld.stats()
        assert s["batches"] == STEPS
        # A sleep between every two calls (the last one before the call that saw the end).
        assert s["compute_s"] >= STEPS * 0.02
        assert 0.0 <= s["wait_fraction"] < 1.0
        assert s["wait_fraction"] == pytest.approx(s["wait_s"] / (s["wait_s"] + s["compute_s"]))
    # Closing keeps what was measured.
    assert ld.stats()["batches"] == STEPS


def test_a_loop_that_keeps_every_batch_is_told_why_it_waits(dataset, daemon):
    """The user's mistake from issue 24: `total = total + loss` keeps each step's graph, and
    with it each batch's images, alive; after the ring's 4 slots the wait cannot end. After a
    few seconds of it the process is told so, once, on stderr."""
    pytest.importorskip("torch", reason="the loop is a PyTorch one")
    script = f"""
import torch, stoker
loader = stoker.Loader({str(dataset)!r}, batch_size=4, crop={SIDE}, socket={str(daemon)!r})
w = torch.ones(1, 3, 1, 1, requires_grad=True)
total = 0
for images, labels in loader:
    x = torch.from_dlpack(images)
    loss = (x * w).mean()  # the graph keeps x for w's gradient
    total = total + loss   # and total keeps every step's graph
    print("step", flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        err = ""
        while time.monotonic() < deadline and "docs/python.md" not in err:
            line = proc.stderr.readline()
            if not line:
                break
            err += line
        assert "all 4 slots" in err, err
        assert "0:0, 0:1, 0:2, 0:3" in err, err
        assert '"Leases: free what you are done with"' in err, err
        assert proc.poll() is None, "the loop ended although every slot was held"
    finally:
        proc.kill()
        out, rest = proc.communicate()
    assert out.count("step") == 4, out
    assert (err + rest).count("holds all") == 1, err + rest


def epoch_steps(ld):
    """(epoch, step) of each batch one `for` over `ld` yields (keeping no batch)."""
    return [(im.batch.epoch, im.batch.step) for im, _ in ld]


def test_a_new_for_after_a_break_starts_the_next_epoch(dataset, daemon):
    """Issue 43 item 2: as a DataLoader's, a new `for` starts the next epoch; the rest of the
    epoch the loop left is dropped, and the position says so. It went on with the same epoch."""
    with loader(dataset, daemon, seed=6) as ld:
        for step, _ in enumerate(ld):
            if step == 1:
                break
        # Until a new `for` begins, the position still names the rest (state_dict resumes there).
        assert (ld.epoch, ld.state_dict()["step"]) == (0, 2)
        assert epoch_steps(ld) == [(1, s) for s in range(STEPS)], "the whole next epoch"
        assert ld.dropped == {"epoch": 0, "step": 2, "batches": STEPS - 2}
        assert (ld.state_dict()["epoch"], ld.state_dict()["step"]) == (2, 0)
        assert epoch_steps(ld) == [(2, s) for s in range(STEPS)], "a finished for drops nothing"
        assert ld.dropped == {"epoch": 0, "step": 2, "batches": STEPS - 2}, "still the last drop"


def test_max_steps_per_epoch_leaves_later_epochs_unshifted(dataset, daemon):
    """`if step >= max_steps: break` in every epoch: each epoch begins at its own first batch,
    the same samples an uninterrupted run's epoch begins with."""
    def first_indices(ld, max_steps):
        out = []
        for step, (images, _) in enumerate(ld):
            if step >= max_steps:
                break
            out.append(np.from_dlpack(images.batch.indices).tolist())
        return out

    with loader(dataset, daemon, seed=7, job="max-steps-full") as full:
        want = []
        for _ in range(3):
            want.append([np.from_dlpack(im.batch.indices).tolist() for im, _ in full][:2])
    with loader(dataset, daemon, seed=7, job="max-steps-cut") as cut:
        got = [first_indices(cut, 2) for _ in range(3)]
    assert got == want


def test_a_for_after_load_state_dict_continues_at_the_saved_batch(dataset, daemon):
    """Resuming mid-epoch is load_state_dict's: the first `for` after it goes on from there."""
    with loader(dataset, daemon, seed=6, job="state-for-a") as a:
        for step, _ in enumerate(a):
            if step == 2:
                break
        state = a.state_dict()
        a.load_state_dict(state)
        assert epoch_steps(a) == [(0, s) for s in range(3, STEPS)]
        assert a.dropped is None
