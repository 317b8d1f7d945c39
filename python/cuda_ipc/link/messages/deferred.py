"""Values whose bytes are still arriving when their message is decoded (src/link/messages/handlers.ts
DeferredValue): a transfer handler's ``decode()`` returns ``DeferredValue(value, ready)`` for a value
that is not usable yet (device memory received over NCCL), and the link hands the message to
``receive()`` only once ``ready`` settled: done, or failed (then the message fails with that error
and its values are disposed of). Messages behind it wait in order.

``Completion`` is the settle-once signal used for that and by the NCCL layer for its transfers: any
thread may settle it, any thread may wait for it, and callbacks run once on the settling thread.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any


class Completion:
    """Settles once: done (``error`` None) or failed with ``error``. ``add_callback(fn)`` runs
    ``fn(self)`` once it settled (at once when it has); ``wait(timeout)`` blocks until then."""

    __slots__ = ("_lock", "_event", "_settled", "_error", "_callbacks")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._settled = False
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Completion], None]] = []

    @property
    def settled(self) -> bool:
        return self._settled

    @property
    def error(self) -> BaseException | None:
        """Why it failed (None while pending or when done)."""
        return self._error

    def settle(self, error: BaseException | None = None) -> bool:
        """Done (``error`` None) or failed; False when it had settled already (this call changes nothing)."""
        with self._lock:
            if self._settled:
                return False
            self._settled = True
            self._error = error
            callbacks, self._callbacks = self._callbacks, []
        self._event.set()
        for fn in callbacks:
            _run(fn, self)
        return True

    def add_callback(self, fn: Callable[[Completion], None]) -> None:
        with self._lock:
            if not self._settled:
                self._callbacks.append(fn)
                return
        _run(fn, self)

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it settled within ``timeout`` seconds (None: as long as it takes)."""
        return self._event.wait(timeout)

    def result(self, timeout: float | None = None) -> None:
        """Waits, then raises its error if it failed; TimeoutError when it did not settle in time."""
        if not self._event.wait(timeout):
            raise TimeoutError
        if self._error is not None:
            raise self._error

    def __repr__(self) -> str:
        state = "pending" if not self._settled else "done" if self._error is None else f"failed: {self._error}"
        return f"<Completion {state}>"


def _run(fn: Callable[[Completion], None], c: Completion) -> None:
    try:
        fn(c)
    except Exception as e:  # noqa: BLE001 - one callback failing must not stop the others
        print(f"cuda_ipc: a completion callback failed: {e!r}", file=sys.stderr)


class DeferredValue:
    """What ``decode()`` returns for a value still arriving: the link puts ``value`` in the message and
    delivers the message once ``ready`` settled (failed: the message fails with its error)."""

    __slots__ = ("value", "ready")

    def __init__(self, value: Any, ready: Completion):
        self.value = value
        self.ready = ready


class PendingMessage:
    """A decoded message in the inbox whose deferred values are still arriving (see inbox.py)."""

    __slots__ = ("value", "owned", "waits")

    def __init__(self, value: Any, owned: list[object] | None, waits: list[Completion]):
        self.value = value
        self.owned = owned
        self.waits = waits

    def unsettled(self) -> Completion | None:
        """The first of its values still arriving, or None once all settled."""
        for w in self.waits:
            if not w.settled:
                return w
        return None

    def failure(self) -> BaseException | None:
        for w in self.waits:
            if w.error is not None:
                return w.error
        return None
