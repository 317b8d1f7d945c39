"""Layouts (src/tensors/sharded/layout.ts): per rank, which boxes of which global tensors it holds
(sources) or needs (destinations), and where in its own local tensors they lie. A local tensor is
one memory (a torch tensor, a DeviceArray): dtype, shape, byte strides; its pieces are boxes of
global tensors placed at an offset of it, and a destination declares the rest as padding. The
plan's offsets are relative to a local tensor's first element; pointers never travel."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from .box import boxes_overlap, find_hole, volume
from .errors import Box, LayoutError, format_range

MAX_NDIM = 32
MAX_NAME_BYTES = 1024
MAX_NODE_BYTES = 255
SAFE = 2**53 - 1
U31 = 0x7FFFFFFF

#: name: (item size, wire code), as src/ipc/dtype.ts and cuda_ipc.ipc.descriptor.DTYPES number them.
DTYPE_CODES = {
    "int8": (1, 1), "int16": (2, 2), "int32": (4, 3), "int64": (8, 4), "uint8": (1, 5), "uint16": (2, 6),
    "uint32": (4, 7), "uint64": (8, 8), "float16": (2, 9), "bfloat16": (2, 10), "float32": (4, 11),
    "float64": (8, 12), "bool": (1, 13), "float8_e4m3fn": (1, 14), "float8_e5m2": (1, 15),
}
DTYPE_BY_CODE = {code: name for name, (_, code) in DTYPE_CODES.items()}
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class GlobalTensor:
    """A global tensor: what every rank that holds or needs a piece of it agrees on."""
    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Piece:
    """A box of a global tensor placed in a local tensor at ``at`` (its own coordinates)."""
    tensor: str
    start: tuple[int, ...]
    length: tuple[int, ...]
    at: tuple[int, ...]


@dataclass(frozen=True)
class LocalTensor:
    """One local tensor of a rank: its pieces and, for a destination, its padding."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # bytes
    pieces: tuple[Piece, ...]
    padding: tuple[Box, ...] = ()


@dataclass(frozen=True)
class RankLayout:
    """A rank's layout: who and where it is, what it holds (sources) and needs (destinations)."""
    rank: int
    node: str
    gpu: int
    tensors: tuple[GlobalTensor, ...]  # sorted by name (UTF-8 bytes)
    sources: tuple[LocalTensor, ...]
    destinations: tuple[LocalTensor, ...]


def itemsize(dtype: str) -> int:
    return DTYPE_CODES[dtype][0]


def contiguous_strides(shape: Sequence[int], size: int) -> tuple[int, ...]:
    """C-contiguous byte strides of ``shape`` with items of ``size`` bytes."""
    strides = [0] * len(shape)
    s = size
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = s
        s *= shape[i]
    return tuple(strides)


def name_key(name: str) -> bytes:
    """Names sort by their UTF-8 bytes (the wire's order, and Node's)."""
    return name.encode("utf-8")


def _invalid(message: str, tensor: str | None = None, rank: int | None = None) -> LayoutError:
    return LayoutError("ERR_LAYOUT_INVALID", message, tensor=tensor, rank=rank)


def _check_name(name: object, what: str, rank: int, limit: int = MAX_NAME_BYTES) -> None:
    if not isinstance(name, str) or not name or _SURROGATE.search(name) or "\ufffd" in name or len(name.encode("utf-8")) > limit:
        raise _invalid(f"rank {rank}: {what} must be a string of 1..{limit} UTF-8 bytes (got {name!r})", rank=rank)


def _check_dims(dims: Sequence[int], what: str, rank: int, tensor: str, low: int) -> None:
    if not isinstance(dims, tuple) or len(dims) > MAX_NDIM:
        raise _invalid(f"rank {rank}: {what} of {tensor} must be a tuple of at most {MAX_NDIM} integers", tensor, rank)
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool) or d < low or d > SAFE:
            raise _invalid(f"rank {rank}: {what} of {tensor} has {d!r}; each must be an integer >= {low}", tensor, rank)



def validate_layout(layout: RankLayout) -> None:
    """Checks one rank's layout on its own (names, bounds, dtypes, pieces not overlapping, a
    destination covered by its pieces and padding exactly once). Raises LayoutError."""
    rank = layout.rank
    if not isinstance(rank, int) or not 0 <= rank <= U31:
        raise _invalid(f"a layout's rank must be an integer 0..2^31-1 (got {rank!r})")
    if not isinstance(layout.gpu, int) or not 0 <= layout.gpu <= U31:
        raise _invalid(f"rank {rank}: gpu must be an integer 0..2^31-1 (got {layout.gpu!r})", rank=rank)
    _check_name(layout.node, "the node id", rank, MAX_NODE_BYTES)
    globals_: dict[str, GlobalTensor] = {}
    previous: str | None = None
    for t in layout.tensors:
        _check_name(t.name, "a tensor name", rank)
        if previous is not None and name_key(previous) >= name_key(t.name):
            raise _invalid(f"rank {rank}: global tensors must be unique and sorted by name ({t.name!r} after {previous!r})", t.name, rank)
        previous = t.name
        if t.dtype not in DTYPE_CODES:
            raise _invalid(f"rank {rank}: tensor {t.name} has unknown dtype {t.dtype!r}", t.name, rank)
        _check_dims(t.shape, "the shape", rank, t.name, 1)
        if volume(t.shape) * itemsize(t.dtype) > SAFE:
            raise _invalid(f"rank {rank}: tensor {t.name} has more than 2^53-1 bytes", t.name, rank)
        globals_[t.name] = t
    used: set[str] = set()
    for role, group in (("source", layout.sources), ("destination", layout.destinations)):
        names: set[str] = set()
        for local in group:
            _check_name(local.name, f"a {role} tensor name", rank)
            if local.name in names:
                raise _invalid(f"rank {rank}: two {role} tensors are named {local.name}", local.name, rank)
            names.add(local.name)
            _validate_local(rank, role, local, globals_, used)
    for name in globals_:
        if name not in used:
            raise _invalid(f"rank {rank}: global tensor {name} is named by no piece; leave it out", name, rank)


def _validate_local(rank: int, role: str, local: LocalTensor, globals_: dict[str, GlobalTensor], used: set[str]) -> None:
    where = f"rank {rank}: {role} {local.name}"
    if local.dtype not in DTYPE_CODES:
        raise _invalid(f"{where} has unknown dtype {local.dtype!r}", local.name, rank)
    size = itemsize(local.dtype)
    _check_dims(local.shape, "the shape", rank, local.name, 1)
    _check_dims(local.strides, "the strides", rank, local.name, 0)
    ndim = len(local.shape)
    if len(local.strides) != ndim:
        raise _invalid(f"{where} has {len(local.strides)} strides for {ndim} dimensions", local.name, rank)
    _check_strides(where, local, size, rank)
    if not local.pieces and (role == "source" or not local.padding):
        raise _invalid(f"{where} has no pieces; leave it out", local.name, rank)
    boxes: list[tuple[Box, str]] = []
    for p in local.pieces:
        g = globals_.get(p.tensor)
        if g is None:
            raise _invalid(f"{where}: a piece names tensor {p.tensor!r}, which the layout's tensors do not list", local.name, rank)
        used.add(p.tensor)
        if g.dtype != local.dtype:
            raise LayoutError("ERR_LAYOUT_DTYPE", f"{where} is {local.dtype} but its piece of {g.name} is {g.dtype}; the dtypes must be equal (no conversion)", tensor=g.name, rank=rank)
        if not (len(p.start) == len(p.length) == len(g.shape) == len(p.at) == ndim):
            raise LayoutError("ERR_LAYOUT_SHAPE", f"{where}: its piece of {g.name} ({len(g.shape)} dimensions) must give start, length and at for each of the {ndim} dimensions of both", tensor=g.name, rank=rank)
        _check_dims(p.start, "a piece start", rank, g.name, 0)
        _check_dims(p.length, "a piece length", rank, g.name, 1)
        _check_dims(p.at, "a piece offset (at)", rank, local.name, 0)
        box = Box(p.start, p.length)
        for i in range(ndim):
            if p.start[i] + p.length[i] > g.shape[i]:
                raise LayoutError("ERR_LAYOUT_BOUNDS", f"{where}: its piece {format_range(box)} of {g.name} is outside the tensor's shape {list(g.shape)}", tensor=g.name, rank=rank, range=box)
        placed = Box(p.at, p.length)
        _check_inside(where, local, placed, f"its piece of {g.name}", rank)
        boxes.append((placed, f"the piece {format_range(box)} of {g.name}"))
    for pad in local.padding:
        _check_dims(pad.start, "a padding start", rank, local.name, 0)
        _check_dims(pad.length, "a padding length", rank, local.name, 1)
        if len(pad.start) != ndim or len(pad.length) != ndim:
            raise LayoutError("ERR_LAYOUT_SHAPE", f"{where}: a padding box must have {ndim} dimensions", tensor=local.name, rank=rank)
        _check_inside(where, local, pad, "its padding", rank)
        boxes.append((pad, "padding"))
    if role == "source" and local.padding:
        raise _invalid(f"{where} declares padding; only destinations do (a source's other bytes are simply not sent)", local.name, rank)
    clash = boxes_overlap([b for b, _ in boxes])
    if clash is not None:
        a, b, r = clash
        raise LayoutError("ERR_LAYOUT_OVERLAP", f"{where}: {boxes[a][1]} and {boxes[b][1]} both cover {format_range(r)} of it; each byte of a local tensor belongs to one piece", tensor=local.name, rank=rank, range=r)
    if role == "destination":
        hole = find_hole(local.shape, [b for b, _ in boxes])
        if hole is not None:
            raise LayoutError("ERR_LAYOUT_UNCOVERED", f"{where}: {format_range(hole)} of it is neither a piece nor declared padding; declare what stays untouched as padding", tensor=local.name, rank=rank, range=hole)


def _check_inside(where: str, local: LocalTensor, box: Box, what: str, rank: int) -> None:
    for i in range(len(local.shape)):
        if box.start[i] + box.length[i] > local.shape[i]:
            raise LayoutError("ERR_LAYOUT_BOUNDS", f"{where}: {what} at {format_range(box)} is outside its shape {list(local.shape)}", tensor=local.name, rank=rank, range=box)


def _check_strides(where: str, local: LocalTensor, size: int, rank: int) -> None:
    dims = sorted(((s, n) for n, s in zip(local.shape, local.strides) if n > 1), key=lambda x: x[0])
    extent = size
    for s, n in dims:
        if s % size or s < extent:
            raise _invalid(f"{where} has strides {list(local.strides)} that put two elements on one byte or are not multiples of {size}", local.name, rank)
        extent = s * (n - 1) + extent
    if extent > SAFE:
        raise _invalid(f"{where} spans more than 2^53-1 bytes", local.name, rank)
