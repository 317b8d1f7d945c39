"""The receiving half's queue (src/link/connection/inbox.ts): messages read from the socket that no receive()
took yet, in order. A message that could not be decoded waits as its error: its receive() raises
it, and the link stays open. A message whose values are still arriving (deferred.py) waits as a
PendingMessage, and the ones behind it wait with it: receive() takes it once they arrived. The
bytes of what waits here count against the link's ``inbox_bytes`` and the process's bound across
links (received_memory.py).
"""
from __future__ import annotations

import weakref
from collections import deque
from typing import Any

from ...errors import IpcError
from ..messages.deferred import Completion, PendingMessage
from ..messages.message_decoder import dispose_values
from ..transport import received_memory


def _release_account(account: list[int]) -> None:
    """An inbox collected with bytes still counted (a link dropped unclosed): they go back."""
    received_memory.release(account[0])
    account[0] = 0


class Inbox(deque[tuple[bool, Any]]):
    """Entries are (True, value), (True, PendingMessage) or (False, error); ``put`` adds one with its
    size in bytes, which the process's bound counts until it is taken or dropped."""

    __slots__ = ("_sizes", "_account")

    def __init__(self) -> None:
        super().__init__()
        self._sizes: deque[int] = deque()
        #: Bytes held, in a list the finalizer can read without keeping the inbox alive.
        self._account = [0]
        weakref.finalize(self, _release_account, self._account)

    @property
    def bytes(self) -> int:
        """Bytes of the messages waiting here."""
        return self._account[0]

    def put(self, entry: tuple[bool, Any], nbytes: int) -> None:
        """Adds ``entry``, a message of ``nbytes`` (0 for an error)."""
        self.append(entry)
        self._sizes.append(nbytes)
        self._account[0] += nbytes
        received_memory.hold(nbytes)

    def _pop(self) -> tuple[bool, Any]:
        entry = self.popleft()
        n = self._sizes.popleft()
        self._account[0] -= n
        received_memory.release(n)
        return entry

    def take(self) -> Any:
        """The oldest message (raises its error instead, for one that could not be decoded or whose
        values failed to arrive). A pending one must have settled (``waiting()`` is None)."""
        ok, value = self._pop()
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
            ok, value = self._pop()
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
