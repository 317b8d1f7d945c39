"""Tensor sets: many named tensors in one link message (docs/PROTOCOL.md section 4.2), the Python side of
Node's TensorMap.

Sending: ``link.send({"weights": share_tensors(model.state_dict())})``. Each allocation the tensors live
in crosses once, however many tensors it holds (a PyTorch caching-allocator segment as the legacy IPC
handle of its base, a pool allocation as pool export data, host memory as its memfd); each tensor is a
row of the set's table: name, dtype, shape, strides, byte offset. Nothing is copied. The object
``share_tensors`` returns remembers its encoding: sending it again (the weights of the next training
step) costs a pointer check per tensor and no driver call.

Receiving: a ``TensorMap`` (tensor_map.py), a read-only mapping of name to tensor: torch tensors
(views, no copy) when torch is importable, else ``DeviceArray`` (device) / ``HostArray`` (host);
``view(name)`` always gives the cuda_ipc view. One lease per message: the sender gets its memory back
once ``close()`` ran and no tensor made from the set is alive. Device memory this process has not
mapped yet starts mapping as the message arrives (tensor_map.py), on a thread of its own.

This module sends (src/tensors/tensor-set-transfer.ts): the record's handler encodes what ``share_tensors``
marked, and a received set sent on as it came; tensor_map.py decodes.
"""
from __future__ import annotations

import bisect
import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Union

from ..cuda import driver as drv
from ..ipc.descriptor import LegacyHandleDescriptor, encode_descriptor, numel
from ..cuda.device import Device
from ..errors import IpcError
from ..host.host_buffer import HostBuffer
from ..arrays.host_array import HostArray
from ..link.transfers import device_transfers
from ..link.transfers import host_transfer
from ..link.messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler
from ..link.lifetimes.lease import Hold, release_hold
from ..arrays.device_array import DeviceArray, DeviceBuffer
from ..arrays.exports import _describe_array, legacy_handle_of, pool_export_of
from ..parallel import each
from .tensor_map import TensorMap, decode_tensor_set
from .wire import KIND_HOST, KIND_LEGACY, KIND_POOL, TENSOR_SET_KIND, encode_set, encode_table
from .._renamed import renamed_attribute

if TYPE_CHECKING:
    from ..host.host_buffer import _Mapping
    from ..link.lifetimes.lease import LeaseHold, ReceivedLease
    from ..link.connection.link import Link

#: How a send waits for the producers of its tensors: ("torch", ordinal), ("stream", (ordinal, CUstream)), ("device", ordinal).
Sync = tuple[str, Any]
#: An allocation's entry in the record: (kind, fd count, data).
Entry = tuple[int, int, bytes]

__all__ = ["SharedTensors", "TensorMap", "share_tensors", "handle_exports"]


# ------------------------------------------------------------------------------------------------
# Sending


class _Alloc:
    """One allocation of a set to send: how to write its entry on a link."""

    __slots__ = ("kind", "key", "size", "data", "pool_id", "pool_fd", "uuid", "export", "mapping", "ordinal", "name")

    def __init__(self, kind: int, key: tuple[Any, ...], size: int):
        self.kind = kind
        self.key = key
        self.size = size
        self.data = b""  # the entry data when it does not depend on the link (legacy, host, pool without its fd)
        self.pool_id = b""
        self.pool_fd = -1
        self.uuid = ""
        self.export = b""
        self.mapping: _Mapping | None = None  # host: its mapping
        self.ordinal: int | None = None  # device: its ordinal
        self.name = ""  # the first tensor found in it (for errors)


class _Encoding:
    """What a set's tensors were when last encoded: their pointers, allocations and table; and the
    record last sent for them without fds (a repeated send sends the same bytes again)."""

    __slots__ = ("pointers", "allocs", "table", "count", "nbytes", "syncs", "record")

    def __init__(self, pointers: list[int], allocs: list[_Alloc], table: bytes, count: int, nbytes: int, syncs: list[Sync]):
        self.pointers = pointers
        self.allocs = allocs
        self.table = table
        self.count = count
        self.nbytes = nbytes
        self.syncs = syncs
        self.record: tuple[list[Entry], bytes] | None = None


def _pointer(obj: Any) -> int:
    """Where a tensor's first element is now (cheap: no driver call)."""
    t = type(obj)
    p: int
    if t is HostArray:
        p = id(obj.buffer._mapping) ^ (obj.buffer.offset << 1)
        return p
    dp = getattr(obj, "data_ptr", None)
    if dp is not None:
        p = dp()
        return p
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        p = cai["data"][0]
        return p
    raise IpcError("ERR_NOT_TRANSFERABLE", f"cannot share a {t.__qualname__} in a tensor set: not a CUDA tensor/array or a HostArray")


class SharedTensors:
    """Named tensors marked for sending as one tensor set (``share_tensors``). Send it as often as you
    like: while every tensor still starts where it did, the encoding is reused."""

    __slots__ = ("_names", "_objs", "_sync", "_encoding", "_lock", "_data_ptr", "__weakref__")  # weakref: other transports' plans (nccl_transfer_send.py)

    def __init__(self, names: list[str], objs: list[Any], sync: bool):
        self._names = names
        self._objs = objs
        self._sync = sync
        # Asked once: a send's pointer check is then one C call per tensor.
        self._data_ptr = torch_data_ptr(objs)
        self._encoding: _Encoding | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._names)

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def __repr__(self) -> str:
        return f"<cuda_ipc.SharedTensors {len(self._names)} tensors>"


def share_tensors(named: Mapping[str, Any] | Iterable[tuple[str, Any]], *, sync: bool = True) -> SharedTensors:
    """Marks named tensors (a dict such as ``model.state_dict()``, or ``(name, tensor)`` pairs such as
    ``model.named_parameters()``) for sending as one tensor set. Values: CUDA tensors and arrays
    (PyTorch, CuPy, anything with ``__cuda_array_interface__``) or ``HostArray``. With ``sync`` (the
    default) every send first waits for the producers' streams, so the peer sees finished values;
    ``sync=False`` leaves that to you."""
    items = named.items() if isinstance(named, Mapping) else named
    names: list[str] = []
    objs: list[Any] = []
    seen: set[str] = set()
    for name, obj in items:
        if not isinstance(name, str) or not name:
            raise IpcError("ERR_INVALID_ARG", f"tensor names are non-empty str, got {name!r}")
        if name in seen:
            raise IpcError("ERR_INVALID_ARG", f"tensor {name!r} appears twice; names must be unique")
        seen.add(name)
        if isinstance(obj, (DeviceArray, DeviceBuffer)):
            raise IpcError("ERR_NOT_TRANSFERABLE", f"tensor {name!r} was received from another process; send the received TensorMap itself, "
                           "or copy it into a tensor of your own (update_in_place)")
        names.append(name)
        objs.append(obj)
    return SharedTensors(names, objs, sync)


def _sync_producers(objs: list[Any], syncs: list[Sync]) -> None:
    """Waits for the streams that produced the tensors (each stream once)."""
    done: set[Sync] = set()
    torch = sys.modules.get("torch")
    for kind, arg in syncs:
        if (kind, arg) in done:
            continue
        done.add((kind, arg))
        if kind == "torch":
            assert torch is not None, "torch tensors come from an imported torch"
            torch.cuda.current_stream(arg).synchronize()
        elif kind == "stream":
            with Device.get(arg[0]).activate():
                drv.driver().call("cuStreamSynchronize", ctypes.c_void_p(arg[1]))
        elif kind == "device":
            with Device.get(arg).activate():
                drv.driver().call("cuCtxSynchronize")


def _describe(st: SharedTensors) -> _Encoding:
    """A fresh encoding of the set: allocations found once each (a driver query per allocation, not
    per tensor, while the tensors are known to lie in one found before), and the table."""
    allocs: list[_Alloc] = []
    by_key: dict[tuple[Any, ...], int] = {}
    bases: dict[int, list[int]] = {}  # device ordinal -> sorted [base, ...]
    spans: dict[int, list[tuple[int, int, int]]] = {}  # device ordinal -> [(base, end, alloc index), ...] parallel to bases
    names: list[str] = []
    dtypes: list[str] = []
    shapes: list[tuple[int, ...]] = []
    strides: list[tuple[int, ...]] = []
    offsets: list[int] = []
    alloc_of: list[int] = []
    syncs: set[Sync] = set()
    nbytes = 0
    for name, obj in zip(st._names, st._objs):
        if type(obj) is HostArray:
            buf = obj.buffer
            m = buf._check()
            if not m.sealed:
                raise IpcError("ERR_NOT_TRANSFERABLE", f"tensor {name!r} lives in a HostBuffer whose file is not sealed against shrinking")
            key = ("host", id(m))
            a = by_key.get(key)
            if a is None:
                alloc = _Alloc(KIND_HOST, key, m.length)
                alloc.mapping = m
                alloc.data = host_transfer._DATA.pack(m.length, 0, m.length)
                a = by_key[key] = len(allocs)
                allocs.append(alloc)
            meta = obj.meta
            offset = buf.offset
        else:
            e = _describe_array(obj, st._sync)
            if not e.ptr:
                raise IpcError("ERR_NOT_EXPORTABLE", f"tensor {name!r} has no memory (no elements); send its shape as data instead")
            if e.meta is None:
                raise IpcError("ERR_NOT_TRANSFERABLE", f"tensor {name!r} has a dtype or layout a tensor set cannot describe")
            meta = e.meta
            ordinal = e.ordinal
            if ordinal is None:
                with Device.get(0).activate():
                    ordinal = drv.ptr_attribute_int(drv.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, e.ptr)
            if e.sync is not None:
                syncs.add(("torch", ordinal) if callable(e.sync) else ("stream", (ordinal, e.sync[1])) if e.sync[0] == "stream" else ("device", ordinal))
            bl = bases.setdefault(ordinal, [])
            sl = spans.setdefault(ordinal, [])
            k = bisect.bisect_right(bl, e.ptr) - 1
            if k >= 0 and e.ptr + e.extent <= sl[k][1]:
                a = sl[k][2]  # inside an allocation found before: no driver call
            else:
                alloc = _device_alloc(e.ptr, ordinal, name)
                a = by_key.get(alloc.key)
                if a is None:
                    a = by_key[alloc.key] = len(allocs)
                    allocs.append(alloc)
                    k = bisect.bisect_right(bl, alloc.key[1])
                    bl.insert(k, alloc.key[1])
                    sl.insert(k, (alloc.key[1], alloc.key[1] + alloc.size, a))
            offset = e.ptr - allocs[a].key[1]
            if offset + e.extent > allocs[a].size:
                raise IpcError("ERR_OUT_OF_RANGE", f"tensor {name!r} runs past the end of its allocation")
        names.append(name)
        dtypes.append(meta.dtype)
        shapes.append(meta.shape)
        strides.append(meta.strides)
        offsets.append(offset)
        alloc_of.append(a)
        nbytes += meta.itemsize * numel(meta.shape)
    _ask_handles(allocs)
    table = encode_table(names, dtypes, shapes, strides, offsets, alloc_of, len(allocs))
    pointers = pointers_of(st)
    return _Encoding(pointers, allocs, table, len(names), nbytes, sorted(syncs, key=repr))


#: Legacy handles asked of the driver by tensor sets (cuIpcGetMemHandle): a repeated send asks none.
handle_exports = 0


def _device_alloc(ptr: int, ordinal: int, name: str) -> _Alloc:
    """The allocation holding ``ptr``: one driver query, and its pool export data from the
    per-allocation cache of arrays/exports.py (checked against the allocation's unique id, so a
    freed and reallocated segment at the same address gets fresh data). A legacy allocation's handle
    is asked later, with the others' (_ask_handles)."""
    dev = Device.get(ordinal)
    with dev.activate():
        facts = drv.pointer_facts(ptr)
        base, size = facts.base, facts.size
        if not size:
            raise IpcError("ERR_NOT_EXPORTABLE", f"tensor {name!r} is not in device memory the CUDA driver knows")
        if facts.pool:
            pool_id, pool_fd, export = pool_export_of(facts.pool, base, facts.buffer_id, f"tensor {name!r}")
            a = _Alloc(KIND_POOL, ("pool", base, facts.buffer_id), size)
            a.pool_id, a.pool_fd, a.export = pool_id, pool_fd, export
        else:
            if facts.managed or facts.memory_type != drv.CU_MEMORYTYPE_DEVICE:
                raise IpcError("ERR_NOT_EXPORTABLE", f"tensor {name!r} is managed or host memory, which CUDA IPC handles cannot share; use HostArray for host memory")
            a = _Alloc(KIND_LEGACY, ("legacy", base, facts.buffer_id), size)
        a.uuid = dev.uuid
        a.ordinal = ordinal
        a.name = name
        return a


def _ask_handles(allocs: list[_Alloc]) -> None:
    """The entries of the legacy allocations _describe found: their handles from the per-allocation
    cache of arrays/exports.py, those it lacks asked of the driver several at once (parallel.py: a
    first sync asks one per caching-allocator segment)."""
    global handle_exports
    todo = [a for a in allocs if a.kind == KIND_LEGACY and not a.data]

    def ask(a: _Alloc) -> tuple[bytes, bool]:
        assert a.ordinal is not None, "a device allocation has its ordinal"
        with Device.get(a.ordinal).activate():
            return legacy_handle_of(a.key[1], a.key[2], f"tensor {a.name!r}")
    pid = os.getpid()
    for a, r in zip(todo, each(ask, todo)):
        if isinstance(r, BaseException):
            raise r
        handle, asked = r
        if asked:
            handle_exports += 1
        a.data = encode_descriptor(LegacyHandleDescriptor(handle, 0, a.size, a.uuid, pid, None))


def torch_data_ptr(objs: list[Any]) -> Callable[[Any], int] | None:
    """``torch.Tensor.data_ptr`` when every one of ``objs`` is a torch tensor (their addresses are then
    one C method call each), else None."""
    torch = sys.modules.get("torch")
    T = getattr(torch, "Tensor", None)
    return T.data_ptr if T is not None and all(isinstance(o, T) for o in objs) else None


def pointers_of(st: SharedTensors) -> list[int]:
    """Where each tensor of ``st`` starts now: one C call each when all are torch tensors."""
    f = st._data_ptr
    return list(map(f, st._objs)) if f is not None else [_pointer(o) for o in st._objs]


def _current(st: SharedTensors) -> _Encoding:
    """The set's encoding, reused while every tensor starts where it did."""
    with st._lock:
        enc = st._encoding
        if enc is not None:
            if pointers_of(st) == enc.pointers:
                return enc
        fresh = st._encoding = _describe(st)
        return fresh


def _entries_for_link(allocs: list[_Alloc], link: Link) -> tuple[list[Entry], list[int], list[Callable[[], None]]]:
    """Entry (kind, fd count, data) per allocation for ``link``, with the fds (all owned) and commits."""
    entries: list[Entry] = []
    fds: list[int] = []
    commits: list[Callable[[], None]] = []
    pools_seen: set[bytes] = set()  # the pool's fd goes with the first of its entries, if the link lacks it
    try:
        for a in allocs:
            if a.kind == KIND_HOST:
                assert a.mapping is not None, "a host allocation has its mapping"
                fds.append(os.dup(a.mapping.fd))
                entries.append((KIND_HOST, 1, a.data))
            elif a.kind == KIND_LEGACY:
                entries.append((KIND_LEGACY, 0, a.data))
            else:
                if a.pool_id not in pools_seen:
                    pools_seen.add(a.pool_id)
                    attach, pfds, commit = device_transfers.pool_fd_for_link(link, a.pool_id, a.pool_fd)
                    if attach:
                        fds.extend(pfds)
                        if commit is not None:
                            commits.append(commit)
                        data = device_transfers.pool_buffer_bytes(a.pool_id, a.uuid, 0, True, a.export, a.size, 0, a.size)
                        entries.append((KIND_POOL, len(pfds), data))
                        continue
                if not a.data:  # without the fd the entry is the same on every link: made once
                    a.data = device_transfers.pool_buffer_bytes(a.pool_id, a.uuid, 0, False, a.export, a.size, 0, a.size)
                entries.append((KIND_POOL, 0, a.data))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return entries, fds, commits


def _hold_for(allocs: list[_Alloc], objs: list[Any], nbytes: int) -> Hold:
    """Keeps the tensors (so their allocations) and host mappings alive until the peer releases the set."""
    mappings = [a.mapping for a in allocs if a.kind == KIND_HOST and a.mapping is not None]
    for m in mappings:
        m.retain()
    keep = list(objs)

    def release() -> None:
        keep.clear()
        for m in mappings:
            m.release()
    return Hold(release, nbytes)


def _encode_shared(st: SharedTensors, link: Link) -> TransferEncoding:
    enc = _current(st)
    if st._sync:
        _sync_producers(st._objs, enc.syncs)
    entries, fds, commits = _entries_for_link(enc.allocs, link)
    try:
        hold = _hold_for(enc.allocs, st._objs, enc.nbytes) if enc.count else None
        # A repeated send of the same allocations without fds is the same record: kept, not rebuilt.
        last = enc.record
        if last is not None and not fds and last[0] == entries:
            data = last[1]
        else:
            data = encode_set(entries, enc.table, enc.count)
            if not fds:
                enc.record = (entries, data)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return _encoding(data, fds, commits, hold)


def _encoding(data: bytes, fds: list[int], commits: list[Callable[[], None]], hold: LeaseHold | None) -> TransferEncoding:
    on_commit: Callable[[], None] | None = None
    if commits:
        def commit_all(commits: list[Callable[[], None]] = commits) -> None:
            for c in commits:
                c()
        on_commit = commit_all
    return TransferEncoding(data=data, fds=fds, close_fds_after_send=True, on_commit=on_commit, hold=hold, kind=TENSOR_SET_KIND)


def _encode_resend(ts: TensorMap, link: Link) -> TransferEncoding:
    """A received set sent on as it came: the same allocations, the same table."""
    ts._check()
    entries: list[Entry] = []
    fds: list[int] = []
    commits: list[Callable[[], None]] = []
    holds: list[LeaseHold] = []
    try:
        for buf in ts._buffers():
            if isinstance(buf, HostBuffer):
                e = host_transfer._HostBufferTransfer().encode(buf, link)
                assert e.hold is not None, "a host buffer's send holds its mapping"
                holds.append(e.hold)
                fds.append(os.dup(e.fds[0]))
                entries.append((KIND_HOST, 1, bytes(e.data)))
                continue
            e = device_transfers._DeviceMemoryTransfer()._resend(buf, link, 0, buf.nbytes)
            assert e.hold is not None, "a device buffer's send holds it"
            holds.append(e.hold)
            fds.extend(e.fds)
            if e.on_commit is not None:
                commits.append(e.on_commit)
            entries.append((KIND_LEGACY if e.kind == "legacy-buffer" else KIND_POOL, len(e.fds), bytes(e.data)))
        data = encode_set(entries, ts.layout.table, ts.layout.count)
    except BaseException:
        for fd in fds:
            os.close(fd)
        for h in holds:
            release_hold(h)
        raise
    total = sum(h.bytes for h in holds)

    def release() -> None:
        for h in holds:
            release_hold(h)
    return _encoding(data, fds, commits, Hold(release, total) if holds else None)


class _TensorSetTransfer(TransferHandler[Union[SharedTensors, TensorMap]]):
    kind = TENSOR_SET_KIND

    def can_transfer(self, value: object) -> bool:
        return type(value) is SharedTensors or type(value) is TensorMap

    def encode(self, value: SharedTensors | TensorMap, link: Link) -> TransferEncoding:
        if isinstance(value, TensorMap):  # (exactly: can_transfer admits these two types only)
            return _encode_resend(value, link)
        return _encode_shared(value, link)

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> TensorMap:
        return decode_tensor_set(data, fds, link, lease)


register_transfer_handler(_TensorSetTransfer())


def __getattr__(name: str) -> Any:
    # The old names of these (_renamed.py): each use warns, for one release.
    return renamed_attribute(__name__, {"TensorMap": TensorMap}, name)
