"""Boxes: volumes, intersections, and the two checks a local tensor needs (src/tensors/sharded/box.ts)."""
from __future__ import annotations

from typing import Sequence

from .errors import Box


def volume(length: Sequence[int]) -> int:
    """Elements in a box of these lengths (1 for no dimensions)."""
    n = 1
    for x in length:
        n *= x
    return n


def intersect(a: Box, b: Box) -> Box | None:
    """The intersection of two boxes, or None when they share no element."""
    start = []
    length = []
    for i in range(len(a.start)):
        s = max(a.start[i], b.start[i])
        e = min(a.start[i] + a.length[i], b.start[i] + b.length[i])
        if e <= s:
            return None
        start.append(s)
        length.append(e - s)
    return Box(tuple(start), tuple(length))


def boxes_overlap(boxes: Sequence[Box]) -> tuple[int, int, Box] | None:
    """The first two boxes (by index, in start order) that overlap, and where; None when none do."""
    if len(boxes) < 2:
        return None
    if len(boxes[0].start) == 0:
        return (0, 1, Box((), ()))
    order = sorted(range(len(boxes)), key=lambda i: (boxes[i].start[0], i))
    for x in range(len(order)):
        a = boxes[order[x]]
        end = a.start[0] + a.length[0]
        y = x + 1
        while y < len(order) and boxes[order[y]].start[0] < end:
            r = intersect(a, boxes[order[y]])
            if r is not None:
                return (min(order[x], order[y]), max(order[x], order[y]), r)
            y += 1
    return None


def find_hole(shape: Sequence[int], boxes: Sequence[Box]) -> Box | None:
    """A box of ``shape`` none of ``boxes`` covers (they do not overlap), or None when they cover it."""
    if sum(volume(b.length) for b in boxes) == volume(shape):
        return None
    cuts = []
    for d, n in enumerate(shape):
        s = {0, n}
        for b in boxes:
            s.add(b.start[d])
            s.add(b.start[d] + b.length[d])
        cuts.append(sorted(s))
    index = [0] * len(shape)
    while True:
        cell = Box(tuple(cuts[d][k] for d, k in enumerate(index)), tuple(cuts[d][k + 1] - cuts[d][k] for d, k in enumerate(index)))
        if not any(intersect(b, cell) for b in boxes):
            return cell
        d = len(shape) - 1
        while d >= 0:
            index[d] += 1
            if index[d] < len(cuts[d]) - 1:
                break
            index[d] = 0
            d -= 1
        if d < 0:
            return None
