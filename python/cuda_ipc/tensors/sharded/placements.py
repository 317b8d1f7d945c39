"""Boxes from placements, the way torch's DTensor computes a rank's shard (what FSDP2's state_dict()
gives): for each mesh dimension in order, Shard(d) cuts the current extent of tensor dimension d
into mesh-size chunks of ceil(n / size) elements, the last shards smaller or empty; Replicate
leaves the box as it is. Mirrors torch.distributed.tensor._utils.compute_local_shape_and_global_offset
and src/tensors/sharded/placements.ts. ``dtensor_box`` reads a DTensor (or anything shaped like one:
``placements``, ``device_mesh``, ``shape``) without importing torch."""
from __future__ import annotations

from typing import Any, Sequence, Union

from .errors import Box, LayoutError

#: ``("shard", d)`` or ``"replicate"``.
Placement = Union[tuple[str, int], str]


def shard_range(size: int, chunks: int, index: int) -> tuple[int, int]:
    """Shard ``index`` of ``size`` elements cut in ``chunks``: (start, length), torch.chunk's rule."""
    chunk = -(-size // chunks)
    start = chunk * index
    if start >= size:
        return (size, 0)
    return (start, min(size, start + chunk) - start)


def placement_box(shape: Sequence[int], mesh: Sequence[int], placements: Sequence[Placement],
                  coordinate: Sequence[int], name: str = "(tensor)") -> Box:
    """The box of the global tensor a rank holds (lengths may be 0: an empty last shard)."""
    def bad(why: str) -> LayoutError:
        return LayoutError("ERR_LAYOUT_INVALID", f"{name}: {why}", tensor=name)
    if not (len(mesh) == len(placements) == len(coordinate)):
        raise bad(f"the mesh has {len(mesh)} dimensions, {len(placements)} placements and a coordinate of "
                  f"{len(coordinate)}; give one of each per mesh dimension")
    start = [0] * len(shape)
    length = list(shape)
    for i, (size, at, p) in enumerate(zip(mesh, coordinate, placements)):
        if not isinstance(size, int) or size < 1 or not isinstance(at, int) or not 0 <= at < size:
            raise bad(f"mesh dimension {i} has size {size} and coordinate {at}; a coordinate is 0..size-1")
        if p == "replicate":
            continue
        d = p[1] if isinstance(p, tuple) and len(p) == 2 and p[0] == "shard" else None
        if not isinstance(d, int) or not 0 <= d < len(shape):
            raise bad(f"placement {i} is {p!r}; use 'replicate' or ('shard', d) with d in 0..{len(shape) - 1}")
        off, n = shard_range(length[d], size, at)
        # torch: an empty shard's offset is the end of the dimension; otherwise shards nest.
        start[d] = shape[d] if n == 0 else start[d] + off
        length[d] = n
    return Box(tuple(start), tuple(length))


def placement_of(p: Any) -> Placement:
    """A DTensor placement object (Shard(d), Replicate()) as ("shard", d) or "replicate"."""
    kind = type(p).__name__
    if hasattr(p, "split_factor") or kind == "_StridedShard":
        raise LayoutError("ERR_LAYOUT_INVALID", f"placement {p!r} (a strided shard, FSDP2 over tensor parallelism) is not supported yet; "
                          "give the rank's box explicitly")
    is_shard = getattr(p, "is_shard", None)
    if (callable(is_shard) and is_shard()) or kind == "Shard":
        return ("shard", int(p.dim))
    is_replicate = getattr(p, "is_replicate", None)
    if (callable(is_replicate) and is_replicate()) or kind == "Replicate":
        return "replicate"
    raise LayoutError("ERR_LAYOUT_INVALID", f"placement {p!r} is neither Shard nor Replicate (a Partial tensor holds no "
                      "final values); redistribute it first")


def dtensor_box(dt: Any, name: str = "(tensor)") -> Box | None:
    """The box this rank holds of DTensor ``dt`` (None when this rank is not on its mesh)."""
    mesh = dt.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    return placement_box(tuple(int(n) for n in dt.shape), tuple(int(n) for n in mesh.shape),
                         [placement_of(p) for p in dt.placements], [int(c) for c in coordinate], name)
