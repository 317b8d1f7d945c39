"""cuda.core's own IPC import of a received pool buffer (src/ipc/pool-interop.ts): what it needs, and
its IPCBufferDescriptor wherever this cuda.core keeps it. cuda.core is imported lazily.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, NamedTuple

from ..errors import IpcError


class CudaCoreImport(NamedTuple):
    """What cuda.core needs to import a received pool buffer with its own IPC API."""

    allocation_handle: int  # a dup of the pool's fd, owned by the caller
    descriptor: Any  # cuda.core IPCBufferDescriptor of the whole allocation
    offset: int  # where this buffer starts in the allocation
    length: int
    device_ordinal: int


# cuda.core is imported by name (importlib): a type checker never needs it installed.
def _cuda_core() -> ModuleType:
    try:
        cc = importlib.import_module("cuda.core")  # cuda.core >= 0.4 / 1.x
        if hasattr(cc, "Buffer"):
            return cc
    except ImportError:
        pass
    try:
        return importlib.import_module("cuda.core.experimental")  # older releases
    except ImportError:
        raise IpcError("ERR_UNSUPPORTED", "cuda.core is not installed in this Python") from None


def ipc_buffer_descriptor(export_data: bytes, size: int) -> Any:
    """A cuda.core IPCBufferDescriptor for a pool allocation (its 64 bytes of export data and size)."""
    cls = None
    for modname in ("cuda.core._memory", "cuda.core._memory._ipc", "cuda.core", "cuda.core.experimental._memory"):
        try:
            mod = __import__(modname, fromlist=["IPCBufferDescriptor"])
        except ImportError:
            continue
        cls = getattr(mod, "IPCBufferDescriptor", None)
        if cls is not None:
            break
    if cls is None:
        raise IpcError("ERR_UNSUPPORTED", "this cuda.core has no IPCBufferDescriptor")
    # The same constructor cuda.core's own pickling uses (IPCBufferDescriptor.__reduce__).
    return cls._init(bytes(export_data), int(size))
