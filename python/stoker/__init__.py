"""stoker: augmented image batches from the stokerd daemon, as zero-copy DLPack tensors.

    import stoker, torch
    loader = stoker.Loader("/data/train", batch_size=64, crop=224)
    for images, labels in loader:
        x, y = torch.from_dlpack(images), torch.from_dlpack(labels)

ctypes over libstoker's C ABI only (see docs/python.md and docs/c-abi.md).
"""

from ._lib import lib as _cdll
from .batch import Batch, Tensor
from .errors import (
    ConnectError,
    DaemonGone,
    DatasetError,
    DeviceError,
    InternalError,
    InvalidArgument,
    ProtocolError,
    RefusedError,
    SpecError,
    StokerError,
    StokerIOError,
)
from .loader import IMAGENET_MEAN, IMAGENET_STD, Loader, build_spec, job_from_env, resolve_device

__version__ = "0.1.0"


def library_version():
    """The version of the libstoker.so in use."""
    return _cdll.stoker_version().decode()


def library_path():
    """The path of the libstoker.so in use."""
    return _cdll.path


__all__ = [
    "Batch",
    "ConnectError",
    "DaemonGone",
    "DatasetError",
    "DeviceError",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "InternalError",
    "InvalidArgument",
    "Loader",
    "ProtocolError",
    "RefusedError",
    "SpecError",
    "StokerError",
    "StokerIOError",
    "Tensor",
    "build_spec",
    "job_from_env",
    "library_path",
    "library_version",
    "resolve_device",
]
