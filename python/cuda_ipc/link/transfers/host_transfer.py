"""Sending a HostBuffer over a link (src/link/transfers/host-transfer.ts) passes its memfd (borrowed for the send)
and where the buffer lies in it; the receiver maps the same memory. Data: u64 file length, u64
offset, u64 length. The send leases the sender's mapping to the peer: it stays mapped until the
receiver's last view of what it got is closed (the lease ends), or the link closes.
"""
from __future__ import annotations

import fcntl
import os
import struct
from typing import TYPE_CHECKING

from ...errors import IpcError
from ...host.host_buffer import HostBuffer
from ..messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler
from ..lifetimes.lease import Hold

if TYPE_CHECKING:
    from ..lifetimes.lease import ReceivedLease
    from ..connection.link import Link

_DATA = struct.Struct("<QQQ")


def _lease_buffer(buffer: HostBuffer) -> Hold:
    m = buffer._check()
    m.retain()
    return Hold(m.release, buffer.nbytes)


class _HostBufferTransfer(TransferHandler[HostBuffer]):
    kind = "host-buffer"

    def can_transfer(self, value: object) -> bool:
        return isinstance(value, HostBuffer)

    def encode(self, value: HostBuffer, link: Link) -> TransferEncoding:
        if value.closed:
            raise IpcError("ERR_CLOSED", "link.send: the HostBuffer is closed; send it before closing it")
        m = value._mapping
        if not m.sealed:
            raise IpcError("ERR_NOT_TRANSFERABLE", "link.send: this HostBuffer's file is not sealed against shrinking")
        return TransferEncoding(
            data=_DATA.pack(m.length, value._offset, value._length), fds=[m.fd], hold=_lease_buffer(value))

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> HostBuffer:
        if len(data) != _DATA.size or len(fds) != 1:
            raise IpcError("ERR_DESCRIPTOR_INVALID", f"received a malformed host-buffer ({len(data)} bytes, {len(fds)} fds)")
        file_length, offset, length = _DATA.unpack(data)
        if length == 0 or offset + length > file_length:
            raise IpcError("ERR_DESCRIPTOR_INVALID", f"received a host-buffer whose range ({offset}+{length}) lies outside its {file_length}-byte file")
        fd = fds[0]
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            seals = 0
        # Only a memfd can carry seals: a pipe, socket, directory, device or plain file is refused here,
        # before anything maps it, and so is a file shorter than announced (SIGBUS otherwise).
        if not seals & fcntl.F_SEAL_SHRINK:
            raise IpcError("ERR_DESCRIPTOR_INVALID", "received a host-buffer whose file is not a memfd sealed against shrinking; mapping it could crash this process")
        if seals & fcntl.F_SEAL_WRITE:
            raise IpcError("ERR_DESCRIPTOR_INVALID", "received a host-buffer whose file is sealed against writing; a host buffer is memory both sides may write")
        size = os.fstat(fd).st_size
        if size < file_length:
            raise IpcError("ERR_DESCRIPTOR_INVALID", f"received a host-buffer announcing a {file_length}-byte file whose fd holds {size} bytes")
        fds[0] = -1
        whole = HostBuffer._from_fd(fd, file_length)  # owns fd now, even if it raises
        if lease is not None:
            whole._mapping.when_unmapped(lease.end)
        if offset == 0 and length == file_length:
            return whole
        try:
            return whole.view(offset, length)
        finally:
            whole.close()


register_transfer_handler(_HostBufferTransfer())
