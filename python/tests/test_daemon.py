"""Against a real stokerd: zero-copy DLPack views of the ring, leases, ranks, resume."""

import ctypes
import gc
from collections import Counter

import numpy as np
import pytest

import stoker
from conftest import CLASSES, PER_CLASS

N = CLASSES * PER_CLASS
SIDE = 32


def loader(dataset, daemon, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("crop", SIDE)
    return stoker.Loader(dataset, socket=daemon, **kw)


def test_numpy_views_the_ring_without_a_copy(dataset, daemon):
    with loader(dataset, daemon, seed=1, job="zero-copy") as ld:
        b = ld.next_batch()
        images = b.images
        a = np.from_dlpack(images)
        assert a.shape == (4, 3, SIDE, SIDE) and a.dtype == np.float32
        assert a.__array_interface__["data"][0] == images.data_ptr
        assert np.all(np.isfinite(a)) and a.std() > 0
        # Writing through one view is seen through another and through the raw address.
        a[0, 0, 0, 0] = 123.5
        assert np.from_dlpack(b.images)[0, 0, 0, 0] == 123.5
        assert ctypes.c_float.from_address(images.data_ptr).value == 123.5
        labels = np.from_dlpack(b.labels)
        assert labels.dtype == np.int64 and labels.__array_interface__["data"][0] == b.labels.data_ptr


def test_labels_and_indices_match_the_dataset(dataset, daemon):
    with loader(dataset, daemon, seed=2, job="labels") as ld:
        assert len(ld) == N // 4
        info = ld.info
        assert (info["dataset_len"], info["num_classes"], info["batch_size"]) == (N, CLASSES, 4)
        # torchvision's ImageFolder names: the class folders, in label order.
        assert info["classes"] == [f"class{c}" for c in range(CLASSES)], info["classes"]
        assert info["class_to_idx"] == {f"class{c}": c for c in range(CLASSES)}
        seen = []
        for _ in range(len(ld)):
            b = ld.next_batch()
            idx = np.from_dlpack(b.indices)
            labels = np.from_dlpack(b.labels)
            status = np.from_dlpack(b.status)
            assert b.epoch == 0 and len(idx) == b.n == 4
            assert np.all(status == 0)
            # ImageFolder: sorted classes, sorted files; sample i is class i // PER_CLASS.
            assert list(labels) == [int(i) // PER_CLASS for i in idx]
            seen.extend(int(i) for i in idx)
        assert sorted(seen) == list(range(N)), "one epoch is a permutation of the dataset"


def test_two_ranks_split_each_epoch(dataset, daemon):
    ranks = [loader(dataset, daemon, seed=3, job="ranks", rank=r, world_size=2) for r in (0, 1)]
    got = []
    for ld in ranks:
        assert len(ld) == N // 2 // 4
        for images, labels in ld:  # one epoch
            got.append(set(int(i) for i in np.from_dlpack(images.batch.indices)))
    for ld in ranks:
        ld.close()
    flat = [i for s in got for i in s]
    assert sorted(flat) == list(range(N)), "disjoint across ranks, together the whole epoch"


def test_state_dict_resume_yields_the_same_next_batch(dataset, daemon):
    a = loader(dataset, daemon, seed=4, job="resume-a")
    for _ in range(4):  # into the second epoch (6 steps per epoch)
        a.next_batch()
    a.next_batch()
    a.next_batch()
    state = a.state_dict()
    assert (state["epoch"], state["step"]) == (1, 0)
    want = a.next_batch()
    want_idx = np.from_dlpack(want.indices).copy()
    want_px = np.from_dlpack(want.images).copy()
    a.close()

    b = loader(dataset, daemon, seed=4, job="resume-b")
    b.load_state_dict(state)
    got = b.next_batch()
    assert (got.epoch, got.step) == (want.epoch, want.step) == (1, 0)
    assert np.array_equal(np.from_dlpack(got.indices), want_idx)
    assert np.array_equal(np.from_dlpack(got.images), want_px), "same pixels: deterministic"
    b.close()


def test_an_array_keeps_its_slot_until_it_is_freed(dataset, daemon):
    with loader(dataset, daemon, seed=5, job="lease") as ld:
        slots = ld.info["slots"]
        first = ld.next_batch()
        kept = np.from_dlpack(first.images)
        snapshot = kept.copy()
        del first
        gc.collect()
        # Far more batches than slots: the ring only keeps going if every other slot comes
        # back, and the daemon must never refill the one `kept` still holds.
        for _ in range(3 * slots):
            b = ld.next_batch()
            _ = np.from_dlpack(b.images).sum()
        assert np.array_equal(kept, snapshot)
        del kept, b, _
        for _ in range(3 * slots):
            ld.next_batch()


def test_capsules_follow_the_dlpack_protocol(dataset, daemon):
    is_valid = ctypes.pythonapi.PyCapsule_IsValid
    is_valid.restype = ctypes.c_int
    is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    with loader(dataset, daemon, seed=6, job="capsules") as ld:
        b = ld.next_batch()
        assert b.images.__dlpack_device__() == (1, 0)
        legacy = b.images.__dlpack__()
        assert is_valid(legacy, b"dltensor") == 1
        versioned = b.images.__dlpack__(max_version=(1, 0))
        assert is_valid(versioned, b"dltensor_versioned") == 1
        with pytest.raises(BufferError):
            b.images.__dlpack__(max_version=(1, 0), copy=True)
        # Unconsumed capsules delete their tensors (and lease shares) when they die.
        del legacy, versioned, b
        for _ in range(3 * ld.info["slots"]):
            ld.next_batch()


def test_end_of_data_ends_iteration(dataset, daemon):
    with loader(dataset, daemon, seed=7, job="eod", epochs=1) as ld:
        assert sum(1 for _ in ld) == N // 4
        assert list(ld) == []
        assert ld.next_batch() is None


def test_torch_from_dlpack_shares_memory(dataset, daemon):
    torch = pytest.importorskip("torch")
    with loader(dataset, daemon, seed=8, job="torch") as ld:
        images, labels = next(iter(ld))
        x, y = torch.from_dlpack(images), torch.from_dlpack(labels)
        assert x.shape == (4, 3, SIDE, SIDE) and x.dtype == torch.float32
        assert x.data_ptr() == images.data_ptr and y.dtype == torch.int64


def test_jax_from_dlpack(dataset, daemon):
    jax = pytest.importorskip("jax")
    with loader(dataset, daemon, seed=9, job="jax") as ld:
        images, _ = next(iter(ld))
        x = jax.dlpack.from_dlpack(images)
        assert x.shape == (4, 3, SIDE, SIDE)


def test_a_checkpoint_resumes_at_another_world_size_serving_the_epoch_once(dataset, daemon):
    # World 2, batches of 2: both ranks take 2 batches (8 of the 24 samples), then stop.
    before = []
    state = None
    for rank in range(2):
        ld = loader(dataset, daemon, seed=8, job="elastic-2", rank=rank, world_size=2,
                    batch_size=2, epochs=2)
        for _ in range(2):
            before.extend(int(i) for i in np.from_dlpack(ld.next_batch().indices))
        if rank == 0:
            state = ld.state_dict()
        ld.close()
    assert (state["epoch"], state["step"], state["consumed"]) == (0, 2, 8)

    # World 3: the rest of epoch 0 (16 samples) over 3 ranks, then epoch 1 as usual.
    after, counts = [], []
    for rank in range(3):
        ld = loader(dataset, daemon, seed=8, job="elastic-3", rank=rank, world_size=3,
                    batch_size=2, epochs=2)
        ld.load_state_dict(state)
        assert len(ld) == 3  # ceil(ceil(16 / 3) / 2)
        n = 0
        for images, labels in ld:  # the rest of epoch 0
            after.extend(int(i) for i in np.from_dlpack(images.batch.indices))
            n += 1
        counts.append(n)
        assert ld.epoch == 1 and len(ld) == 4  # ceil(ceil(24 / 3) / 2)
        assert ld.state_dict()["consumed"] == 0
        ld.close()
    assert counts == [3, 3, 3], "equal batch counts, so DDP never hangs"
    seen = Counter(before + after)
    assert sorted(seen) == list(range(N)), "nothing missed"
    assert len(set(after) - set(before)) == 16, "the rest, each sample once"
    # 16 over 3 ranks pads 2 samples, wrapped to the epoch's start (served before).
    twice = [i for i, k in seen.items() if k > 1]
    assert len(twice) == 2 and set(twice) <= set(before) and max(seen.values()) == 2


def test_a_relative_path_that_does_not_exist_is_not_found(daemon, tmp_path, monkeypatch):
    """Issue 24 item 12: it said "permission denied ... not an absolute path"."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(stoker.DatasetError) as e:
        len(stoker.Loader("nope/train", batch_size=4, crop=8, socket=daemon))
    # Issue 43 item 3: said by the Loader when it is made, as "not found: PATH".
    assert str(e.value) == f"not found: {tmp_path}/nope/train", str(e.value)
    assert "permission denied" not in str(e.value)


def test_evaluation_is_served_in_dataset_order_and_training_shuffled(dataset, daemon):
    """Issue 24 item 9: shuffle=False exists, and an evaluation loader is not shuffled unless
    asked; ranks take DistributedSampler's interleaved shares of the order."""
    n = CLASSES * PER_CLASS

    def indices(**kw):
        with stoker.Loader(dataset, batch_size=4, crop=8, socket=daemon, epochs=1, **kw) as ld:
            return [i for b in ld.batches() for i in np.from_dlpack(b.indices).tolist()]

    assert indices(train=False) == list(range(n))
    assert indices(train=False, rank=1, world_size=2, job="eval-order") == list(range(1, n, 2))
    assert indices(shuffle=False) == list(range(n))
    shuffled = indices()
    assert sorted(shuffled) == list(range(n)) and shuffled != list(range(n))
    assert indices(train=False, shuffle=True) == shuffled
