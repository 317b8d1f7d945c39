"""Waiting for something a link's frames may end (deferred.py): the values of the oldest message still
arriving (receive()), or a transfer of the link a caller waits for (a tensor set fetched or received
into parameters over NCCL). The link is read meanwhile, so that the peer's NCCL_ABORT, GOODBYE or
death, which end what is arriving, are seen; the frames read go where they always go (messages to
the inbox, behind). The waiting thread sleeps in poll() on the socket and an eventfd the settling
thread rings.
"""
from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from ..messages.deferred import Completion

#: The Link (link.py), named here and never imported: link.py imports this module, and an import back,
#: even for types, would close a circle.
Link = Any

# os.eventfd and its helpers, typed here (mypy 1.0's typeshed predates them).
_eventfd_read: Callable[[int], int] = getattr(os, "eventfd_read")
_eventfd_write: Callable[[int, int], None] = getattr(os, "eventfd_write")
_EFD_CLOEXEC: int = getattr(os, "EFD_CLOEXEC")
_EFD_NONBLOCK: int = getattr(os, "EFD_NONBLOCK")


class Wake:
    """A link's eventfd that wakes a thread waiting in wait_settled; ringing it after close() does
    nothing (the number may belong to another file by then)."""

    __slots__ = ("fd", "_lock")

    def __init__(self) -> None:
        self.fd: int = getattr(os, "eventfd")(0, _EFD_CLOEXEC | _EFD_NONBLOCK)
        self._lock = threading.Lock()

    def ring(self) -> None:
        with self._lock:
            if self.fd >= 0:
                try:
                    _eventfd_write(self.fd, 1)
                except BlockingIOError:
                    pass  # rung many times before a read: it is still readable

    def close(self) -> None:
        with self._lock:
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def await_settled(link: Link, done: Completion, timeout: float | None) -> bool:
    """Waits until ``done`` settled, reading ``link`` meanwhile unless another thread does (its
    receive(), which sees what ends it just as well). False at the timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not done.settled:
        if link._recv_lock.acquire(blocking=False):
            try:
                if not wait_settled(link, done, deadline):
                    return False
            finally:
                link._close_socket_if_closed()
                link._recv_lock.release()
        else:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return done.settled
            done.wait(0.05 if remaining is None else min(0.05, remaining))
    return True


def wait_settled(link: Link, waiting: Completion, deadline: float | None) -> bool:
    """Waits until ``waiting`` settled, reading the frames that come meanwhile (at most up to the
    inbox's bound). False at the deadline. With the link's receive lock held."""
    wake: Wake = link._wake or Wake()
    link._wake = wake
    fd = wake.fd
    waiting.add_callback(lambda _c: wake.ring())
    while not waiting.settled:
        reading = link._state != "closed" and link._may_read_ahead()
        if reading and link._has_buffered():
            link._read_one(0.0, want_message=False)
            continue
        p = select.poll()
        p.register(fd, select.POLLIN)
        if reading:
            p.register(link._fd, select.POLLIN)
        ms = -1 if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
        events = dict(p.poll(ms))
        if events.get(fd):
            try:
                _eventfd_read(fd)
            except BlockingIOError:
                pass
        if reading and events.get(link._fd):
            link._read_one(0.0, want_message=False)
        elif not events and deadline is not None and not waiting.settled:
            return False
    return True
