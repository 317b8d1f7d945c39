"""Refused connections, counted and reported coalesced (src/link/connect/refusal-report.ts): a flood of
connections that fail or go past a bound costs a counter each, and ``on_refused`` hears of them at
most once per interval. The first refusal after a quiet interval is reported at once, so a single
wrong token is heard as it happens. The Python listeners run in accept(), so a gathered report goes
out from there (accept() wakes for it)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from ...errors import IpcError

#: How many addresses a report names one by one; the rest are summed in ``other_sources``.
REPORT_SOURCES = 16
#: The default interval between two reports, in seconds.
REFUSED_INTERVAL = 1.0


@dataclass(frozen=True)
class RefusedReport:
    """Every connection refused since the previous report (at least one), as Node's RefusedReport; the
    callback gets the first of them as an IpcError beside it: ``on_refused(error, report)``."""

    #: Connections this report covers (the first error's included).
    count: int
    #: Counts by error code (ERR_AUTH_FAILED, ERR_FRAME_INVALID, ERR_TIMEOUT, ERR_LIMIT_REACHED, ...).
    by_code: dict[str, int]
    #: Counts by source (a remote address; an IPv6 one by its /64), the first 16 sources seen.
    by_source: dict[str, int]
    #: Refusals from sources past the 16 named.
    other_sources: int
    #: When the first and the last refusal happened (time.time()).
    first: float
    last: float


RefusedCallback = Callable[[IpcError, RefusedReport], None]


class RefusalReporter:
    def __init__(self, interval: float, callback: RefusedCallback | None):
        self._interval = interval
        self._callback = callback
        self._last_emit = float("-inf")
        self._count = 0
        self._by_code: dict[str, int] = {}
        self._by_source: dict[str, int] = {}
        self._other = 0
        self._error: IpcError | None = None
        self._first = 0.0
        self._last = 0.0
        #: Every refusal so far.
        self.total = 0
        # accept() notes refusals while close() may flush from another thread.
        self._lock = threading.Lock()

    def note(self, error: IpcError, source: str) -> None:
        with self._lock:
            self._note(error, source)
        if time.monotonic() >= self._last_emit + self._interval:
            self.flush()

    def _note(self, error: IpcError, source: str) -> None:
        self.total += 1
        if self._callback is None:
            return
        now = time.time()
        if self._error is None:
            self._error, self._first = error, now
        self._count += 1
        self._last = now
        self._by_code[error.code] = self._by_code.get(error.code, 0) + 1
        if source in self._by_source:
            self._by_source[source] += 1
        elif len(self._by_source) < REPORT_SOURCES:
            self._by_source[source] = 1
        else:
            self._other += 1

    def due(self) -> float | None:
        """When (time.monotonic()) the gathered report is to go out; None when nothing is gathered."""
        return None if self._error is None else self._last_emit + self._interval

    def flush(self) -> None:
        """Reports what is gathered now (nothing when nothing is)."""
        with self._lock:
            if self._error is None or self._callback is None:
                return
            error = self._error
            report = RefusedReport(self._count, self._by_code, self._by_source, self._other, self._first, self._last)
            self._count, self._by_code, self._by_source, self._other, self._error = 0, {}, {}, 0, None
            self._last_emit = time.monotonic()
        self._callback(error, report)
