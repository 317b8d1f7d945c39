"""Device slots: GPU work on a slot is ordered across processes by 32-bit fence words in the channel's
control block (docs/channel-protocol.md section 7; the Node side is src/channel/fences.ts). This
process registers the block with the GPU (cuMemHostRegister, PORTABLE | DEVICEMAP), and its streams
raise fences (cuStreamWriteValue32, a memory barrier before the write) and wait for them
(cuStreamWaitValue32, GEQ), with no CPU wait in between.

Values are tickets compared as wrapping counters: value v is reached when (word - v) as int32 >= 0.
A wait already reached is skipped, and a fence whose stream has nothing queued (cuStreamQuery) is
written by the CPU at once: each stream memory operation costs about 2 us of driver time.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from ctypes import byref, c_void_p
from typing import TYPE_CHECKING

from ..cuda import driver as drv
from ..cuda.stream import StreamLike, stream_handle as stream_handle  # the stream forms every cuda_ipc call accepts
from ..errors import IpcError

if TYPE_CHECKING:
    from ..cuda.device import Device
    from .shared_words import SharedWords


#: A stream as callers name it (cuda/stream.py).
Stream = StreamLike


def fence_reached(word: int, value: int) -> bool:
    """True when a fence holding ``word`` has reached ``value`` (wrapping comparison)."""
    return ((word - value) & 0xFFFFFFFF) < 0x80000000


class Fences:
    """The control block's fence words, registered with the GPU for ``device`` (a cuda_ipc Device)."""

    def __init__(self, device: Device, words: SharedWords):
        self.device = device
        self._words = words
        d = drv.driver()
        self._host = words.address
        with device.activate():
            d.call("cuMemHostRegister", c_void_p(self._host), words.length,
                   drv.CU_MEMHOSTREGISTER_PORTABLE | drv.CU_MEMHOSTREGISTER_DEVICEMAP)
            try:
                p = drv.CUdeviceptr()
                d.call("cuMemHostGetDevicePointer", byref(p), c_void_p(self._host), 0)
            except BaseException:
                d.call("cuMemHostUnregister", c_void_p(self._host))
                raise
        self._base = p.value
        self._registered = True
        #: Stream operations were queued (close() then waits for the device before unregistering).
        self.queued = False
        self._d = d
        self._query = d._raw("cuStreamQuery")
        self._wait = d._raw("cuStreamWaitValue32")
        self._write = d._raw("cuStreamWriteValue32")

    def reached(self, off: int, value: int) -> bool:
        return fence_reached(self._words.load32(off), value)

    def signal(self, stream: Stream, off: int, value: int) -> None:
        """Writes ``value`` into the fence at ``off`` once the work queued on ``stream`` so far is
        done: from the CPU now when the stream is idle, else by the stream."""
        h = stream_handle(stream)
        with self.device.activate():
            r = self._query(h)
            if r == 0:
                self._words.store32(off, value)
                return
            if r != drv.CUDA_ERROR_NOT_READY:
                raise self._d.error(r, "cuStreamQuery")
            r = self._write(h, self._base + off, value & 0xFFFFFFFF, drv.CU_STREAM_WRITE_VALUE_DEFAULT)
            if r != 0:
                raise self._d.error(r, "cuStreamWriteValue32")
            self.queued = True

    def wait_on(self, stream: Stream, off: int, value: int) -> None:
        """Work queued on ``stream`` after this waits until the fence at ``off`` reaches ``value``."""
        if self.reached(off, value):
            return
        h = stream_handle(stream)
        with self.device.activate():
            r = self._wait(h, self._base + off, value & 0xFFFFFFFF, drv.CU_STREAM_WAIT_VALUE_GEQ)
            if r != 0:
                raise self._d.error(r, "cuStreamWaitValue32")
            self.queued = True

    def synchronize(self, waits: Iterable[tuple[int, int]], timeout: float | None, service: Callable[[], None] | None = None) -> None:
        """Waits on this thread until every (offset, value) fence is reached (ERR_TIMEOUT after
        ``timeout`` seconds). ``service()`` runs now and then (the channel's housekeeping)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0
        for off, value in waits:
            while not self.reached(off, value):
                if deadline is not None and time.monotonic() >= deadline:
                    raise IpcError("ERR_TIMEOUT", "the channel's GPU work (a fence) did not complete within the timeout")
                if service is not None:
                    service()
                # Microseconds at first (a kernel about to finish), backing off to a millisecond.
                pause = min(max(pause * 2, 20e-6), 1e-3)
                time.sleep(pause)

    def raise_(self, off: int, value: int) -> None:
        """From the CPU: raises the fence at ``off`` to ``value`` unless it is there or past it (for a
        participant whose process is gone: the writes it queued will never run)."""
        w = self._words
        for _ in range(64):
            cur = w.load32(off)
            if fence_reached(cur, value):
                return
            if w.cas32(off, cur, value) == cur:
                return

    def close(self) -> None:
        """Unregisters the control block (after the device finished the stream operations on it)."""
        if not self._registered:
            return
        self._registered = False
        with self.device.activate():
            if self.queued:
                self._d.call("cuCtxSynchronize")
            self._d.call("cuMemHostUnregister", c_void_p(self._host))
