"""Legacy CUDA IPC handles a peer sent (src/ipc/legacy.ts): 64-byte bearer tokens for a whole
allocation, the path that CuPy, Numba and PyTorch also speak. Mapped through this process's cache of
mappings (cache.py); a handle this process exported itself maps as its own memory.
"""
from __future__ import annotations

import os
from collections.abc import Callable

from ..cuda import driver as drv
from .descriptor import LegacyHandleDescriptor
from ..cuda.device import Device
from ..errors import CudaError, IpcError
from ..parallel import each
from . import cache


class LegacyRelease:
    """The unmap of a mapping from the cache: gives back one reference on (handle, device). An object
    rather than a closure, so that a tensor set can give back hundreds at once
    (cache._legacy_release_many)."""

    __slots__ = ("handle", "user")

    def __init__(self, handle: bytes, user: Device):
        self.handle = handle
        self.user = user

    def __call__(self) -> None:
        cache._legacy_release(self.handle, self.user)


def open_legacy(desc: LegacyHandleDescriptor, user: Device) -> tuple[int, Callable[[], None]]:
    """Maps the allocation behind ``desc.handle`` for ``user``; returns (base, unmap)."""
    resident = Device.by_uuid(desc.device_uuid)
    local = cache._local_exports.get(desc.handle)
    if local is not None:
        try:
            with resident.activate():
                same = drv.ipc_get_mem_handle(local) == desc.handle
                size = drv.address_range(local)[1] if same else 0
            if same:
                _check_range(desc, size)
                user.enable_peer_access(resident)  # our own allocation, sent back to us
                return local, (lambda: None)
        except CudaError:
            pass  # freed since: fall through to the driver's answer
    try:
        base, size = cache._legacy_acquire(desc.handle, user)
    except CudaError as e:
        if e.code in ("CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_INVALID_HANDLE"):
            why = "this process exported it but has since freed the memory" if desc.pid == os.getpid() else (
                f"the exporting process {desc.pid} has exited, or freed the memory, or the bytes are not a CUDA IPC handle")
            raise IpcError("ERR_HANDLE_STALE", f"cannot open the IPC handle: {why}. Ask the exporter for a fresh descriptor") from e
        raise
    close = LegacyRelease(desc.handle, user)
    try:
        _check_range(desc, size)
    except BaseException:
        close()
        raise
    return base, close


def open_legacy_many(wanted: list[tuple[LegacyHandleDescriptor, Device]]) -> list[tuple[int, Callable[[], None]] | BaseException]:
    """open_legacy for each (descriptor, device), as one batch: the mappings already open are found
    under one lock, the others opened several at once (parallel.py: a first sync's opens). Each
    result is (base, unmap) or the error of that one."""
    out: list[tuple[int, Callable[[], None]] | BaseException | None] = [None] * len(wanted)
    rest: list[int] = []
    hits = cache._legacy_acquire_open([(d.handle, u) for d, u in wanted])
    local = cache._local_exports
    for i, ((desc, user), hit) in enumerate(zip(wanted, hits)):
        if hit is None or desc.handle in local:
            if hit is not None:
                cache._legacy_release(desc.handle, user)
            rest.append(i)
        else:
            out[i] = _mapped(desc, user, hit[0], hit[1])
    for i, r in zip(rest, each(lambda i: open_legacy(*wanted[i]), rest)):
        out[i] = r
    return [r for r in out if r is not None]


def _mapped(desc: LegacyHandleDescriptor, user: Device, base: int, size: int) -> tuple[int, Callable[[], None]] | BaseException:
    close = LegacyRelease(desc.handle, user)
    try:
        _check_range(desc, size)
    except IpcError as e:
        close()
        return e
    return base, close


def _check_range(desc: LegacyHandleDescriptor, allocation_size: int) -> None:
    if desc.offset + desc.byte_length > allocation_size:
        raise IpcError("ERR_OUT_OF_RANGE", f"the descriptor names {desc.byte_length} bytes at offset {desc.offset}, but the allocation holds only {allocation_size} bytes")
