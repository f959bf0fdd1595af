"""The package's DLPack, lease and resume machinery against a protocol-level stand-in daemon
(fake_daemon.py): runs everywhere, even where stokerd cannot be built."""

import ctypes
import gc
import threading

import numpy as np
import pytest

import stoker
from fake_daemon import FakeDaemon, expected_indices

SIDE = 8


@pytest.fixture
def fake(tmp_path):
    d = FakeDaemon(tmp_path / "fake.sock")
    yield str(d.path)
    d.close()


def loader(sock, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("crop", SIDE)
    return stoker.Loader("/fake", socket=sock, **kw)


def test_numpy_sees_the_ring_itself(fake):
    with loader(fake) as ld:
        b = ld.next_batch()
        assert (b.epoch, b.step, b.n) == (0, 0, 4)
        images = b.images
        a = np.from_dlpack(images)
        assert a.shape == (4, 3, SIDE, SIDE) and a.dtype == np.float32
        assert a.__array_interface__["data"][0] == images.data_ptr
        idx = np.from_dlpack(b.indices)
        assert list(idx) == expected_indices(0, 0, 4)
        assert list(np.from_dlpack(b.labels)) == [i % 3 for i in idx]
        assert np.all(a[1] == idx[1])
        a[0, 0, 0, 0] = -5.0
        assert np.from_dlpack(b.images)[0, 0, 0, 0] == -5.0
        assert ctypes.c_float.from_address(images.data_ptr).value == -5.0


def test_epochs_iterate_and_len_is_steps_per_epoch(fake):
    with loader(fake, epochs=2) as ld:
        assert len(ld) == 6
        first = [np.from_dlpack(im.batch.indices).tolist() for im, _ in ld]
        assert first == [expected_indices(0, s, 4) for s in range(6)]
        assert ld.epoch == 1
        assert sum(1 for _ in ld) == 6
        assert list(ld) == [] and ld.next_batch() is None


def test_leases_return_when_the_last_view_dies(fake):
    with loader(fake) as ld:
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


def test_holding_every_slot_blocks_until_one_is_freed(fake):
    with loader(fake) as ld:
        held = [ld.next_batch() for _ in range(4)]
        got = []
        t = threading.Thread(target=lambda: got.append(ld.next_batch()))
        t.start()
        t.join(0.5)
        assert t.is_alive(), "a fifth batch arrived while all 4 slots were held"
        held.pop(0)  # the Batch dies: its slot goes back
        t.join(10)
        assert not t.is_alive() and got[0].step == 4


def test_unconsumed_capsules_release_their_share(fake):
    is_valid = ctypes.pythonapi.PyCapsule_IsValid
    is_valid.restype = ctypes.c_int
    is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    with loader(fake) as ld:
        for _ in range(12):
            b = ld.next_batch()
            legacy = b.images.__dlpack__()
            versioned = b.labels.__dlpack__(max_version=(1, 0))
            assert is_valid(legacy, b"dltensor") == 1
            assert is_valid(versioned, b"dltensor_versioned") == 1
            del legacy, versioned, b


def test_a_released_batch_refuses_new_exports(fake):
    with loader(fake) as ld:
        b = ld.next_batch()
        images = b.images
        b.release()
        with pytest.raises(stoker.StokerError, match="after release"):
            np.from_dlpack(images)


def test_state_dict_resumes_at_the_next_batch(fake):
    a = loader(fake)
    for _ in range(8):
        a.next_batch()
    state = a.state_dict()
    assert (state["epoch"], state["step"]) == (1, 2)
    want = np.from_dlpack(a.next_batch().indices).tolist()
    a.close()
    b = loader(fake)
    b.load_state_dict(state)
    got = b.next_batch()
    assert (got.epoch, got.step) == (1, 2)
    assert np.from_dlpack(got.indices).tolist() == want == expected_indices(1, 2, 4)
    b.close()


def test_torch_takes_the_tensors_without_a_copy(fake):
    torch = pytest.importorskip("torch")
    with loader(fake) as ld:
        images, labels = next(iter(ld))
        x, y = torch.from_dlpack(images), torch.from_dlpack(labels)
        assert x.data_ptr() == images.data_ptr and x.shape == (4, 3, SIDE, SIDE)
        assert y.dtype == torch.int64 and y.tolist() == [i % 3 for i in expected_indices(0, 0, 4)]
        x[0, 0, 0, 0] = 7.0
        assert np.from_dlpack(images)[0, 0, 0, 0] == 7.0


def test_the_daemon_going_away_raises_daemon_gone_then_connect_error(tmp_path):
    d = FakeDaemon(tmp_path / "gone.sock", slots=2)
    ld = loader(str(d.path))
    ld.next_batch()
    ld.next_batch()
    d.close()
    with pytest.raises(stoker.DaemonGone) as e:
        for _ in range(10):  # READYs already queued on the socket still arrive first
            ld.next_batch()
    assert isinstance(e.value, ConnectionError) and "closed" in str(e.value)
    state = ld.state_dict()
    assert state["epoch"] == 0 and state["step"] >= 2
    ld.load_state_dict(state)  # what a trainer does to resume: reattach at the position
    with pytest.raises(stoker.ConnectError):
        ld.next_batch()


def test_stats_split_waiting_from_the_loops_own_time(fake):
    import time

    with loader(fake, epochs=1) as ld:
        assert ld.stats() == {"wait_s": 0.0, "compute_s": 0.0, "batches": 0,
                              "wait_fraction": 0.0}
        # The fake daemon ends the data once every slot is back: hold none while waiting.
        while (b := ld.next_batch()) is not None:
            del b
            time.sleep(0.02)
        s = ld.stats()
        assert s["batches"] == 6
        # Six sleeps between calls (the last one before the call that saw the end).
        assert s["compute_s"] >= 6 * 0.02
        assert 0.0 <= s["wait_fraction"] < 1.0
        assert s["wait_fraction"] == pytest.approx(s["wait_s"] / (s["wait_s"] + s["compute_s"]))
    # Closing keeps what was measured.
    assert ld.stats()["batches"] == 6
