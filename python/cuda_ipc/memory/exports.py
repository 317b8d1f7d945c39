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

import ctypes
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, Union

from .. import driver as drv
from ..descriptor import ArrayMeta, dtype_name
from ..device import Device
from ..errors import IpcError
from .buffer import ArrayView, DeviceBuffer


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


def _stream_sync(stream: int, dev: Device) -> Callable[[], None]:
    def run() -> None:
        with dev.activate():
            drv.driver().call("cuStreamSynchronize", ctypes.c_void_p(stream))
    return run


def _describe_array(obj: Any, sync: bool) -> _Exported:
    """Pointer, extent, array metadata and how to wait for the producer, of a tensor/array."""
    mod = type(obj).__module__ or ""
    if mod.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda"):
        if not obj.is_cuda:
            raise IpcError("ERR_NOT_EXPORTABLE", "a CPU tensor cannot be shared as device memory; send a HostBuffer view (torch.frombuffer(hb.memory, ...)) instead")
        itemsize = obj.element_size()
        try:
            meta = ArrayMeta.make(dtype_name(obj.dtype), tuple(obj.shape), tuple(s * itemsize for s in obj.stride()))
            extent = meta.extent
        except IpcError:
            meta = None
            extent = (sum((d - 1) * s for d, s in zip(obj.shape, obj.stride())) + 1) * itemsize if obj.numel() else 0
        torch = sys.modules["torch"]
        waiter: ProducerSync = (lambda: torch.cuda.current_stream(obj.device).synchronize()) if sync else None
        return _Exported(obj.data_ptr(), extent, meta, obj, waiter, obj.device.index)
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
    if isinstance(v, (Shared, DeviceBuffer, ArrayView)):
        return True
    mod = type(v).__module__ or ""
    if mod.startswith("torch") and hasattr(v, "is_cuda"):
        return bool(v.is_cuda)
    if mod.startswith("cuda.core") and type(v).__name__ == "Buffer":
        return True
    return hasattr(type(v), "__cuda_array_interface__")
