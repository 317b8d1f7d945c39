"""The per-process bound on memory held for received messages not yet consumed, across every link
(src/link/transport/received-memory.ts; issue 40). Each link's inbox counts the messages it read ahead of
receive() here; once the total reaches the bound, poll() and the reading a receive() does while it
waits for NCCL stop reading ahead on every link (the kernel, then the peers' senders, hold the
backlog) until receive() takes messages. receive() on a link with nothing read ahead still reads its
one message: the application asked for it. Nothing is dropped or refused for the bound.

The bound: ``set_max_received_bytes(n)``, else CUDA_IPC_MAX_RECEIVED_BYTES, else 1 GiB, as in Node.
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import NamedTuple

#: Default per-process bound (1 GiB): four default inbox bounds.
DEFAULT_MAX_RECEIVED_BYTES = 2**30


class ReceivedMemory(NamedTuple):
    """Bytes of received messages not consumed yet, the bound, and the most held so far."""

    held: int
    limit: int
    peak: int


def _limit_from_environment() -> int:
    text = os.environ.get("CUDA_IPC_MAX_RECEIVED_BYTES", "")
    if text == "":
        return DEFAULT_MAX_RECEIVED_BYTES
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n >= 1:
        return n
    warnings.warn(f"CUDA_IPC_MAX_RECEIVED_BYTES={text!r} is not a positive integer; the default "
                  f"({DEFAULT_MAX_RECEIVED_BYTES}) holds", RuntimeWarning, stacklevel=2)
    return DEFAULT_MAX_RECEIVED_BYTES


_lock = threading.Lock()
_limit = _limit_from_environment()
_held = 0
_peak = 0


def hold(nbytes: int) -> None:
    """Counts ``nbytes`` of a message read ahead (it arrived: never refused here)."""
    global _held, _peak
    if nbytes > 0:
        with _lock:
            _held += nbytes
            _peak = max(_peak, _held)


def release(nbytes: int) -> None:
    """``nbytes`` counted by hold() are no longer held."""
    global _held
    if nbytes > 0:
        with _lock:
            _held = max(0, _held - nbytes)


def bound_reached() -> bool:
    """Whether reading ahead stops on every link."""
    return _held >= _limit


def set_max_received_bytes(nbytes: int) -> None:
    """Sets the per-process bound on memory held for received messages not yet consumed, across all
    links (default 1 GiB, or CUDA_IPC_MAX_RECEIVED_BYTES). TypeError / ValueError for anything but a
    positive int."""
    global _limit
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"set_max_received_bytes: nbytes must be an int, got {type(nbytes).__name__}")
    if nbytes < 1:
        raise ValueError(f"set_max_received_bytes: nbytes must be at least 1, got {nbytes}")
    _limit = nbytes


def received_memory() -> ReceivedMemory:
    """This process against its bound (see set_max_received_bytes())."""
    return ReceivedMemory(_held, _limit, _peak)


def _reset_peak() -> None:
    """For tests: the peak starts again from what is held now."""
    global _peak
    with _lock:
        _peak = _held
