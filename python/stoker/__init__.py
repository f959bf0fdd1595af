"""Client of the stoker daemon (``stokerd``), over the C ABI of ``libstoker.so`` (ctypes).

    import stoker, torch
    loader = stoker.Loader("/data/train", spec={"batch_size": 256, "crop": {...}}, job="run-1")
    for images, labels in loader:          # DLPack-capable views of the daemon's ring
        x = torch.from_dlpack(images)      # no copy
        ...

``libstoker.so`` is found through ``$STOKER_LIB``, else next to this package, else the
system's library path. Rank and world size default to ``RANK`` / ``WORLD_SIZE`` (torchrun).
"""

from ._lib import StokerError, NoDaemonError, DisconnectedError, RefusedError
from .loader import Batch, Loader, Tensor

__all__ = [
    "Batch",
    "DisconnectedError",
    "Loader",
    "NoDaemonError",
    "RefusedError",
    "StokerError",
    "Tensor",
]
