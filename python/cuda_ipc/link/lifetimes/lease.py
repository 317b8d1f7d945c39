"""Leases, as on the Node side (src/link/lifetimes/lease.ts; rules in docs/PROTOCOL.md).

Everything sent over a link that keeps a resource alive on the sending side (a host buffer's
memory, a tensor, a pool) is *leased* to the peer until the peer says it is done with it (a RELEASE
frame naming the lease id) or the link closes for any reason, the peer's death included.
"""
from __future__ import annotations

import itertools
import threading
import warnings
from collections.abc import Iterable
from typing import Callable, Protocol

from ...leak import ReceivedLease as ReceivedLease  # here since issue 36 (what is received holds one below the link)
from ..transport.frame import MAX_LEASE_ID


class LeaseHold(Protocol):
    """The sender-side resource a lease keeps alive: ``release()`` runs exactly once."""

    bytes: int

    def release(self) -> None: ...


class Hold:
    """A LeaseHold from a callable (and, for accounting, the bytes it keeps alive)."""

    __slots__ = ("_release", "bytes")

    def __init__(self, release: Callable[[], None], nbytes: int = 0):
        self._release: Callable[[], None] | None = release
        self.bytes = nbytes

    def release(self) -> None:
        r, self._release = self._release, None
        if r is not None:
            r()


_ids = itertools.count(1)
_ids_lock = threading.Lock()


def next_lease_id() -> int:
    """Lease ids are unique in the process (so also per link), 1..2^53-1."""
    with _ids_lock:
        i = next(_ids)
    if i > MAX_LEASE_ID:  # pragma: no cover - 2^53 sends
        raise OverflowError("lease ids exhausted")
    return i


def release_hold(hold: LeaseHold) -> None:
    """Runs ``hold.release()``, reporting (never raising) a failure: the other holds must still run."""
    try:
        hold.release()
    except Exception as e:  # noqa: BLE001 - reported, the link's bookkeeping must go on
        warnings.warn(f"a lease's release() raised: {e!r}", RuntimeWarning, stacklevel=2)


class OutgoingLeases:
    """Leases this process granted to the peer of one link."""

    def __init__(self) -> None:
        self._holds: dict[int, LeaseHold] = {}
        self._bytes = 0
        self._closed = False
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return len(self._holds)

    @property
    def bytes(self) -> int:
        return self._bytes

    def add(self, lease_id: int, hold: LeaseHold) -> None:
        with self._lock:
            if not self._closed:
                self._holds[lease_id] = hold
                self._bytes += getattr(hold, "bytes", 0) or 0
                return
        release_hold(hold)  # the link is closed: no one holds it

    def release(self, ids: Iterable[int]) -> int | None:
        """The peer released ``ids``: returns the first id that is not outstanding (never granted, or
        released already), having released the ids before it; None when all were known."""
        for i in ids:
            with self._lock:
                hold = self._holds.pop(i, None)
                if hold is None:
                    return i
                self._bytes -= getattr(hold, "bytes", 0) or 0
            release_hold(hold)
        return None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            holds = list(self._holds.values())
            self._holds.clear()
            self._bytes = 0
        for h in holds:
            release_hold(h)


class LeaseFromPeer:
    """The receiving side of one lease (a ReceivedLease): call ``end()`` once the value is finally released."""

    __slots__ = ("_table", "id", "_ended")

    def __init__(self, table: "IncomingLeases", lease_id: int):
        self._table = table
        self.id = lease_id
        self._ended = False

    @property
    def ended(self) -> bool:
        return self._ended or self._table.closed

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._table.end(self.id)


class IncomingLeases:
    """Leases the peer of one link granted to this process. Ended ids go back in RELEASE frames through
    ``flush(ids)``, called by ``end()`` (which may run in a garbage-collection finalizer on any
    thread); the link sends them at once when it can, else at its next operation."""

    def __init__(self, flush: Callable[[], None]):
        self._live: set[int] = set()
        self._pending: list[int] = []
        self._lock = threading.Lock()
        self._flush = flush
        self.closed = False

    @property
    def count(self) -> int:
        return len(self._live)

    def is_live(self, lease_id: int) -> bool:
        return lease_id in self._live

    def open(self, lease_id: int) -> LeaseFromPeer:
        with self._lock:
            self._live.add(lease_id)
        return LeaseFromPeer(self, lease_id)

    def end(self, lease_id: int) -> None:
        with self._lock:
            if self.closed or lease_id not in self._live:
                return
            self._live.discard(lease_id)
            self._pending.append(lease_id)
        self._flush()

    def take_pending(self) -> list[int]:
        with self._lock:
            ids, self._pending = self._pending, []
        return ids

    def put_back(self, ids: list[int]) -> None:
        with self._lock:
            if not self.closed:
                self._pending[:0] = ids

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def close(self) -> None:
        """The link closed: the sender has ended every lease itself; nothing more is sent."""
        with self._lock:
            self.closed = True
            self._live.clear()
            self._pending = []
