"""Tensor sets: many named tensors in one link message (docs/PROTOCOL.md section 4.2), the Python side of
Node's TensorMap.

Sending: ``link.send({"weights": share_tensors(model.state_dict())})``. Each allocation the tensors live
in crosses once, however many tensors it holds (a PyTorch caching-allocator segment as the legacy IPC
handle of its base, a pool allocation as pool export data, host memory as its memfd); each tensor is a
row of the set's table: name, dtype, shape, strides, byte offset. Nothing is copied. The object
``share_tensors`` returns remembers its encoding: sending it again (the weights of the next training
step) costs a pointer check per tensor and no driver call.

Receiving: a ``TensorSet``, a read-only mapping of name to tensor: torch tensors (views, no copy) when
torch is importable, else ``ArrayView`` (device) / ``HostArray`` (host); ``view(name)`` always gives
the cuda_ipc view. One lease per message: the sender gets its memory back once ``close()`` ran and no
tensor made from the set is alive. Memory is mapped on first use.
"""
from __future__ import annotations

import bisect
import ctypes
import os
import struct
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Iterator

from . import driver as drv
from .link import device_transfers, host_transfer
from .memory import cache
from .memory.buffer import _CREATE as _DEVICE_BUFFER, ArrayView, DeviceBuffer, _Origin
from .memory.exports import _describe_array
from .link.handlers import TransferEncoding, TransferHandler, handler_for_kind, register_transfer_handler
from .descriptor import DTYPES, ArrayMeta, LegacyHandleDescriptor, decode_descriptor, encode_descriptor
from .device import Device
from .errors import CudaError, IpcError
from .host import HostBuffer
from .host_array import HostArray
from .link.lease import Hold, release_hold
from .tensor_wire import KIND_HOST, KIND_LEGACY, KIND_POOL, TENSOR_SET_KIND, TensorLayout, decode_table, encode_set, encode_table, parse_set

_LAYOUT_STATE = "cuda_ipc.tensor_set.layouts"
_LAYOUTS_KEPT = 16


# ------------------------------------------------------------------------------------------------
# Sending


class _Alloc:
    """One allocation of a set to send: how to write its entry on a link."""

    __slots__ = ("kind", "key", "size", "data", "pool_id", "pool_fd", "uuid", "export", "mapping", "ordinal")

    def __init__(self, kind: int, key, size: int):
        self.kind = kind
        self.key = key
        self.size = size
        self.data = b""  # the entry data when it does not depend on the link (legacy, host)
        self.pool_id = b""
        self.pool_fd = -1
        self.uuid = ""
        self.export = b""
        self.mapping = None  # host: the _Mapping
        self.ordinal = None  # device: its ordinal


class _Encoding:
    """What a set's tensors were when last encoded: their pointers, allocations and table."""

    __slots__ = ("pointers", "allocs", "table", "count", "nbytes", "syncs")

    def __init__(self, pointers, allocs, table, count, nbytes, syncs):
        self.pointers = pointers
        self.allocs = allocs
        self.table = table
        self.count = count
        self.nbytes = nbytes
        self.syncs = syncs


def _pointer(obj) -> int:
    """Where a tensor's first element is now (cheap: no driver call)."""
    t = type(obj)
    if t is HostArray:
        return id(obj.buffer._mapping) ^ (obj.buffer.offset << 1)
    dp = getattr(obj, "data_ptr", None)
    if dp is not None:
        return dp()
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        return cai["data"][0]
    raise IpcError("ERR_NOT_TRANSFERABLE", f"cannot share a {t.__qualname__} in a tensor set: not a CUDA tensor/array or a HostArray")


class SharedTensors:
    """Named tensors marked for sending as one tensor set (``share_tensors``). Send it as often as you
    like: while every tensor still starts where it did, the encoding is reused."""

    __slots__ = ("_names", "_objs", "_sync", "_encoding", "_lock")

    def __init__(self, names: list, objs: list, sync: bool):
        self._names = names
        self._objs = objs
        self._sync = sync
        self._encoding: _Encoding | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._names)

    @property
    def names(self) -> list:
        return list(self._names)

    def __repr__(self) -> str:
        return f"<cuda_ipc.SharedTensors {len(self._names)} tensors>"


def share_tensors(named, *, sync: bool = True) -> SharedTensors:
    """Marks named tensors (a dict such as ``model.state_dict()``, or ``(name, tensor)`` pairs such as
    ``model.named_parameters()``) for sending as one tensor set. Values: CUDA tensors and arrays
    (PyTorch, CuPy, anything with ``__cuda_array_interface__``) or ``HostArray``. With ``sync`` (the
    default) every send first waits for the producers' streams, so the peer sees finished values;
    ``sync=False`` leaves that to you."""
    items = named.items() if isinstance(named, Mapping) else named
    names: list = []
    objs: list = []
    seen = set()
    for name, obj in items:
        if not isinstance(name, str) or not name:
            raise IpcError("ERR_INVALID_ARG", f"tensor names are non-empty str, got {name!r}")
        if name in seen:
            raise IpcError("ERR_INVALID_ARG", f"tensor {name!r} appears twice; names must be unique")
        seen.add(name)
        if isinstance(obj, (ArrayView, DeviceBuffer)):
            raise IpcError("ERR_NOT_TRANSFERABLE", f"tensor {name!r} was received from another process; send the received TensorSet itself, "
                           "or copy it into a tensor of your own (update_in_place)")
        names.append(name)
        objs.append(obj)
    return SharedTensors(names, objs, sync)


def _sync_producers(objs, syncs) -> None:
    """Waits for the streams that produced the tensors (each stream once)."""
    done = set()
    torch = sys.modules.get("torch")
    for kind, arg in syncs:
        if (kind, arg) in done:
            continue
        done.add((kind, arg))
        if kind == "torch":
            torch.cuda.current_stream(arg).synchronize()
        elif kind == "stream":
            with Device.get(arg[0]).activate():
                drv.driver().call("cuStreamSynchronize", ctypes.c_void_p(arg[1]))
        elif kind == "device":
            with Device.get(arg).activate():
                drv.driver().call("cuCtxSynchronize")


def _describe(st: SharedTensors):
    """A fresh encoding of the set: allocations found once each (a driver query per allocation, not
    per tensor, while the tensors are known to lie in one found before), and the table."""
    allocs: list[_Alloc] = []
    by_key: dict = {}
    bases: dict[int, list] = {}  # device ordinal -> sorted [base, ...]
    spans: dict[int, list] = {}  # device ordinal -> [(base, end, alloc index), ...] parallel to bases
    names, dtypes, shapes, strides, offsets, alloc_of = [], [], [], [], [], []
    syncs: set = set()
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
        nbytes += meta.itemsize * _numel(meta.shape)
    table = encode_table(names, dtypes, shapes, strides, offsets, alloc_of, len(allocs))
    pointers = _pointers(st._objs)
    return _Encoding(pointers, allocs, table, len(names), nbytes, sorted(syncs, key=repr))


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


#: Legacy handles asked of the driver by tensor sets (cuIpcGetMemHandle): a repeated send asks none.
handle_exports = 0


def _device_alloc(ptr: int, ordinal: int, name: str) -> _Alloc:
    """The allocation holding ``ptr``: one driver query, its handle or export data from memory.py's
    per-allocation cache (checked against the allocation's unique id, so a freed and reallocated
    segment at the same address gets a fresh handle)."""
    global handle_exports
    dev = Device.get(ordinal)
    with dev.activate():
        facts = drv.pointer_facts(ptr)
        base, size = facts.base, facts.size
        if not size:
            raise IpcError("ERR_NOT_EXPORTABLE", f"tensor {name!r} is not in device memory the CUDA driver knows")
        if facts.pool:
            pool = facts.pool
            with cache._export_lock:
                known = cache._local_pools.get(pool)
                if known is None:
                    try:
                        fd = drv.pool_export_fd(pool)
                    except CudaError as err:
                        raise IpcError("ERR_NOT_EXPORTABLE", f"tensor {name!r} lives in a memory pool that is not IPC-enabled ({err.code})") from err
                    known = cache._local_pools[pool] = (os.urandom(16), fd)
            cached = cache._export_handles.get(base)
            if cached is not None and facts.buffer_id and cached[0] == facts.buffer_id:
                export = cached[1]
            else:
                export = drv.pool_export_pointer(base)
                with cache._export_lock:
                    cache._export_handles[base] = (facts.buffer_id, export)
            cache._local_pool_exports[export] = base
            a = _Alloc(KIND_POOL, ("pool", base, facts.buffer_id), size)
            a.pool_id, a.pool_fd, a.export = known[0], known[1], export
        else:
            if facts.managed or facts.memory_type != drv.CU_MEMORYTYPE_DEVICE:
                raise IpcError("ERR_NOT_EXPORTABLE", f"tensor {name!r} is managed or host memory, which CUDA IPC handles cannot share; use HostArray for host memory")
            cached = cache._export_handles.get(base)
            if cached is not None and facts.buffer_id and cached[0] == facts.buffer_id:
                handle = cached[1]
            else:
                try:
                    handle = drv.ipc_get_mem_handle(base)
                except CudaError as err:
                    raise IpcError("ERR_NOT_EXPORTABLE", f"the driver has no IPC handle for tensor {name!r} ({err.code}); it may come from "
                                   "cuMemCreate/VMM (e.g. PyTorch's expandable_segments:True), which legacy handles cannot share") from err
                handle_exports += 1
                with cache._export_lock:
                    cache._export_handles[base] = (facts.buffer_id, handle)
            cache._local_exports[handle] = base
            a = _Alloc(KIND_LEGACY, ("legacy", base, facts.buffer_id), size)
            a.data = encode_descriptor(LegacyHandleDescriptor(handle, 0, size, dev.uuid, os.getpid(), None))
        a.uuid = dev.uuid
        a.ordinal = ordinal
        return a


def _pointers(objs) -> list:
    """Where each tensor starts now: for torch tensors one C method call each."""
    torch = sys.modules.get("torch")
    if torch is not None:
        T = torch.Tensor
        if all(type(o) is T or isinstance(o, T) for o in objs):
            return list(map(T.data_ptr, objs))
    return [_pointer(o) for o in objs]


def _current(st: SharedTensors) -> _Encoding:
    """The set's encoding, reused while every tensor starts where it did."""
    with st._lock:
        enc = st._encoding
        if enc is not None:
            if _pointers(st._objs) == enc.pointers:
                return enc
        enc = st._encoding = _describe(st)
        return enc


def _entries_for_link(allocs, link):
    """Entry (kind, fd count, data) per allocation for ``link``, with the fds (all owned) and commits."""
    entries, fds, commits = [], [], []
    attached = set()
    try:
        for a in allocs:
            if a.kind == KIND_HOST:
                fds.append(os.dup(a.mapping.fd))
                entries.append((KIND_HOST, 1, a.data))
            elif a.kind == KIND_LEGACY:
                entries.append((KIND_LEGACY, 0, a.data))
            else:
                attach, pfds, commit = device_transfers._pool_fd_for_link(link, a.pool_id, a.pool_fd)
                if attach and a.pool_id in attached:  # the fd already goes with an earlier entry
                    for fd in pfds:
                        os.close(fd)
                    attach, pfds, commit = False, [], None
                if attach:
                    attached.add(a.pool_id)
                data = device_transfers._pool_ref_bytes(a.pool_id, a.uuid, 0, attach)
                data[48:112] = a.export
                struct.pack_into("<QQQ", data, 112, a.size, 0, a.size)
                fds.extend(pfds)
                if commit is not None:
                    commits.append(commit)
                entries.append((KIND_POOL, len(pfds), bytes(data)))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return entries, fds, commits


def _hold_for(allocs, objs, nbytes) -> Hold:
    """Keeps the tensors (so their allocations) and host mappings alive until the peer releases the set."""
    mappings = [a.mapping for a in allocs if a.kind == KIND_HOST]
    for m in mappings:
        m.retain()
    keep = list(objs)

    def release():
        keep.clear()
        for m in mappings:
            m.release()
    return Hold(release, nbytes)


def _encode_shared(st: SharedTensors, link) -> TransferEncoding:
    enc = _current(st)
    if st._sync:
        _sync_producers(st._objs, enc.syncs)
    entries, fds, commits = _entries_for_link(enc.allocs, link)
    try:
        hold = _hold_for(enc.allocs, st._objs, enc.nbytes) if enc.count else None
        data = encode_set(entries, enc.table, enc.count)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return _encoding(data, fds, commits, hold)


def _encoding(data, fds, commits, hold) -> TransferEncoding:
    on_commit = None
    if commits:
        def on_commit(commits=commits):
            for c in commits:
                c()
    return TransferEncoding(data=data, fds=fds, close_fds_after_send=True, on_commit=on_commit, hold=hold, kind=TENSOR_SET_KIND)


def _encode_resend(ts: "TensorSet", link) -> TransferEncoding:
    """A received set sent on as it came: the same allocations, the same table."""
    ts._check()
    entries, fds, commits, holds = [], [], [], []
    try:
        for buf in ts._allocs:
            if isinstance(buf, HostBuffer):
                e = host_transfer._HostBufferTransfer().encode(buf, link)
                holds.append(e.hold)
                fds.append(os.dup(e.fds[0]))
                entries.append((KIND_HOST, 1, bytes(e.data)))
                continue
            e = device_transfers._DeviceMemoryTransfer()._resend(buf, link, 0, buf.nbytes)
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

    def release():
        for h in holds:
            release_hold(h)
    return _encoding(data, fds, commits, Hold(release, total) if holds else None)


# ------------------------------------------------------------------------------------------------
# Receiving


_torch_checked = False
_torch = None


def _torch_module():
    """torch when it imports, else None (asked once)."""
    global _torch_checked, _torch
    if not _torch_checked:
        try:
            import torch  # noqa: PLC0415 - optional, heavy
            _torch = torch
        except ImportError:
            _torch = None
        _torch_checked = True
    return _torch


class TensorSet(Mapping):
    """Named tensors received in one message (see the module notes). ``ts[name]``: a torch tensor when
    torch is importable (a view: no copy), else the cuda_ipc view; ``view(name)``: ``ArrayView``
    (device memory) or ``HostArray`` (host memory); ``close(sync=True)`` lets go of the set (the views
    from ``view()`` with it; torch tensors keep the memory alive on their own until they are gone)."""

    def __init__(self, layout: TensorLayout, allocations: list, _token=None):
        if _token is not _CREATE:
            raise IpcError("ERR_INVALID_ARG", "TensorSet objects come from links (receive)")
        self.layout = layout
        self._allocs = allocations
        self._closed = False
        self._views: dict[int, Any] = {}
        self._tensors: dict[int, Any] = {}
        self._bases: dict[int, Any] = {}
        self._lock = threading.Lock()

    # -- mapping --

    def __getitem__(self, name: str):
        return self.tensor(name) if _torch_module() is not None else self.view(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.layout.names)

    def __len__(self) -> int:
        return self.layout.count

    def __contains__(self, name) -> bool:
        return name in self.layout.index

    # -- facts --

    @property
    def closed(self) -> bool:
        return self._closed

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
    def allocations(self) -> list:
        """The buffers over each allocation the message brought (DeviceBuffer or HostBuffer)."""
        return list(self._allocs)

    def _check(self) -> None:
        if self._closed:
            raise IpcError("ERR_CLOSED", "this TensorSet is closed")

    def _index(self, name: str) -> int:
        i = self.layout.index.get(name)
        if i is None:
            raise KeyError(name)
        return i

    def bases(self) -> list:
        """Addresses of the allocations in this process (mapping device memory on first use)."""
        self._check()
        return [a.ptr if not isinstance(a, HostBuffer) else _host_address(a) for a in self._allocs]

    # -- views --

    def view(self, name: str):
        """The cuda_ipc view of a tensor: ``ArrayView`` (``__cuda_array_interface__``, DLPack) or ``HostArray``;
        valid until the set is closed."""
        self._check()
        i = self._index(name)
        v = self._views.get(i)
        if v is None:
            L = self.layout
            buf = self._allocs[L.allocations[i]]
            if isinstance(buf, HostBuffer):
                v = HostArray(buf, L.dtypes[i], L.shapes[i], L.strides[i], L.offsets[i])
            else:
                v = ArrayView(buf, ArrayMeta.make(L.dtypes[i], L.shapes[i], L.strides[i]), L.offsets[i])
            self._views[i] = v
        return v

    def tensor(self, name: str):
        """A torch tensor over the received memory (no copy), made once per name."""
        self._check()
        i = self._index(name)
        t = self._tensors.get(i)
        if t is None:
            torch = _torch_module()
            if torch is None:
                raise IpcError("ERR_UNSUPPORTED", "torch does not import in this Python; use view(name)")
            L = self.layout
            base = self._torch_base(L.allocations[i], torch)
            itemsize = DTYPES[L.dtypes[i]][0]
            off = L.offsets[i]
            t = base[off:off + L.extents[i]].view(getattr(torch, L.dtypes[i])).as_strided(L.shapes[i], [s // itemsize for s in L.strides[i]])
            self._tensors[i] = t
        return t

    def tensors(self) -> dict:
        """Every tensor, by name (torch tensors)."""
        return {n: self.tensor(n) for n in self.layout.names}

    def _torch_base(self, a: int, torch):
        """A uint8 torch tensor over the whole allocation: its own handle on the memory, so the tensors
        made from it keep the memory mapped after the set is closed, until they are gone."""
        b = self._bases.get(a)
        if b is None:
            buf = self._allocs[a]
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
        first = None
        for a in self._allocs:
            try:
                a.close(sync) if not isinstance(a, HostBuffer) else a.close()
            except Exception as e:  # noqa: BLE001 - close them all, report the first
                first = first or e
        if first is not None:
            raise first

    def __enter__(self) -> "TensorSet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing to report to at collection time
                pass

    def __repr__(self) -> str:
        return f"<cuda_ipc.TensorSet {self.layout.count} tensors, {self.memory} memory{' closed' if self._closed else ''}>"


_CREATE = object()


def _host_address(buf: HostBuffer) -> int:
    c = ctypes.c_char.from_buffer(buf._check().mmap, buf.offset)
    try:
        return ctypes.addressof(c)
    finally:
        del c


def _decode(data: memoryview, fds: list, link, lease) -> TensorSet:
    allocations, table, count = parse_set(data, len(fds))
    sizes = [a[3] for a in allocations]
    layout = _cached_layout(link, table, count, sizes)
    # One lease for the message: it ends once every allocation it brought is released here.
    whole = _PartLease(lease, len(allocations))
    buffers = []
    at = 0
    try:
        for kind, fd_count, body, size in allocations:
            handler = handler_for_kind(_KIND_NAMES[kind])
            if handler is None:
                raise IpcError("ERR_NOT_TRANSFERABLE", f"received a tensor set with a '{_KIND_NAMES[kind]}' allocation but no handler for it is registered")
            mine = fds[at:at + fd_count]
            part = _AllocationLease(whole)
            try:
                buf = _decode_legacy(body, part) if kind == KIND_LEGACY else handler.decode(body, mine, link, part)
            finally:
                fds[at:at + fd_count] = mine  # taken ones are -1; the rest stay the link's to close
            for k in range(at, at + fd_count):
                fds[k] = -1
            at += fd_count
            buffers.append(buf)
            if kind == KIND_LEGACY:
                part.on_end = _dropper(buf._origin)
            if buf.nbytes != size:
                raise IpcError("ERR_FRAME_INVALID", f"a received tensor set's allocation maps {buf.nbytes} bytes, not the {size} it announced")
    except BaseException:
        for b in buffers:
            try:
                b.close(False) if not isinstance(b, HostBuffer) else b.close()
            except Exception:  # noqa: BLE001 - being discarded
                pass
        raise
    return TensorSet(layout, buffers, _CREATE)


_KIND_NAMES = {KIND_LEGACY: "legacy-buffer", KIND_POOL: "pool-buffer", KIND_HOST: "host-buffer"}

# Legacy entries decoded before, by their bytes: a repeated sync brings the same few hundred (one
# per caching-allocator segment), and a descriptor is immutable once checked.
_descriptors: "OrderedDict[bytes, LegacyHandleDescriptor]" = OrderedDict()
_descriptors_lock = threading.Lock()


def _decode_legacy(body, lease):
    """What the 'legacy-buffer' handler makes of ``body``, with the canonical decode done once per bytes."""
    key = bytes(body)
    with _descriptors_lock:
        desc = _descriptors.get(key)
    if desc is None:
        desc = decode_descriptor(key, "cuda-legacy-handle")
        with _descriptors_lock:
            _descriptors[key] = desc
            while len(_descriptors) > 8192:
                _descriptors.popitem(last=False)
    origin = _Origin("legacy", lease, desc.device_uuid, 0, descriptor=desc)
    return DeviceBuffer(origin, desc.offset, desc.byte_length, _DEVICE_BUFFER)


class _PartLease:
    """Counts a message's allocations: its lease (if any) ends with the last of them."""

    __slots__ = ("_lease", "_open", "_lock")

    def __init__(self, lease, count: int):
        self._lease = lease
        self._open = count
        self._lock = threading.Lock()

    def end_one(self) -> None:
        with self._lock:
            self._open -= 1
            last = self._open == 0
        if last and self._lease is not None:
            self._lease.end()


class _AllocationLease:
    """What one allocation's handler sees as its lease: its end counts towards the message's, after
    ``on_end`` (a legacy mapping is closed then rather than left idle)."""

    __slots__ = ("_whole", "_ended", "on_end")

    def __init__(self, whole: _PartLease):
        self._whole = whole
        self._ended = False
        self.on_end = None

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


def _dropper(origin):
    """Closes a legacy mapping once its set let go of it, unless something else here still uses it:
    an idle mapping would keep the sender's memory after the sender freed it."""
    def drop():
        if origin.user is not None:
            cache._legacy_drop(origin.descriptor.handle, origin.user)
    return drop


def _cached_layout(link, table, count: int, sizes: list) -> TensorLayout:
    """A layout this link decoded before, when the table is the same bytes (a repeated send of the same
    tensors; the last few are kept, so that a state dict sent as several sets hits too): then only
    the extents are checked against this message's allocations."""
    cache = link.handler_state.get(_LAYOUT_STATE)
    if cache is None:
        cache = link.handler_state[_LAYOUT_STATE] = OrderedDict()
    last = cache.get(table)
    if last is not None and last.count == count and last.allocation_count == len(sizes):
        for a, end in enumerate(last.ends):
            if end > sizes[a]:
                raise IpcError("ERR_FRAME_INVALID", f"a received tensor set is malformed: its tensors reach byte {end} of allocation {a}, which holds {sizes[a]}")
        cache.move_to_end(table)
        return last
    layout = decode_table(table, count, sizes)
    cache[layout.table] = layout
    while len(cache) > _LAYOUTS_KEPT:
        cache.popitem(last=False)
    return layout


class _TensorSetTransfer(TransferHandler):
    kind = TENSOR_SET_KIND

    def can_transfer(self, value) -> bool:
        return type(value) is SharedTensors or type(value) is TensorSet

    def encode(self, value, link) -> TransferEncoding:
        if type(value) is TensorSet:
            return _encode_resend(value, link)
        return _encode_shared(value, link)

    def decode(self, data, fds, link, lease):
        return _decode(data, fds, link, lease)


register_transfer_handler(_TensorSetTransfer())
