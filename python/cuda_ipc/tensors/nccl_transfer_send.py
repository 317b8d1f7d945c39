"""Sending a tensor set on a TCP link (docs/PROTOCOL.md 8.3, 'nccl-tensor-set'; src/tensors/nccl-transfer.ts):
``link.send({"weights": share_tensors(model.state_dict())})`` on a tcp:// link. The record carries the
table (names, dtypes, shapes, packed offsets); the bytes follow over the link's NCCL communicator
as one packed stream in chunks: a chunk that is one range of this process's memory goes straight
from there, another is gathered into a staging slot first (chunk_pipeline.py).

The plan (table, packed offsets, chunk routes) is kept per ``share_tensors`` object while every
tensor still starts where it did: a repeated sync of the same weights costs a pointer check per
tensor, an event per producing stream, and the record. The tensors are kept until the receiver has
the bytes (its RELEASE) and NCCL is done reading them: do not change them meanwhile.
"""
from __future__ import annotations

import bisect
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..cuda import driver as drv
from ..ipc.descriptor import DTYPES
from ..cuda.device import Device
from ..errors import IpcError
from ..host.host_buffer import HostBuffer
from ..arrays.host_array import HostArray
from ..link.messages.handlers import TransferEncoding
from ..link.nccl.nccl_comms import LinkComm, check_peer
from ..link.nccl.nccl_outgoing import begin_outgoing
from .chunk_pipeline import ChunkOperation, mover_of
from ..arrays.device_array import DeviceBuffer
from ..arrays.exports import _describe_array
from ..nccl import NcclCommunicator
from .nccl_wire import NCCL_TENSOR_SET_KIND, encode_nccl_tensor_set, encode_packed_table
from .packed_stream import DEFAULT_CHUNK_BYTES, MIN_CHUNK_BYTES, PACK_ALIGN, ChunkRoute, PlacedTensor, SourceTensor, pack_offsets, route_chunks
from ..cuda.stream import after_producer, producer_stream
from .tensor_map import TensorMap
from .tensor_set_transfer import SharedTensors, pointers_of

if TYPE_CHECKING:
    from ..link.connection.link import Link


class SendPlan(NamedTuple):
    """What sending one set takes, kept per SharedTensors while its tensors stay where they are."""

    device: Device
    table: bytes
    tensor_count: int
    packed_length: int
    chunk_bytes: int
    routes: list[ChunkRoute]
    #: Where each tensor started when planned (a changed one makes a new plan).
    pointers: list[int]
    #: The producers' streams (events recorded on them at each send), and whether the device must be
    #: synchronized instead (a CUDA array that names no stream).
    after: tuple[int, ...]
    sync_device: bool


def chunk_bytes_for(length: int) -> int:
    """The chunk size for a stream of ``length`` bytes: the default, or less for a short stream (as Node's)."""
    fit = -(-length // PACK_ALIGN) * PACK_ALIGN
    return min(DEFAULT_CHUNK_BYTES, max(MIN_CHUNK_BYTES, fit))


class _Allocation:
    """One allocation the tensors live in (its identity joins tensors into runs)."""

    __slots__ = ("base", "end")

    def __init__(self, base: int, end: int):
        self.base = base
        self.end = end


class _Tensor(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    address: int
    allocation: object


def _not_transferable(name: str, why: str) -> IpcError:
    return IpcError("ERR_NOT_TRANSFERABLE", f"link.send: tensor {name!r} {why}")


def _allocation_of(ptr: int, extent: int, device: Device, known: dict[int, tuple[list[int], list[_Allocation]]], name: str) -> _Allocation:
    """The allocation holding [ptr, ptr + extent): one driver query per allocation (later tensors in one
    found before need none). ``known``: per device, the allocations found so far, sorted by base."""
    bases, found = known.setdefault(device.ordinal, ([], []))
    k = bisect.bisect_right(bases, ptr) - 1
    if k >= 0 and ptr + extent <= found[k].end:
        return found[k]
    with device.activate():
        facts = drv.pointer_facts(ptr)
    if not facts.size or ptr + extent > facts.base + facts.size:
        raise _not_transferable(name, "is not in device memory the CUDA driver knows (or runs past the end of its allocation)")
    a = _Allocation(facts.base, facts.base + facts.size)
    k = bisect.bisect_right(bases, a.base)
    bases.insert(k, a.base)
    found.insert(k, a)
    return a


def _plan(names: list[str], objs: list[Any], sync: bool) -> SendPlan:
    device: Device | None = None
    tensors: list[_Tensor] = []
    after: set[int] = set()
    sync_device = False
    known: dict[int, tuple[list[int], list[_Allocation]]] = {}
    for name, obj in zip(names, objs):
        if type(obj) is HostArray:
            raise _not_transferable(name, "is in host memory; a tensor set crosses a TCP link over NCCL, device memory only (send "
                                    "host tensors in a HostBuffer, which is copied)")
        e = _describe_array(obj, sync)
        if not e.ptr or not e.extent:
            raise _not_transferable(name, "has no elements; tensor sets carry tensors of at least one element")
        if e.meta is None or e.meta.dtype not in DTYPES:
            raise _not_transferable(name, "has a dtype or layout a tensor set cannot describe")
        if not e.meta.c_contiguous:
            raise _not_transferable(name, "is strided; a tensor set crosses a TCP link as C-contiguous tensors (send a contiguous "
                                    "copy: tensor.contiguous())")
        ordinal = e.ordinal
        if ordinal is None:
            with Device.get(0).activate():
                ordinal = drv.ptr_attribute_int(drv.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, e.ptr)
        d = Device.get(ordinal)
        if device is None:
            device = d
        elif d is not device:
            raise IpcError("ERR_NOT_TRANSFERABLE", f"link.send: the tensors live on several devices ({device.ordinal} and {d.ordinal}); "
                           "over a TCP link send one set per device")
        if e.sync is not None:
            s = producer_stream(obj, ordinal)
            if s is None:
                sync_device = True
            else:
                after.add(s)
        a = _allocation_of(e.ptr, e.extent, d, known, name)
        tensors.append(_Tensor(name, e.meta.dtype, e.meta.shape, e.extent, e.ptr, a))
    if device is None:
        raise IpcError("ERR_NOT_TRANSFERABLE", "link.send: an empty tensor set has nothing to send")
    offsets, length = pack_offsets([SourceTensor(t.nbytes, t.address, t.allocation) for t in tensors])
    chunk = chunk_bytes_for(length)
    table = encode_packed_table([t.name for t in tensors], [t.dtype for t in tensors], [t.shape for t in tensors], offsets)
    routes = route_chunks([PlacedTensor(o, t.nbytes, t.address) for o, t in zip(offsets, tensors)], length, chunk)
    return SendPlan(device, table, len(tensors), length, chunk, routes, [t.address for t in tensors], tuple(sorted(after)), sync_device)


_plans: weakref.WeakKeyDictionary[SharedTensors, SendPlan] = weakref.WeakKeyDictionary()


def _plan_shared(st: SharedTensors) -> SendPlan:
    """The plan of ``st``, reused while every tensor starts where it did."""
    with st._lock:
        plan = _plans.get(st)
        if plan is not None and pointers_of(st) == plan.pointers:
            return plan
        plan = _plans[st] = _plan(st._names, st._objs, st._sync)
        return plan


def _plan_received(ts: TensorMap) -> tuple[SendPlan, list[Any]]:
    """A received set sent on as it came (its device memory; mapped here or fetched): a plan made for this send."""
    if ts.pending:
        raise IpcError("ERR_INVALID_STATE", "link.send: this TensorMap came over a TCP link and its bytes are still on its sender: "
                       "fetch() it before sending it on")
    ts._check()
    L = ts.layout
    views: list[Any] = []
    for i, name in enumerate(L.names):
        if isinstance(ts._allocs[L.allocations[i]], HostBuffer):
            raise _not_transferable(name, "is in host memory; a tensor set crosses a TCP link over NCCL, device memory only")
        views.append(ts.view(name))
    return _plan(list(L.names), views, False), views


def is_nccl_tensor_set_value(value: object) -> bool:
    return type(value) is SharedTensors or isinstance(value, TensorMap)


def encode_tensor_set(value: SharedTensors | TensorMap, link: Link) -> TransferEncoding:
    """The 'nccl-tensor-set' encoding of ``value`` for ``link``; its chunks are queued once the message went out."""
    check_peer(link, "a tensor set")
    let_go: Callable[[], None] = _nothing
    if isinstance(value, SharedTensors):
        plan = _plan_shared(value)
        keep: Any = list(value._objs)
    else:
        plan, keep = _plan_received(value)
        retained = [a._origin for a in value._buffers() if isinstance(a, DeviceBuffer)]
        for o in retained:
            o.retain()  # a received set's memory stays (and so its sender's lease) until the peer and NCCL are done

        def release_origins() -> None:
            for o in retained:
                o.release(False)
        let_go = release_origins
    try:
        out = begin_outgoing(link, plan.device)
    except BaseException:
        let_go()
        raise
    try:
        data = encode_nccl_tensor_set(out.reference, out.sequence, plan.table, plan.tensor_count, plan.packed_length, plan.chunk_bytes)
        events = [ev for ev in (after_producer(plan.device, s) for s in plan.after) if ev is not None]
        if plan.sync_device:
            plan.device.synchronize()
    except BaseException:
        out.abandoned()
        let_go()
        raise
    def start(lc: LinkComm, c: NcclCommunicator) -> None:
        how = ChunkOperation("broadcast", 0) if lc.broadcast else ChunkOperation("send", 1)
        try:
            mover_of(lc).queue(c, how, plan.routes, events)
        finally:
            for ev in events:
                ev.close()

    return out.encoding(data, plan.packed_length, NCCL_TENSOR_SET_KIND, start, events, keep, let_go)


def _nothing() -> None:
    pass
