"""Batches and their DLPack tensors.

A `Batch` holds one share of a ring slot's lease (a `stoker_batch*`). Its `Tensor`s are views
of the slot: each `__dlpack__` call exports a fresh `DLManagedTensorVersioned` that holds its
own share, so the slot goes back to the daemon only when the batch, its Tensor wrappers, and
every array imported from them (numpy, torch, jax) are gone.

When the daemon serves the images from a GPU (`Loader(device="cuda")`), the images tensor is
on kDLCUDA: `__dlpack__(stream=s)` names the consumer's stream to libstoker, which records an
event there when the slot is released and gives the slot back only once it completed.
"""

import ctypes
import json
import sys
from ctypes import POINTER, byref

from . import _lib
from ._lib import DLManagedTensorVersioned, call, lib
from .errors import FieldError, StokerError, error_for

# FieldStatus (ipc/wire/src/ring/mod.rs) as FieldError.reason names it.
_FIELD_REASONS = {1: "missing", 2: "too_large", 3: "unreadable"}

_DTYPE_NAMES = {
    (_lib.KDL_UINT, 8): "uint8",
    (_lib.KDL_UINT, 64): "uint64",
    (_lib.KDL_INT, 64): "int64",
    (_lib.KDL_FLOAT, 16): "float16",
    (_lib.KDL_FLOAT, 32): "float32",
    (_lib.KDL_BFLOAT, 16): "bfloat16",
}

# numpy dtype names for copy_to_host(); bfloat16 (which numpy lacks) comes as its uint16 bits.
_HOST_DTYPES = {"uint8": "uint8", "uint64": "uint64", "int64": "int64", "float16": "float16",
                "float32": "float32", "bfloat16": "uint16"}

_EXPORTS = {
    "images": "stoker_batch_images",
    "labels": "stoker_batch_labels",
    "soft_labels": "stoker_batch_soft_labels",
    "indices": "stoker_batch_indices",
    "status": "stoker_batch_status",
}


class Tensor:
    """A DLPack-capable view of one region of a batch (no copy).

    Pass it to `torch.from_dlpack`, `numpy.from_dlpack` or `jax.dlpack.from_dlpack`.
    `shape`, `dtype` (a name such as "float32") and `data_ptr` describe it.
    """

    __slots__ = ("batch", "kind", "view", "shape", "dtype", "data_ptr", "device")

    def __init__(self, batch, kind, view=None):
        self.batch = batch
        self.kind = kind
        # For kind "images": which view (None: view 0 through stoker_batch_images).
        self.view = view
        ptr = self._export()
        try:
            t = ptr.contents.dl_tensor
            self.shape = tuple(t.shape[i] for i in range(t.ndim))
            self.dtype = _DTYPE_NAMES.get((t.dtype.code, t.dtype.bits), "unknown")
            self.data_ptr = t.data or 0
            # (DLDeviceType, id): (1, 0) on the host, (2, N) on the client's cuda:N.
            self.device = (t.device.device_type, t.device.device_id)
        finally:
            lib.stoker_dlpack_delete(ptr)

    @property
    def is_cuda(self):
        return self.device[0] == _lib.KDL_CUDA

    def _export(self):
        handle = self.batch._handle
        if not handle:
            raise StokerError(f"the batch's {self.kind} tensor was used after release()")
        out = POINTER(DLManagedTensorVersioned)()
        if self.view is None:
            call(_EXPORTS[self.kind], handle, byref(out))
        else:
            call("stoker_batch_view", handle, self.view, byref(out))
        return out

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"this stoker tensor lives on device {self.__dlpack_device__()}, "
                              f"not {tuple(dl_device)}")
        if copy:
            raise BufferError("stoker tensors are views of the shared ring; copy after import")
        if self.is_cuda:
            self._record_stream(stream)
        elif stream is not None and stream != -1:
            raise BufferError(f"stream must be None for a CPU tensor, got {stream!r}")
        addr = ctypes.cast(self._export(), ctypes.c_void_p).value
        if max_version is None or tuple(max_version)[0] < 1:
            return _lib.legacy_capsule(addr)
        return _lib.versioned_capsule(addr)

    def __dlpack_device__(self):
        return self.device

    def _record_stream(self, stream):
        """Names the consumer's stream: the slot goes back only after the work queued there
        when the batch is released completed. DLPack's numbers: 1 legacy default stream, 2
        per-thread default, else a cudaStream_t; None or -1: the current stream of PyTorch
        when it is in use, else the legacy default stream."""
        if stream is None or stream == -1:
            stream = current_stream(self.device[1])
        if not isinstance(stream, int) or stream < 0:
            raise BufferError(f"stream must be a CUDA stream handle (int), got {stream!r}")
        handle = self.batch._handle
        if not handle:
            raise StokerError(f"the batch's {self.kind} tensor was used after release()")
        call("stoker_batch_record_stream", handle, stream)

    def numpy(self):
        """A numpy array viewing the ring (needs numpy >= 1.22); host tensors only (see
        `copy_to_host` for images on a GPU)."""
        import numpy

        if self.is_cuda:
            raise BufferError(f"the {self.kind} tensor is on cuda:{self.device[1]}; "
                              "use copy_to_host() for a host copy")
        return numpy.from_dlpack(self)

    def copy_to_host(self):
        """A numpy copy of this tensor, from the ring or the GPU (synchronous: for inspection
        and tests, not the training path). bfloat16 comes as its uint16 bit patterns."""
        import numpy

        if self.kind != "images" or (self.view and not self.is_cuda):
            return numpy.array(self.numpy(), copy=True)
        if self.view:
            raise StokerError(f"copy_to_host() of view {self.view} on cuda:{self.device[1]}: "
                              "import it (torch.from_dlpack) and copy that")
        handle = self.batch._handle
        if not handle:
            raise StokerError(f"the batch's {self.kind} tensor was used after release()")
        out = numpy.empty(self.shape, dtype=_HOST_DTYPES[self.dtype])
        call("stoker_batch_copy_images_to_host", handle, out.ctypes.data, out.nbytes)
        return out

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        where = f", device=cuda:{self.device[1]}" if self.is_cuda else ""
        kind = self.kind if self.view is None else f"view {self.view}"
        return f"stoker.Tensor({kind}, shape={self.shape}, dtype={self.dtype}{where})"


def current_stream(device_id):
    """The stream a consumer that named none works on: PyTorch's current stream on
    `cuda:device_id` when PyTorch has initialised CUDA in this process, else 1 (the legacy
    default stream)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        handle = cuda.current_stream(device_id).cuda_stream
        return handle if handle != 0 else 1
    return 1


def _tensor(which):
    """A property giving one of the batch's tensors (`Tensor(batch, which)`), made anew on
    each access."""
    return property(lambda batch: Tensor(batch, which), doc=f"The batch's {which} (a Tensor).")


class Batch:
    """One batch: `images`, `labels`, `indices` (global sample indices), `status` (0 ok,
    1 replaced, 2 failed), `soft_labels` (with a batch mix, else None) as Tensors, `views` (a list of Tensors, one per view), and `epoch`, `step`, `n`, `slot`, `images_ptr` (the
    slot's images address, host or device). `fields` (when the spec asks for fields) is a dict
    of per-sample lists, `field(name, i)` one value."""

    def __init__(self, field_modes=()):
        """An empty batch: `stoker_next` writes its lease into `_handle` (pass
        `byref(batch._handle)`), then `_read_header()` fills the rest. The object exists before
        the lease does, so the lease always has an owner, even when a KeyboardInterrupt unwinds
        the call that received it (the Loader keeps the batch and hands it out next)."""
        self._handle = ctypes.c_void_p()
        # (name, "bytes" | "str" | "json") per field the spec asks for, in its order.
        self._field_modes = tuple(field_modes)
        self.epoch = None
        self.step = self.n = self.slot = self.images_ptr = None
        # Classes of the soft labels (the spec's batch_mix), 0 without a batch mix.
        self.num_classes = 0

    def _read_header(self):
        """Fills epoch, step, n, slot and images_ptr from the lease (again: it is idempotent)."""
        header = _lib.read_info(_lib.BatchHeader, "stoker_batch_info", self._handle)
        self.epoch = header.epoch
        self.step = header.step
        self.n = header.n
        self.slot = header.slot
        # Address of the first image in the ring: host memory, or the slot's device address
        # on the client's GPU (what a CUDA tensor made from `images` points at).
        self.images_ptr = header.images
        self.num_classes = header.num_classes

    # Tensors reference the batch, never the other way round: no reference cycle, so the
    # lease goes back as soon as the last reference does, not at the next GC pass.
    images = _tensor("images")
    labels = _tensor("labels")
    indices = _tensor("indices")
    status = _tensor("status")

    @property
    def soft_labels(self):
        """The soft labels a batch mix (MixUp / CutMix, the spec's `batch_mix`) made: a float32
        Tensor of shape [n, num_classes], each row summing to 1, as torchvision's
        `transforms.v2.MixUp` / `CutMix` return; None when the job has no batch mix. Made
        anew on each access."""
        if not self.num_classes:
            return None
        return Tensor(self, "soft_labels")

    @property
    def views(self):
        """The images of every view (docs/views.md), a list of Tensors, view 0 first (the
        same images as `images`); one entry for a spec without `extra_views`. Made anew on
        each access."""
        if not self._handle:
            raise StokerError("the batch's views were read after release()")
        count = ctypes.c_uint32()
        call("stoker_batch_view_count", self._handle, byref(count))
        return [Tensor(self, "images", v) for v in range(count.value)]

    @property
    def fields(self):
        """{name: [value per sample]} for the spec's fields: each value the sample's own bytes
        (copied out of the ring), decoded as the Loader's `fields` asked (bytes, str, parsed
        JSON), or a FieldError (not raised) where that sample's field is not served: the
        other samples are unaffected. Read anew on each access."""
        out = {}
        for f, (name, mode) in enumerate(self._field_modes):
            values = []
            for i in range(self.n):
                try:
                    values.append(self._field(f, name, mode, i))
                except FieldError as e:
                    values.append(e)
            out[name] = values
        return out

    def field(self, name, i):
        """Field `name` of sample `i`, decoded as the Loader's `fields` asked; raises FieldError
        (naming the sample and the reason) where it is not served."""
        for f, (known, mode) in enumerate(self._field_modes):
            if known == name:
                if not 0 <= i < self.n:
                    raise IndexError(f"sample {i} of a batch of {self.n}")
                return self._field(f, name, mode, i)
        raise KeyError(f"field {name!r}: the spec asks for {[n for n, _ in self._field_modes]}")

    def _field(self, f, name, mode, i):
        if not self._handle:
            raise StokerError(f"the batch's field {name!r} was read after release()")
        data, length, status = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_uint8()
        r = lib.stoker_batch_field(self._handle, f, i, byref(data), byref(length), byref(status))
        if r == FieldError.code:
            raise FieldError(_lib.last_error(), sample=self._index(i), field=name,
                             reason=_FIELD_REASONS.get(status.value, "unreadable"))
        if r != 0:
            raise error_for(r, f"stoker_batch_field: {_lib.last_error()}")
        raw = ctypes.string_at(data.value, length.value) if length.value else b""
        if mode == "bytes":
            return raw
        try:
            text = raw.decode("utf-8")
            return text if mode == "str" else json.loads(text)
        except ValueError as e:
            reason = "not_text" if isinstance(e, UnicodeDecodeError) else "not_json"
            what = "UTF-8 text" if reason == "not_text" else "JSON"
            sample = self._index(i)
            raise FieldError(f"field {name!r} of sample {sample} is not {what}: {e}",
                             sample=sample, field=name, reason=reason) from None

    def _index(self, i):
        """The global sample index at position `i`."""
        header = _lib.read_info(_lib.BatchHeader, "stoker_batch_info", self._handle)
        return header.indices[i]

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
