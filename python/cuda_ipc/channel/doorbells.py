"""Doorbells: one eventfd per participant entry of a channel (src/channel/doorbells.ts). The hub hands
every participant the whole set at attach, so any participant can wake any other; participant k
sleeps polling eventfd k (waiter.py), others ring it when the control block says k is asleep
(slot_ring.py).

On the wire (a link transfer record of kind 'channel-doorbells'): data is u32 count, the record
carries that many eventfds, entry 0 first. The receiver checks each is an eventfd.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..link.transport.fds import close_fds
from ..link.messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler
from ..errors import IpcError

if TYPE_CHECKING:
    from ..link.lifetimes.lease import ReceivedLease
    from ..link.connection.link import Link

DOORBELLS_KIND = "channel-doorbells"

# os.eventfd_read/_write, typed here (mypy 1.0's typeshed predates them).
eventfd_read: Callable[[int], int] = getattr(os, "eventfd_read")
eventfd_write: Callable[[int, int], None] = getattr(os, "eventfd_write")


class Doorbells:
    """One eventfd per participant entry (received at attach, owned: closed by close())."""

    __slots__ = ("fds", "closed")

    def __init__(self, fds: list[int]):
        self.fds = list(fds)
        self.closed = False

    def ring(self, k: int) -> None:
        if self.closed or not 0 <= k < len(self.fds):
            return
        try:
            eventfd_write(self.fds[k], 1)
        except BlockingIOError:
            pass  # the count is at its maximum: readable already
        except OSError:
            pass  # closed under us: nobody polls it any more

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        close_fds(self.fds)


class _DoorbellsTransfer(TransferHandler[Doorbells]):
    """'channel-doorbells': data is u32 count; the record carries that many eventfds, entry 0 first."""

    kind = DOORBELLS_KIND

    def can_transfer(self, value: object) -> bool:
        return isinstance(value, Doorbells)

    def encode(self, value: Doorbells, link: Link) -> TransferEncoding:
        if value.closed:
            raise IpcError("ERR_CLOSED", "link.send: the channel's doorbells are closed")
        return TransferEncoding(data=struct.pack("<I", len(value.fds)), fds=list(value.fds))

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> Doorbells:
        if len(data) != 4 or struct.unpack("<I", data)[0] != len(fds) or not fds:
            raise IpcError("ERR_DESCRIPTOR_INVALID", f"received malformed channel doorbells ({len(data)} bytes, {len(fds)} fds)")
        for fd in fds:
            try:
                ok = os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
            except OSError:
                ok = False
            if not ok:
                raise IpcError("ERR_DESCRIPTOR_INVALID", "received channel doorbells that are not eventfds")
        bells = Doorbells(fds)
        for i in range(len(fds)):
            fds[i] = -1  # owned by bells now
        if lease is not None:
            lease.end()  # nothing on the sender's side depends on our copies
        return bells


register_transfer_handler(_DoorbellsTransfer())
