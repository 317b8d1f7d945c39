"""The device allocations of a received tensor set before anything needs their buffers (tensor_map.py).

A DeviceBuffer, a lease part and a mapping reference per allocation, made for every message, cost a
repeated sync of a few hundred allocations (a model's caching-allocator segments, or its IPC pool's)
milliseconds of Python that update_in_place never uses: it needs the addresses only. So a received
set keeps each device allocation as what the record said (a legacy descriptor, or a
``LazyPool``), maps them for itself as one batch per kind (``hold``: the legacy handles through
the cache of mappings, the pool buffers under their pool's lock), gives them back as one
(``release``), and makes a DeviceBuffer only for an allocation a view or a tensor needs
(``make_buffer``), with a lease part and a mapping reference of its own: it may outlive the set.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Union

from ..ipc.descriptor import LegacyHandleDescriptor
from ..cuda.device import Device, importing_device
from ..ipc import cache
from ..arrays.device_array import _CREATE, DeviceBuffer, _Origin
from ..ipc.legacy import LegacyRelease, open_legacy, open_legacy_many
from ..ipc.pool import PoolImport

if TYPE_CHECKING:
    from ..link.lifetimes.lease import ReceivedLease


class LazyPool:
    """A pool buffer of a received set (its pool, retained by the set, and export data), not yet a
    DeviceBuffer."""

    __slots__ = ("pool", "export", "size", "offset", "length")

    def __init__(self, pool: PoolImport, export: bytes, size: int, offset: int, length: int):
        self.pool = pool
        self.export = export
        self.size = size
        self.offset = offset
        self.length = length

    @property
    def device_uuid(self) -> str:
        return self.pool.device_uuid


class PoolRelease:
    """The unmap of a pool buffer the set imported: gives back one reference on the import (an object,
    so that ``release`` can give back a pool's buffers under one hold of its lock)."""

    __slots__ = ("pool", "export")

    def __init__(self, pool: PoolImport, export: bytes):
        self.pool = pool
        self.export = export

    def __call__(self) -> None:
        self.pool.unmap(self.export)


#: A device allocation of a received set with no buffer made yet.
Lazy = Union[LegacyHandleDescriptor, LazyPool]
#: The types of Lazy, for isinstance.
LAZY_TYPES = (LegacyHandleDescriptor, LazyPool)
#: A mapping a set holds for a lazy allocation: (base, its unmap, the device it is mapped for).
HeldMapping = tuple[int, Callable[[], None], Device]


class PartLease:
    """Counts a message's allocations: its lease (if any) ends with the last of them."""

    __slots__ = ("_lease", "_open", "_lock")

    def __init__(self, lease: ReceivedLease | None, count: int):
        self._lease = lease
        self._open = count
        self._lock = threading.Lock()

    def add_one(self) -> None:
        with self._lock:
            self._open += 1

    def end_one(self) -> None:
        with self._lock:
            self._open -= 1
            last = self._open == 0
        if last and self._lease is not None:
            self._lease.end()


class AllocationLease:
    """What one allocation's handler sees as its lease: its end counts towards the message's, after
    ``on_end`` (a legacy mapping is closed then rather than left idle)."""

    __slots__ = ("_whole", "_ended", "on_end")

    def __init__(self, whole: PartLease):
        self._whole = whole
        self._ended = False
        self.on_end: Callable[[], None] | None = None

    @property
    def id(self) -> int:
        return self._whole._lease.id if self._whole._lease is not None else 0

    @property
    def ended(self) -> bool:
        return self._ended

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            if self.on_end is not None:
                self.on_end()
        finally:
            self._whole.end_one()


def dropper(origin: _Origin) -> Callable[[], None]:
    """Closes a legacy mapping once its set let go of it, unless something else here still uses it:
    an idle mapping would keep the sender's memory after the sender freed it."""
    def drop() -> None:
        if origin.user is not None and origin.descriptor is not None:  # (a legacy origin has its descriptor)
            cache._legacy_drop(origin.descriptor.handle, origin.user)
    return drop


def user_of(item: Lazy, users: dict[str, Device]) -> Device:
    """The device ``item`` is mapped for (the working device, else where it lives), via ``users``: a
    cache by device UUID for a batch."""
    uuid = item.device_uuid
    user = users.get(uuid)
    if user is None:
        user = users[uuid] = importing_device(Device.by_uuid(uuid))
    return user


def hold(items: list[Lazy], users: dict[str, Device]) -> list[HeldMapping | BaseException]:
    """Maps every item for the set itself, as one batch per kind: the mapping of each, or its error
    (the others are mapped all the same; the caller gives back what it does not keep)."""
    out: dict[int, HeldMapping | BaseException] = {}
    legacy: list[tuple[int, LegacyHandleDescriptor, Device]] = []
    pools: dict[int, list[tuple[int, LazyPool]]] = {}  # by id(pool)
    for i, item in enumerate(items):
        if isinstance(item, LegacyHandleDescriptor):
            legacy.append((i, item, user_of(item, users)))
        else:
            pools.setdefault(id(item.pool), []).append((i, item))
    if legacy:
        for (i, _, user), r in zip(legacy, open_legacy_many([(d, u) for _, d, u in legacy])):
            out[i] = r if isinstance(r, BaseException) else (r[0], r[1], user)
    for members in pools.values():
        pool = members[0][1].pool
        user = user_of(members[0][1], users)
        for (i, p), base in zip(members, pool.import_pointers([p.export for _, p in members], user)):
            out[i] = base if isinstance(base, BaseException) else (base, PoolRelease(pool, p.export), user)
    return [out[i] for i in range(len(items))]


class HeldMappings:
    """The mappings held for the lazy allocations of received sets (allocation index -> mapping), and
    their addresses once all are known: one set's, or shared by the sets decoded from one record
    while they overlap (a repeated sync's next set arrives while the last one is open), so that such
    a set takes all of them with one reference. Given back when the last set leaves."""

    __slots__ = ("by_index", "addresses", "_users", "_lock")

    def __init__(self) -> None:
        self.by_index: dict[int, HeldMapping] = {}
        #: every allocation's address (the sets sharing these have only lazy allocations, so the same ones)
        self.addresses: list[int] | None = None
        self._users = 1
        self._lock = threading.Lock()

    def join(self) -> bool:
        """One more set shares these; False once the last one left (nothing held any more)."""
        with self._lock:
            if self._users <= 0:
                return False
            self._users += 1
            return True

    def keep(self, indexes: list[int], results: list[HeldMapping | BaseException], closing: bool) -> tuple[list[HeldMapping], set[int], BaseException | None]:
        """Keeps the mappings made for allocations ``indexes`` (none when ``closing``; none that is held
        already): (what to give back, the allocations that failed, the first failure)."""
        undo: list[HeldMapping] = []
        failed: set[int] = set()
        first: BaseException | None = None
        with self._lock:
            for a, r in zip(indexes, results):
                if isinstance(r, BaseException):
                    failed.add(a)
                    first = first or r
                elif closing or self._users <= 0 or a in self.by_index:
                    undo.append(r)
                else:
                    self.by_index[a] = r
        return undo, failed, first

    def leave(self) -> list[HeldMapping]:
        """One set lets go: every mapping, to give back, when it was the last one; else none."""
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return []
            out = list(self.by_index.values())
            self.by_index = {}
            self.addresses = None
            return out


def needs_driver(item: Lazy, users: dict[str, Device]) -> bool:
    """Whether mapping ``item`` takes a driver call now: not mapped in this process yet, and not this
    process's own memory sent back to it."""
    if isinstance(item, LegacyHandleDescriptor):
        return item.handle not in cache._local_exports and not cache._legacy_is_open(item.handle, user_of(item, users))
    return item.export not in cache._local_pool_exports and not item.pool.is_imported(item.export)


class MapAhead:
    """``hold`` of some of a set's lazy allocations on a thread of its own, started as the set is
    decoded: a first sync's handle opens and pool imports (tens of milliseconds in the driver, without
    the GIL) then run while the table is decoded and the update planned."""

    def __init__(self, indexes: list[int], items: list[Lazy]):
        self.indexes = indexes
        self._results: list[HeldMapping | BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(items,), name="cuda_ipc-map-ahead", daemon=True)
        self._thread.start()

    def _run(self, items: list[Lazy]) -> None:
        try:
            self._results = hold(items, {})
        except BaseException as e:  # noqa: BLE001 - each item's answer, for whoever collects them
            self._results = [e] * len(items)

    def results(self) -> list[HeldMapping | BaseException]:
        """Waits for the mappings: each one's, or its error."""
        self._thread.join()
        return self._results


def map_ahead(items: Sequence[object]) -> MapAhead | None:
    """A MapAhead for the lazy allocations among ``items`` that take a driver call to map, or None when
    there are none (a repeated sync: everything is mapped already)."""
    users: dict[str, Device] = {}
    wanted = [(i, x) for i, x in enumerate(items) if isinstance(x, LAZY_TYPES) and needs_driver(x, users)]
    return MapAhead([i for i, _ in wanted], [x for _, x in wanted]) if wanted else None


def synchronize(mappings: Iterable[HeldMapping]) -> BaseException | None:
    """Waits for the work queued on the devices ``mappings`` are mapped for (each device once), so
    that the memory's sender may reuse it: the first failure, if any (the caller goes on)."""
    first: BaseException | None = None
    for user in {m[2] for m in mappings}:
        try:
            user.synchronize()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            first = first or e
    return first


def release(mappings: list[HeldMapping], sync: bool) -> None:
    """Gives back mappings ``hold`` made, as one batch per kind, after the queued work on their devices
    (``sync``): a legacy mapping nobody uses any more is closed now rather than kept idle (it would
    keep the sender's memory after the sender freed it). Gives them all back, then raises the first
    failure."""
    if not mappings:
        return
    first = synchronize(mappings) if sync else None
    legacy: list[tuple[bytes, Device]] = []
    pools: dict[int, tuple[PoolImport, list[bytes]]] = {}
    others: list[Callable[[], None]] = []
    for _, unmap, _ in mappings:
        if isinstance(unmap, LegacyRelease):
            legacy.append((unmap.handle, unmap.user))
        elif isinstance(unmap, PoolRelease):
            pools.setdefault(id(unmap.pool), (unmap.pool, []))[1].append(unmap.export)
        else:
            others.append(unmap)  # this process's own memory sent back to it: nothing mapped
    try:
        cache._legacy_release_many(legacy, drop=True)
    except BaseException as e:  # noqa: BLE001 - give them all back, raise the first
        first = first or e
    for pool, exports in pools.values():
        try:
            pool.unmap_many(exports)
        except BaseException as e:  # noqa: BLE001
            first = first or e
    for unmap in others:
        try:
            unmap()
        except BaseException as e:  # noqa: BLE001
            first = first or e
    if first is not None:
        raise first


def make_buffer(item: Lazy, lease: PartLease, held: HeldMapping | None) -> DeviceBuffer:
    """A DeviceBuffer over ``item`` with a part of ``lease`` of its own, and, when the set holds the
    mapping (``held``), its own reference on it."""
    lease.add_one()
    part = AllocationLease(lease)
    if isinstance(item, LegacyHandleDescriptor):
        origin = _Origin("legacy", part, item.device_uuid, 0, descriptor=item)
        part.on_end = dropper(origin)
        buf = DeviceBuffer(origin, item.offset, item.byte_length, _CREATE)
    else:
        origin = _Origin("pool", part, item.pool.device_uuid, item.size, pool=item.pool, export_data=item.export)
        buf = DeviceBuffer(origin, item.offset, item.length, _CREATE)
    if held is not None:
        user = held[2]
        unmap: Callable[[], None]
        try:
            if isinstance(item, LegacyHandleDescriptor):
                base, unmap = open_legacy(item, user)  # found in the cache: the set holds it
            else:
                base = item.pool.import_pointer(item.export, user)  # the set's import: one more user of it
                unmap = PoolRelease(item.pool, item.export)
        except BaseException:
            buf.close(False)
            raise
        origin.adopt(base, unmap, user)
    return buf
