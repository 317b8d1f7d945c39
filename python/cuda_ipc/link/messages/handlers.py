"""Transfer handlers (src/link/messages/handlers.ts, transfer.ts): how objects that own OS or GPU resources
(HostBuffer, device buffers, pools, events, channel doorbells, tensor sets) travel inside link
messages. A handler turns a value into bytes plus fds on the sending side (``encode``) and rebuilds
it on the receiving side (``decode``); the registry here is what the message encoder and decoder
look values and record kinds up in.

Each handler says which links it serves (``transports``): 'unix' links between processes of one
machine pass fds and CUDA IPC handles; 'tcp' links between machines carry neither (PROTOCOL.md 1.1),
so a HostBuffer travels there as a copy of its bytes (host_bytes_transfer.py) and device memory needs a
handler that moves it over NCCL. A value no handler of the link's transport takes is refused with
ERR_NOT_TRANSFERABLE, and the message names what to send instead (``instead``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from ...errors import IpcError

if TYPE_CHECKING:
    from ..lifetimes.lease import LeaseHold, ReceivedLease

#: The Link (connection/link.py) as this layer sees it: opaque, passed on or used by name, never imported
#: (it is above this layer; src/link/messages/handlers.ts types it `object` for the same reason).
Link = Any

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
    #: The links this handler's records travel on: 'unix' (one machine) and/or 'tcp' (between
    #: machines, TLS included: no fds, and nothing that only means something on this machine).
    transports: frozenset[str] = frozenset({"unix"})

    def instead(self, transport: str) -> str:
        """What to send instead of this handler's values on a ``transport`` link it does not serve."""
        return (f"a '{self.kind}' carries file descriptors or handles that only mean something on this machine; "
                "copy the data into bytes or a HostBuffer (a TCP link copies those)")

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


def handler_for_value(value: object, transport: str = "unix") -> TransferHandler[Any] | None:
    """The first handler (in registration order) that serves ``transport`` and takes ``value``."""
    for h in _handlers:
        if transport in h.transports and h.can_transfer(value):
            return h
    return None


def not_on_transport(value: object, transport: str) -> str | None:
    """Why ``value`` cannot travel on a ``transport`` link though a handler of another transport takes
    it, and what to send instead (None when no handler takes it at all)."""
    for h in _handlers:
        if transport not in h.transports and h.can_transfer(value):
            return h.instead(transport)
    return None


def handler_for_kind(kind: str) -> TransferHandler[Any] | None:
    return by_kind.get(kind)
