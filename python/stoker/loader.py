"""The Loader: an iterable of (images, labels) DLPack tensors served by stokerd."""

import ctypes
import json
import os
from ctypes import POINTER, byref, c_uint64, c_void_p

from . import _lib
from ._lib import check, lib

_CAPSULE_NAME = b"dltensor_versioned"

# Private prototypes: the shared ctypes.pythonapi function objects may be re-typed by others.
_CapsuleDestructor = ctypes.CFUNCTYPE(None, c_void_p)
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, c_void_p, ctypes.c_char_p, _CapsuleDestructor)(
    ("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_get_pointer = ctypes.PYFUNCTYPE(c_void_p, c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


@_CapsuleDestructor
def _capsule_destructor(capsule):
    # A consumer renames the capsule to "used_..." and owns the tensor; an unconsumed capsule
    # still owns it and frees it here.
    if _capsule_is_valid(capsule, _CAPSULE_NAME):
        ptr = _capsule_get_pointer(capsule, _CAPSULE_NAME)
        managed = ctypes.cast(ptr, POINTER(_lib.DLManagedTensorVersioned))
        if managed.contents.deleter:
            managed.contents.deleter(managed)


class Tensor:
    """One part of a batch (images, labels, indices or status) as a DLPack producer.

    ``torch.from_dlpack(t)``, ``np.from_dlpack(t)`` and ``jax.dlpack.from_dlpack(t)`` view the
    daemon's ring without copying; the slot stays leased until every such view is gone.
    """

    def __init__(self, batch, which):
        self._batch = batch
        self._which = which

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("stoker tensors are views of the ring; copy after import")
        if max_version is None or tuple(max_version)[0] < 1:
            raise BufferError(
                "stoker exports DLPack 1.0 (versioned) tensors; "
                "use a consumer that passes max_version (numpy >= 2.1, torch >= 2.4)"
            )
        out = POINTER(_lib.DLManagedTensorVersioned)()
        check(lib.stoker_batch_dlpack(self._batch._handle, self._which, byref(out)))
        return _capsule_new(ctypes.cast(out, c_void_p), _CAPSULE_NAME, _capsule_destructor)

    def data_ptr(self):
        """Address of the first element (in the ring: the same for every view)."""
        info = self._batch._info
        return {
            _lib.TENSOR_IMAGES: info.images,
            _lib.TENSOR_LABELS: ctypes.cast(info.labels, c_void_p).value,
            _lib.TENSOR_INDICES: ctypes.cast(info.indices, c_void_p).value,
            _lib.TENSOR_STATUS: ctypes.cast(info.status, c_void_p).value,
        }[self._which]

    def tolist(self):
        """Labels, indices or status as Python ints (a copy; for tests and small uses)."""
        info = self._batch._info
        src = {
            _lib.TENSOR_LABELS: info.labels,
            _lib.TENSOR_INDICES: info.indices,
            _lib.TENSOR_STATUS: info.status,
        }.get(self._which)
        if src is None:
            raise TypeError("tolist() is for labels, indices and status")
        return [src[i] for i in range(info.n)]


class Batch:
    """A lease on one slot; its tensors keep it alive. ``release()`` or dropping it frees it."""

    def __init__(self, handle):
        self._handle = handle
        self._info = _lib.BatchInfo(struct_size=ctypes.sizeof(_lib.BatchInfo))
        check(lib.stoker_batch_get_info(handle, byref(self._info)))
        self.epoch = self._info.epoch
        self.step = self._info.step
        self.n = self._info.n

    # Tensors are made on demand: a tensor refers to its batch, never the other way round,
    # so dropping the last reference releases the slot at once (no cycle to wait for).
    @property
    def images(self):
        return Tensor(self, _lib.TENSOR_IMAGES)

    @property
    def labels(self):
        return Tensor(self, _lib.TENSOR_LABELS)

    @property
    def indices(self):
        return Tensor(self, _lib.TENSOR_INDICES)

    @property
    def status(self):
        return Tensor(self, _lib.TENSOR_STATUS)

    def release(self):
        if self._handle:
            lib.stoker_batch_free(self._handle)
            self._handle = None

    def __del__(self):
        self.release()


def _env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


class Loader:
    """Batches of one rank of a job, one epoch per iteration.

    rank / world_size default to ``RANK`` / ``WORLD_SIZE`` (set by torchrun); the job key to
    ``STOKER_JOB``, else ``TORCHELASTIC_RUN_ID``, else ``"default"``. ``spec`` is a dict or
    JSON string (see docs/protocol.md). ``state_dict()`` / ``load_state_dict()`` resume at the
    next batch, like torchdata's StatefulDataLoader.
    """

    def __init__(self, dataset, spec, *, job=None, rank=None, world_size=None, seed=0,
                 socket=None, device="cpu"):
        self.dataset = str(dataset)
        self.spec_json = spec if isinstance(spec, str) else json.dumps(spec)
        self.job = job or os.environ.get("STOKER_JOB") or os.environ.get(
            "TORCHELASTIC_RUN_ID") or "default"
        self.rank = _env_int("RANK", 0) if rank is None else rank
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
        self.seed = seed
        self.socket = None if socket is None else str(socket)
        self.device = device
        self._client = None
        self._start = (0, 0)
        self._pending = None
        self._ended = False

    def _attach(self):
        if self._client is not None:
            return
        opts = _lib.AttachOptions(
            struct_size=ctypes.sizeof(_lib.AttachOptions),
            rank=self.rank,
            world_size=self.world_size,
            socket=None if self.socket is None else self.socket.encode(),
            job=self.job.encode(),
            device=self.device.encode(),
            spec_json=self.spec_json.encode(),
            dataset=self.dataset.encode(),
            seed=self.seed,
            start_epoch=self._start[0],
            start_step=self._start[1],
        )
        handle = c_void_p()
        check(lib.stoker_attach(byref(opts), byref(handle)))
        self._client = handle
        self._info = _lib.ClientInfo(struct_size=ctypes.sizeof(_lib.ClientInfo))
        check(lib.stoker_client_get_info(handle, byref(self._info)))

    def _next(self):
        handle = c_void_p()
        if check(lib.stoker_next(self._client, byref(handle))) == _lib.END:
            return None
        return Batch(handle)

    def batches(self):
        """Yields the next epoch's Batch objects (images, labels, indices, status, step)."""
        self._attach()
        batch = self._pending or self._next()
        self._pending = None
        if batch is None:
            self._ended = True
            return
        epoch = batch.epoch
        while batch is not None:
            if batch.epoch != epoch:
                self._pending = batch  # the next epoch starts here
                return
            yield batch
            batch = None  # hold no lease while waiting for the next one
            batch = self._next()
        self._ended = True

    def __iter__(self):
        for batch in self.batches():
            yield batch.images, batch.labels

    def __len__(self):
        self._attach()
        return self._info.steps_per_epoch

    def state_dict(self):
        """Where to resume: the batch after the last one yielded."""
        if self._pending is not None:
            return {"epoch": self._pending.epoch, "step": self._pending.step}
        if self._client is None:
            return {"epoch": self._start[0], "step": self._start[1]}
        epoch, step = c_uint64(), c_uint64()
        check(lib.stoker_position(self._client, byref(epoch), byref(step)))
        return {"epoch": epoch.value, "step": step.value}

    def load_state_dict(self, state):
        """Resumes at ``state`` (from ``state_dict()``); re-attaches on the next iteration."""
        self.close()
        self._start = (int(state["epoch"]), int(state["step"]))

    def close(self):
        """Detaches. Tensors already handed out stay readable until freed."""
        self._pending = None
        if self._client is not None:
            lib.stoker_detach(self._client)
            self._client = None

    def __del__(self):
        self.close()
