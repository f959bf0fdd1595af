"""Batches and their DLPack tensors.

A `Batch` holds one share of a ring slot's lease (a `stoker_batch*`). Its `Tensor`s are views
of the slot: each `__dlpack__` call exports a fresh `DLManagedTensorVersioned` that holds its
own share, so the slot goes back to the daemon only when the batch, its Tensor wrappers, and
every array imported from them (numpy, torch, jax) are gone.
"""

import ctypes
from ctypes import POINTER, byref

from . import _lib
from ._lib import DLManagedTensorVersioned, call, lib
from .errors import StokerError

_DTYPE_NAMES = {
    (_lib.KDL_UINT, 8): "uint8",
    (_lib.KDL_UINT, 64): "uint64",
    (_lib.KDL_INT, 64): "int64",
    (_lib.KDL_FLOAT, 16): "float16",
    (_lib.KDL_FLOAT, 32): "float32",
    (_lib.KDL_BFLOAT, 16): "bfloat16",
}

_EXPORTS = {
    "images": "stoker_batch_images",
    "labels": "stoker_batch_labels",
    "indices": "stoker_batch_indices",
    "status": "stoker_batch_status",
}


class Tensor:
    """A DLPack-capable view of one region of a batch (no copy).

    Pass it to `torch.from_dlpack`, `numpy.from_dlpack` or `jax.dlpack.from_dlpack`.
    `shape`, `dtype` (a name such as "float32") and `data_ptr` describe it.
    """

    __slots__ = ("batch", "kind", "shape", "dtype", "data_ptr")

    def __init__(self, batch, kind):
        self.batch = batch
        self.kind = kind
        ptr = self._export()
        try:
            t = ptr.contents.dl_tensor
            self.shape = tuple(t.shape[i] for i in range(t.ndim))
            self.dtype = _DTYPE_NAMES.get((t.dtype.code, t.dtype.bits), "unknown")
            self.data_ptr = t.data or 0
        finally:
            lib.stoker_dlpack_delete(ptr)

    def _export(self):
        handle = self.batch._handle
        if not handle:
            raise StokerError(f"the batch's {self.kind} tensor was used after release()")
        out = POINTER(DLManagedTensorVersioned)()
        call(_EXPORTS[self.kind], handle, byref(out))
        return out

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"stoker tensors live on the CPU, not device {dl_device}")
        if copy:
            raise BufferError("stoker tensors are views of the shared ring; copy after import")
        if stream is not None and stream != -1:
            raise BufferError(f"stream must be None for a CPU tensor, got {stream!r}")
        addr = ctypes.cast(self._export(), ctypes.c_void_p).value
        if max_version is None or tuple(max_version)[0] < 1:
            return _lib.legacy_capsule(addr)
        return _lib.versioned_capsule(addr)

    def __dlpack_device__(self):
        return (_lib.KDL_CPU, 0)

    def numpy(self):
        """A numpy array viewing the ring (needs numpy >= 1.22)."""
        import numpy

        return numpy.from_dlpack(self)

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"stoker.Tensor({self.kind}, shape={self.shape}, dtype={self.dtype})"


class Batch:
    """One batch: `images`, `labels`, `indices` (global sample indices), `status` (0 ok,
    1 replaced, 2 failed) as Tensors, and `epoch`, `step`, `n`, `slot`."""

    def __init__(self, handle):
        self._handle = handle
        header = _lib.BatchHeader()
        header.size = ctypes.sizeof(header)
        try:
            call("stoker_batch_info", handle, byref(header))
        except BaseException:
            self.release()
            raise
        self.epoch = header.epoch
        self.step = header.step
        self.n = header.n
        self.slot = header.slot

    # Tensors reference the batch, never the other way round: no reference cycle, so the
    # lease goes back as soon as the last reference does, not at the next GC pass.
    @property
    def images(self):
        return Tensor(self, "images")

    @property
    def labels(self):
        return Tensor(self, "labels")

    @property
    def indices(self):
        return Tensor(self, "indices")

    @property
    def status(self):
        return Tensor(self, "status")

    def release(self):
        """Gives up this object's share of the slot now (arrays already imported keep theirs).
        Further `__dlpack__` calls on its tensors fail."""
        handle, self._handle = self._handle, None
        if handle:
            lib.stoker_batch_release(handle)

    def __del__(self):
        if getattr(self, "_handle", None):
            self.release()

    def __repr__(self):
        return f"stoker.Batch(epoch={self.epoch}, step={self.step}, n={self.n})"
