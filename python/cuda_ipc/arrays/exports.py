"""Device memory this process shares (src/ipc/legacy.ts exportPointer, pool.ts exportPoolBuffer):
``share(obj, sync=...)``, and what a tensor or array is to a send: its pointer, extent, array
metadata and how to wait for the work that produced it.

A tensor or array in a message is shared, never copied: memory from an IPC-enabled memory pool
travels as a pool buffer (the pool's fd once per link, then 64 bytes of export data), any other
device memory as the legacy IPC handle of its allocation plus offset and length (the handle of an
interior pointer is the handle of its allocation's base, so PyTorch's caching-allocator
sub-allocations and views with storage offsets arrive at the right address). The object is kept
alive until the peer releases it. Before sending, the object's stream is synchronized so that the
peer sees finished data (``share(obj, sync=False)`` skips that when you ordered the work yourself).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, Union

from ..cuda import driver as drv
from ..ipc.descriptor import ArrayMeta, dtype_name
from .buffer_array import torch_contiguous
from ..errors import CudaError, IpcError
from ..ipc import cache
from .device_array import DeviceArray, DeviceBuffer


class Shared:
    """``share(obj, sync=...)``: a tensor/array to send, with options."""

    __slots__ = ("obj", "sync")

    def __init__(self, obj: Any, sync: bool):
        self.obj = obj
        self.sync = sync


def share(obj: Any, *, sync: bool = True) -> Shared:
    """Marks a CUDA tensor/array for sending. ``sync=False`` skips synchronizing its stream before the
    send (do it yourself, or make the peer wait on an event)."""
    return Shared(obj, sync)


#: How a send waits for the work that produced an array: a callable, ("stream", CUstream), ("device", None)
#: (the whole device), or None (not at all).
ProducerSync = Union[Callable[[], object], tuple[str, Any], None]


class _Exported(NamedTuple):
    ptr: int
    extent: int
    meta: ArrayMeta | None
    keep: Any
    sync: ProducerSync
    ordinal: int | None = None  # the device, when the object says (saves a driver query)
    whole: bool = False  # the object is a whole allocation (ptr is its base, extent its size)


def _describe_array(obj: Any, sync: bool) -> _Exported:
    """Pointer, extent, array metadata and how to wait for the producer, of a tensor/array."""
    mod = type(obj).__module__ or ""
    if mod.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda"):
        device = obj.get_device()
        if device < 0:
            raise IpcError("ERR_NOT_EXPORTABLE", "a CPU tensor cannot be shared as device memory; send a HostBuffer view (torch.frombuffer(hb.memory, ...)) instead")
        torch = sys.modules["torch"]
        waiter: ProducerSync = (lambda: torch.cuda.current_stream(device).synchronize()) if sync else None
        meta: ArrayMeta | None
        fast = torch_contiguous(obj)
        if fast is not None:
            meta = ArrayMeta.make(fast[0], fast[1], fast[2])
            return _Exported(obj.data_ptr(), fast[3], meta, obj, waiter, device)
        itemsize = obj.element_size()
        try:
            meta = ArrayMeta.make(dtype_name(obj.dtype), tuple(obj.shape), tuple(s * itemsize for s in obj.stride()))
            extent = meta.extent
        except IpcError:
            meta = None
            extent = (sum((d - 1) * s for d, s in zip(obj.shape, obj.stride())) + 1) * itemsize if obj.numel() else 0
        return _Exported(obj.data_ptr(), extent, meta, obj, waiter, device)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        ptr = cai["data"][0]
        meta = None
        try:
            meta = ArrayMeta.make(dtype_name(cai["typestr"]), tuple(cai["shape"]), cai.get("strides"))
            extent = meta.extent
        except IpcError:
            itemsize = int(cai["typestr"][2:])
            shape = tuple(cai["shape"])
            strides = cai.get("strides")
            if strides is None:
                n = 1
                for d in shape:
                    n *= d
                extent = n * itemsize
            else:
                extent = 0 if 0 in shape else sum((d - 1) * s for d, s in zip(shape, strides)) + itemsize
        waiter = None
        stream = cai.get("stream")
        if sync and stream is not None and ptr:
            waiter = ("stream", stream)
        elif sync and ptr:
            waiter = ("device", None)
        return _Exported(ptr, extent, meta, obj, waiter)
    if mod.startswith("cuda.core") and hasattr(obj, "handle") and hasattr(obj, "size"):
        return _Exported(int(obj.handle), int(obj.size), None, obj, ("device", None) if sync else None, whole=True)
    raise IpcError("ERR_NOT_TRANSFERABLE", f"cannot share {type(obj).__qualname__}: not a CUDA tensor or array")


def _is_device_array(v: object) -> bool:
    if isinstance(v, (Shared, DeviceBuffer, DeviceArray)):
        return True
    mod = type(v).__module__ or ""
    if mod.startswith("torch") and hasattr(v, "is_cuda"):
        return bool(v.is_cuda)
    if mod.startswith("cuda.core") and type(v).__name__ == "Buffer":
        return True
    return hasattr(type(v), "__cuda_array_interface__")


# ------------------------------------------------------------------------------------------------
# What the driver gives to share an allocation: asked once per allocation (its buffer id tells a new
# allocation at a reused address apart; PyTorch's caching allocator hands the same blocks out again
# and again), and recorded as this process's own, should it come back (cache.py).


def legacy_handle_of(base: int, buffer_id: int, what: str) -> tuple[bytes, bool]:
    """The legacy IPC handle of this process's allocation at ``base``, and whether the driver was asked
    for it now. ERR_NOT_EXPORTABLE, naming ``what``, when the driver has none for it."""
    known = cache._export_handles.get(base)
    if known is not None and buffer_id and known[0] == buffer_id:
        handle = known[1]
        cache._local_exports[handle] = base  # (still) ours, should it come back
        return handle, False
    try:
        handle = drv.ipc_get_mem_handle(base)
    except CudaError as err:
        raise IpcError("ERR_NOT_EXPORTABLE", f"the driver has no IPC handle for {what} ({err.code}); it may come from cuMemCreate/VMM "
                       "(e.g. PyTorch's expandable_segments:True), which legacy handles cannot share") from err
    with cache._export_lock:
        cache._export_handles[base] = (buffer_id, handle)
        cache._local_exports[handle] = base
    return handle, True


def pool_export_of(pool: int, base: int, buffer_id: int, what: str) -> tuple[bytes, int, bytes]:
    """(pool id, pool fd, export data) of this process's allocation at ``base`` in ``pool``: the pool's
    fd is exported once per pool (ERR_NOT_EXPORTABLE, naming ``what``, when the pool is not
    IPC-enabled), the export data asked once per allocation."""
    with cache._export_lock:
        known = cache._local_pools.get(pool)
        if known is None:
            try:
                fd = drv.pool_export_fd(pool)
            except CudaError as err:
                raise IpcError("ERR_NOT_EXPORTABLE", f"{what} lives in a memory pool that is not IPC-enabled ({err.code}); allocate it from an "
                               "IPC pool (cuda.core: DeviceMemoryResourceOptions(ipc_enabled=True)) or from cudaMalloc") from err
            known = cache._local_pools[pool] = (os.urandom(16), fd)
    pool_id, fd = known
    cached = cache._export_handles.get(base)
    if cached is not None and buffer_id and cached[0] == buffer_id:
        export = cached[1]
        cache._local_pool_exports[export] = base
    else:
        export = drv.pool_export_pointer(base)
        with cache._export_lock:
            cache._export_handles[base] = (buffer_id, export)
            cache._local_pool_exports[export] = base
    return pool_id, fd, export
