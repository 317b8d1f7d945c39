"""GPU memory shared with other processes: what this process receives (src/ipc, src/cuda/buffer.ts)
and what it shares. Received device memory is a ``DeviceBuffer`` (``__cuda_array_interface__`` and
DLPack, mapped on first use); a tensor or array put in a message is shared zero-copy (``share``). How
they travel over links: link/transfers/device_transfers.py.

The modules, by role: buffer (DeviceBuffer, DeviceArray), pool (pool imports, ImportedPool), legacy
(legacy-handle imports), event (IpcEvent), cache (the cache of mappings, and what this process
exported), exports (share(), what a tensor or array is to a send), pool_interop (cuda.core's own
import of a pool buffer).
"""
from .buffer import DeviceArray, DeviceBuffer
from .cache import _export_handles, configure_import_cache, legacy_cache_stats  # _export_handles: bench/python/weights_peer.py
from .event import IpcEvent
from .exports import Shared, share
from .pool import ImportedPool
from .pool_interop import CudaCoreImport, ipc_buffer_descriptor
from typing import Any
from .._renamed import renamed_attribute

__all__ = [
    "DeviceArray", "DeviceBuffer", "configure_import_cache", "legacy_cache_stats", "IpcEvent", "Shared", "share", "ImportedPool",
    "CudaCoreImport", "ipc_buffer_descriptor",
]


def __getattr__(name: str) -> Any:
    # The old names of these (_renamed.py): each use warns, for one release.
    return renamed_attribute(__name__, {"DeviceArray": DeviceArray}, name)
