"""Boxes from placements, the way torch's DTensor computes a rank's shard (what FSDP2's state_dict()
gives): for each mesh dimension in order, Shard(d) cuts the current extent of tensor dimension d
into mesh-size chunks of ceil(n / size) elements, the last shards smaller or empty; Replicate
leaves the box as it is. Mirrors torch.distributed.tensor._utils.compute_local_shape_and_global_offset
and src/tensors/sharded/placements.ts. A strided shard (``("shard", d, n)``, torch's
``_StridedShard(d, split_factor=n)``: what FSDP2 over tensor parallelism gives) cuts the current extent
of dimension d into n chunks, each of those into mesh-size chunks, and keeps this rank's chunk of
each, concatenated (torch's ``_StridedShard._split_tensor``): a local tensor that is generally
several boxes of the global one (``placement_pieces``). ``dtensor_pieces`` reads a DTensor (or
anything shaped like one: ``placements``, ``device_mesh``, ``shape``) without importing torch."""
from __future__ import annotations

import itertools
from typing import Any, Sequence, Union

from .errors import Box, LayoutError

#: ``("shard", d)``, ``("shard", d, split_factor)`` (a strided shard) or ``"replicate"``.
Placement = Union[tuple[str, int], tuple[str, int, int], str]


def shard_range(size: int, chunks: int, index: int) -> tuple[int, int]:
    """Shard ``index`` of ``size`` elements cut in ``chunks``: (start, length), torch.chunk's rule."""
    chunk = -(-size // chunks)
    start = chunk * index
    if start >= size:
        return (size, 0)
    return (start, min(size, start + chunk) - start)


def _check(shape: Sequence[int], mesh: Sequence[int], placements: Sequence[Placement], coordinate: Sequence[int],
           name: str) -> tuple[list[tuple[int, int | None] | None], bool]:
    """Each placement as (d, split_factor or None), or None for Replicate; and whether any is strided."""
    def bad(why: str) -> LayoutError:
        return LayoutError("ERR_LAYOUT_INVALID", f"{name}: {why}", tensor=name)
    if not (len(mesh) == len(placements) == len(coordinate)):
        raise bad(f"the mesh has {len(mesh)} dimensions, {len(placements)} placements and a coordinate of "
                  f"{len(coordinate)}; give one of each per mesh dimension")
    out: list[tuple[int, int | None] | None] = []
    for i, (size, at, p) in enumerate(zip(mesh, coordinate, placements)):
        if not isinstance(size, int) or size < 1 or not isinstance(at, int) or not 0 <= at < size:
            raise bad(f"mesh dimension {i} has size {size} and coordinate {at}; a coordinate is 0..size-1")
        if p == "replicate":
            out.append(None)
            continue
        t: tuple[Any, ...] = p if isinstance(p, tuple) else ()
        ok = len(t) in (2, 3) and t[0] == "shard"
        d = t[1] if ok else None
        f = t[2] if ok and len(t) == 3 else None
        if not isinstance(d, int) or not 0 <= d < len(shape) or (f is not None and (not isinstance(f, int) or f < 1)) \
                or (ok and len(t) == 3 and f is None):
            raise bad(f"placement {i} is {p!r}; use 'replicate', ('shard', d) or ('shard', d, n) with d in 0..{len(shape) - 1} and n >= 1")
        out.append((d, f))
    return out, any(p is not None and p[1] is not None for p in out)


def _take(segments: list[list[int]], start: int, length: int, out: list[list[int]]) -> None:
    """The part [start, start + length) of the extent that ``segments`` (global [start, length] runs, concatenated) make."""
    at = 0
    for s, n in segments:
        lo, hi = max(start, at), min(start + length, at + n)
        if hi > lo:
            if out and out[-1][0] + out[-1][1] == s + lo - at:
                out[-1][1] += hi - lo
            else:
                out.append([s + lo - at, hi - lo])
        at += n


def placement_pieces(shape: Sequence[int], mesh: Sequence[int], placements: Sequence[Placement], coordinate: Sequence[int],
                     name: str = "(tensor)") -> tuple[tuple[int, ...], list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]]:
    """The local tensor a rank holds: its shape and its pieces, (start, length, at) each: a box of the
    global tensor at offset ``at`` of the local one (none when it is empty)."""
    checked, _ = _check(shape, mesh, placements, coordinate, name)
    runs: list[list[list[int]]] = [[[0, n]] for n in shape]
    for size, at, p in zip(mesh, coordinate, checked):
        if p is None:
            continue
        d, f = p
        n = sum(x[1] for x in runs[d])
        out: list[list[int]] = []
        if f is None:
            off, ln = shard_range(n, size, at)
            _take(runs[d], off, ln, out)
        else:
            for j in range(f):
                a, la = shard_range(n, f, j)
                b, lb = shard_range(la, size, at)
                _take(runs[d], a + b, lb, out)
        runs[d] = out
    local = tuple(sum(x[1] for x in r) for r in runs)
    if any(n == 0 for n in local):
        return local, []
    offsets = []
    for r in runs:
        acc, offs = 0, []
        for _, n in r:
            offs.append(acc)
            acc += n
        offsets.append(offs)
    pieces = []
    for k in itertools.product(*(range(len(r)) for r in runs)):
        pieces.append((tuple(runs[d][x][0] for d, x in enumerate(k)), tuple(runs[d][x][1] for d, x in enumerate(k)),
                       tuple(offsets[d][x] for d, x in enumerate(k))))
    return local, pieces


def placement_box(shape: Sequence[int], mesh: Sequence[int], placements: Sequence[Placement],
                  coordinate: Sequence[int], name: str = "(tensor)") -> Box:
    """The box of the global tensor a rank holds (lengths may be 0: an empty last shard); strided
    shards that make it several boxes are refused (``placement_pieces`` gives those)."""
    checked, strided = _check(shape, mesh, placements, coordinate, name)
    if strided:
        local, pieces = placement_pieces(shape, mesh, placements, coordinate, name)
        if len(pieces) > 1:
            raise LayoutError("ERR_LAYOUT_INVALID", f"{name}: its strided shards make this rank's part {len(pieces)} boxes of the "
                              "tensor; use placement_pieces", tensor=name)
        if pieces:
            return Box(pieces[0][0], pieces[0][1])
        return Box(tuple(n if local[d] == 0 else 0 for d, n in enumerate(shape)), local)
    start = [0] * len(shape)
    length = list(shape)
    for size, at, p in zip(mesh, coordinate, checked):
        if p is None:
            continue
        d = p[0]
        off, n = shard_range(length[d], size, at)
        # torch: an empty shard's offset is the end of the dimension; otherwise shards nest.
        start[d] = shape[d] if n == 0 else start[d] + off
        length[d] = n
    return Box(tuple(start), tuple(length))


def placement_of(p: Any) -> Placement:
    """A DTensor placement object (Shard(d), _StridedShard(d, split_factor=n), Replicate()) as
    ("shard", d), ("shard", d, n) or "replicate"."""
    kind = type(p).__name__
    if getattr(p, "split_factor", None) is not None or kind == "_StridedShard":
        return ("shard", int(p.dim), int(p.split_factor))
    is_shard = getattr(p, "is_shard", None)
    if (callable(is_shard) and is_shard()) or kind == "Shard":
        return ("shard", int(p.dim))
    is_replicate = getattr(p, "is_replicate", None)
    if (callable(is_replicate) and is_replicate()) or kind == "Replicate":
        return "replicate"
    raise LayoutError("ERR_LAYOUT_INVALID", f"placement {p!r} is neither Shard nor Replicate (a Partial tensor holds no "
                      "final values); redistribute it first")


def _dtensor_spec(dt: Any) -> tuple[tuple[int, ...], tuple[int, ...], list[Placement], list[int]] | None:
    mesh = dt.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    return (tuple(int(n) for n in dt.shape), tuple(int(n) for n in mesh.shape), [placement_of(p) for p in dt.placements],
            [int(c) for c in coordinate])


def dtensor_box(dt: Any, name: str = "(tensor)") -> Box | None:
    """The box this rank holds of DTensor ``dt`` (None when this rank is not on its mesh)."""
    spec = _dtensor_spec(dt)
    return None if spec is None else placement_box(*spec, name)


def dtensor_pieces(dt: Any, name: str = "(tensor)") -> tuple[tuple[int, ...], list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]] | None:
    """The local shape and pieces this rank holds of DTensor ``dt`` (None when this rank is not on its mesh)."""
    spec = _dtensor_spec(dt)
    return None if spec is None else placement_pieces(*spec, name)
