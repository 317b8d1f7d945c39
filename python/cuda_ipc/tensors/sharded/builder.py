"""Building a rank's layout without writing boxes (src/tensors/sharded/builder.ts): a box or a
whole tensor, DTensor placements (or a DTensor itself, read duck-typed: no torch import), a
tensor's own dtype, shape and strides, and destination parameters made of pieces of several global
tensors (fused qkv, gate_up) split for tensor parallelism and padded."""
from __future__ import annotations

from typing import Any, Sequence

from .box import volume
from .errors import Box, LayoutError
from .layout import (
    DTYPE_CODES, GlobalTensor, LocalTensor, Piece, RankLayout, contiguous_strides, itemsize, name_key, validate_layout,
)
from .placements import Placement, dtensor_pieces, placement_box, placement_pieces, shard_range

_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32", "short": "int16"}


def dtype_of(dtype: Any) -> str:
    """A dtype name from a name ('bfloat16') or a torch dtype (torch.bfloat16)."""
    s = dtype if isinstance(dtype, str) else str(dtype)
    if s.startswith("torch."):
        s = s[6:]
    s = _ALIASES.get(s, s)
    if s not in DTYPE_CODES:
        raise LayoutError("ERR_LAYOUT_DTYPE", f"dtype {dtype!r} has no cuda-ipc name; use one of {', '.join(DTYPE_CODES)}")
    return s


def _ints(v: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(x) for x in v)


def tensor_parallel_parameter(*, dtype: Any, parts: Sequence[tuple[str, Sequence[int]]], dim: int, size: int, rank: int,
                              pad_multiple: int | None = None) -> dict[str, Any]:
    """The parameter a tensor-parallel rank holds (``need_parameter``'s keyword arguments): each
    part (tensor name, global shape) padded along ``dim`` to ``pad_multiple``, cut by torch.chunk's
    rule, the chunks concatenated along ``dim``; rows past a part's real extent are padding."""
    if not parts or not 0 <= dim < len(parts[0][1]) or size < 1 or not 0 <= rank < size:
        raise LayoutError("ERR_LAYOUT_INVALID", f"tensor_parallel_parameter: give at least one part, dim within its dimensions and 0 <= rank < size (dim {dim}, rank {rank}, size {size})")
    first = _ints(parts[0][1])
    pieces: list[dict[str, Any]] = []
    padding: list[Box] = []
    offset = 0
    for tensor, shape in parts:
        shape = _ints(shape)
        if len(shape) != len(first) or any(n != first[i] for i, n in enumerate(shape) if i != dim):
            raise LayoutError("ERR_LAYOUT_SHAPE", f"tensor_parallel_parameter: {tensor} {list(shape)} cannot be concatenated with {list(first)} along dimension {dim}", tensor=tensor)
        n = shape[dim]
        padded = -(-n // pad_multiple) * pad_multiple if pad_multiple else n
        c0, cl = shard_range(padded, size, rank)
        real = max(0, min(c0 + cl, n) - c0)
        zeros = [0] * len(shape)
        if real > 0:
            start = list(zeros); start[dim] = c0
            length = list(shape); length[dim] = real
            at = list(zeros); at[dim] = offset
            pieces.append({"tensor": tensor, "shape": shape, "start": tuple(start), "length": tuple(length), "at": tuple(at)})
        if cl > real:
            start = list(zeros); start[dim] = offset + real
            length = list(shape); length[dim] = cl - real
            padding.append(Box(tuple(start), tuple(length)))
        offset += cl
    shape_out = list(first); shape_out[dim] = offset
    return {"dtype": dtype_of(dtype), "shape": tuple(shape_out), "pieces": pieces, "padding": padding}


class LayoutBuilder:
    """Builds one rank's layout; ``build()`` checks it (validate_layout) and returns it."""

    def __init__(self, *, rank: int, node: str, gpu: int):
        self._rank = (rank, node, gpu)
        self._globals: dict[str, GlobalTensor] = {}
        self._sources: list[LocalTensor] = []
        self._destinations: list[LocalTensor] = []

    def hold(self, name: str, *, dtype: Any, shape: Sequence[int], start: Sequence[int] | None = None,
             length: Sequence[int] | None = None, mesh: Sequence[int] | None = None, placements: Sequence[Placement] | None = None,
             coordinate: Sequence[int] | None = None, strides: Sequence[int] | None = None, tensor: str | None = None) -> "LayoutBuilder":
        """This rank sends from local tensor ``name``: a box of a global tensor (the whole one by
        default), or the box its placements give (``mesh``, ``placements``, ``coordinate``)."""
        return self._plain(self._sources, name, dtype, shape, start, length, mesh, placements, coordinate, strides, tensor)

    def need(self, name: str, *, dtype: Any, shape: Sequence[int], start: Sequence[int] | None = None,
             length: Sequence[int] | None = None, mesh: Sequence[int] | None = None, placements: Sequence[Placement] | None = None,
             coordinate: Sequence[int] | None = None, strides: Sequence[int] | None = None, tensor: str | None = None) -> "LayoutBuilder":
        """This rank receives into local tensor ``name``."""
        return self._plain(self._destinations, name, dtype, shape, start, length, mesh, placements, coordinate, strides, tensor)

    def hold_dtensor(self, name: str, dt: Any, *, tensor: str | None = None) -> "LayoutBuilder":
        """``hold`` for a DTensor (FSDP2's state_dict() values): its placements, mesh and local tensor."""
        return self._dtensor(self._sources, name, dt, tensor)

    def need_dtensor(self, name: str, dt: Any, *, tensor: str | None = None) -> "LayoutBuilder":
        return self._dtensor(self._destinations, name, dt, tensor)

    def hold_tensor(self, name: str, t: Any, *, shape: Sequence[int], start: Sequence[int] | None = None, tensor: str | None = None) -> "LayoutBuilder":
        """``hold`` for a plain tensor (torch: dtype, shape, stride()) that is the box at ``start`` of a global tensor of ``shape``."""
        dtype, local, strides = _tensor_facts(t)
        return self.hold(name, dtype=dtype, shape=shape, start=start, length=local, strides=strides, tensor=tensor)

    def need_tensor(self, name: str, t: Any, *, shape: Sequence[int], start: Sequence[int] | None = None, tensor: str | None = None) -> "LayoutBuilder":
        dtype, local, strides = _tensor_facts(t)
        return self.need(name, dtype=dtype, shape=shape, start=start, length=local, strides=strides, tensor=tensor)

    def hold_parameter(self, name: str, *, dtype: Any, shape: Sequence[int], pieces: Sequence[dict[str, Any]], padding: Sequence[Box] = (),
                       strides: Sequence[int] | None = None) -> "LayoutBuilder":
        """A source local tensor made of pieces (dicts: tensor, shape (global), start, length, at)."""
        return self._parameter(self._sources, name, dtype, shape, pieces, padding, strides)

    def need_parameter(self, name: str, *, dtype: Any, shape: Sequence[int], pieces: Sequence[dict[str, Any]], padding: Sequence[Box] = (),
                       strides: Sequence[int] | None = None) -> "LayoutBuilder":
        """A destination parameter made of pieces (fused qkv, gate_up), the rest declared padding."""
        return self._parameter(self._destinations, name, dtype, shape, pieces, padding, strides)

    def build(self) -> RankLayout:
        rank, node, gpu = self._rank
        tensors = tuple(sorted(self._globals.values(), key=lambda t: name_key(t.name)))
        layout = RankLayout(rank, node, gpu, tensors, tuple(self._sources), tuple(self._destinations))
        validate_layout(layout)
        return layout

    def _plain(self, group: list[LocalTensor], name: str, dtype: Any, shape: Sequence[int], start: Sequence[int] | None, length: Sequence[int] | None,
               mesh: Sequence[int] | None, placements: Sequence[Placement] | None, coordinate: Sequence[int] | None,
               strides: Sequence[int] | None, tensor: str | None) -> "LayoutBuilder":
        shape = _ints(shape)
        if placements is not None and any(isinstance(p, tuple) and len(p) == 3 for p in placements):
            # Strided shards: the local tensor is several boxes of the global one, each at its offset.
            local, placed = placement_pieces(shape, _ints(mesh or ()), placements, _ints(coordinate or ()), name)
            if not placed:
                return self
            pieces = [{"tensor": tensor or name, "shape": shape, "start": s, "length": ln, "at": at} for s, ln, at in placed]
            return self._parameter(group, name, dtype, local, pieces, (), strides)
        if placements is not None:
            box = placement_box(shape, _ints(mesh or ()), placements, _ints(coordinate or ()), name)
        else:
            box = Box(_ints(start) if start is not None else (0,) * len(shape), _ints(length) if length is not None else shape)
        if volume(box.length) == 0:
            return self  # an empty shard: nothing to send or receive
        piece = {"tensor": tensor or name, "shape": shape, "start": box.start, "length": box.length}
        return self._parameter(group, name, dtype, box.length, [piece], (), strides)

    def _dtensor(self, group: list[LocalTensor], name: str, dt: Any, tensor: str | None) -> "LayoutBuilder":
        placed = dtensor_pieces(dt, name)
        if placed is None or not placed[1]:
            return self
        shape_local, pieces = placed
        dtype, local, strides = _tensor_facts(dt.to_local())
        if local != shape_local:
            box = Box(pieces[0][0], pieces[0][1]) if len(pieces) == 1 else None
            raise LayoutError("ERR_LAYOUT_SHAPE", f"{name}: the DTensor's local tensor is {list(local)} but its placements give "
                              f"{list(shape_local)} (torch's rule differs from cuda-ipc's here); give the box explicitly", tensor=name, range=box)
        shape = _ints(dt.shape)
        out = [{"tensor": tensor or name, "shape": shape, "start": s, "length": ln, "at": at} for s, ln, at in pieces]
        return self._parameter(group, name, dtype, shape_local, out, (), strides)

    def _parameter(self, group: list[LocalTensor], name: str, dtype: Any, shape: Sequence[int], pieces: Sequence[dict[str, Any]], padding: Sequence[Box],
                   strides: Sequence[int] | None) -> "LayoutBuilder":
        dtype = dtype_of(dtype)
        shape = _ints(shape)
        if volume(shape) == 0:
            return self
        out = []
        for p in pieces:
            gshape = _ints(p["shape"])
            known = self._globals.get(p["tensor"])
            if known is not None and (known.dtype != dtype or known.shape != gshape):
                code = "ERR_LAYOUT_DTYPE" if known.dtype != dtype else "ERR_LAYOUT_SHAPE"
                raise LayoutError(code, f"rank {self._rank[0]}: {p['tensor']} is {dtype} {list(gshape)} in {name} but {known.dtype} {list(known.shape)} elsewhere in this layout", tensor=p["tensor"], rank=self._rank[0])
            if known is None:
                self._globals[p["tensor"]] = GlobalTensor(p["tensor"], dtype, gshape)
            start = _ints(p["start"])
            at = _ints(p["at"]) if p.get("at") is not None else (0,) * len(start)
            out.append(Piece(p["tensor"], start, _ints(p["length"]), at))
        st = _ints(strides) if strides is not None else contiguous_strides(shape, itemsize(dtype))
        group.append(LocalTensor(name, dtype, shape, st, tuple(out), tuple(Box(_ints(b[0]), _ints(b[1])) for b in padding)))
        return self


def _tensor_facts(t: Any) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """dtype, shape and byte strides of a torch tensor (stride() in elements) or an array-like with byte ``strides``."""
    dtype = dtype_of(t.dtype)
    shape = _ints(t.shape)
    stride = getattr(t, "stride", None)
    if callable(stride):
        strides = tuple(int(s) * itemsize(dtype) for s in stride())
    elif getattr(t, "strides", None) is not None:
        strides = _ints(t.strides)
    else:
        strides = contiguous_strides(shape, itemsize(dtype))
    return dtype, shape, strides
