"""Moving a packed stream's chunks over NCCL on one side (docs/PROTOCOL.md 8.3; src/tensors/chunk-pipeline.ts):
one NCCL operation per chunk, straight from or into memory where the chunk's route says so
(packed_stream.py), otherwise through one of two staging slots that a copy_runs launch fills
(sending: gather) or empties (receiving: scatter) on a second stream, so that the copy of one chunk
overlaps the transfer of the next. Everything is queued up front; nothing here waits for the GPU.

  send, staged chunk k (slot s = k % 2):  copy: wait free[s], gather k -> s, record full[s]
                                           nccl: wait full[s], send s, record free[s]
  recv, staged chunk k:                    nccl: wait free[s], recv -> s, record full[s]
                                           copy: wait full[s], scatter s, record free[s]

One ChunkMover per communicator (its extras), used by its worker thread only: its transfers are
queued one after another and reuse the slots, events and run table (a repeated sync of the same
tensors builds and uploads no table).
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from ctypes import byref, c_size_t, c_uint32, c_uint64, c_void_p
from typing import NamedTuple

from . import kernels as copy_kernels
from ..cuda import driver as drv
from .kernels import BLOCK_THREADS, CHUNK_BYTES, grid_for, plan_runs
from ..cuda.device import Device
from ..errors import IpcError
from ..link.nccl.nccl_comms import LinkComm
from ..nccl import NcclCommunicator
from .packed_stream import ChunkRoute
from ..cuda.stream import Event, Stream

_ROW_BYTES = copy_kernels.ROW.size


class ChunkOperation(NamedTuple):
    """What each chunk is on the communicator: 'send' to / 'recv' from rank ``peer``, or a 'broadcast' from rank ``peer``."""

    op: str
    peer: int


class _StagedChunk(NamedTuple):
    row: int
    runs: int
    items: int


class _TablePlan(NamedTuple):
    data: bytes
    #: per chunk: where its rows are in the table, None for a direct chunk
    chunks: list[_StagedChunk | None]


class ChunkMover:
    """The chunk pipeline of one communicator on one side (see the module notes)."""

    def __init__(self, device: Device, nccl_stream: Stream):
        self.device = device
        self.nccl_stream = nccl_stream
        self.copy_stream = Stream(device)
        self._free = [Event(device), Event(device)]
        self._full = [Event(device), Event(device)]
        self._done = Event(device)
        self._slots: list[int] = []
        self._slot_bytes = 0
        self._table_ptr = 0
        self._table_capacity = 0
        self._table_data = b""
        #: The last plan, for the routes object it was made from (a repeated sync passes the same one).
        self._plan_for: tuple[Sequence[ChunkRoute], tuple[int, ...], bool] | None = None
        self._plan: _TablePlan | None = None
        self._closed = False
        #: Bytes of the run tables uploaded (0 on a repeated sync), for timings.
        self.uploaded = 0

    def queue(self, comm: NcclCommunicator, how: ChunkOperation, routes: Sequence[ChunkRoute], after: Sequence[Event] = ()) -> None:
        """Queues every chunk of one transfer (``routes``: this side's) on the streams; both streams
        first wait for ``after`` (the producers of what is sent, or the users of what is received
        into). The NCCL stream has passed the whole transfer (the copies too) once its work so far ran."""
        if self._closed:
            raise IpcError("ERR_CLOSED", "the NCCL transfer was dropped: its link closed")
        sending = how.op == "send" or (how.op == "broadcast" and comm.rank == how.peer)
        largest = max((r.bytes for r in routes if not r.direct), default=0)
        if largest:
            self._ensure_slots(largest)
        plan = self._plan_of(routes, sending)
        wait_event, record, check = drv.entry_point("cuStreamWaitEvent"), drv.entry_point("cuEventRecord"), drv.check
        nccl, copy = c_void_p(self.nccl_stream.handle), c_void_p(self.copy_stream.handle)
        free = [c_void_p(e.handle) for e in self._free]
        full = [c_void_p(e.handle) for e in self._full]
        handle = self.nccl_stream.handle
        # The device's context made current once: each call below is one driver call, not three (the
        # context pushed and popped around every call was most of a staged chunk's host time).
        with self.device.activate():
            self.uploaded = self._upload(plan.data)
            for ev in after:
                check(wait_event(nccl, c_void_p(ev.handle), 0), "cuStreamWaitEvent")
                check(wait_event(copy, c_void_p(ev.handle), 0), "cuStreamWaitEvent")
            for k, route in enumerate(routes):
                staged = plan.chunks[k]
                s = k % 2
                if route.direct:
                    buffer = route.address
                else:
                    assert staged is not None, "a staged chunk has its rows"
                    buffer = self._slots[s]
                    if sending:
                        check(wait_event(copy, free[s], 0), "cuStreamWaitEvent")
                        self._launch(staged)
                        check(record(full[s], copy), "cuEventRecord")
                        check(wait_event(nccl, full[s], 0), "cuStreamWaitEvent")
                    else:
                        check(wait_event(nccl, free[s], 0), "cuStreamWaitEvent")
                if how.op == "broadcast":
                    comm.broadcast(buffer, route.bytes, how.peer, stream=handle)
                elif how.op == "send":
                    comm.send(buffer, route.bytes, how.peer, stream=handle)
                else:
                    comm.recv(buffer, route.bytes, how.peer, stream=handle)
                if not route.direct:
                    assert staged is not None, "a staged chunk has its rows"
                    if sending:
                        check(record(free[s], nccl), "cuEventRecord")
                    else:
                        check(record(full[s], nccl), "cuEventRecord")
                        check(wait_event(copy, full[s], 0), "cuStreamWaitEvent")
                        self._launch(staged)
                        check(record(free[s], copy), "cuEventRecord")
            # Done when both streams passed this transfer's work.
            done = c_void_p(self._done.handle)
            check(record(done, copy), "cuEventRecord")
            check(wait_event(nccl, done, 0), "cuStreamWaitEvent")

    def _plan_of(self, routes: Sequence[ChunkRoute], gather: bool) -> _TablePlan:
        """The run table of the staged chunks: gathers (addresses -> slot) or scatters (slot -> addresses)."""
        key = (tuple(self._slots), gather)
        cached = self._plan_for
        if cached is not None and cached[0] is routes and cached[1:] == key and self._plan is not None:
            return self._plan
        parts: list[bytes] = []
        chunks: list[_StagedChunk | None] = []
        rows = 0
        for k, route in enumerate(routes):
            if route.direct:
                chunks.append(None)
                continue
            slot = self._slots[k % 2]
            here = [address for _, address, _ in route.copies]
            there = [slot + at for at, _, _ in route.copies]
            sizes = [n for _, _, n in route.copies]
            t = plan_runs(there, here, sizes) if gather else plan_runs(here, there, sizes)
            chunks.append(_StagedChunk(rows, t.runs, t.chunks))
            parts.append(t.data)
            rows += t.runs
        plan = _TablePlan(b"".join(parts), chunks)
        self._plan_for = (routes, key[0], key[1])
        self._plan = plan
        return plan

    def _ensure_slots(self, nbytes: int) -> None:
        """Two staging slots of at least ``nbytes`` each (kept for the next transfer; larger ones replace them)."""
        if len(self._slots) == 2 and self._slot_bytes >= nbytes:
            return
        if self._slots:
            # Work queued by the transfer before may still use them.
            self.copy_stream.synchronize()
            self.nccl_stream.synchronize()
            self._free_slots()
        with self.device.activate():
            for _ in range(2):
                p = drv.CUdeviceptr()
                drv.driver().call("cuMemAlloc", byref(p), nbytes)
                self._slots.append(p.value)
        self._slot_bytes = nbytes
        self._plan_for = None

    def _free_slots(self) -> None:
        with self.device.activate():
            for p in self._slots:
                drv.driver().call("cuMemFree", drv.CUdeviceptr(p))
        self._slots = []
        self._slot_bytes = 0

    def _upload(self, data: bytes) -> int:
        """Makes the device's run table ``data`` (on the copy stream, after every launch that read the
        one before); the bytes uploaded (0 when it is the table there already)."""
        if not data or data is self._table_data or data == self._table_data:
            return 0
        with self.device.activate():
            if self._table_capacity < len(data):
                if self._table_ptr:
                    # Launches still queued may read the old table: let them finish before it goes.
                    self.copy_stream.synchronize()
                    drv.driver().call("cuMemFree", drv.CUdeviceptr(self._table_ptr))
                    self._table_ptr = self._table_capacity = 0
                p = drv.CUdeviceptr()
                drv.driver().call("cuMemAlloc", byref(p), len(data))
                self._table_ptr, self._table_capacity = p.value, len(data)
            self._table_data = b""
            copy_kernels.call("cuMemcpyHtoDAsync", c_uint64(self._table_ptr), data, c_size_t(len(data)), c_void_p(self.copy_stream.handle))
            self._table_data = data
        return len(data)

    def _launch(self, c: _StagedChunk) -> None:
        """copy_runs over chunk ``c``'s rows, on the copy stream; the device's context is current."""
        if c.runs == 0:
            return
        fn, sms = copy_kernels.copy_runs_function(self.device.ordinal)
        values = (c_uint64(self._table_ptr + c.row * _ROW_BYTES), c_uint32(c.runs), c_uint64(c.items), c_uint64(CHUNK_BYTES))
        pointers = (c_void_p * 4)(*[ctypes.addressof(v) for v in values])
        copy_kernels.call("cuLaunchKernel", c_void_p(fn), grid_for(c.items, sms), 1, 1, BLOCK_THREADS, 1, 1, 0,
                          c_void_p(self.copy_stream.handle), pointers, None)

    def close(self) -> None:
        """Frees the slots, events, table and copy stream once nothing queued can use them (after the
        communicator was closed or aborted: an aborted NCCL operation ends its kernels). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.copy_stream.synchronize()
            self.nccl_stream.synchronize()
        finally:
            if self._slots:
                self._free_slots()
            if self._table_ptr:
                with self.device.activate():
                    drv.driver().call("cuMemFree", drv.CUdeviceptr(self._table_ptr))
                self._table_ptr = 0
            for e in (*self._free, *self._full, self._done):
                e.close()
            self.copy_stream.close()


def mover_of(comm: LinkComm) -> ChunkMover:
    """The chunk mover of a communicator (its staging slots, copy stream and run table), made on first
    use (on the communicator's worker thread)."""
    m = comm.extras.get("chunks")
    if m is None:
        m = comm.extras["chunks"] = ChunkMover(comm.device, comm.stream)
    assert isinstance(m, ChunkMover)
    return m
