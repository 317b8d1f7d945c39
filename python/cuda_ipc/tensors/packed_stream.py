"""The packed stream of an ``nccl-tensor-set`` (docs/PROTOCOL.md 8.3), as src/tensors/packed-stream.ts.

A state dict's bytes laid out as the sender keeps them, cut into chunks of equal size, one NCCL
operation each. Pure: offsets, the receiver's checks, and each side's route for each chunk (straight
from or into memory where the chunk is one range there, else through a staging buffer with a list of
copies to gather or scatter). No CUDA here.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from ..errors import IpcError

#: Alignment a run keeps from its sender's address: its remainder modulo this.
PACK_ALIGN = 256
#: Smallest chunk the protocol allows.
MIN_CHUNK_BYTES = 1 << 20
#: Chunk size a sender uses unless told otherwise (as Node's).
DEFAULT_CHUNK_BYTES = 512 << 20


class SourceTensor(NamedTuple):
    """One tensor of a set to send: its bytes, its device address, the allocation it lives in."""

    nbytes: int
    address: int
    allocation: object


def pack_offsets(tensors: Sequence[SourceTensor]) -> tuple[list[int], int]:
    """Packed offsets in send order and the stream's length (PROTOCOL.md 8.3): a tensor directly
    after its predecessor in the same allocation follows it without a gap; any other starts at the
    first offset at or after the predecessor's end with its address's remainder modulo 256."""
    offsets: list[int] = []
    end = 0
    prev: SourceTensor | None = None
    for t in tensors:
        if prev is not None and prev.allocation is t.allocation and prev.address + prev.nbytes == t.address:
            at = end
        else:
            at = end + ((t.address % PACK_ALIGN) - (end % PACK_ALIGN)) % PACK_ALIGN
        offsets.append(at)
        end = at + t.nbytes
        prev = t
    return offsets, end


def _malformed(why: str) -> IpcError:
    return IpcError("ERR_FRAME_INVALID", f"a received nccl-tensor-set is malformed: {why}")


def check_packed_layout(offsets: Sequence[int], nbytes: Sequence[int], itemsizes: Sequence[int], length: int) -> None:
    """The receiver's checks: offsets non-decreasing, no overlap, aligned to the item size, and
    ``length`` the end of the last tensor."""
    end = 0
    for i, at in enumerate(offsets):
        if at < end:
            raise _malformed(f"tensor #{i} starts at byte {at} of the stream, inside the tensor before it (which ends at {end})")
        if at % itemsizes[i]:
            raise _malformed(f"tensor #{i} starts at byte {at}, not a multiple of its {itemsizes[i]}-byte elements")
        end = at + nbytes[i]
    if end != length:
        raise _malformed(f"its packed length is {length} bytes, but its last tensor ends at byte {end}")


def check_chunk_bytes(chunk_bytes: int, what: str) -> None:
    if chunk_bytes < MIN_CHUNK_BYTES or chunk_bytes % PACK_ALIGN:
        raise IpcError("ERR_FRAME_INVALID", f"{what}: a chunk of {chunk_bytes} bytes is not a multiple of {PACK_ALIGN} of at least {MIN_CHUNK_BYTES}")


def chunk_count(length: int, chunk_bytes: int) -> int:
    return math.ceil(length / chunk_bytes)


class PlacedTensor(NamedTuple):
    """Where this side's memory holds a tensor of the stream; address None: nowhere (dropped)."""

    offset: int
    nbytes: int
    address: int | None


class ChunkRoute(NamedTuple):
    """How one chunk moves here: ``direct`` from/into ``address``, else through staging with
    ``copies`` = (offset in the chunk, address here, bytes) to gather or scatter."""

    direct: bool
    bytes: int
    address: int
    copies: tuple[tuple[int, int, int], ...]


def route_chunks(tensors: Sequence[PlacedTensor], length: int, chunk_bytes: int) -> list[ChunkRoute]:
    """Each chunk's route for one side: direct when it lies inside one run (tensors back to back in
    the stream and in memory, each with an address), otherwise piece by piece through staging."""
    run_of: list[int] = []
    runs = -1
    prev: PlacedTensor | None = None
    for t in tensors:
        joins = (prev is not None and t.address is not None and prev.address is not None
                 and prev.offset + prev.nbytes == t.offset and prev.address + prev.nbytes == t.address)
        if not joins:
            runs += 1
        run_of.append(runs)
        prev = t
    routes: list[ChunkRoute] = []
    first = 0
    n = len(tensors)
    for k in range(chunk_count(length, chunk_bytes)):
        lo = k * chunk_bytes
        hi = min(lo + chunk_bytes, length)
        while first < n and tensors[first].offset + tensors[first].nbytes <= lo:
            first += 1
        if first < n:
            t0 = tensors[first]
            if t0.address is not None and t0.offset <= lo:
                last = first
                while last + 1 < n and run_of[last + 1] == run_of[first] and tensors[last].offset + tensors[last].nbytes < hi:
                    last += 1
                tl = tensors[last]
                if tl.offset + tl.nbytes >= hi:
                    routes.append(ChunkRoute(True, hi - lo, t0.address + (lo - t0.offset), ()))
                    continue
        copies: list[tuple[int, int, int]] = []
        i = first
        while i < n and tensors[i].offset < hi:
            t = tensors[i]
            i += 1
            if t.address is None or t.nbytes == 0:
                continue
            a = max(lo, t.offset)
            b = min(hi, t.offset + t.nbytes)
            if b > a:
                copies.append((a - lo, t.address + (a - t.offset), b - a))
        routes.append(ChunkRoute(False, hi - lo, 0, tuple(copies)))
    return routes
