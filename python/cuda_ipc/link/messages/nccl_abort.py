"""NCCL_ABORT frames (docs/PROTOCOL.md 3 and 8.4), for the NCCL layer: a side that aborted an NCCL
communicator tells the peer, which aborts its end too and fails the transfers queued on it.

Only on TCP links, only to a peer whose HELLO announced NCCL (feature bit 3), never before its
HELLO (``peer_takes_nccl(link)``). ``on_nccl_abort(link, hook)`` subscribes to the peer's frames
(without a subscriber they are ignored); ``send_nccl_abort(link, communicator, reason, text)`` sends one.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from ...errors import IpcError
from ..transport import frame as fr

#: The Link (connection/link.py) as this layer sees it: opaque, passed on or used by name, never imported
#: (it is above this layer; src/link/messages/handlers.ts types it `object` for the same reason).
Link = Any

#: PROTOCOL.md 8.4's reasons.
ABORT_CANNOT_TAKE = 1
ABORT_NCCL_FAILED = 2
ABORT_NO_COMMUNICATOR = 3


class NcclAbort(NamedTuple):
    """An NCCL_ABORT the peer sent: it aborted this communicator."""

    #: The 16-byte communicator id (PROTOCOL.md 8.1).
    communicator: bytes
    #: 1 the receiver could not take the transfer, 2 NCCL failed, 3 the communicator could not be made.
    reason: int
    text: str


#: What receives the peer's NCCL_ABORT frames: hook(link, abort), on the thread that read the frame.
NcclAbortHook = Callable[["Link", NcclAbort], None]


def peer_takes_nccl(link: Link) -> bool:
    """Whether the peer announced that it takes device memory over NCCL (HELLO feature bit 3): an open
    TCP link to a peer that set it. NCCL records and NCCL_ABORT go only to such a peer."""
    return link.transport == "tcp" and link.state == "open" and bool(link._peer_features & fr.FEATURE_NCCL)


def on_nccl_abort(link: Link, hook: NcclAbortHook) -> Callable[[], None]:
    """Runs ``hook(link, abort)`` for each NCCL_ABORT frame the peer sends on ``link``. Returns a function
    that removes the hook."""
    hooks = link._nccl_abort_hooks
    hooks.append(hook)

    def remove() -> None:
        if hook in hooks:
            hooks.remove(hook)
    return remove


def send_nccl_abort(link: Link, communicator: bytes, reason: int, text: str = "") -> None:
    """Tells the peer that this side aborted the communicator ``communicator`` (its 16-byte id) for
    ``reason`` (1, 2 or 3), with ``text`` (cut to 1024 UTF-8 bytes). ERR_UNSUPPORTED on a link that is
    not an open TCP link to a peer that announced NCCL; ERR_LINK_CLOSED / ERR_PEER_GONE once closed."""
    if not isinstance(communicator, (bytes, bytearray)) or len(communicator) != 16:
        raise TypeError("send_nccl_abort: communicator must be the 16-byte communicator id")
    if reason not in fr.NCCL_ABORT_REASONS:
        raise ValueError(f"send_nccl_abort: reason must be one of {fr.NCCL_ABORT_REASONS}, got {reason!r}")
    if not isinstance(text, str):
        raise TypeError("send_nccl_abort: text must be a str")
    if link.closed:
        raise link._closed_error("send NCCL_ABORT")
    if not peer_takes_nccl(link):
        raise IpcError("ERR_UNSUPPORTED", f"send_nccl_abort: the {link._peer_name} does not take NCCL transfers on this link "
                       "(only an open TCP link whose peer announced them does)")
    data = text.encode("utf-8")[:fr.MAX_NCCL_ABORT_TEXT].decode("utf-8", "ignore").encode("utf-8")
    link._outbox.send(fr.nccl_abort_frame(bytes(communicator), reason, data))


def dispatch_nccl_abort(link: Link, buf: memoryview, payload_length: int) -> IpcError | None:
    """A received NCCL_ABORT (its header checked) to the link's hooks; the error that closes the link
    when the frame is out of spec (on a Unix link, or its fields)."""
    if link.transport != "tcp":
        return IpcError("ERR_FRAME_INVALID", f"the {link._peer_name} sent NCCL_ABORT on a Unix link (it belongs to TCP links only)")
    try:
        abort = NcclAbort(*fr.read_nccl_abort(buf, payload_length))
    except IpcError as e:
        return e
    for hook in list(link._nccl_abort_hooks):
        try:
            hook(link, abort)
        except Exception as e:  # noqa: BLE001 - the link goes on; the NCCL layer reports its own failures
            print(f"cuda_ipc: an NCCL_ABORT hook failed: {e!r}", file=sys.stderr)
    return None
