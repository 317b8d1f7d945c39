"""The receiving half's queue (src/link/inbox.ts): messages read from the socket that no receive()
took yet, in order. A message that could not be decoded waits as its error: its receive() raises
it, and the link stays open.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from .message_decoder import dispose_values


class Inbox(deque[tuple[bool, Any]]):
    """Entries are (True, value) or (False, error)."""

    __slots__ = ()

    def take(self) -> Any:
        """The oldest message (raises its error instead, for one that could not be decoded)."""
        ok, value = self.popleft()
        if ok:
            return value
        raise value

    def drain(self) -> None:
        """Drops the messages never received, closing the buffers they hold."""
        while self:
            ok, value = self.popleft()
            if ok:
                dispose_values(owned_of(value))


def owned_of(value: Any) -> list[object]:
    """Objects with close() inside a received message (to dispose of unread messages)."""
    out: list[object] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif v is not None and not isinstance(v, (str, int, float, bytes)) and callable(getattr(v, "close", None)):
            out.append(v)
    return out
