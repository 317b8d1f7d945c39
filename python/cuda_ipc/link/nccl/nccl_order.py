"""The order of one NCCL communicator's transfers (src/link/nccl/nccl-comms.ts TransferOrder): NCCL matches
operations by the order each rank queues them, so both sides start a communicator's transfers
strictly in sequence order, whoever asks first. A transfer is submitted with what starts it, or
deferred (a tensor set received lazily: it starts when its user asks, or when a later transfer
needs the way: then it is forced, and receives into memory of its own). No CUDA and no NCCL here:
a worker thread (nccl_comms.py) takes the transfers in turn and starts them.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from ...errors import IpcError

#: Queues a transfer's NCCL work (called on the communicator's worker thread).
Start = Callable[[], None]
#: The communicator ended before the transfer started: it will never run.
Fail = Callable[[IpcError], object]


class _Entry:
    __slots__ = ("start", "force", "fail")

    def __init__(self, start: Start | None, force: Callable[[], None] | None, fail: Fail):
        self.start = start
        self.force = force
        self.fail = fail


class TransferOrder:
    """Transfers of one communicator, started strictly in sequence order (0, 1, 2, ...). ``take()``
    gives the next one to start (once it was submitted), forcing a deferred one when a later
    transfer waits behind it; ``fail(error)`` ends the order: waiting transfers fail, and so will
    every later submit."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._next = 0
        self._entries: dict[int, _Entry] = {}
        self._highest = -1
        self._failed: IpcError | None = None

    @property
    def next(self) -> int:
        """The sequence number of the transfer to start next."""
        return self._next

    @property
    def failed(self) -> IpcError | None:
        return self._failed

    def submit(self, sequence: int, start: Start, fail: Fail) -> None:
        """``sequence`` starts with ``start()`` in its turn; ``fail`` runs instead if the order ends first."""
        with self._cond:
            failed = self._failed
            if failed is None:
                e = self._entries.get(sequence)
                if e is not None:
                    e.start, e.fail = start, fail
                else:
                    self._entries[sequence] = _Entry(start, None, fail)
                self._highest = max(self._highest, sequence)
                self._cond.notify_all()
                return
        fail(failed)

    def defer(self, sequence: int, force: Callable[[], None], fail: Fail) -> None:
        """``sequence`` waits for its consumer to submit it; ``force()`` makes it submit now (it must
        call submit for ``sequence`` before it returns, or end the order) once a later transfer waits."""
        with self._cond:
            failed = self._failed
            if failed is None:
                self._entries[sequence] = _Entry(None, force, fail)
                self._cond.notify_all()
                return
        fail(failed)

    def take(self, block: bool = False) -> Start | None:
        """The next transfer's start (it is then no longer waiting), forcing a deferred one first when
        a later one was submitted. None when the order ended, or, unless ``block``, when the next
        transfer was not submitted yet (``block`` waits for it)."""
        with self._cond:
            while True:
                if self._failed is not None:
                    return None
                e = self._entries.get(self._next)
                if e is not None and e.start is None and e.force is not None and self._highest > self._next:
                    force, e.force = e.force, None
                    try:
                        force()  # submits this sequence (the lock is reentrant), or ends the order
                    except Exception as error:  # noqa: BLE001 - a force must not stop the worker; it ends the order instead
                        self.fail(IpcError("ERR_NCCL", f"an earlier transfer could not be received to make way for a later one: {error}"))
                    continue
                if e is None or e.start is None:
                    if not block:
                        return None
                    self._cond.wait()
                    continue
                del self._entries[self._next]
                self._next += 1
                return e.start

    def fail(self, error: IpcError) -> None:
        """The communicator ended: every waiting transfer fails with ``error``, and so will later ones."""
        with self._cond:
            if self._failed is None:
                self._failed = error
            entries = list(self._entries.values())
            self._entries.clear()
            self._cond.notify_all()
        for e in entries:
            try:
                e.fail(error)
            except Exception as x:  # noqa: BLE001 - the others must still fail
                print(f"cuda_ipc: failing an NCCL transfer raised: {x!r}", file=sys.stderr)
