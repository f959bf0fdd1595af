"""Batches into JAX (CPU) and PyTorch without a copy, from the installed wheel."""

import pytest

import stoker


@pytest.fixture
def own_daemon(env, monkeypatch):
    """Runs the loader in this process with the test's private runtime dir."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("STOKER_SOCKET", raising=False)


def test_jax_takes_the_batch_without_a_copy(dataset, own_daemon):
    try:
        import jax
        import jax.dlpack
    except ImportError as e:
        pytest.skip(f"SKIPPED JAX test: jax is not installed ({e}); pip install 'jax[cpu]'")
    loader = stoker.Loader(str(dataset), batch_size=8, crop=32, seed=0)
    batch = loader.next_batch()
    x = jax.dlpack.from_dlpack(batch.images)
    assert x.shape == (8, 3, 32, 32) and str(x.dtype) == "float32"
    assert x.unsafe_buffer_pointer() == batch.images.data_ptr, "JAX copied the images"
    # Labels are int64: JAX keeps them as they are only in 64-bit mode (by default it narrows
    # them to int32, which is a copy). docs/python.md says so.
    jax.config.update("jax_enable_x64", True)
    y = jax.dlpack.from_dlpack(batch.labels)
    assert y.shape == (8,) and str(y.dtype) == "int64"
    assert y.unsafe_buffer_pointer() == batch.labels.data_ptr, "JAX copied the labels"
    assert list(y.tolist()) == list(batch.labels.numpy())
    del x, y, batch
    loader.close()


def test_torch_takes_the_batch_without_a_copy(dataset, own_daemon):
    try:
        import torch
    except ImportError as e:
        pytest.skip(f"SKIPPED PyTorch test: torch is not installed in this environment ({e})")
    loader = stoker.Loader(str(dataset), batch_size=8, crop=32, seed=0)
    batch = loader.next_batch()
    x = torch.from_dlpack(batch.images)
    y = torch.from_dlpack(batch.labels)
    assert tuple(x.shape) == (8, 3, 32, 32) and x.dtype == torch.float32
    assert x.data_ptr() == batch.images.data_ptr
    assert y.data_ptr() == batch.labels.data_ptr
    del x, y, batch
    loader.close()


def test_torch_takes_gpu_batches_without_a_copy(dataset, own_daemon, monkeypatch):
    """On a machine with a GPU (skipped elsewhere): the images of `device="cuda"` are CUDA
    tensors on cuda:0 whose data pointer is the slot's, and work queued on them on PyTorch's
    current stream runs while the loader keeps releasing and receiving slots."""
    try:
        import torch
    except ImportError as e:
        pytest.skip(f"SKIPPED PyTorch GPU test: torch is not installed ({e})")
    if not torch.cuda.is_available():
        pytest.skip("SKIPPED PyTorch GPU test: torch sees no CUDA device")
    monkeypatch.setenv("STOKER_DAEMON_ARGS", "--backend cuda")
    loader = stoker.Loader(str(dataset), batch_size=8, crop=32, seed=0, device="cuda",
                           epochs=2)
    sums = []
    for batch in loader.batches():
        assert batch.images.__dlpack_device__() == (2, 0)
        x = torch.from_dlpack(batch.images)
        assert x.device == torch.device("cuda", 0)
        assert x.data_ptr() == batch.images.data_ptr, "PyTorch copied the images"
        sums.append((x.float() * 2).sum())      # queued on the current stream
        del x, batch                            # release fenced by that stream's work
    torch.cuda.synchronize()
    assert len(sums) > 0 and all(torch.isfinite(s) for s in sums)
    loader.close()
