"""The planner's typed errors (src/tensors/sharded/errors.ts): each names the tensor, the rank whose
layout showed it and the range in question, so that a group can say which layout to fix before
anything moves."""
from __future__ import annotations

from typing import NamedTuple, Sequence

from ...errors import IpcError

#: The codes of LayoutError.
LAYOUT_ERROR_CODES = (
    "ERR_LAYOUT_INVALID", "ERR_LAYOUT_BOUNDS", "ERR_LAYOUT_DTYPE", "ERR_LAYOUT_SHAPE",
    "ERR_LAYOUT_UNCOVERED", "ERR_LAYOUT_OVERLAP",
)


class Box(NamedTuple):
    """A box: start and length per dimension."""
    start: tuple[int, ...]
    length: tuple[int, ...]


class LayoutError(IpcError):
    """A layout or plan refused before anything moved; ``code`` says why, ``tensor``, ``rank`` and
    ``range`` say where."""

    def __init__(self, code: str, message: str, *, tensor: str | None = None, rank: int | None = None,
                 range: Box | None = None):
        super().__init__(code, message)
        self.tensor = tensor
        self.rank = rank
        self.range = Box(tuple(range.start), tuple(range.length)) if range is not None else None


def format_range(box: Box | tuple[Sequence[int], Sequence[int]]) -> str:
    """A range as messages print it: ``[0:4, 8:16]`` (start:end per dimension)."""
    start, length = box
    return "[" + ", ".join(f"{s}:{s + n}" for s, n in zip(start, length)) + "]"
