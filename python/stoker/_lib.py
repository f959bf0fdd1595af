"""ctypes bindings of libstoker's C ABI (ipc/include/stoker.h), and nothing else.

Every function the header declares is bound here with its exact argument and result types;
`call()` checks each result and raises the matching `StokerError` subclass with the library's
per-thread message.

The library is found, in order, at:
1. `$STOKER_LIB` (a path to libstoker.so);
2. next to this package (built into the wheel by `pip install ./python`, see setup.py);
3. the Cargo target directory of the repository this file sits in (a source checkout):
   `$CARGO_TARGET_DIR/{release,debug}`, then `<repo>/target/{release,debug}`.
"""

import ctypes
import os
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path

from .errors import error_for

LIB_NAME = "libstoker.so"

# stoker_result values (stoker.h).
STOKER_OK = 0
STOKER_END_OF_DATA = 1

# DLPack constants (dlpack.h 1.0).
KDL_CPU = 1
KDL_CUDA = 2
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT = 0, 1, 2, 4
DLPACK_FLAG_BITMASK_READ_ONLY = 1


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


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


DELETER_VERSIONED = ctypes.CFUNCTYPE(None, c_void_p)


class DLManagedTensorVersioned(Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", c_void_p),
        ("deleter", c_void_p),
        ("flags", c_uint64),
        ("dl_tensor", DLTensor),
    ]


class DLManagedTensor(Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", c_void_p),
        ("deleter", c_void_p),
    ]


class AttachOptions(Structure):
    """stoker_attach_options"""

    _fields_ = [
        ("size", c_size_t),
        ("socket", c_char_p),
        ("job", c_char_p),
        ("rank", c_uint32),
        ("world_size", c_uint32),
        ("dataset", c_char_p),
        ("spec_json", c_char_p),
        ("seed", c_uint64),
        ("start_epoch", c_uint64),
        ("start_step", c_uint64),
        ("device", c_char_p),
        ("offset_epoch", c_uint64),
        ("offset_consumed", c_uint64),
    ]


class AttachInfo(Structure):
    """stoker_attach_info"""

    _fields_ = [
        ("size", c_size_t),
        ("slots", c_uint32),
        ("batch_size", c_uint32),
        ("steps_per_epoch", c_uint64),
        ("dataset_len", c_uint64),
        ("classes", c_uint64),
        ("height", c_uint32),
        ("width", c_uint32),
        ("next_epoch", c_uint64),
        ("next_step", c_uint64),
        ("next_consumed", c_uint64),
        ("offset_epoch_steps", c_uint64),
        ("image_memory", c_uint32),
        ("device_id", c_int32),
        ("skipped", c_uint64),
    ]


class StallInfo(Structure):
    """stoker_stall_info"""

    _fields_ = [
        ("size", c_size_t),
        ("wait_s", ctypes.c_double),
        ("compute_s", ctypes.c_double),
        ("wait_fraction", ctypes.c_double),
        ("batches", c_uint64),
        ("bad_samples", c_uint64),
    ]


class BatchHeader(Structure):
    """stoker_batch_header"""

    _fields_ = [
        ("size", c_size_t),
        ("epoch", c_uint64),
        ("step", c_uint64),
        ("n", c_uint32),
        ("slot", c_uint32),
        ("labels", POINTER(c_int64)),
        ("indices", POINTER(c_uint64)),
        ("status", POINTER(c_uint8)),
        ("images", c_uint64),
        ("images_bytes", c_uint64),
        ("images_device_type", c_int32),
        ("images_device_id", c_int32),
        ("num_classes", c_uint32),
        ("soft_labels", POINTER(ctypes.c_float)),
    ]


_RESULT = c_int32
_CLIENT = c_void_p
_BATCH = c_void_p
_TENSOR_OUT = POINTER(POINTER(DLManagedTensorVersioned))

# name: (restype, argtypes), exactly as stoker.h declares them.
_SIGNATURES = {
    "stoker_version": (c_char_p, []),
    "stoker_protocol_version": (c_uint16, []),
    "stoker_last_error": (c_char_p, []),
    "stoker_result_name": (c_char_p, [c_int32]),
    "stoker_attach_options_init": (_RESULT, [POINTER(AttachOptions)]),
    "stoker_attach": (_RESULT, [POINTER(AttachOptions), POINTER(_CLIENT)]),
    "stoker_client_info": (_RESULT, [_CLIENT, POINTER(AttachInfo)]),
    "stoker_client_class_name": (_RESULT, [_CLIENT, c_uint64, c_char_p, c_size_t,
                                           POINTER(c_size_t)]),
    "stoker_client_skipped_name": (_RESULT, [_CLIENT, c_uint64, c_char_p, c_size_t,
                                             POINTER(c_size_t)]),
    "stoker_client_bad_sample_name": (_RESULT, [_CLIENT, c_uint64, c_char_p, c_size_t,
                                                POINTER(c_size_t)]),
    "stoker_client_stall": (_RESULT, [_CLIENT, POINTER(StallInfo)]),
    "stoker_next": (_RESULT, [_CLIENT, POINTER(_BATCH)]),
    "stoker_batch_info": (_RESULT, [_BATCH, POINTER(BatchHeader)]),
    "stoker_batch_images": (_RESULT, [_BATCH, _TENSOR_OUT]),
    "stoker_batch_labels": (_RESULT, [_BATCH, _TENSOR_OUT]),
    "stoker_batch_soft_labels": (_RESULT, [_BATCH, _TENSOR_OUT]),
    "stoker_batch_indices": (_RESULT, [_BATCH, _TENSOR_OUT]),
    "stoker_batch_status": (_RESULT, [_BATCH, _TENSOR_OUT]),
    "stoker_batch_view_count": (_RESULT, [_BATCH, POINTER(c_uint32)]),
    "stoker_batch_view": (_RESULT, [_BATCH, c_uint32, _TENSOR_OUT]),
    "stoker_batch_field": (_RESULT, [_BATCH, c_uint32, c_uint32, POINTER(c_void_p),
                                     POINTER(c_size_t), POINTER(c_uint8)]),
    "stoker_batch_record_stream": (_RESULT, [_BATCH, c_size_t]),
    "stoker_batch_copy_images_to_host": (_RESULT, [_BATCH, c_void_p, c_size_t]),
    "stoker_dlpack_to_legacy": (
        _RESULT,
        [POINTER(DLManagedTensorVersioned), POINTER(POINTER(DLManagedTensor))],
    ),
    "stoker_dlpack_delete": (None, [c_void_p]),
    "stoker_batch_release": (None, [_BATCH]),
    "stoker_detach": (None, [_CLIENT]),
    "stoker_client_position": (_RESULT, [_CLIENT, POINTER(c_uint64), POINTER(c_uint64)]),
    "stoker_client_steps_in": (_RESULT, [_CLIENT, c_uint64, POINTER(c_uint64)]),
    "stoker_position_consumed": (
        _RESULT, [c_uint64, c_uint64, c_uint64, c_uint64, c_uint32, c_uint32, POINTER(c_uint64)]),
    "stoker_socket_path_resolve": (_RESULT, [POINTER(c_char_p), POINTER(c_int32)]),
}


def _repo_candidates():
    here = Path(__file__).resolve().parent
    for root in [here.parent.parent, *here.parents]:
        if (root / "Cargo.toml").is_file() and (root / "ipc").is_dir():
            dirs = []
            if os.environ.get("CARGO_TARGET_DIR"):
                dirs.append(Path(os.environ["CARGO_TARGET_DIR"]))
            dirs.append(root / "target")
            return [d / p / LIB_NAME for d in dirs for p in ("release", "debug")]
    return []


def candidates():
    """Where the library is looked for, in order."""
    out = []
    if os.environ.get("STOKER_LIB"):
        out.append(Path(os.environ["STOKER_LIB"]))
    out.append(Path(__file__).resolve().parent / LIB_NAME)
    out.extend(_repo_candidates())
    return out


def _load():
    tried = candidates()
    env = os.environ.get("STOKER_LIB")
    if env and not Path(env).is_file():
        raise ImportError(f"STOKER_LIB={env} does not exist")
    for path in tried:
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype = restype
                fn.argtypes = argtypes
            lib.path = str(path)
            return lib
    raise ImportError(
        "libstoker.so not found; build it with `cargo build --release -p stoker-client` and "
        "reinstall (`pip install ./python`), or point STOKER_LIB at it. Looked in: "
        + ", ".join(str(p) for p in tried)
    )


lib = _load()


def last_error():
    msg = lib.stoker_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def call(name, *args):
    """Calls `name`, raising the typed error for any result other than OK / END_OF_DATA."""
    result = getattr(lib, name)(*args)
    if result < 0:
        raise error_for(result, f"{name}: {last_error()}")
    return result


def read_info(struct, name, handle, on_failure=None):
    """A fresh `struct` (its leading size field set, as libstoker's versioned structs want)
    filled by the call `name(handle, &struct)`; if the call fails, `on_failure()` runs before
    the error is raised."""
    info = struct()
    info.size = ctypes.sizeof(info)
    try:
        call(name, handle, ctypes.byref(info))
    except BaseException:
        if on_failure is not None:
            on_failure()
        raise
    return info


def result_name(result):
    return lib.stoker_result_name(result).decode()


# --- DLPack capsules ----------------------------------------------------------------------

_pyapi = ctypes.pythonapi
# Private function objects (prototypes), not the shared `ctypes.pythonapi.X` attributes whose
# argtypes any other code may change. The capsule is passed as a raw address: in a destructor
# its refcount is already 0, so it must not travel as a py_object.
_PyCapsule_New = ctypes.PYFUNCTYPE(ctypes.py_object, c_void_p, c_char_p, c_void_p)(
    ("PyCapsule_New", _pyapi))
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(c_int, c_void_p, c_char_p)(("PyCapsule_IsValid", _pyapi))
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(
    ("PyCapsule_GetPointer", _pyapi))
_Py_IncRef = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", _pyapi))

# Capsule names must outlive their capsules: these module constants live as long as the
# module (and the destructors below keep their own references).
VERSIONED_NAME = b"dltensor_versioned"
LEGACY_NAME = b"dltensor"

_DESTRUCTOR = ctypes.CFUNCTYPE(None, c_void_p)


def _make_destructor(name, delete):
    # Everything the destructor needs is bound as a default argument, so it keeps working
    # while the interpreter tears modules down.
    def destructor(capsule, _valid=_PyCapsule_IsValid, _get=_PyCapsule_GetPointer,
                   _name=name, _delete=delete):
        # A consumer that took the tensor renamed the capsule ("used_..."): then it owns the
        # tensor and calls the deleter itself. Otherwise nobody took it: delete it here.
        if _valid(capsule, _name):
            _delete(_get(capsule, _name))

    cb = _DESTRUCTOR(destructor)
    # Never freed: a capsule may be destroyed at interpreter exit after this module is gone.
    _Py_IncRef(cb)
    return cb


def _delete_legacy(ptr, _cast=ctypes.cast, _t=POINTER(DLManagedTensor), _f=DELETER_VERSIONED):
    managed = _cast(ptr, _t).contents
    if managed.deleter:
        _f(managed.deleter)(ptr)


_VERSIONED_DESTRUCTOR = _make_destructor(VERSIONED_NAME, lib.stoker_dlpack_delete)
_LEGACY_DESTRUCTOR = _make_destructor(LEGACY_NAME, _delete_legacy)


def versioned_capsule(tensor_ptr):
    """Wraps a DLManagedTensorVersioned* in a "dltensor_versioned" capsule that owns it."""
    return _PyCapsule_New(tensor_ptr, VERSIONED_NAME, ctypes.cast(_VERSIONED_DESTRUCTOR, c_void_p))


def legacy_capsule(tensor_ptr):
    """Wraps a DLManagedTensorVersioned* as a pre-1.0 "dltensor" capsule that owns it."""
    legacy = POINTER(DLManagedTensor)()
    try:
        call("stoker_dlpack_to_legacy", ctypes.cast(tensor_ptr, POINTER(DLManagedTensorVersioned)),
             ctypes.byref(legacy))
    except BaseException:
        lib.stoker_dlpack_delete(tensor_ptr)
        raise
    addr = ctypes.cast(legacy, c_void_p).value
    return _PyCapsule_New(addr, LEGACY_NAME, ctypes.cast(_LEGACY_DESTRUCTOR, c_void_p))
