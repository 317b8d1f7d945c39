"""Tensor sets over TCP links (docs/PROTOCOL.md 8.3, 'nccl-tensor-set'; src/tensors/nccl-transfer.ts):
the handler of the record (sending: nccl_transfer_send.py), and the receiving side.

A received set arrives at once as a ``RemoteTensorSet`` (a TensorMap): names, dtypes and shapes are
there, the bytes are still on the sender (``pending``). They come over NCCL when the set is used:

- ``update_in_place(params, ts)`` receives them straight into the parameters when each is a
  C-contiguous tensor on the receiving device (chunks that are one run of the parameters' memory
  land there directly, the others through staging, scattered by copy_runs); otherwise the set is
  fetched first and copied as any set;
- ``ts[name]``, ``ts.view(name)``, ``ts.tensors()``, ``ts.fetch()`` receive it into one allocation
  of this process's own first (blocking);
- ``ts.close()`` of a set never used takes its bytes off the wire and drops them (the sender's
  transfer must end); the garbage collector does the same.

Transfers on a communicator are received in sequence order: a later transfer received first makes
an earlier set that waits for its user receive into memory of its own then (it stays usable). The
sender's lease ends once the set's bytes are here (or will never come).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Union

from . import update as upd
from .chunk_pipeline import ChunkOperation, mover_of
from ..cuda.device import Device
from ..errors import IpcError
from ..link.connection.arriving import await_settled
from ..link.messages.deferred import Completion
from ..link.messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler
from ..link.messages.nccl_abort import ABORT_CANNOT_TAKE
from ..link.nccl.nccl_comms import LinkComm, incoming_comm
from ..arrays.device_array import DeviceArray, DeviceBuffer
from ..arrays.owned import allocate_device_buffer, hold, unhold
from ..nccl import NcclCommunicator
from .nccl_wire import NCCL_TENSOR_SET_KIND, NcclTensorSetRecord, decode_nccl_tensor_set, decode_packed_table
from .nccl_transfer_send import encode_tensor_set, is_nccl_tensor_set_value
from .packed_stream import ChunkRoute, PlacedTensor, route_chunks
from ..cuda.stream import Event, after_producer
from ..arrays.host_array import HostArray
from .tensor_map import _CREATE, TensorMap
from .tensor_set_transfer import SharedTensors
from .wire import TensorLayout

if TYPE_CHECKING:
    from ..link.lifetimes.lease import ReceivedLease
    from ..link.connection.link import Link

__all__ = ["RemoteTensorSet"]


def _consumed() -> IpcError:
    return IpcError("ERR_INVALID_STATE", "this TensorMap was received straight into your tensors by update_in_place: it holds no bytes of its own")


class RemoteTensorSet(TensorMap):
    """A tensor set that came over a TCP link (see the module notes): ``pending`` while its bytes are
    still on the sender; ``fetch()`` receives them into memory of this process's own (blocking), as
    does the first tensor asked for; ``update_in_place`` receives them straight into parameters."""

    def _update_from_remote(self, dst: Mapping[str, Any], *, stream: Any, strict: bool) -> upd.UpdateResult | None:
        return update_from_remote(dst, self, stream=stream, strict=strict)

    def __init__(self, comm: LinkComm, record: NcclTensorSetRecord, lease: ReceivedLease | None, link: Link, _token: object = None):
        if _token is not _REMOTE:
            raise IpcError("ERR_INVALID_ARG", "RemoteTensorSet objects come from TCP links (receive)")
        super().__init__(record.layout, [], _CREATE)
        self._comm = comm
        #: The link it came on: read while waiting for the bytes (the sender's NCCL_ABORT or death ends the wait).
        self._link = link
        self._record = record
        self._lease = lease
        self._remote_lock = threading.Lock()
        self._started = False
        self._consumed = False
        self._fetching: Completion | None = None
        self._buffer: DeviceBuffer | None = None
        self._failed: IpcError | None = None
        comm.defer(record.sequence, self._force, self._fail)

    # -- facts --

    @property
    def pending(self) -> bool:
        """True while the bytes are still on the sender: not fetched, nor received into your tensors."""
        return self._buffer is None and not self._consumed

    @property
    def device(self) -> Device:
        """The device the bytes land on (the receiving device of the link)."""
        return self._comm.device

    @property
    def memory(self) -> str:
        return "device"

    def __repr__(self) -> str:
        state = "closed" if self._closed else "consumed" if self._consumed else "fetched" if self._buffer is not None else "pending"
        return f"<cuda_ipc.RemoteTensorSet {self.layout.count} tensors, {self._record.packed_length} bytes, {state}>"

    # -- receiving into memory of its own --

    def fetch(self, timeout: float | None = None) -> "RemoteTensorSet":
        """Receives the set into one allocation of this process's own on ``device`` (at once when it
        was already); returns the set. Raises the transfer's error (the link closed: ERR_PEER_GONE,
        NCCL failed: ERR_NCCL), ERR_TIMEOUT after ``timeout`` seconds (it keeps arriving)."""
        self._check()
        c = self._start_fetch()
        if not await_settled(self._link, c, timeout):
            raise IpcError("ERR_TIMEOUT", f"TensorMap.fetch: the set's bytes did not arrive within {timeout} s")
        c.result()
        return self

    def _force(self) -> None:
        """A later transfer on the communicator needs the way: receive into memory of its own now."""
        self._start_fetch()

    def _start_fetch(self) -> Completion:
        with self._remote_lock:
            if self._fetching is not None:
                return self._fetching
            self._begin()
            fetching = self._fetching = Completion()
        P, device = self._record.packed_length, self._comm.device
        try:
            buf = allocate_device_buffer(P, device)
        except Exception as e:  # noqa: BLE001 - the transfer cannot be taken: the sender learns it
            error = IpcError("ERR_NCCL", f"could not allocate {P} bytes on device {device.ordinal} to receive a tensor set over NCCL: {e}")
            self._comm.abort(error, ABORT_CANNOT_TAKE)
            self._end_lease()
            fetching.settle(error)
            return fetching
        hold(buf)  # the transfer's own hold: closing the set meanwhile frees nothing under NCCL

        def settle(error: IpcError | None) -> None:
            with self._remote_lock:
                keep = error is None and not self._closed
                if keep:
                    self._allocs = [buf]
                    self._buffer = buf
            if not keep:
                buf.close(sync=False)
            unhold(buf)
            self._end_lease()
            fetching.settle(error)
        self._submit(route_chunks([PlacedTensor(0, P, buf.ptr)], P, self._record.chunk_bytes), settle)
        return fetching

    def _begin(self) -> None:
        """This set's transfer starts now (once), with the remote lock held."""
        if self._failed is not None:
            raise self._failed
        if self._started:
            raise IpcError("ERR_INVALID_STATE", "this set is being received already")
        self._started = True

    def _submit(self, routes: list[ChunkRoute], settle: Any, after: tuple[Event, ...] = (), times: dict[str, float] | None = None) -> None:
        how = ChunkOperation("broadcast", 0) if self._comm.broadcast else ChunkOperation("recv", 0)

        def start(lc: LinkComm, c: NcclCommunicator) -> None:
            if times is not None:
                times["started"] = time.perf_counter()
            mover = mover_of(lc)
            try:
                mover.queue(c, how, routes, after)
            finally:
                for ev in after:
                    ev.close()
            if times is not None:
                times["queued"] = time.perf_counter()
                times["uploaded"] = float(mover.uploaded)
        self._comm.submit(self._record.sequence, start, settle)

    def _fail(self, error: IpcError) -> None:
        """The communicator ended before the set's turn: its bytes will never come."""
        with self._remote_lock:
            if self._failed is None:
                self._failed = error
        self._end_lease()

    def _end_lease(self) -> None:
        """The sender may have its memory back: the bytes are here, or will never come."""
        if self._lease is not None:
            self._lease.end()

    # -- receiving straight into tensors (update_in_place) --

    def _receive_into(self, routes: list[ChunkRoute], after: tuple[Event, ...], times: dict[str, float]) -> Completion:
        with self._remote_lock:
            if self._fetching is not None:
                raise IpcError("ERR_INVALID_STATE", "this set is being received into memory of its own already; update from it once "
                               "fetch() returned")
            self._begin()
            self._consumed = True
        done = Completion()

        def settle(error: IpcError | None) -> None:
            self._end_lease()
            done.settle(error)
        self._submit(routes, settle, after, times)
        return done

    # -- nobody will use it --

    def _drop(self) -> None:
        with self._remote_lock:
            if self._started or self._failed is not None:
                return  # being received (a fetch closes its memory once done, the set being closed)
            self._started = True
        P = self._record.packed_length

        def settle(_error: IpcError | None) -> None:
            self._end_lease()
        self._submit(route_chunks([PlacedTensor(0, P, None)], P, self._record.chunk_bytes), settle)

    def close(self, sync: bool = True) -> None:
        """Lets go of the set: its memory (a fetched set) as TensorMap.close does; a set never used is
        received and dropped, so that the sender's transfer ends. Idempotent."""
        with self._remote_lock:
            if self._closed:
                return
            fetched = self._buffer is not None
            if not fetched:
                self._closed = True
        if fetched:
            super().close(sync)
            return
        self._drop()

    # -- the TensorMap views: the bytes must be here --

    def _check(self) -> None:
        super()._check()
        if self._consumed:
            raise _consumed()

    def _ensure(self) -> None:
        self._check()
        if self._buffer is None:
            self.fetch()

    def bases(self) -> list[int]:
        self._ensure()
        return super().bases()

    def view(self, name: str) -> DeviceArray | HostArray:
        self._ensure()
        return super().view(name)

    def tensor(self, name: str) -> Any:
        self._ensure()
        return super().tensor(name)


_REMOTE = object()


# ------------------------------------------------------------------------------------------------
# update_in_place from a pending set


class _RemotePlan(NamedTuple):
    plan: upd._Plan
    #: every pair a C-contiguous destination on the receiving device: received straight into them
    direct: bool
    routes: list[ChunkRoute]
    staged: int
    keep: Any


_remote_plans: OrderedDict[tuple[int, int, bool, int], _RemotePlan] = OrderedDict()
_remote_plans_lock = threading.Lock()


def _remote_plan(dst: Mapping[str, Any], ts: RemoteTensorSet, strict: bool) -> _RemotePlan:
    """The plan of (these parameters, this table), reused while each parameter is the same object at the same address."""
    layout = ts.layout
    device = ts.device
    key = (id(dst), id(layout), strict, device.ordinal)
    with _remote_plans_lock:
        hit = _remote_plans.get(key)
    if hit is not None and hit.plan.length == len(dst):
        current = [dst.get(n) for n in hit.plan.names]
        if all(a is b for a, b in zip(current, hit.plan.dst_objs)) and upd._addresses(current) == hit.plan.dst_ptrs:
            return hit
    index, L = layout.index, layout

    def ref(name: str) -> tuple[int | None, upd._Ref | None]:
        i = index.get(name)
        if i is None:
            return None, None
        return i, upd._Ref(L.dtypes[i], L.shapes[i], L.strides[i], L.nbytes[i], L.extents[i], False, device.ordinal)
    p = upd._plan(dst, L.names, ref, strict)
    direct = not p.strided and all(not d.host and d.ordinal == device.ordinal for d in (upd._describe(o)[0] for o in p.dst_objs))
    targets: list[int | None] = [None] * L.count
    for k, i in enumerate(p.src_index):
        targets[i] = p.dst_ptrs[k]
    routes = route_chunks([PlacedTensor(L.offsets[i], L.nbytes[i], targets[i]) for i in range(L.count)], ts._record.packed_length,
                          ts._record.chunk_bytes) if direct else []
    made = _RemotePlan(p, direct, routes, sum(1 for r in routes if not r.direct), (dst, layout))
    with _remote_plans_lock:
        _remote_plans[key] = made
        _remote_plans.move_to_end(key)
        while len(_remote_plans) > 16:
            _remote_plans.popitem(last=False)
    return made


def update_from_remote(dst: Mapping[str, Any], ts: TensorMap, *, stream: Any, strict: bool) -> upd.UpdateResult | None:
    """update_in_place from a pending set: straight into the parameters (returns once the bytes are
    there), or None after fetching the set when they do not all take it directly (the caller then
    copies as from any set). Names, dtypes and shapes are checked first (ERR_TENSOR_MISMATCH)."""
    if not isinstance(ts, RemoteTensorSet):
        return None
    ts._check()
    if ts._fetching is not None:  # being received into memory of its own (forced by a later transfer): copy from there
        ts.fetch()
        return None
    t0 = time.perf_counter()
    rp = _remote_plan(dst, ts, strict)
    if not rp.direct:
        ts.fetch()
        return None
    p = rp.plan
    device = ts.device
    with device.activate():
        handle = upd._stream_handle(stream, device.ordinal)
    # The parameters may still be in use by work queued on the caller's stream: NCCL writes after it.
    ev = after_producer(device, handle)
    times: dict[str, float] = {}
    t1 = time.perf_counter()
    done = ts._receive_into(rp.routes, () if ev is None else (ev,), times)
    await_settled(ts._link, done, None)
    done.result()
    t2 = time.perf_counter()
    started, queued = times.get("started", t1), times.get("queued", t1)
    us = 1e6
    timings = {"plan": (t1 - t0) * us, "wait": (started - t1) * us, "queue": (queued - started) * us, "transfer": (t2 - queued) * us,
               "uploaded": times.get("uploaded", 0.0)}
    missing = [] if strict else p.missing
    unexpected = [] if strict else p.unexpected
    return upd.UpdateResult(len(p.names), p.bytes, missing, unexpected, len(rp.routes), "nccl", handle, timings)


# ------------------------------------------------------------------------------------------------
# The record's handler


_TABLE_KEY = "cuda_ipc.nccl.table"


def _cached_decode(link: Link) -> Any:
    """decode_packed_table, reusing the layout this link decoded last when the table is the same bytes
    (a repeated sync); then only its end against this stream's length is checked."""
    def decode(table: bytes, count: int, packed_length: int) -> TensorLayout:
        last: TensorLayout | None = link.handler_state.get(_TABLE_KEY)
        if last is not None and last.count == count and last.table == table:
            if last.offsets[-1] + last.nbytes[-1] == packed_length:
                return last
        layout = decode_packed_table(table, count, packed_length)
        link.handler_state[_TABLE_KEY] = layout
        return layout
    return decode


class _NcclTensorSetTransfer(TransferHandler[Union[SharedTensors, TensorMap]]):
    kind = NCCL_TENSOR_SET_KIND
    transports = frozenset({"tcp"})

    def instead(self, transport: str) -> str:
        return ("a TensorMap received over a TCP link holds memory of this process's own, which a Unix link does not share; "
                "send share_tensors(ts.tensors()) instead")

    def can_transfer(self, value: object) -> bool:
        return is_nccl_tensor_set_value(value)

    def encode(self, value: SharedTensors | TensorMap, link: Link) -> TransferEncoding:
        return encode_tensor_set(value, link)

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> RemoteTensorSet:
        if fds:
            raise IpcError("ERR_DESCRIPTOR_INVALID", "received an nccl-tensor-set record with fds")
        record = decode_nccl_tensor_set(data, _cached_decode(link))
        comm = incoming_comm(link, record.comm, record.sequence)
        return RemoteTensorSet(comm, record, lease, link, _REMOTE)


register_transfer_handler(_NcclTensorSetTransfer())
