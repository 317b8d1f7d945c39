"""The plan (src/tensors/sharded/plan.ts, the same rules and the same runs): from every rank's
layout, which byte runs go from which source rank to which destination rank, checked before
anything moves. Sources with equal boxes of a tensor are replicas of one box; where distinct boxes
never partly overlap, a destination piece's cells are its intersections with them, otherwise the
edges of the sources that meet it cut it into a grid. Each cell goes from one source that holds it
(on the destination's node first; a big cell split into slabs over several, a small one rotated by
destination and cell). With ``rank``, only that rank's pairs."""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Sequence, TypeVar, Union

from .box import find_hole
from .errors import Box, LayoutError, format_range
from .layout import GlobalTensor, RankLayout, itemsize, validate_layout
from .layout_wire import layout_fingerprint
from .runs import PlanRun, box_runs, sort_and_merge

#: A cell at least this large is split among the sources that hold it.
SPLIT_MIN_BYTES = 1 << 20


@dataclass(frozen=True)
class PlanPair:
    """Everything one source rank sends one destination rank."""
    src: int
    dst: int
    path: str  # 'local' (one rank), 'ipc' (one node), 'nccl' (between nodes)
    bytes: int
    runs: tuple[PlanRun, ...]


@dataclass(frozen=True)
class ShardPlan:
    fingerprint: str
    ranks: tuple[tuple[int, str, int], ...]  # (rank, node, gpu), sorted
    scope: object  # 'all' or a rank
    pairs: tuple[PlanPair, ...]  # by source rank, then destination rank


class _Entry:
    __slots__ = ("rank", "local", "start", "end", "at", "strides", "order", "group")

    def __init__(self, rank: int, local: int, start: tuple[int, ...], end: tuple[int, ...], at: tuple[int, ...], strides: tuple[int, ...]):
        self.rank: int = rank
        self.local: int = local
        self.start: tuple[int, ...] = start
        self.end: tuple[int, ...] = end
        self.at: tuple[int, ...] = at
        self.strides: tuple[int, ...] = strides
        self.order: int = 0
        self.group: _Group | None = None


class _Group:
    """Sources with one box of a tensor: id in box order, members in rank order."""

    def __init__(self, gid: int, start: tuple[int, ...], end: tuple[int, ...]):
        self.id = gid
        self.start = start
        self.end = end
        self.members: list[_Entry] = []


_E = TypeVar("_E", bound=Union["_Entry", "_Group"])


class _Tensor:
    def __init__(self, tensor: GlobalTensor):
        self.tensor = tensor
        self.itemsize = itemsize(tensor.dtype)
        self.sources: list[_Entry] = []
        self.dests: list[_Entry] = []
        self.max_source = 0
        self.max_dest = 0
        self.groups: list[_Group] | None = None


def plan_sharded(layouts: Sequence[RankLayout], *, rank: int | None = None) -> ShardPlan:
    """The plan for ``layouts`` (every rank's, each once); ``rank``: only the pairs that rank is in
    (and only what it receives is checked for cover). Raises LayoutError."""
    ordered = sorted(layouts, key=lambda x: x.rank)
    for i, layout in enumerate(ordered):
        validate_layout(layout)
        if i and ordered[i - 1].rank == layout.rank:
            raise LayoutError("ERR_LAYOUT_INVALID", f"two layouts are rank {layout.rank}; each rank gives one", rank=layout.rank)
    me = -1
    if rank is not None:
        me = next((i for i, x in enumerate(ordered) if x.rank == rank), -1)
        if me < 0:
            raise LayoutError("ERR_LAYOUT_INVALID", f"rank {rank} has no layout among the {len(ordered)} given", rank=rank)
    index = _build_index(ordered)
    out: dict[tuple[int, int], list[PlanRun]] = {}
    for t in index.values():
        if me < 0:
            for p in t.dests:
                _plan_piece(ordered, out, t, p)
            continue
        for p in t.dests:
            if p.rank == me:
                _plan_piece(ordered, out, t, p)
        for s in t.sources:
            if s.rank != me:
                continue
            for p in _overlapping(t.dests, t.max_dest, s):
                if p.rank != me:
                    _plan_piece(ordered, out, t, p, s)
    pairs = []
    for (si, di) in sorted(out):
        src, dst = ordered[si], ordered[di]
        runs = sort_and_merge(out[(si, di)])
        path = "local" if si == di else "ipc" if src.node == dst.node else "nccl"
        pairs.append(PlanPair(src.rank, dst.rank, path, sum(r.bytes * r.count for r in runs), runs))
    return ShardPlan(layout_fingerprint(ordered), tuple((x.rank, x.node, x.gpu) for x in ordered),
                     "all" if rank is None else rank, tuple(pairs))


def plan_bytes(plan: ShardPlan) -> tuple[dict[int, int], dict[int, int]]:
    """Bytes each rank sends and receives in a plan (of its scope)."""
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    for p in plan.pairs:
        sent[p.src] = sent.get(p.src, 0) + p.bytes
        received[p.dst] = received.get(p.dst, 0) + p.bytes
    return sent, received


def _build_index(layouts: Sequence[RankLayout]) -> dict[str, _Tensor]:
    index: dict[str, _Tensor] = {}
    owner: dict[str, int] = {}
    for r, layout in enumerate(layouts):
        for g in layout.tensors:
            t = index.get(g.name)
            if t is None:
                index[g.name] = _Tensor(g)
                owner[g.name] = layout.rank
                continue
            if t.tensor.dtype != g.dtype:
                raise LayoutError("ERR_LAYOUT_DTYPE", f"tensor {g.name} is {t.tensor.dtype} in rank {owner[g.name]}'s layout but {g.dtype} in rank {layout.rank}'s; every rank must give one dtype", tensor=g.name, rank=layout.rank)
            if t.tensor.shape != g.shape:
                raise LayoutError("ERR_LAYOUT_SHAPE", f"tensor {g.name} is {list(t.tensor.shape)} in rank {owner[g.name]}'s layout but {list(g.shape)} in rank {layout.rank}'s; every rank must give one global shape", tensor=g.name, rank=layout.rank)
        for group, key in ((layout.sources, "sources"), (layout.destinations, "dests")):
            for li, local in enumerate(group):
                for p in local.pieces:
                    e = _Entry(r, li, p.start, tuple(s + n for s, n in zip(p.start, p.length)), p.at, local.strides)
                    getattr(index[p.tensor], key).append(e)
    for t in index.values():
        for i, e in enumerate(t.sources):
            e.order = i
        for i, e in enumerate(t.dests):
            e.order = i
        t.sources.sort(key=lambda e: (e.start[0] if e.start else 0, e.order))
        t.dests.sort(key=lambda e: (e.start[0] if e.start else 0, e.order))
        t.max_source = max(((e.end[0] - e.start[0]) if e.start else 1 for e in t.sources), default=0)
        t.max_dest = max(((e.end[0] - e.start[0]) if e.start else 1 for e in t.dests), default=0)
        t.groups = _group_replicas(t.sources)
    return index


def _group_replicas(sources: Sequence[_Entry]) -> list[_Group] | None:
    by_box: dict[tuple[tuple[int, ...], tuple[int, ...]], _Group] = {}
    groups: list[_Group] = []
    for e in sorted(sources, key=lambda x: x.order):
        g = by_box.get((e.start, e.end))
        if g is None:
            g = _Group(len(groups), e.start, e.end)
            by_box[(e.start, e.end)] = g
            groups.append(g)
        g.members.append(e)
        e.group = g
    groups.sort(key=lambda x: (x.start[0] if x.start else 0, x.id))
    ndim = len(groups[0].start) if groups else 0
    if ndim == 0:
        return None  # no sources, or 0-d ones: the grid (one cell)
    reach: int | None = None
    opened: list[_Group] = []
    for g in groups:
        if reach is None or g.start[0] >= reach:
            opened = []
        for o in opened:
            if all(o.start[d] < g.end[d] and o.end[d] > g.start[d] for d in range(ndim)):
                return None
        opened = [o for o in opened if o.end[0] > g.start[0]]
        opened.append(g)
        reach = g.end[0] if reach is None or g.end[0] > reach else reach
    return groups


def _overlapping(entries: Sequence[_E], max_len: int, box: _Entry) -> list[_E]:
    ndim = len(box.start)
    i = 0
    if ndim:
        frm = box.start[0] - max_len
        lo, hi = 0, len(entries)
        while lo < hi:
            mid = (lo + hi) // 2
            if entries[mid].start[0] <= frm:
                lo = mid + 1
            else:
                hi = mid
        i = lo
    found = []
    while i < len(entries):
        e = entries[i]
        i += 1
        if ndim and e.start[0] >= box.end[0]:
            break
        if all(e.start[d] < box.end[d] and e.end[d] > box.start[d] for d in range(ndim)):
            found.append(e)
    return found


def _plan_piece(layouts: Sequence[RankLayout], out: dict[tuple[int, int], list[PlanRun]], t: _Tensor, p: _Entry, only: _Entry | None = None) -> None:
    if t.groups is not None:
        _plan_piece_by_boxes(layouts, out, t, t.groups, p, only)
        return
    ndim = len(p.start)
    sources = _overlapping(t.sources, t.max_source, p)
    dst_layout = layouts[p.rank]
    name = t.tensor.name
    if not sources:
        raise _uncovered(name, dst_layout, Box(p.start, tuple(e - s for s, e in zip(p.start, p.end))))
    cuts: list[list[int]] = []
    for d in range(ndim):
        edges = {p.start[d], p.end[d]}
        for s in sources:
            if s.start[d] > p.start[d]:
                edges.add(s.start[d])
            if s.end[d] < p.end[d]:
                edges.add(s.end[d])
        cuts.append(sorted(edges))
    grid = [len(c) - 1 for c in cuts]
    lo = [bisect_left(c, max(only.start[d], p.start[d])) if only else 0 for d, c in enumerate(cuts)]
    hi = [bisect_left(c, min(only.end[d], p.end[d])) if only else grid[d] for d, c in enumerate(cuts)]
    span = [h - l for l, h in zip(lo, hi)]
    cells = 1
    for x in span:
        cells *= x
    candidates: list[list[_Entry]] = [[] for _ in range(cells)]
    for s in sources:
        a = [max(bisect_left(c, max(s.start[d], p.start[d])), lo[d]) for d, c in enumerate(cuts)]
        b = [min(bisect_left(c, min(s.end[d], p.end[d])), hi[d]) for d, c in enumerate(cuts)]
        if any(x >= y for x, y in zip(a, b)):
            continue
        k = list(a)
        while True:
            cell = 0
            for d in range(ndim):
                cell = cell * span[d] + (k[d] - lo[d])
            candidates[cell].append(s)
            d = ndim - 1
            while d >= 0:
                k[d] += 1
                if k[d] < b[d]:
                    break
                k[d] = a[d]
                d -= 1
            if d < 0:
                break
    k = list(lo)
    for c in range(cells):
        start = tuple(cuts[d][x] for d, x in enumerate(k))
        length = tuple(cuts[d][x + 1] - cuts[d][x] for d, x in enumerate(k))
        ordinal = 0
        for d in range(ndim):
            ordinal = ordinal * grid[d] + k[d]
        held = candidates[c]
        if not held:
            raise _uncovered(name, dst_layout, Box(start, length))
        near = [s for s in held if layouts[s.rank].node == dst_layout.node]
        if near:
            held = near
        held = sorted(held, key=lambda e: e.order)
        _assign_cell(out, t, p, Box(start, length), held, (dst_layout.rank + ordinal) % len(held), only)
        d = ndim - 1
        while d >= 0:
            k[d] += 1
            if k[d] < hi[d]:
                break
            k[d] = lo[d]
            d -= 1


def _plan_piece_by_boxes(layouts: Sequence[RankLayout], out: dict[tuple[int, int], list[PlanRun]], t: _Tensor, groups: list[_Group],
                         p: _Entry, only: _Entry | None) -> None:
    dst_layout = layouts[p.rank]
    ndim = len(p.start)
    meeting = [only.group] if only is not None and only.group is not None else _overlapping(groups, t.max_source, p)
    covered = 0
    for g in meeting:
        start = tuple(max(g.start[d], p.start[d]) for d in range(ndim))
        length = tuple(min(g.end[d], p.end[d]) - start[d] for d in range(ndim))
        cells = 1
        for n in length:
            cells *= n
        covered += cells
        held = g.members
        if len(held) > 1:
            near = [x for x in held if layouts[x.rank].node == dst_layout.node]
            if near:
                held = near
        _assign_cell(out, t, p, Box(start, length), held, (dst_layout.rank + g.id) % len(held), only)
    if only is None:
        whole = 1
        for d in range(ndim):
            whole *= p.end[d] - p.start[d]
        if covered < whole:
            boxes = [Box(tuple(max(g.start[d], p.start[d]) - p.start[d] for d in range(ndim)),
                         tuple(min(g.end[d], p.end[d]) - max(g.start[d], p.start[d]) for d in range(ndim))) for g in meeting]
            hole = find_hole(tuple(e - s for s, e in zip(p.start, p.end)), boxes)
            assert hole is not None
            raise _uncovered(t.tensor.name, dst_layout, Box(tuple(x + s for x, s in zip(hole.start, p.start)), hole.length))


def _assign_cell(out: dict[tuple[int, int], list[PlanRun]], t: _Tensor, p: _Entry, box: Box, held: list[_Entry], rot: int, only: _Entry | None) -> None:
    slabs = 1
    dim = next((i for i, n in enumerate(box.length) if n > 1), -1)
    if len(held) > 1 and dim >= 0:
        size = t.itemsize
        for n in box.length:
            size *= n
        slabs = max(1, min(len(held), box.length[dim], size // SPLIT_MIN_BYTES))
    if slabs == 1:
        _emit(out, t, held[rot], p, box, only)
        return
    n = box.length[dim]
    base, extra = divmod(n, slabs)
    offset = box.start[dim]
    for j in range(slabs):
        ln = base + (1 if j < extra else 0)
        start = list(box.start); start[dim] = offset
        length = list(box.length); length[dim] = ln
        _emit(out, t, held[(j + rot) % len(held)], p, Box(tuple(start), tuple(length)), only)
        offset += ln


def _emit(out: dict[tuple[int, int], list[PlanRun]], t: _Tensor, s: _Entry, p: _Entry, box: Box, only: _Entry | None) -> None:
    if only is not None and s is not only:
        return
    src = sum((box.start[d] - s.start[d] + s.at[d]) * s.strides[d] for d in range(len(box.start)))
    dst = sum((box.start[d] - p.start[d] + p.at[d]) * p.strides[d] for d in range(len(box.start)))
    box_runs(out.setdefault((s.rank, p.rank), []), s.local, p.local, src, dst, box.length, s.strides, p.strides, t.itemsize)


def _uncovered(name: str, dst: RankLayout, r: Box) -> LayoutError:
    return LayoutError("ERR_LAYOUT_UNCOVERED", f"tensor {name}: {format_range(r)}, which rank {dst.rank} needs, is held by no "
                       "source rank; add the sources that hold it, or take it out of the destination's pieces", tensor=name, rank=dst.rank, range=r)
