"""The host data path of a sharded sync (src/tensors/sharded/host-copy.ts): a destination's 'local' and
'ipc' runs copied between memoryviews of host memory (HostArrays, and the memfd host buffers a
source's tensor set maps here). Every run is checked against both memories once, when its copy is
compiled; a compiled batch is kept while the epoch lasts, so a repeated sync is the copies alone.
A strided run whose block is 1, 2, 4 or 8 bytes and whose strides are multiples of it is one
stepped slice assignment; other strided runs copy block by block."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from ...errors import IpcError
from .plan import PlanPair

_FORMATS = {1: "B", 2: "H", 4: "I", 8: "Q"}


@dataclass(frozen=True)
class HostMemory:
    """One local tensor's host memory: its bytes from the first element to the end of the last."""
    bytes: memoryview


@dataclass(frozen=True)
class DeviceMemory:
    """One local tensor's device memory: its first element and the bytes it spans, on ``device``."""
    device: int
    pointer: int
    extent: int


RunMemory = Union[HostMemory, DeviceMemory]


@dataclass(frozen=True)
class CopyPair:
    """A pair this rank is the destination of, with its source rank's source tensors as mapped here."""
    pair: PlanPair
    sources: Sequence[RunMemory]


def check_run_bounds(pair: PlanPair, sources: Sequence[int], destinations: Sequence[int]) -> None:
    """Every run of ``pair`` inside its two memories (their extents in bytes); ERR_OUT_OF_RANGE
    naming the run otherwise (a source whose mapped tensor is smaller than its layout said)."""
    for i, r in enumerate(pair.runs):
        for side, t, off, stride, extents in (("source", r.src_tensor, r.src_offset, r.src_stride, sources),
                                              ("destination", r.dst_tensor, r.dst_offset, r.dst_stride, destinations)):
            if t >= len(extents):
                raise IpcError("ERR_OUT_OF_RANGE", f"run {i} of rank {pair.src} -> {pair.dst} names {side} tensor {t}, "
                               f"and there are {len(extents)}")
            end = off + (r.count - 1) * stride + r.bytes
            if off < 0 or end > extents[t]:
                raise IpcError("ERR_OUT_OF_RANGE", f"run {i} of rank {pair.src} -> {pair.dst} reaches byte {end} of {side} tensor {t}, "
                               f"which has {extents[t]}: the memory given for it is smaller than its layout")


class HostRunCopier:
    """Copies the 'local' and 'ipc' runs of a destination on host memory. ``compile`` checks and
    prepares a batch (its memoryview slices), ``copy`` runs it, ``close`` lets go of the slices."""

    def __init__(self) -> None:
        self._ops: list[tuple[memoryview, memoryview]] = []
        self._blocks: list[tuple[memoryview, memoryview, int, int, int, int, int, int]] = []
        self.bytes = 0

    def compile(self, pairs: Sequence[CopyPair], destinations: Sequence[RunMemory]) -> None:
        self.close()
        dst = [_host(m, "destination") for m in destinations]
        ops: list[tuple[memoryview, memoryview]] = []
        blocks: list[tuple[memoryview, memoryview, int, int, int, int, int, int]] = []
        total = 0
        try:
            for cp in pairs:
                src = [_host(m, f"rank {cp.pair.src}'s source") for m in cp.sources]
                check_run_bounds(cp.pair, [len(s) for s in src], [len(d) for d in dst])
                for r in cp.pair.runs:
                    s, d = src[r.src_tensor], dst[r.dst_tensor]
                    total += r.bytes * r.count
                    if r.count == 1:
                        ops.append((d[r.dst_offset:r.dst_offset + r.bytes], s[r.src_offset:r.src_offset + r.bytes]))
                        continue
                    fmt = _FORMATS.get(r.bytes)
                    if fmt is not None and r.src_stride % r.bytes == 0 and r.dst_stride % r.bytes == 0:
                        ds = d[r.dst_offset:r.dst_offset + (r.count - 1) * r.dst_stride + r.bytes].cast(fmt)
                        ss = s[r.src_offset:r.src_offset + (r.count - 1) * r.src_stride + r.bytes].cast(fmt)
                        ops.append((ds[::r.dst_stride // r.bytes], ss[::r.src_stride // r.bytes]))
                        continue
                    blocks.append((d, s, r.dst_offset, r.src_offset, r.bytes, r.count, r.dst_stride, r.src_stride))
        except BaseException:
            for a, b in ops:
                a.release()
                b.release()
            raise
        self._ops, self._blocks, self.bytes = ops, blocks, total

    def copy(self) -> int:
        """Copies every run of the compiled batch; returns the bytes copied."""
        for d, s in self._ops:
            d[:] = s
        for dm, sm, do, so, n, count, ds, ss in self._blocks:
            for _ in range(count):
                dm[do:do + n] = sm[so:so + n]
                do += ds
                so += ss
        return self.bytes

    def close(self) -> None:
        for a, b in self._ops:
            a.release()
            b.release()
        self._ops, self._blocks, self.bytes = [], [], 0


def _host(m: RunMemory, what: str) -> memoryview:
    if not isinstance(m, HostMemory):
        raise IpcError("ERR_INVALID_ARG", f"the host copier was given device memory for a {what} tensor; a rank's memories are all "
                       "host or all on its GPU")
    return m.bytes.cast("B") if m.bytes.format != "B" or m.bytes.ndim != 1 else m.bytes
