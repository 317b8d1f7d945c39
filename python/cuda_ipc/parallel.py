"""A few threads for driver calls that take long and release the GIL (ctypes calls do): the legacy
IPC handle opens of a tensor set's first sync (cuIpcOpenMemHandle, ~90 us each on an H100) and the
handle asks of its sender (cuIpcGetMemHandle). Several at once, where the driver lets them run at
once; one after the other otherwise, at no extra cost but a thread handoff.

``CUDA_IPC_DRIVER_THREADS`` sets how many (default 8; 1: none, everything on the calling thread).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Fewer items than this run on the calling thread.
PARALLEL_FROM = 8

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def threads() -> int:
    """How many threads driver calls may use (CUDA_IPC_DRIVER_THREADS, default 8)."""
    try:
        n = int(os.environ.get("CUDA_IPC_DRIVER_THREADS", "8"))
    except ValueError:
        n = 8
    return max(1, min(n, 64))


def each(fn: Callable[[T], R], items: Sequence[T]) -> list[R | BaseException]:
    """``fn(x)`` for every item, on up to threads() threads when there are many, in item order: its
    result, or the exception it raised (every call runs; the caller undoes what succeeded, if it
    must, and raises)."""
    def one(x: T) -> R | BaseException:
        try:
            return fn(x)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            return e
    n = threads()
    if n == 1 or len(items) < PARALLEL_FROM:
        return [one(x) for x in items]
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size != n:  # (a changed setting: a new pool; the old one's threads end)
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool, _pool_size = ThreadPoolExecutor(max_workers=n, thread_name_prefix="cuda_ipc-driver"), n
        pool = _pool
    return list(pool.map(one, items))
