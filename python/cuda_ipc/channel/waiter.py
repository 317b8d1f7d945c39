"""How an end waits for the control block to change (src/channel/waiter.ts): spin briefly, then sleep
on its doorbell (an eventfd) and on its link to the hub, so that it notices the hub's death.

Wait modes: 'adaptive' (default): spin for up to ``spin_us`` (default 10) while recent waits mostly
ended within that bound, then sleep; 'sleep': never spin; 'spin': always spin ``spin_us`` (default
50) first. A sleep re-checks after WAIT_BACKSTOP even without a ring (a wake-up lost with a dying
waker).
"""
from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import IpcError
from .doorbells import eventfd_read, eventfd_write
from .layout import H_DATA_SEQ, H_DATA_SLEEPERS, H_SPACE_SEQ, H_SPACE_SLEEPERS

if TYPE_CHECKING:
    from ..link.connection.link import Link
    from .slot_ring import Ring
    from .shared_words import SharedWords

DEFAULT_ADAPTIVE_SPIN_US = 10
DEFAULT_SPIN_US = 50
MAX_SPIN_US = 100_000
#: A sleep re-checks after this long even without a ring (a wake-up lost with a dying waker).
WAIT_BACKSTOP = 1.0
_PROBE_EVERY = 16
_MIN_HIT_RATE = 0.3
_HIT_RATE_AFTER_HIT = 0.55


class WaitPolicy:
    __slots__ = ("mode", "spin")

    def __init__(self, wait: str, spin_us: float | None):
        if wait not in ("adaptive", "sleep", "spin"):
            raise IpcError("ERR_INVALID_ARG", f"wait must be 'adaptive', 'sleep' or 'spin'; got {wait!r}")
        if spin_us is None:
            spin_us = DEFAULT_SPIN_US if wait == "spin" else DEFAULT_ADAPTIVE_SPIN_US
        if not isinstance(spin_us, (int, float)) or not 0 <= spin_us <= MAX_SPIN_US:
            raise IpcError("ERR_INVALID_ARG", f"spin_us must be in 0..{MAX_SPIN_US}; got {spin_us!r}")
        self.mode = wait
        self.spin = spin_us / 1e6


class Waiter:
    """The waits of one end: ``park()`` spins, then sleeps on the doorbell ``bell`` of participant
    ``ring.me`` (and on the link to the hub once ``watch_link()`` named it). ``lock``: the end's
    lock, held by the caller of park(), released while sleeping."""

    def __init__(self, ring: Ring, words: SharedWords, bell: int, policy: WaitPolicy, role: str, lock: threading.RLock):
        self.ring = ring
        self.w = words
        self.policy = policy
        self.seq_off = H_DATA_SEQ if role == "consumer" else H_SPACE_SEQ
        self.sleepers_off = H_DATA_SLEEPERS if role == "consumer" else H_SPACE_SLEEPERS
        self.closed = False
        self._lock = lock
        self._bell = bell
        # Sleeps poll the doorbell and the link (select.poll objects, made once).
        self._poll_bell = select.poll()
        self._poll_bell.register(self._bell, select.POLLIN)
        self._poller = self._poll_bell
        self._link: Link | None = None
        self._link_fd = -1
        self._link_quiet_until = 0.0
        self._hits = 1.0
        self._waits = 0
        #: Counts of how waits ended (tests, benchmarks).
        self.stats = {"spin_hits": 0, "sleeps": 0, "rung": 0, "rescued": 0}

    def watch_link(self, link: Link) -> None:
        """Sleeps poll ``link`` too (the hub's: its closing is how this end learns the hub died)."""
        # Our own copy of the socket's fd: the link may close its own at any time.
        self._link = link
        self._link_fd = os.dup(link.fileno())
        self._poller = select.poll()
        self._poller.register(self._bell, select.POLLIN)
        self._poller.register(self._link_fd, select.POLLIN)

    def unwatch_link(self) -> None:
        self._link = None
        if self._link_fd >= 0:
            self._poller = self._poll_bell
            os.close(self._link_fd)
            self._link_fd = -1

    def park(self, ready: Callable[[], bool], deadline: float | None, limit: Callable[[float], float]) -> bool:
        """Returns once ``ready()`` may have become true (spin, then sleep on the doorbell and the hub
        link), or the deadline passed, or cancel() was called; True after a whole sleep (the caller
        runs its housekeeping then). ``limit(timeout)`` shortens a sleep for repairs that are due.
        Called with the end's lock held; releases it while sleeping."""
        w = self.w
        seq_off = self.seq_off
        seq = w.load32(seq_off)
        if ready():
            return False
        budget = self._budget()
        t0 = time.perf_counter() if self.policy.mode == "adaptive" else 0.0
        if budget > 0 and self.ring.spin_while(seq_off, seq, budget):
            self.stats["spin_hits"] += 1
            self._learn(True)
            return False
        self.ring.enter_sleep(self.sleepers_off)
        try:
            if ready() or self.closed:
                return False
            self.stats["sleeps"] += 1
            timeout = WAIT_BACKSTOP
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - time.monotonic()))
            timeout = limit(timeout)
            poller = self._poller
            if self._link_fd >= 0 and time.monotonic() < self._link_quiet_until:
                poller = self._poll_bell  # another thread reads the link: look at it again soon
                timeout = min(timeout, 0.01)
            self._lock.release()
            try:
                events = poller.poll(timeout * 1000)
            finally:
                self._lock.acquire()
            if self.closed:
                return False
            rung = False
            for fd, _ev in events:
                if fd == self._bell:
                    rung = True
                    try:
                        eventfd_read(self._bell)
                    except (BlockingIOError, OSError):
                        pass
                elif fd == self._link_fd:
                    self._poll_link()
            if rung:
                self.stats["rung"] += 1
            elif not events and ready():
                self.stats["rescued"] += 1
        finally:
            if not self.closed:
                self.ring.leave_sleep(self.sleepers_off)
                if t0:
                    self._learn(time.perf_counter() - t0 <= self.policy.spin)
        return True

    def _poll_link(self) -> None:
        link = self._link
        if link is None:
            return
        try:
            link.poll()
        except Exception:  # noqa: BLE001 - the link reports its own failures to its user
            pass
        if not link.closed:
            # Readable, yet nothing was read: another thread is in link.receive() and reads it.
            self._link_quiet_until = time.monotonic() + 0.01

    def _budget(self) -> float:
        p = self.policy
        if p.mode == "spin":
            return p.spin
        if p.mode == "sleep" or p.spin == 0:
            return 0.0
        if self._hits >= _MIN_HIT_RATE:
            return p.spin
        self._waits += 1
        return p.spin if self._waits % _PROBE_EVERY == 0 else 0.0

    def _learn(self, hit: bool) -> None:
        if hit:
            self._hits = max(self._hits + (1 - self._hits) / 8, _HIT_RATE_AFTER_HIT)
        else:
            self._hits -= self._hits / 8

    def cancel(self) -> None:
        """Ends a sleep of this end now, and every later one at once (close() from another thread)."""
        self.closed = True
        try:
            eventfd_write(self._bell, 1)
        except OSError:
            pass
