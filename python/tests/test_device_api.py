"""Device selection without a daemon: how `device=` is read, and that a GPU which cannot be used
is a DeviceError naming it and the reason (here: no CUDA driver at all)."""

import pytest

import stoker
from stoker.batch import current_stream


def test_device_names_are_normalised(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert stoker.resolve_device(None) == "cpu"
    assert stoker.resolve_device("cpu") == "cpu"
    assert stoker.resolve_device("cuda") == "cuda:0"
    assert stoker.resolve_device("cuda:3") == "cuda:3"
    uuid = "GPU-57e0e3c0-0000-4000-8000-000000000001"
    assert stoker.resolve_device(uuid) == uuid
    for bad in ("tpu", "cuda:x", "cuda:-1", "cuda1"):
        with pytest.raises(ValueError, match="is not 'cpu', 'cuda'"):
            stoker.resolve_device(bad)


def test_bare_cuda_follows_local_rank_under_torchrun(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert stoker.resolve_device("cuda") == "cuda:5"
    assert stoker.resolve_device("cuda:1") == "cuda:1"
    loader = stoker.Loader(tmp_path, batch_size=2, crop=8, device="cuda",
                           socket=tmp_path / "s.sock")
    assert loader.device == "cuda:5"


def test_bare_cuda_is_the_one_visible_gpu_when_each_rank_sees_one(monkeypatch):
    """Slurm and Kubernetes often give each rank exactly one GPU through CUDA_VISIBLE_DEVICES:
    LOCAL_RANK then names a device this process does not see, and "cuda" is its one GPU."""
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-57e0e3c0-0000-4000-8000-000000000001")
    assert stoker.resolve_device("cuda") == "cuda:0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert stoker.resolve_device("cuda") == "cuda:3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert stoker.resolve_device("cuda") == "cuda:0"
    # An explicit ordinal is the user's: passed on as given.
    assert stoker.resolve_device("cuda:3") == "cuda:3"


def test_a_gpu_without_a_driver_is_a_device_error_naming_it(monkeypatch, tmp_path):
    # A library path that does not exist: libcuda cannot load, whatever the machine has.
    monkeypatch.setenv("STOKER_CONNECT_TIMEOUT", "0")
    loader = stoker.Loader(tmp_path, batch_size=2, crop=8, device="cuda:1",
                           socket=tmp_path / "s.sock")
    monkeypatch.setenv("STOKER_LIBCUDA", str(tmp_path / "no-libcuda.so"))
    # (libcuda is loaded once per process: no test in this process loads a real one.)
    with pytest.raises(stoker.DeviceError) as e:
        len(loader)
    assert e.value.code == -10
    assert "cuda:1" in str(e.value) and "libcuda" in str(e.value)


def test_without_torch_the_release_fences_the_legacy_default_stream():
    assert current_stream(0) == 1
