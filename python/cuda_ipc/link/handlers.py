"""Transfer handlers (src/link/handlers.ts, transfer.ts): how objects that own OS or GPU resources
(HostBuffer, device buffers, pools, events, channel doorbells, tensor sets) travel inside link
messages. A handler turns a value into bytes plus fds on the sending side (``encode``) and rebuilds
it on the receiving side (``decode``); the registry here is what the message encoder and decoder
look values and record kinds up in.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from ..errors import IpcError

if TYPE_CHECKING:
    from .lease import LeaseHold, ReceivedLease
    from .link import Link

_KIND_RE = re.compile(r"^[\x21-\x7e]{1,64}$")


@dataclass
class TransferEncoding:
    """What a handler's ``encode()`` returns for one value."""

    #: Bytes for the receiver's decode; copied into the frame during send.
    data: bytes | bytearray
    #: fds to pass with the message, borrowed (read during send only) unless close_fds_after_send.
    fds: list[int] = field(default_factory=list)
    close_fds_after_send: bool = False
    #: Runs once the message went out; never if the send failed.
    on_commit: Callable[[], None] | None = None
    #: The sender-side resource the value keeps alive while the peer uses it (a lease), with
    #: ``release()`` and ``bytes``.
    hold: LeaseHold | None = None
    #: The record kind, for a handler that sends values under several kinds (default: its own).
    kind: str | None = None


T = TypeVar("T")


class TransferHandler(Generic[T]):
    """How objects that own OS or GPU resources travel inside link messages (see register_transfer_handler):
    a ``TransferHandler[T]`` sends values of type T (those ``can_transfer`` says yes to)."""

    kind: str = ""

    def can_transfer(self, value: object) -> bool:
        raise NotImplementedError

    def encode(self, value: T, link: Link) -> TransferEncoding:
        raise NotImplementedError

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> Any:
        """Rebuilds the value. ``data`` is valid during the call only. On return the handler owns
        ``fds``; if it raises, the link closes every fd still in ``fds`` (a handler that already took
        one sets its entry to -1). The value must call ``lease.end()`` once finally released."""
        raise NotImplementedError


#: The registry by record kind (the decoder looks each record up here).
by_kind: dict[str, TransferHandler[Any]] = {}
_handlers: list[TransferHandler[Any]] = []


def register_transfer_handler(handler: TransferHandler[Any]) -> None:
    """Registers a handler for every link in this process (the receiving process needs it too)."""
    kind = getattr(handler, "kind", None)
    if not isinstance(kind, str) or not _KIND_RE.match(kind) or kind.startswith("@"):
        raise IpcError("ERR_INVALID_ARG", f"transfer handler kind {kind!r} must be 1..64 printable ASCII characters not starting with '@'")
    if kind in by_kind:
        raise IpcError("ERR_INVALID_ARG", f"a transfer handler for '{kind}' is already registered; unregister it first to replace it")
    by_kind[kind] = handler
    _handlers.append(handler)


def unregister_transfer_handler(kind: str) -> bool:
    h = by_kind.pop(kind, None)
    if h is None:
        return False
    _handlers.remove(h)
    return True


def handler_for_value(value: object) -> TransferHandler[Any] | None:
    for h in _handlers:
        if h.can_transfer(value):
            return h
    return None


def handler_for_kind(kind: str) -> TransferHandler[Any] | None:
    return by_kind.get(kind)
