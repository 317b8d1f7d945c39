"""A HostBuffer on a TCP link (docs/PROTOCOL.md 4.1 ``host-bytes``): no fd crosses machines, so its
bytes are copied into the message (as they are when send() is called) and the receiver gets a new
HostBuffer (a memfd of its own, as ``HostBuffer.allocate``) holding them. Nothing is leased: the
sender's buffer is free the moment send() returns, and the two buffers are unrelated from then on.

Data: u64 length n (1..2^53-1), then the n bytes.
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from ...errors import IpcError
from ...host.host_buffer import HostBuffer
from ..messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler

if TYPE_CHECKING:
    from ..lifetimes.lease import ReceivedLease
    from ..connection.link import Link

_LENGTH = struct.Struct("<Q")
_MAX_LENGTH = 2**53 - 1


class _HostBytesTransfer(TransferHandler[HostBuffer]):
    kind = "host-bytes"
    transports = frozenset({"tcp"})

    def can_transfer(self, value: object) -> bool:
        return isinstance(value, HostBuffer)

    def encode(self, value: HostBuffer, link: Link) -> TransferEncoding:
        if value.closed:
            raise IpcError("ERR_CLOSED", "link.send: the HostBuffer is closed; send it before closing it")
        with value.memory as m:
            # One bytes object (the encoder copies bytes into the frame without another copy of its own).
            data = b"".join((_LENGTH.pack(len(m)), m))
        return TransferEncoding(data=data)

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> HostBuffer:
        if len(data) < _LENGTH.size or fds or lease is not None:
            raise IpcError("ERR_DESCRIPTOR_INVALID", f"received a malformed host-bytes record ({len(data)} bytes, {len(fds)} fds, "
                           f"{'leased' if lease is not None else 'not leased'})")
        (n,) = _LENGTH.unpack_from(data)
        if n == 0 or n > _MAX_LENGTH or len(data) - _LENGTH.size != n:
            raise IpcError("ERR_DESCRIPTOR_INVALID", f"received a host-bytes record announcing {n} bytes with {len(data) - _LENGTH.size}")
        buf = HostBuffer.allocate(n)
        try:
            with buf.memory as m:
                m[:] = data[_LENGTH.size:]
        except BaseException:
            buf.close()
            raise
        return buf


register_transfer_handler(_HostBytesTransfer())
