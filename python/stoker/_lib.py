"""ctypes declarations of stoker.h, and the mapping of results to exceptions."""

import ctypes
import os
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path

OK, END = 0, 1
ERR_INVALID_ARGUMENT, ERR_NO_DAEMON, ERR_DISCONNECTED = -1, -2, -3
ERR_REFUSED, ERR_PROTOCOL, ERR_INTERNAL = -4, -5, -6

TENSOR_IMAGES, TENSOR_LABELS, TENSOR_INDICES, TENSOR_STATUS = 0, 1, 2, 3


class StokerError(RuntimeError):
    """A libstoker call failed; ``code`` is the stoker_result."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class NoDaemonError(StokerError):
    """No stoker daemon listens at the socket."""


class DisconnectedError(StokerError):
    """The daemon went away: attach again and resume from ``state_dict()``."""


class RefusedError(StokerError):
    """The daemon refused the attach (spec mismatch, rank taken, unknown dataset, ...)."""


_ERRORS = {
    ERR_NO_DAEMON: NoDaemonError,
    ERR_DISCONNECTED: DisconnectedError,
    ERR_REFUSED: RefusedError,
}


class AttachOptions(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("rank", c_uint32),
        ("world_size", c_uint32),
        ("socket", c_char_p),
        ("job", c_char_p),
        ("device", c_char_p),
        ("spec_json", c_char_p),
        ("dataset", c_char_p),
        ("seed", c_uint64),
        ("start_epoch", c_uint64),
        ("start_step", c_uint64),
    ]


class ClientInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("slots", c_uint32),
        ("steps_per_epoch", c_uint64),
        ("dataset_len", c_uint64),
        ("classes", c_uint64),
        ("slot_bytes", c_uint64),
        ("ring_bytes", c_uint64),
    ]


class BatchInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("n", c_uint32),
        ("epoch", c_uint64),
        ("step", c_uint64),
        ("images", c_void_p),
        ("image_bytes", c_uint64),
        ("labels", POINTER(c_int64)),
        ("indices", POINTER(c_uint64)),
        ("status", POINTER(c_uint8)),
        ("height", c_uint32),
        ("width", c_uint32),
        ("channels", c_uint32),
        ("dtype", c_uint32),
        ("layout", c_uint32),
    ]


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", c_void_p),
    ("deleter", _Deleter),
    ("flags", c_uint64),
    ("dl_tensor", DLTensor),
]


def _find_library():
    env = os.environ.get("STOKER_LIB")
    if env:
        return env
    here = Path(__file__).resolve().parent / "libstoker.so"
    if here.exists():
        return str(here)
    return "libstoker.so"


lib = ctypes.CDLL(_find_library())
lib.stoker_last_error.restype = c_char_p
lib.stoker_last_error.argtypes = []
lib.stoker_protocol_version.restype = c_uint32
lib.stoker_attach.restype = c_int
lib.stoker_attach.argtypes = [POINTER(AttachOptions), POINTER(c_void_p)]
lib.stoker_detach.restype = None
lib.stoker_detach.argtypes = [c_void_p]
lib.stoker_client_get_info.restype = c_int
lib.stoker_client_get_info.argtypes = [c_void_p, POINTER(ClientInfo)]
lib.stoker_position.restype = c_int
lib.stoker_position.argtypes = [c_void_p, POINTER(c_uint64), POINTER(c_uint64)]
lib.stoker_next.restype = c_int
lib.stoker_next.argtypes = [c_void_p, POINTER(c_void_p)]
lib.stoker_batch_get_info.restype = c_int
lib.stoker_batch_get_info.argtypes = [c_void_p, POINTER(BatchInfo)]
lib.stoker_batch_free.restype = None
lib.stoker_batch_free.argtypes = [c_void_p]
lib.stoker_batch_dlpack.restype = c_int
lib.stoker_batch_dlpack.argtypes = [c_void_p, c_uint32, POINTER(POINTER(DLManagedTensorVersioned))]


def check(result):
    """Raises the exception for a failed stoker_result; returns the result otherwise."""
    if result >= 0:
        return result
    message = (lib.stoker_last_error() or b"").decode("utf-8", "replace")
    raise _ERRORS.get(result, StokerError)(result, message)
