"""The NCCL path of a sharded sync (docs/PROTOCOL.md 9.3; src/tensors/sharded/nccl-runs.ts): each
pair's byte stream (its runs in plan order, each run's count*bytes bytes packed) cut into chunks
(``nccl_chunk_bytes``: the plan's chunk over the busier rank's NCCL streams); round k is ONE
``comm.group()`` holding this rank's send or receive of chunk k of every NCCL pair it is in (pairs
without a chunk k skip), so no order of pairs can deadlock and a Node rank's rounds match these. A
chunk that is one range of a local tensor goes straight from or into it; the others go through a
staging slot of one round's staged chunks: gathered by copy_runs before the send, scattered after
the receive, all on one stream (so the slot is free again for the next round's gather; staging is
one round's staged bytes, at most one plan chunk). The CPU waits once at the end, polling the
stream so that a failure elsewhere in the group (``stop``), NCCL's own asynchronous error or the
deadline aborts the communicator instead of hanging.

``nccl_chunk_bytes``, ``pair_chunks`` and ``plan_rounds`` are pure (the CPU tests check them);
``NcclRunMover`` runs them."""
from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...cuda import driver as drv
from ...cuda.device import Device
from ...errors import IpcError
from .. import kernels
from .host_copy import DeviceMemory, check_run_bounds
from .plan import PlanPair

#: Each staged chunk starts at a multiple of this in the slot (copy_runs' 16-byte loads, NCCL's alignment).
SLOT_ALIGN = 256


def nccl_chunk_bytes(pairs: Sequence[PlanPair], chunk_bytes: int) -> Callable[[PlanPair], int]:
    """The chunk of each NCCL pair of a plan (PROTOCOL.md 9.3; Node: ncclChunkBytes): ``chunk_bytes`` over
    the NCCL streams (pairs it sends or receives) of the busier of the pair's two ranks, down to a
    multiple of 256 where that leaves at least 512. A rank's round then stays within ``chunk_bytes``
    whatever its fan-out, and both ranks of a pair compute the same size."""
    streams: dict[int, int] = {}
    for p in pairs:
        if p.path == "nccl":
            streams[p.src] = streams.get(p.src, 0) + 1
            streams[p.dst] = streams.get(p.dst, 0) + 1

    def chunk_of(p: PlanPair) -> int:
        c = chunk_bytes // max(streams.get(p.src, 1), streams.get(p.dst, 1))
        return c - c % SLOT_ALIGN if c >= 512 else max(1, c)
    return chunk_of


@dataclass(frozen=True)
class Chunk:
    """Chunk k of a pair's stream: its bytes and the (address, bytes) segments of local memory they are."""
    bytes: int
    segments: tuple[tuple[int, int], ...]

    @property
    def direct(self) -> bool:
        return len(self.segments) == 1


@dataclass(frozen=True)
class RoundEntry:
    """One send or receive of a round: the pair (its index in the streams), its chunk, where NCCL reads
    or writes (the local memory itself, or the slot at ``slot_offset``; -1: direct)."""
    stream: int
    chunk: Chunk
    address: int
    slot_offset: int


def pair_chunks(pair: PlanPair, memories: Sequence[DeviceMemory], send: bool, chunk_bytes: int) -> list[Chunk]:
    """The chunks of ``pair``'s stream on this side (``send``: from its sources, else into its destinations)."""
    if chunk_bytes < 1:
        raise IpcError("ERR_INVALID_ARG", f"chunk_bytes must be positive, got {chunk_bytes}")
    chunks: list[Chunk] = []
    segments: list[tuple[int, int]] = []
    filled = 0
    for r in pair.runs:
        base = memories[r.src_tensor if send else r.dst_tensor].pointer + (r.src_offset if send else r.dst_offset)
        stride = r.src_stride if send else r.dst_stride
        for i in range(r.count):
            addr, left = base + i * stride, r.bytes
            while left:
                take = min(left, chunk_bytes - filled)
                if segments and segments[-1][0] + segments[-1][1] == addr:
                    segments[-1] = (segments[-1][0], segments[-1][1] + take)  # contiguous with the last: one range
                else:
                    segments.append((addr, take))
                addr, left, filled = addr + take, left - take, filled + take
                if filled == chunk_bytes:
                    chunks.append(Chunk(filled, tuple(segments)))
                    segments, filled = [], 0
    if filled:
        chunks.append(Chunk(filled, tuple(segments)))
    return chunks


def plan_rounds(streams: Sequence[list[Chunk]], slot: int) -> tuple[list[list[RoundEntry]], int]:
    """Round k: chunk k of every stream that has one, in stream order; staged chunks placed in a slot
    at ``slot`` (an address). Returns the rounds and the slot's bytes (the largest round's staging)."""
    rounds: list[list[RoundEntry]] = []
    slot_bytes = 0
    for k in range(max((len(c) for c in streams), default=0)):
        entries: list[RoundEntry] = []
        offset = 0
        for s, chunks in enumerate(streams):
            if k >= len(chunks):
                continue
            c = chunks[k]
            if c.direct:
                entries.append(RoundEntry(s, c, c.segments[0][0], -1))
            else:
                entries.append(RoundEntry(s, c, slot + offset, offset))
                offset += -(-c.bytes // SLOT_ALIGN) * SLOT_ALIGN
        rounds.append(entries)
        slot_bytes = max(slot_bytes, offset)
    return rounds, slot_bytes


def staging_rows(entry: RoundEntry, send: bool) -> tuple[list[int], list[int], list[int]]:
    """(dsts, srcs, sizes) of the copy_runs rows that gather a staged send chunk or scatter a received one."""
    dsts: list[int] = []
    srcs: list[int] = []
    sizes: list[int] = []
    at = entry.address
    for addr, n in entry.chunk.segments:
        dsts.append(at if send else addr)
        srcs.append(addr if send else at)
        sizes.append(n)
        at += n
    return dsts, srcs, sizes


class NcclRunMover:
    """Moves one rank's NCCL runs of each sync on GPU ``ordinal`` (prepared once per epoch)."""

    def __init__(self, ordinal: int, sends: Sequence[PlanPair], recvs: Sequence[PlanPair], sources: Sequence[DeviceMemory],
                 destinations: Sequence[DeviceMemory], chunk_of: Callable[[PlanPair], int], comm_rank: Callable[[int], int]):
        for p in sends:
            check_run_bounds(p, [m.extent for m in sources], [1 << 62] * (1 + max((r.dst_tensor for r in p.runs), default=0)))
        for p in recvs:
            check_run_bounds(p, [1 << 62] * (1 + max((r.src_tensor for r in p.runs), default=0)), [m.extent for m in destinations])
        self.ordinal = ordinal
        self._peers = [comm_rank(p.dst) for p in sends] + [comm_rank(p.src) for p in recvs]
        self._send = [True] * len(sends) + [False] * len(recvs)
        streams = [pair_chunks(p, sources, True, chunk_of(p)) for p in sends] + [pair_chunks(p, destinations, False, chunk_of(p)) for p in recvs]
        _, slot_bytes = plan_rounds(streams, 0)
        self._slot = 0
        self._stream = 0
        with Device.get(ordinal).activate():
            if slot_bytes:
                ptr = drv.CUdeviceptr()
                drv.driver().call("cuMemAlloc", ctypes.byref(ptr), slot_bytes)
                self._slot = ptr.value or 0
            h = ctypes.c_void_p()
            kernels.call("cuStreamCreate", ctypes.byref(h), 1)
            self._stream = h.value or 0
        self.staging = slot_bytes
        self._rounds, _ = plan_rounds(streams, self._slot)
        self._tables: list[tuple[kernels.RunTable, kernels.DeviceTable] | None] = []
        for entries in self._rounds:
            for want_send in (True, False):
                rows: tuple[list[int], list[int], list[int]] = ([], [], [])
                for e in entries:
                    if e.slot_offset >= 0 and self._send[e.stream] == want_send:
                        d, s, n = staging_rows(e, want_send)
                        rows[0].extend(d)
                        rows[1].extend(s)
                        rows[2].extend(n)
                self._tables.append((kernels.plan_runs(*rows), kernels.DeviceTable(ordinal)) if rows[0] else None)

    def move(self, comm: Any, stop: threading.Event, deadline: float | None) -> int:
        """Queues every round, then waits for the stream; returns the staging bytes used. A set ``stop``
        or the deadline aborts the communicator (IpcError ERR_CLOSED / ERR_TIMEOUT)."""
        with Device.get(self.ordinal).activate():
            for k, entries in enumerate(self._rounds):
                gather, scatter = self._tables[2 * k], self._tables[2 * k + 1]
                if gather is not None:
                    gather[1].upload(gather[0], self._stream)
                    gather[1].launch(gather[0], self._stream)
                ops = [{"op": "send" if self._send[e.stream] else "recv", "buffer": e.address, "bytes": e.chunk.bytes,
                        "peer": self._peers[e.stream]} for e in entries]
                comm.group(ops, stream=self._stream, timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
                if scatter is not None:
                    scatter[1].upload(scatter[0], self._stream)
                    scatter[1].launch(scatter[0], self._stream)
            query = drv.driver()._raw("cuStreamQuery")
            pause = 0.0005
            while True:
                r = query(self._stream)
                if r == 0:
                    return self.staging
                if r != drv.CUDA_ERROR_NOT_READY:
                    comm.abort()
                    raise drv.driver().error(r, "cuStreamQuery")
                error = comm.poll_async_error()
                if error in ("ncclSuccess", "ncclInProgress"):
                    error = None  # healthy (None: another thread is in a call, which reports errors itself)
                if error is not None or stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                    comm.abort()
                    if error is not None:
                        raise IpcError("ERR_NCCL", f"NCCL failed while moving the sync's runs: {error}")
                    raise IpcError("ERR_TIMEOUT" if not stop.is_set() else "ERR_CLOSED", "the NCCL rounds did not end: "
                                   + ("past the sync's timeout" if not stop.is_set() else "the group failed meanwhile"))
                time.sleep(pause)
                pause = min(pause * 2, 0.01)

    def close(self) -> None:
        """Frees the slot, the tables and the stream (after what is queued on it)."""
        try:
            with Device.get(self.ordinal).activate():
                if self._stream:
                    drv.driver().call("cuStreamSynchronize", ctypes.c_void_p(self._stream))
                for t in self._tables:
                    if t is not None:
                        t[1].close()
                if self._slot:
                    drv.driver().call("cuMemFree", drv.CUdeviceptr(self._slot))
                if self._stream:
                    drv.driver().call("cuStreamDestroy", ctypes.c_void_p(self._stream))
        finally:
            self._tables, self._slot, self._stream = [], 0, 0
