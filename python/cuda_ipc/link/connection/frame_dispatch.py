"""What a link does with each frame it read (src/link/connection/frame-dispatch.ts): a MESSAGE decoded into the
inbox, RELEASE and GONE to the leases and the allocations' owners, NCCL_ABORT to the NCCL layer, the
handshake's HELLO, GOODBYE and REFUSE to the link's state; and a record whose fds the kernel dropped
for want of descriptors. The link (link.py) reads the records and calls these; they act on its
state, as its own methods did.
"""
from __future__ import annotations

import os
import struct
from typing import Any

from ...errors import IpcError
from ..transport import frame as fr
from ..messages.deferred import Completion, PendingMessage
from ..transport.fds import close_fds
from ..lifetimes.gone import dispatch_gone
from ..transport.large_message import check_large_length, check_message_length, large_frame_length, read_large_payload
from ..messages.message_decoder import decode_message, lease_ids_of
from ..messages.message_format import Malformed
from ..messages.nccl_abort import dispatch_nccl_abort

#: The Link (link.py), named here and never imported: link.py imports this module, and an import back,
#: even for types, would close a circle.
Link = Any


def fds_lost_here(link: "Link", length: int) -> bool:
    """A record arrived whole but without (some of) its fds, which the kernel closed (MSG_CTRUNC).
    When its header is sound and announces no more fds than a record may carry, they were lost
    here, as this process (or the system) had no descriptor left: that message alone fails with
    ERR_FD_LIMIT and its leases go back to the sender; the link goes on. False for anything
    else (the caller closes the link). As frame-dispatch.ts #fdsLostHere."""
    buf = link._rview
    if length < fr.HEADER_BYTES:
        return False
    declared = fr.declared_fds(buf)
    try:
        ftype, flags, _ = fr.parse_header(buf, length, declared)
    except IpcError:
        return False
    if ftype != fr.MESSAGE or declared == 0 or declared > fr.MAX_FDS or link._state != "open":
        return False
    error = IpcError(
        "ERR_FD_LIMIT",
        f"a message from the {link._peer_name} carried {declared} fds, and this process had no descriptor left for them "
        "(EMFILE/ENFILE: see `ulimit -n`); the message was dropped and its leases returned. Close buffers, links or "
        "channels you no longer need")
    if flags & fr.LARGE_PAYLOAD:
        # Its payload was in the lost memfd: which leases it granted is unknowable, so only
        # closing the link (which ends them all) gives them back.
        link._shutdown(error, "local")
        return True
    ids = lease_ids_of(buf[fr.HEADER_BYTES:length]) if (flags & fr.ENCODING_MASK) == fr.ENC_JSON_WITH_RECORDS else []
    if ids is None:
        return False
    for lease_id in ids:
        if not link._leases_in.is_live(lease_id):
            link._leases_in.open(lease_id).end()
    link._inbox.put((False, error), 0)
    return True


def dispatch_record(link: "Link", buf: memoryview, length: int, fds: list[int]) -> None:
    """Handles one frame of ``length`` bytes in ``buf`` that came with ``fds`` (owned from here), for ``link``."""
    try:
        ftype, flags, payload_length = fr.parse_header(buf, length, len(fds))
    except IpcError as e:
        close_fds(fds)
        link._shutdown(e, "local")
        return
    if ftype in (fr.MESSAGE, fr.RELEASE, fr.GONE, fr.NCCL_ABORT) and link._state != "open":
        close_fds(fds)
        what = {fr.MESSAGE: "message", fr.RELEASE: "RELEASE", fr.GONE: "GONE"}.get(ftype, "NCCL_ABORT")
        link._shutdown(IpcError("ERR_FRAME_INVALID", f"the {link._peer_name} sent a {what} before the link handshake"), "local")
        return
    if ftype == fr.MESSAGE:
        payload: memoryview = buf[fr.HEADER_BYTES:length]
        try:
            if flags & fr.LARGE_PAYLOAD:
                memfd, fds = fds[0], fds[1:]
                try:
                    size = large_frame_length(buf, fr.HEADER_BYTES)
                    check_large_length(size, link.max_message_bytes)
                    payload = memoryview(read_large_payload(memfd, size))
                finally:
                    os.close(memfd)
            else:
                check_message_length(payload_length, link.max_message_bytes)
        except IpcError as e:
            close_fds(fds)
            if e.code == "ERR_MESSAGE_TOO_LARGE":
                link._outbox.send_now(fr.refuse_frame(fr.REFUSE_TOO_LARGE, str(e)))
            link._shutdown(e, "local")
            return
        waits: list[Completion] = []
        try:
            value, owned = decode_message(flags & fr.ENCODING_MASK, payload, fds, link, link._leases_in, waits)
        except Malformed as e:
            link._shutdown(e, "local")
            return
        except IpcError as e:
            link._inbox.put((False, e), 0)
            return
        link._inbox.put((True, PendingMessage(value, owned, waits) if waits else value), len(payload))
        return
    if ftype == fr.RELEASE:
        try:
            ids = fr.read_release_ids(buf, payload_length)
        except IpcError as e:
            link._shutdown(e, "local")
            return
        unknown = link._leases_out.release(ids)
        if unknown is not None:
            link._shutdown(IpcError(
                "ERR_FRAME_INVALID",
                f"the {link._peer_name} released lease {unknown}, which this link never granted or had already ended"), "local")
        return
    if ftype == fr.GONE:
        try:
            entries = fr.read_gone_entries(buf, payload_length)
        except IpcError as e:
            link._shutdown(e, "local")
            return
        dispatch_gone(entries, link)
        return
    if ftype == fr.NCCL_ABORT:
        error = dispatch_nccl_abort(link, buf, payload_length)
        if error is not None:
            link._shutdown(error, "local")
        return
    if ftype == fr.HELLO:
        if link._state != "handshaking":
            link._shutdown(IpcError("ERR_FRAME_INVALID", f"the {link._peer_name} sent a second HELLO"), "local")
            return
        link._peer_features = fr.hello_features(buf)
        if not link._hello_sent:
            link._send_hello()
        if link._state != "closed":
            link._state = "open"
            link._outbox.open = True
        return
    if ftype == fr.GOODBYE:
        link._shutdown(None, "peer")
        return
    if ftype == fr.REFUSE:
        reason = struct.unpack_from("<H", buf, fr.HEADER_BYTES)[0]
        text = bytes(buf[fr.HEADER_BYTES + 2:min(length, fr.HEADER_BYTES + 2 + 1024)]).decode("utf-8", "replace")
        if reason == fr.REFUSE_TOO_LARGE:
            link._shutdown(IpcError("ERR_MESSAGE_TOO_LARGE", f"the {link._peer_name} refused a message: {text}", limit="max_message_bytes"), "peer")
            return
        if reason == fr.REFUSE_BUSY:
            link._shutdown(IpcError("ERR_LISTENER_BUSY", f"the {link._peer_name} is busy: {text}"), "peer")
            return
        link._shutdown(IpcError("ERR_PEER_REFUSED", f"the {link._peer_name} refused the link: {text}"), "peer")
