"""TensorMap: a tensor set as received (src/tensors/tensor-map.ts), a read-only mapping of name to
tensor. It holds the allocations the message brought (one mapping each) and makes each named tensor,
a view into them, on first use: torch tensors when torch is importable, else ``DeviceArray`` (device) /
``HostArray`` (host); ``view(name)`` always gives the cuda_ipc view. One lease per message: the
sender gets its memory back once ``close()`` ran and no tensor made from the set is alive.

A device allocation stays what the record said until something needs its buffer (a view, a
tensor, ``allocations``): ``bases()`` maps them as one batch and ``close()`` gives them back as one
(lazy_allocations.py), so that a repeated sync of a few hundred allocations makes no object per
allocation (update_in_place needs the addresses only).

Decoding the 'tensor-set' record (wire.py) into a TensorMap is here too: each allocation by
the handler of its own kind, a legacy entry decoded once per bytes, a table decoded once per link
while it repeats.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterator, Union

from ..ipc.descriptor import DTYPES, ArrayMeta, LegacyHandleDescriptor, decode_descriptor
from ..errors import IpcError
from ..host.host_buffer import HostBuffer, host_address
from ..arrays.host_array import HostArray
from ..leak import Resource
from ..link.messages.handlers import handler_for_kind
from ..cuda.device import Device
from ..link.transfers.device_transfers import read_pool_buffer
from ..arrays.buffer_array import torch_module
from ..arrays.device_array import DeviceArray, DeviceBuffer, map_buffers
from .lazy_allocations import (LAZY_TYPES as _LAZY, AllocationLease, HeldMapping, HeldMappings, Lazy, LazyPool, MapAhead, PartLease, hold, make_buffer,
                               map_ahead, release, synchronize, user_of)
from .wire import KIND_HOST, KIND_LEGACY, KIND_POOL, TensorLayout, decode_table, parse_set
from .._renamed import renamed_attribute

if TYPE_CHECKING:
    from ..link.lifetimes.lease import ReceivedLease
    from ..link.connection.link import Link

#: What one allocation of a received set is in this process.
Allocation = Union[HostBuffer, DeviceBuffer]
#: An allocation as a set holds it: its buffer, or (device memory, no buffer made yet) what the record said.
Held = Union[HostBuffer, DeviceBuffer, LegacyHandleDescriptor, LazyPool]

_LAYOUT_STATE = "cuda_ipc.tensors.tensor_set_transfer.layouts"
_RECORD_STATE = "cuda_ipc.tensors.tensor_set_transfer.records"
_LAYOUTS_KEPT = 16


#: Its name before it moved to arrays/buffer_array.py (code written against it, on other branches, still runs).
_torch_module = torch_module


class TensorMap(Resource, Mapping[str, Any]):
    """Named tensors received in one message (see the module notes). ``ts[name]``: a torch tensor when
    torch is importable (a view: no copy), else the cuda_ipc view; ``view(name)``: ``DeviceArray``
    (device memory) or ``HostArray`` (host memory); ``close(sync=True)`` lets go of the set (the views
    from ``view()`` with it; torch tensors keep the memory alive on their own until they are gone)."""

    def __init__(self, layout: TensorLayout, allocations: list[Held], _token: object = None, whole: PartLease | None = None,
                 ahead: MapAhead | None = None, held: HeldMappings | None = None):
        if _token is not _CREATE:
            raise IpcError("ERR_INVALID_ARG", "TensorMap objects come from links (receive)")
        self.layout = layout
        self._allocs = allocations
        self._closed = False
        # The message's lease (a part per buffer made, and one the set holds until close()); the
        # mappings held for its lazy allocations (its own, or shared with the open sets of the same
        # record: joined already), with the allocations' addresses once known.
        self._whole = whole
        self._held = held if held is not None else HeldMappings()
        self._ahead = ahead  # the mappings started as the set was decoded (a first sync's), until collected
        # The pools of its lazy pool buffers, held by the set until close() (the link may go first).
        self._pools = list({id(x.pool): x.pool for x in allocations if type(x) is LazyPool}.values())
        for pool in self._pools:
            pool.retain()
        self._views: dict[int, Any] = {}
        self._tensors: dict[int, Any] = {}
        self._bases: dict[int, Any] = {}
        self._lock = threading.Lock()

    # -- mapping --

    def __getitem__(self, name: str) -> Any:
        return self.tensor(name) if torch_module() is not None else self.view(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.layout.names)

    def __len__(self) -> int:
        return self.layout.count

    def __contains__(self, name: object) -> bool:
        return name in self.layout.index

    # -- facts --

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> bool:
        """True for a set that came over a TCP link whose bytes are still on the sender
        (nccl_tensor_set.RemoteTensorSet); a set received over a Unix link never is."""
        return False

    def _update_from_remote(self, dst: Mapping[str, Any], *, stream: Any, strict: bool) -> Any:
        """update_in_place of a pending set (RemoteTensorSet overrides it): an UpdateResult, or None
        when the bytes must be fetched first. A set received over a Unix link is never pending."""
        return None

    @property
    def memory(self) -> str:
        """'device', 'host' or 'mixed'."""
        host = any(isinstance(a, HostBuffer) for a in self._allocs)
        device = any(not isinstance(a, HostBuffer) for a in self._allocs)
        return "mixed" if host and device else "host" if host else "device"

    @property
    def nbytes(self) -> int:
        return sum(self.layout.nbytes)

    @property
    def allocations(self) -> list[Allocation]:
        """The buffers over each allocation the message brought (DeviceBuffer or HostBuffer)."""
        if self._closed:
            return [a for a in self._allocs if isinstance(a, (HostBuffer, DeviceBuffer))]
        return self._buffers()

    def _buffers(self) -> list[Allocation]:
        """Every allocation's buffer (made now for the lazy ones)."""
        return [self._allocation_buffer(a) for a in range(len(self._allocs))]

    def _allocation_buffer(self, a: int) -> Allocation:
        """Allocation ``a``'s buffer, made now if it is lazy (lazy_allocations.make_buffer)."""
        got = self._allocs[a]
        if not isinstance(got, _LAZY):
            return got
        with self._lock:
            self._check()
            item = self._allocs[a]
            if not isinstance(item, _LAZY):
                return item
            assert self._whole is not None, "a set with lazy allocations has its lease parts"
            buf = make_buffer(item, self._whole, self._held.by_index.get(a))
            self._allocs[a] = buf
            return buf

    def _placement(self) -> tuple[list[bool], list[int]]:
        """Per allocation: whether it is host memory, and the ordinal of the device it is used on (0
        for host memory), without making buffers."""
        host: list[bool] = []
        ordinals: list[int] = []
        users: dict[str, Device] = {}
        for a, x in enumerate(self._allocs):
            if isinstance(x, HostBuffer):
                host.append(True)
                ordinals.append(0)
                continue
            host.append(False)
            if isinstance(x, _LAZY):
                held = self._held.by_index.get(a)
                ordinals.append((held[2] if held is not None else user_of(x, users)).ordinal)
            else:
                ordinals.append(x.device.ordinal)
        return host, ordinals

    def _check(self) -> None:
        if self._closed:
            raise IpcError("ERR_CLOSED", "this TensorMap is closed")

    def _index(self, name: str) -> int:
        i = self.layout.index.get(name)
        if i is None:
            raise KeyError(name)
        return i

    def bases(self) -> list[int]:
        """Addresses of the allocations in this process, mapping device memory not mapped yet as one
        batch (legacy handles through the cache of mappings, those not open yet opened several at
        once: a first sync's opens; pool buffers under their pool's lock)."""
        self._check()
        known = self._held.addresses
        if known is not None:
            return list(known)
        allocs = self._allocs
        failed, first = self._collect_ahead()
        by_index = self._held.by_index
        unheld = [a for a, x in enumerate(allocs) if isinstance(x, _LAZY) and a not in by_index and a not in failed]
        if unheld:
            self._hold(unheld)
        if first is not None:
            raise first
        unmapped = [x for x in allocs if type(x) is DeviceBuffer and x._origin.base is None]
        if unmapped:
            map_buffers(unmapped)
        out = [by_index[a][0] if isinstance(x, _LAZY) else host_address(x) if isinstance(x, HostBuffer) else x.ptr
               for a, x in enumerate(allocs)]
        if len(by_index) == len(allocs):  # all held here (a buffer made later maps the same mapping: the same address)
            self._held.addresses = out
        return list(out)

    def _hold(self, indexes: list[int]) -> None:
        """Maps the lazy allocations ``indexes`` for the set itself; raises the first failure, keeping the
        others (close() gives them back)."""
        lazy = [(a, x) for a, x in ((a, self._allocs[a]) for a in indexes) if isinstance(x, _LAZY)]  # (one made a buffer meanwhile: left out)
        first = self._install([a for a, _ in lazy], hold([x for _, x in lazy], {}))[1]
        if first is not None:
            raise first

    def _collect_ahead(self) -> tuple[set[int], BaseException | None]:
        """Waits for the mappings started at decode (MapAhead) and takes them into the set's hold:
        the allocations that failed, and the first failure."""
        with self._lock:
            ahead, self._ahead = self._ahead, None
        if ahead is None:
            return set(), None
        return self._install(ahead.indexes, ahead.results())

    def _install(self, indexes: list[int], results: list[HeldMapping | BaseException]) -> tuple[set[int], BaseException | None]:
        """Keeps the mappings made for allocations ``indexes`` (those held already, or all of them once
        the set is closed, given back): the allocations that failed, and the first failure."""
        undo, failed, first = self._held.keep(indexes, results, self._closed)
        release(undo, False)
        return failed, first

    # -- views --

    def view(self, name: str) -> DeviceArray | HostArray:
        """The cuda_ipc view of a tensor: ``DeviceArray`` (``__cuda_array_interface__``, DLPack) or ``HostArray``;
        valid until the set is closed."""
        self._check()
        i = self._index(name)
        v = self._views.get(i)
        if v is None:
            L = self.layout
            buf = self._allocation_buffer(L.allocations[i])
            if isinstance(buf, HostBuffer):
                v = HostArray(buf, L.dtypes[i], L.shapes[i], L.strides[i], L.offsets[i])
            else:
                v = DeviceArray(buf, ArrayMeta.make(L.dtypes[i], L.shapes[i], L.strides[i]), L.offsets[i])
            self._views[i] = v
        return v

    def tensor(self, name: str) -> Any:
        """A torch tensor over the received memory (no copy), made once per name."""
        self._check()
        i = self._index(name)
        t = self._tensors.get(i)
        if t is None:
            torch = torch_module()
            if torch is None:
                raise IpcError("ERR_UNSUPPORTED", "torch does not import in this Python; use view(name)")
            L = self.layout
            base = self._torch_base(L.allocations[i], torch)
            itemsize = DTYPES[L.dtypes[i]][0]
            off = L.offsets[i]
            t = base[off:off + L.extents[i]].view(getattr(torch, L.dtypes[i])).as_strided(L.shapes[i], [s // itemsize for s in L.strides[i]])
            self._tensors[i] = t
        return t

    def tensors(self) -> dict[str, Any]:
        """Every tensor, by name (torch tensors)."""
        return {n: self.tensor(n) for n in self.layout.names}

    def _torch_base(self, a: int, torch: ModuleType) -> Any:
        """A uint8 torch tensor over the whole allocation: its own handle on the memory, so the tensors
        made from it keep the memory mapped after the set is closed, until they are gone."""
        b = self._bases.get(a)
        if b is None:
            buf = self._allocation_buffer(a)
            if isinstance(buf, HostBuffer):
                b = torch.from_dlpack(buf.view(0, buf.nbytes))
            else:
                handle = buf.slice(0, buf.nbytes)
                b = torch.as_tensor(handle, device=f"cuda:{handle.device.ordinal}")
            self._bases[a] = b
        return b

    # -- lifetime --

    def close(self, sync: bool = True) -> None:
        """Lets go of the set: device memory is unmapped (after the device's queued work, unless
        ``sync=False``) once no torch tensor made from it is alive, then the sender is told. Idempotent."""
        if self._closed:
            return
        self._closed = True
        views, self._views = self._views, {}
        for v in views.values():
            if isinstance(v, HostArray):
                v.close()
        self._tensors = {}
        self._bases = {}
        first: BaseException | None = None
        self._collect_ahead()  # (closed: what it mapped is given back)
        held = self._held
        if sync:
            # Work queued on the memory must finish before the sender may reuse it (the lease ends
            # below, whether or not another set still maps it).
            first = synchronize(list(held.by_index.values()))
        try:
            release(held.leave(), False)
        except Exception as e:  # noqa: BLE001 - close them all, report the first
            first = first or e
        for a in self._allocs:
            if isinstance(a, _LAZY):
                continue
            try:
                a.close(sync) if not isinstance(a, HostBuffer) else a.close()
            except Exception as e:  # noqa: BLE001 - close them all, report the first
                first = first or e
        pools, self._pools = self._pools, []
        for pool in pools:
            pool.release()
        if self._whole is not None:
            self._whole.end_one()  # the set's own part
        if first is not None:
            raise first

    def __repr__(self) -> str:
        return f"<cuda_ipc.TensorMap {self.layout.count} tensors, {self.memory} memory{' closed' if self._closed else ''}>"


_CREATE = object()


def decode_tensor_set(data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> TensorMap:
    # A record without fds that repeats one this link decoded lately byte for byte (a repeated sync of
    # the same weights; the last few are kept, as layouts are, so that a state dict sent as several
    # sets hits too) decodes to what that one did: its lazy allocations and layout are kept, not
    # parsed again (a pool it names stays this link's while the link lives). While a set of that
    # record is open, the new one shares its mappings (one reference for all).
    record = bytes(data) if not fds else b""
    records: OrderedDict[bytes, tuple[list[Lazy], TensorLayout, HeldMappings]] | None = link.handler_state.get(_RECORD_STATE)
    if records is None:
        records = link.handler_state[_RECORD_STATE] = OrderedDict()
    known = records.get(record) if record else None
    if known is not None:
        lazy, layout, held = known
        shared = held if held.join() else None
        ts = TensorMap(layout, list(lazy), _CREATE, PartLease(lease, 1), held=shared)
        records[record] = (lazy, layout, ts._held)
        records.move_to_end(record)
        return ts
    ts = _decode(data, fds, link, lease)
    lazy = [a for a in ts._allocs if isinstance(a, _LAZY)]
    if record and len(lazy) == len(ts._allocs):
        records[record] = (lazy, ts.layout, ts._held)
        while len(records) > _LAYOUTS_KEPT:
            records.popitem(last=False)
    return ts


def _decode(data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> TensorMap:
    allocations, table, count = parse_set(data, len(fds))
    sizes = [a[3] for a in allocations]
    # One lease for the message: it ends once every allocation it brought is released here, and the
    # set itself (device allocations stay lazy, held by the set, until a buffer is asked for).
    whole = PartLease(lease, sum(1 for a in allocations if a[0] == KIND_HOST) + 1)
    items: list[Held] = []
    at = 0
    try:
        for kind, fd_count, body, size in allocations:
            mine = fds[at:at + fd_count]
            try:
                if kind == KIND_LEGACY:
                    desc = _legacy_descriptor(body)
                    items.append(desc)
                    mapped = desc.byte_length
                elif kind == KIND_POOL:
                    pool, export, allocation_size, offset, length = read_pool_buffer(body, mine, link)
                    items.append(LazyPool(pool, export, allocation_size, offset, length))
                    mapped = length
                else:
                    handler = handler_for_kind(_KIND_NAMES[kind])
                    if handler is None:
                        raise IpcError("ERR_NOT_TRANSFERABLE", f"received a tensor set with a '{_KIND_NAMES[kind]}' allocation but no handler for it is registered")
                    buf: Allocation = handler.decode(body, mine, link, AllocationLease(whole))
                    items.append(buf)
                    mapped = buf.nbytes
            finally:
                fds[at:at + fd_count] = mine  # taken ones are -1; the rest stay the link's to close
            for k in range(at, at + fd_count):
                fds[k] = -1
            at += fd_count
            if mapped != size:
                raise IpcError("ERR_FRAME_INVALID", f"a received tensor set's allocation maps {mapped} bytes, not the {size} it announced")
        # The allocations not mapped here yet start mapping now, while the table is decoded.
        ahead = map_ahead(items)
        try:
            layout = _cached_layout(link, table, count, sizes)
        except BaseException:
            if ahead is not None:
                release([r for r in ahead.results() if not isinstance(r, BaseException)], False)
            raise
    except BaseException:
        for b in items:
            if isinstance(b, HostBuffer):
                try:
                    b.close()
                except Exception:  # noqa: BLE001 - being discarded
                    pass
        raise
    return TensorMap(layout, items, _CREATE, whole, ahead)


_KIND_NAMES = {KIND_LEGACY: "legacy-buffer", KIND_POOL: "pool-buffer", KIND_HOST: "host-buffer"}

# Legacy entries decoded before, by their bytes: a repeated sync brings the same few hundred (one
# per caching-allocator segment), and a descriptor is immutable once checked.
_descriptors: "OrderedDict[bytes, LegacyHandleDescriptor]" = OrderedDict()
_descriptors_lock = threading.Lock()


def _legacy_descriptor(body: memoryview) -> LegacyHandleDescriptor:
    """The descriptor of a 'legacy-buffer' entry, decoded (and checked) once per bytes."""
    key = bytes(body)
    with _descriptors_lock:
        desc = _descriptors.get(key)
    if desc is None:
        desc = decode_descriptor(key, "cuda-legacy-handle")
        with _descriptors_lock:
            _descriptors[key] = desc
            while len(_descriptors) > 8192:
                _descriptors.popitem(last=False)
    return desc


def _cached_layout(link: Link, table: bytes, count: int, sizes: list[int]) -> TensorLayout:
    """A layout this link decoded before, when the table is the same bytes (a repeated send of the same
    tensors; the last few are kept, so that a state dict sent as several sets hits too): then only
    the extents are checked against this message's allocations."""
    layouts: OrderedDict[bytes, TensorLayout] | None = link.handler_state.get(_LAYOUT_STATE)
    if layouts is None:
        layouts = link.handler_state[_LAYOUT_STATE] = OrderedDict()
    last = layouts.get(table)
    if last is not None and last.count == count and last.allocation_count == len(sizes):
        for a, end in enumerate(last.ends):
            if end > sizes[a]:
                raise IpcError("ERR_FRAME_INVALID", f"a received tensor set is malformed: its tensors reach byte {end} of allocation {a}, which holds {sizes[a]}")
        layouts.move_to_end(table)
        return last
    layout = decode_table(table, count, sizes)
    layouts[layout.table] = layout
    while len(layouts) > _LAYOUTS_KEPT:
        layouts.popitem(last=False)
    return layout


def __getattr__(name: str) -> Any:
    # The old names of these (_renamed.py): each use warns, for one release.
    return renamed_attribute(__name__, {"TensorMap": TensorMap}, name)
