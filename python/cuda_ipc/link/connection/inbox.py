"""The receiving half's queue (src/link/connection/inbox.ts): messages read from the socket that no receive()
took yet, in order. A message that could not be decoded waits as its error: its receive() raises
it, and the link stays open. A message whose values are still arriving (deferred.py) waits as a
PendingMessage, and the ones behind it wait with it: receive() takes it once they arrived.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from ...errors import IpcError
from ..messages.deferred import Completion, PendingMessage
from ..messages.message_decoder import dispose_values


class Inbox(deque[tuple[bool, Any]]):
    """Entries are (True, value), (True, PendingMessage) or (False, error)."""

    __slots__ = ()

    def take(self) -> Any:
        """The oldest message (raises its error instead, for one that could not be decoded or whose
        values failed to arrive). A pending one must have settled (``waiting()`` is None)."""
        ok, value = self.popleft()
        if not ok:
            raise value
        if type(value) is PendingMessage:
            failure = value.failure()
            if failure is not None:
                dispose_values(value.owned)
                if isinstance(failure, IpcError):
                    raise failure
                raise IpcError("ERR_DESCRIPTOR_INVALID", f"a received value could not be completed: {failure}") from failure
            return value.value
        return value

    def waiting(self) -> Completion | None:
        """What the oldest message still waits for (a value arriving), or None when it can be taken."""
        if not self:
            return None
        ok, value = self[0]
        return value.unsettled() if ok and type(value) is PendingMessage else None

    def ready_count(self) -> int:
        """Messages that receive() can take without waiting: those before the first still arriving."""
        n = 0
        for ok, value in self:
            if ok and type(value) is PendingMessage and value.unsettled() is not None:
                break
            n += 1
        return n

    def drain(self) -> None:
        """Drops the messages never received, closing the buffers they hold."""
        while self:
            ok, value = self.popleft()
            if ok:
                dispose_values(value.owned if type(value) is PendingMessage else owned_of(value))


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
