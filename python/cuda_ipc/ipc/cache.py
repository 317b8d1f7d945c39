"""This process's caches of device memory (src/ipc/legacy.ts's import cache; the Node side keeps its
own in the addon): the mappings of received legacy handles, and what this process exported.

Legacy mappings are opened once per process and device, and kept open (idle) a while after their
last user, as Node's import cache does: reopening a handle then costs nothing, and closing a mapping
(cuIpcCloseMemHandle, which is slow while the exporter still holds the memory) happens later, for the
least recently used idle one, usually after its exporter freed it.

What this process exported: the legacy handle or pool export data of each allocation (asked of the
driver once per allocation), and the allocation each handle and export names, so that memory of
this process sent back to it maps as itself (the driver refuses to open a process's own handle).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TypeVar

from ..cuda import driver as drv
from ..cuda.device import Device
from ..errors import CudaError, IpcError

#: link.handler_state keys: the pools received on a link (id -> PoolImport), and the ids of the pools
#: whose fd went out on it.
_POOLS_RECEIVED = "cuda_ipc.pools_received"
_POOLS_SENT = "cuda_ipc.pools_sent"


# ------------------------------------------------------------------------------------------------
# Legacy mappings

class _LegacyMapping:
    __slots__ = ("base", "size", "refs", "last_use", "device")

    def __init__(self, base: int, size: int, device: Device):
        self.base = base
        self.size = size
        self.refs = 1
        self.last_use = 0
        self.device = device


_legacy_lock = threading.Lock()
_legacy_maps: dict[tuple[bytes, str], _LegacyMapping] = {}  # (handle, device uuid) -> mapping
# Indexes kept with _legacy_maps (under _legacy_lock), so that no open or release walks every
# mapping (a tensor set of a few hundred allocations opens and releases them all at once):
_legacy_by_base: dict[tuple[str, int], tuple[bytes, str]] = {}  # (device uuid, base) -> key
_legacy_idle: set[tuple[bytes, str]] = set()  # keys of mappings nobody uses (refs == 0)
# Opens in progress: a second acquire of the same key waits for the first one's mapping; opens of
# different handles run at once (the driver call is made without _legacy_lock).
_legacy_opening: dict[tuple[bytes, str], threading.Event] = {}
_legacy_clock = 0
_legacy_idle_limit = 16
_legacy_opens = 0  # [tensors hook] cuIpcOpenMemHandle calls made (legacy_cache_stats()["opened"])


def _reset_legacy() -> None:
    """Forgets every mapping without closing any (tests with a fake driver)."""
    with _legacy_lock:
        _legacy_maps.clear()
        _legacy_by_base.clear()
        _legacy_idle.clear()
        _legacy_gone.clear()


def _forget(key: tuple[bytes, str]) -> _LegacyMapping:
    """With _legacy_lock held: removes the mapping of ``key`` from the cache and its indexes."""
    m = _legacy_maps.pop(key)
    _legacy_idle.discard(key)
    if _legacy_by_base.get((key[1], m.base)) == key:
        del _legacy_by_base[(key[1], m.base)]
    return m


def _legacy_acquire(handle: bytes, user: Device) -> tuple[int, int]:
    """(base, allocation size) of the mapping of ``handle`` for ``user``, opened if need be. Threads
    opening different handles do so at once (TensorMap.bases() opens a set's handles in parallel)."""
    global _legacy_clock, _legacy_opens
    key = (handle, user.uuid)
    while True:
        with _legacy_lock:
            m = _legacy_maps.get(key)
            if m is not None:
                if m.refs == 0:
                    _legacy_idle.discard(key)
                m.refs += 1
                _legacy_clock += 1
                m.last_use = _legacy_clock
                return m.base, m.size
            opening = _legacy_opening.get(key)
            if opening is None:
                opening = _legacy_opening[key] = threading.Event()
                break
        opening.wait()  # another thread opens it: take its mapping (or open it, if that failed)
    try:
        with user.activate():
            base = drv.ipc_open_mem_handle(handle)
            try:
                size = drv.address_range(base)[1]
            except BaseException:
                drv.driver().call("cuIpcCloseMemHandle", base)
                raise
        with _legacy_lock:
            _legacy_opens += 1
            # An idle entry of this device at the same address belongs to an allocation the driver no
            # longer maps here (its handle differs, or the lookup above would have found it): stale.
            old_key = _legacy_by_base.get((user.uuid, base))
            if old_key is not None and old_key != key:
                old = _legacy_maps.get(old_key)
                if old is not None and old.base == base and old.refs == 0:
                    _forget(old_key)
            m = _LegacyMapping(base, size, user)
            _legacy_clock += 1
            m.last_use = _legacy_clock
            _legacy_maps[key] = m
            _legacy_by_base[(user.uuid, base)] = key
            return base, size
    finally:
        with _legacy_lock:
            del _legacy_opening[key]
        opening.set()


def _legacy_acquire_open(wanted: list[tuple[bytes, Device]]) -> list[tuple[int, int] | None]:
    """_legacy_acquire of each (handle, device) whose mapping is open now, under one lock; None for
    the others (nothing acquired for them)."""
    global _legacy_clock
    out: list[tuple[int, int] | None] = []
    with _legacy_lock:
        for handle, user in wanted:
            key = (handle, user.uuid)
            m = _legacy_maps.get(key)
            if m is None:
                out.append(None)
                continue
            if m.refs == 0:
                _legacy_idle.discard(key)
            m.refs += 1
            _legacy_clock += 1
            m.last_use = _legacy_clock
            out.append((m.base, m.size))
    return out


def _legacy_release(handle: bytes, user: Device) -> None:
    _legacy_release_many([(handle, user)], drop=False)


def _legacy_is_open(handle: bytes, user: Device) -> bool:
    """Whether the mapping of ``handle`` for ``user`` is open (in use or idle)."""
    return (handle, user.uuid) in _legacy_maps


def _legacy_release_many(keys: list[tuple[bytes, Device]], drop: bool) -> None:
    """Gives back one reference on the mapping of each (handle, device), under one lock (one, or a
    tensor set's at its close). A mapping nobody uses any more stays open, idle (the least recently
    used closed beyond the idle limit), unless its exporter freed it or ``drop`` asks to close it now,
    as _legacy_drop does (an idle mapping would keep its sender's memory after the sender freed it).
    Gives them all back, then raises the first failure."""
    first: BaseException | None = None
    with _legacy_lock:
        for handle, user in keys:
            key = (handle, user.uuid)
            m = _legacy_maps.get(key)
            if m is None or m.refs == 0:
                continue
            m.refs -= 1
            if m.refs:
                continue
            if drop or handle in _legacy_gone:
                _forget(key)
                if handle in _legacy_gone and not any(k[0] == handle for k in _legacy_maps):
                    _legacy_gone.discard(handle)
                try:
                    with m.device.activate():
                        drv.driver().call("cuIpcCloseMemHandle", m.base)
                except CudaError as e:
                    first = first or e
            else:
                _legacy_idle.add(key)
        if len(_legacy_idle) > _legacy_idle_limit:
            _trim_idle(_legacy_idle_limit)
    if first is not None:
        raise first


def _trim_idle(keep: int) -> None:
    """With _legacy_lock held: closes idle mappings, least recently used first, until ``keep`` remain."""
    idle = [(_legacy_maps[k].last_use, k) for k in _legacy_idle if k in _legacy_maps]
    if len(idle) <= keep:
        return
    idle.sort()
    first: BaseException | None = None
    for _, k in idle[:len(idle) - keep]:
        m = _forget(k)
        try:
            with m.device.activate():
                drv.driver().call("cuIpcCloseMemHandle", m.base)
        except CudaError as e:
            first = first or e
    if first is not None:
        raise first


_legacy_gone: set[bytes] = set()  # handles whose exporter freed them: not kept idle at their last release


def forget_legacy_allocation(handle: bytes) -> int:
    """The exporter freed the allocation of ``handle`` (a GONE notice, PROTOCOL.md 3.2): closes its
    idle mappings now, on every device, and the busy ones at their last release instead of keeping
    them idle. Returns how many it closed."""
    closed = 0
    first: BaseException | None = None
    with _legacy_lock:
        for k, m in list(_legacy_maps.items()):
            if k[0] != handle:
                continue
            if m.refs:
                _legacy_gone.add(handle)
                continue
            _forget(k)
            try:
                with m.device.activate():
                    drv.driver().call("cuIpcCloseMemHandle", m.base)
                closed += 1
            except CudaError as e:
                first = first or e
    if first is not None:
        raise first
    return closed


def _legacy_drop(handle: bytes, user: Device) -> bool:
    """[tensors hook] Closes the mapping of ``handle`` for ``user`` now if nothing uses it (instead of
    leaving it idle in the cache): tensor sets drop theirs, so that an idle mapping never keeps a
    sender's freed memory. True when one was closed."""
    with _legacy_lock:
        m = _legacy_maps.get((handle, user.uuid))
        if m is None or m.refs:
            return False
        _forget((handle, user.uuid))
        with m.device.activate():
            drv.driver().call("cuIpcCloseMemHandle", m.base)
        return True


def configure_import_cache(idle_limit: int) -> None:
    """How many unused legacy mappings stay open (default 16; least recently used closed first). An
    idle mapping keeps its allocation's memory alive after the exporter frees it, so 0 trades
    reopening cost for memory."""
    global _legacy_idle_limit
    if type(idle_limit) is not int or idle_limit < 0:
        raise IpcError("ERR_INVALID_ARG", f"idle_limit must be a non-negative int, got {idle_limit!r}")
    with _legacy_lock:
        _legacy_idle_limit = idle_limit
        _trim_idle(idle_limit)


def legacy_cache_stats() -> dict[str, int]:
    """This process's legacy mappings: ``mappings``, ``idle``, ``idle_limit``, ``references``, and ``opened``
    (handles opened so far: a mapping found in the cache opens none)."""
    with _legacy_lock:
        refs = sum(m.refs for m in _legacy_maps.values())
        idle = len(_legacy_idle)
        return {"mappings": len(_legacy_maps), "idle": idle, "idle_limit": _legacy_idle_limit, "references": refs, "opened": _legacy_opens}


# ------------------------------------------------------------------------------------------------
# What this process exported

K = TypeVar("K")
V = TypeVar("V")


class _Recent(OrderedDict[K, V]):
    """A dict that forgets its oldest entries beyond ``limit`` (entries are re-checked on use)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


# handle -> allocation base of legacy exports from this process (so that a handle sent back to us
# opens as a view instead of failing: the driver refuses to open a process's own handle).
_local_exports: dict[bytes, int] = _Recent(4096)
# export data -> pointer of pool allocations exported from this process.
_local_pool_exports: dict[bytes, int] = _Recent(4096)
# allocation base -> (its buffer id, its legacy handle or pool export data), exported from this process.
_export_handles: dict[int, tuple[int, bytes]] = _Recent(4096)
# CUmemoryPool handle -> (16-byte id, fd) of pools whose memory this process exported.
_local_pools: dict[int, tuple[bytes, int]] = {}
_export_lock = threading.Lock()
