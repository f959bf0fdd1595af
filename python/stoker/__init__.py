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
    FieldError,
    InternalError,
    InvalidArgument,
    ProtocolError,
    RefusedError,
    SpecError,
    StokerError,
    StokerIOError,
)
from .loader import IMAGENET_MEAN, IMAGENET_STD, Loader, build_spec, job_from_env, resolve_device

def library_version():
    """The version of the libstoker.so in use: `git describe` of its source at build time
    (e.g. `0.1.0+g1a2b3c4d5e`), or the crate version where it was built without git."""
    return _cdll.stoker_version().decode()


def protocol_version():
    """The protocol version libstoker speaks to stokerd; a daemon of another one refuses the
    attach, saying which side to upgrade and both versions."""
    return int(_cdll.stoker_protocol_version())


# The package and its libstoker.so ship together (the wheel bundles them): one version.
__version__ = library_version()


def library_path():
    """The path of the libstoker.so in use."""
    return _cdll.path


__all__ = [
    "Batch",
    "ConnectError",
    "DaemonGone",
    "DatasetError",
    "DeviceError",
    "FieldError",
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
    "protocol_version",
    "resolve_device",
]
