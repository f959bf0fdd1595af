"""One rank of a GPU job, run as its own process by test_cuda.py: `Loader(device="cuda")` with
LOCAL_RANK choosing the GPU (as under torchrun), every spec in turn as a job of its own, each
batch checked as a CUDA DLPack producer and copied back to the host into an .npz file.

usage: cuda_client_proc.py SOCKET DATASET SPECS_JSON OUT_NPZ SEED [JOB]   (env LOCAL_RANK, RANK)
       cuda_client_proc.py fence SOCKET DATASET SPEC_JSON OUT_NPZ SEED

       cuda_client_proc.py jax SOCKET DATASET SPEC_JSON OUT_NPZ SEED

`fence` plays a framework consumer on its own CUDA stream (made through the emulated driver
with ctypes, every operation on it delayed by STOKER_EMU_OP_DELAY_US): it hands the stream to
`__dlpack__(stream=...)`, queues a write of a marker into the slot there, and drops the batch at
once. The release must wait for that write: each batch, read once the stream has drained, is
saved for the test to compare with the CPU backend's.

`jax` plays JAX without JAX: `jax.dlpack.from_dlpack` passes `__dlpack__(stream=...)` the
device's stream for external ready events (`jax/_src/dlpack.py`:
`device.get_stream_for_external_ready_events()`), not a stream its computations run on. So the
consumer names one stream (the ready-events one) and queues its work on another (the compute
one, delayed); before it drops the batch it waits for that work, as docs/python.md tells a JAX
user to (`block_until_ready()` on what was computed from the batch). Each batch, read once the
compute stream has drained, is saved for the test to compare with the CPU backend's.
"""

import ctypes
import json
import os
import sys

import numpy as np

import stoker


def main():
    socket, dataset, specs, out, seed = sys.argv[1:6]
    job = sys.argv[6] if len(sys.argv) > 6 else "py"
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    arrays = {}
    for i, spec in enumerate(json.loads(specs)):
        loader = stoker.Loader(dataset, spec=spec, device="cuda", rank=rank, world_size=2,
                               job=f"{job}-{i}", seed=int(seed), socket=socket, autostart=False)
        assert loader.device == f"cuda:{local_rank}", loader.device
        assert loader.info["image_memory"] == 1 and loader.info["device_id"] == local_rank
        slots = {}
        for step, b in enumerate(loader.batches()):
            images = b.images
            assert images.__dlpack_device__() == (2, local_rank), images.__dlpack_device__()
            assert images.data_ptr % 256 == 0
            # The tensor is the slot itself (no copy): its data pointer is the slot's address.
            assert images.data_ptr == b.images_ptr != 0
            # A slot's images live at one address for the whole attach: no copy per batch.
            assert slots.setdefault(b.slot, images.data_ptr) == images.data_ptr
            # Consumers name their stream; a CPU-only dl_device request is refused.
            capsule = images.__dlpack__(stream=1, max_version=(1, 0))
            del capsule
            try:
                images.__dlpack__(dl_device=(1, 0))
                raise AssertionError("a CUDA tensor exported to the CPU")
            except BufferError:
                pass
            try:
                images.numpy()
                raise AssertionError("numpy() of a CUDA tensor")
            except BufferError:
                pass
            key = f"{i}_{step}"
            arrays[f"images_{key}"] = images.copy_to_host()
            arrays[f"indices_{key}"] = b.indices.copy_to_host()
            arrays[f"labels_{key}"] = b.labels.copy_to_host()
            arrays[f"status_{key}"] = b.status.copy_to_host()
            arrays[f"pos_{key}"] = np.array([b.epoch, b.step])
            del images, b
        loader.close()
    np.savez(out, **arrays)
    print("done", len(arrays))


def attached_on_the_driver(job):
    """(the loader of job `job` on cuda:0 from argv, attached; `check(name, *args)` calling the
    driver libstoker uses and asserting success; the output file), with the device's primary
    context current in this thread."""
    socket, dataset, spec, out, seed = sys.argv[2:7]
    cu = ctypes.CDLL(os.environ["STOKER_LIBCUDA"])

    def check(name, *args):
        r = getattr(cu, name)(*args)
        assert r == 0, f"{name} returned {r}"

    loader = stoker.Loader(dataset, spec=json.loads(spec), device="cuda:0", rank=0,
                           world_size=1, job=job, seed=int(seed), socket=socket,
                           autostart=False)
    loader.info  # attach (the driver is initialised by libstoker)
    ctx = ctypes.c_void_p()
    check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), 0)
    check("cuCtxSetCurrent", ctx)
    return loader, check, out


class Marker:
    """0x7F bytes in pinned memory, copied over a batch's images on a stream: the write a
    consumer's late work makes. Pinned, so the copy stays queued on a delayed stream (from
    pageable memory the driver may run it before returning)."""

    def __init__(self, check):
        self.check, self.ptr, self.bytes = check, ctypes.c_void_p(), 0

    def write(self, images, n, stream):
        if self.bytes < n:
            self.check("cuMemAllocHost_v2", ctypes.byref(self.ptr), ctypes.c_size_t(n))
            ctypes.memset(self.ptr, 0x7F, n)
            self.bytes = n
        self.check("cuMemcpyHtoDAsync_v2", ctypes.c_uint64(images.data_ptr), self.ptr,
                   ctypes.c_size_t(n), stream)


def fence():
    loader, check, out = attached_on_the_driver("fence")
    stream = ctypes.c_void_p()
    check("cuStreamCreate", ctypes.byref(stream), 1)
    arrays = {}
    marker = Marker(check)
    for step, b in enumerate(loader.batches()):
        check("cuStreamSynchronize", stream)
        images = b.images
        arrays[f"images_{step}"] = images.copy_to_host()
        arrays[f"indices_{step}"] = b.indices.copy_to_host()
        capsule = images.__dlpack__(stream=stream.value)
        marker.write(images, arrays[f"images_{step}"].nbytes, stream)
        del capsule, images, b
    check("cuStreamSynchronize", stream)
    loader.close()
    np.savez(out, **arrays)
    print("done", len(arrays))


def jax_style():
    loader, check, out = attached_on_the_driver("jax")
    ready, compute = ctypes.c_void_p(), ctypes.c_void_p()
    # XLA's streams are non-blocking: neither waits for the other, nor for the default stream.
    check("cuStreamCreate", ctypes.byref(ready), 1)
    check("cuStreamCreate", ctypes.byref(compute), 1)
    marker = Marker(check)
    arrays = {}
    for step, b in enumerate(loader.batches()):
        images = b.images
        arrays[f"images_{step}"] = images.copy_to_host()
        arrays[f"indices_{step}"] = b.indices.copy_to_host()
        # What jax.dlpack.from_dlpack does: the ready-events stream, not the compute stream.
        capsule = images.__dlpack__(stream=ready.value)
        # "The computation": it writes the slot on the compute stream, after a delay.
        marker.write(images, arrays[f"images_{step}"].nbytes, compute)
        # What a JAX user must do before letting go of the batch: wait for the work that
        # reads it (`out.block_until_ready()`). The ready-events stream fences nothing of it.
        check("cuStreamSynchronize", compute)
        del capsule, images, b
    loader.close()
    np.savez(out, **arrays)
    print("done", len(arrays))


if __name__ == "__main__":
    if sys.argv[1] == "fence":
        fence()
    elif sys.argv[1] == "jax":
        jax_style()
    else:
        main()
