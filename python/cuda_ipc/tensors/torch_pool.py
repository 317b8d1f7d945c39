"""A PyTorch memory pool in a CUDA IPC pool: ``ipc_mem_pool()`` is a ``torch.cuda.MemPool`` whose
segments come from a CUDA memory pool made for IPC (POSIX file descriptors), through PyTorch's
``CUDAPluggableAllocator`` and the allocator of the native helper (native/py/torch_pool.cc)::

    pool = cuda_ipc.ipc_mem_pool()
    with torch.cuda.use_mem_pool(pool):
        model = build_model().cuda()          # every parameter in the IPC pool
    link.send({"weights": share_tensors(model.state_dict())})

Why: a tensor set of a model in PyTorch's default allocator sends one legacy IPC handle per
caching-allocator segment, and the receiver opens each (cuIpcOpenMemHandle, 150-700 us on an H200:
about 80 ms for a model of 392 segments) on its first sync. A model in an IPC pool sends the pool's
fd once and each pool allocation as 64 bytes of export data, which the receiver maps
(cuMemPoolImportPointer). The allocator carves PyTorch's segments out of a few large pool
allocations (chunks: 32 MiB first, then growing with the pool, up to 2 GiB each), so that a whole
model is a few exports and imports, not one per segment. Repeated syncs map nothing either way
(mappings are kept). Use it for a trainer that syncs weights to other processes; the default
allocator is fine for a set sent once, or where the first sync's opens do not matter.

A peer sent any tensor of a chunk can read the whole chunk (other tensors allocated in the pool
beside it): send from it only to processes you would send the whole model to. A chunk whose
segments PyTorch freed (``torch.cuda.empty_cache()``) goes back to the pool. The newest chunk may be
mostly unused (up to 2 GiB reserved ahead of need; where the device has no room for that, a chunk
just large enough); ``pool_stats`` says what the pool holds and uses.

Needs torch with ``torch.cuda.MemPool`` (2.6 or newer) and the native helper (``native_helper()``):
ERR_UNSUPPORTED otherwise, saying which. The pool of each device lives as long as the process.
"""
from __future__ import annotations

import ctypes
import importlib
import threading
from typing import Any

from ..errors import IpcError
from ..native.addon import library, native_helper

_lock = threading.Lock()
_allocator: Any = None


def _torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError as e:
        raise IpcError("ERR_UNSUPPORTED", f"ipc_mem_pool needs PyTorch ({e})") from None


def _helper() -> Any:
    """The native helper's GIL-keeping handle; ERR_UNSUPPORTED, saying why, where it is not loaded."""
    lib = library("ipc_mem_pool")
    if lib is None:
        raise IpcError("ERR_UNSUPPORTED", f"ipc_mem_pool needs cuda_ipc's native helper: {native_helper().reason}")
    return lib[0]


def last_error() -> str:
    """What the IPC pool allocator's driver answered last time something failed ('' when nothing did)."""
    lib = library("ipc_mem_pool")
    if lib is None:
        return ""
    out = ctypes.create_string_buffer(256)
    lib[0].cip_torch_last_error(out, 256)
    return out.value.decode("utf-8", "replace")


def pool_handle(device: int = 0) -> int:
    """The CUmemoryPool that ``ipc_mem_pool`` allocates from on ``device`` (made now if need be)."""
    lib = _helper()
    f = lib.cip_torch_pool
    f.restype = ctypes.c_ulonglong
    h: int = f(device)
    if not h:
        raise IpcError("ERR_UNSUPPORTED", f"could not make an IPC memory pool on device {device}: {last_error()}")
    return h


def pool_stats(device: int = 0) -> dict[str, int]:
    """What ``ipc_mem_pool``'s allocator holds on ``device``: ``chunks`` (pool allocations), ``reserved``
    (their bytes) and ``used`` (bytes in the segments PyTorch holds)."""
    lib = _helper()
    out = (ctypes.c_ulonglong * 3)()
    if lib.cip_torch_pool_stats(device, out) != 0:
        raise IpcError("ERR_INVALID_ARG", f"device {device!r} is out of range (0-63)")
    return {"chunks": out[0], "reserved": out[1], "used": out[2]}


def ipc_mem_pool(device: int | None = None) -> Any:
    """A ``torch.cuda.MemPool`` allocating from a CUDA IPC pool (see the module notes). ``device``: the
    CUDA device to check now (default: torch's current device); the pool serves whichever device
    PyTorch allocates on."""
    torch = _torch()
    mem_pool = getattr(torch.cuda, "MemPool", None)
    pluggable = getattr(getattr(torch.cuda, "memory", None), "CUDAPluggableAllocator", None)
    if mem_pool is None or pluggable is None:
        raise IpcError("ERR_UNSUPPORTED", f"ipc_mem_pool needs torch.cuda.MemPool and CUDAPluggableAllocator (PyTorch 2.6 or newer); this is {torch.__version__}")
    info = native_helper()
    if not info.active or info.path is None:
        raise IpcError("ERR_UNSUPPORTED", f"ipc_mem_pool needs cuda_ipc's native helper: {info.reason}")
    pool_handle(torch.cuda.current_device() if device is None else device)  # fails here, saying why, rather than as an OOM later
    global _allocator
    with _lock:
        if _allocator is None:
            _allocator = pluggable(info.path, "cip_torch_alloc", "cip_torch_free")
        alloc = _allocator
    return mem_pool(alloc.allocator())
