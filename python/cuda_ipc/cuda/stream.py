"""CUDA streams and events the package makes for its own GPU work (the NCCL transfers of TCP links:
their streams, the order between them and the users' streams, and knowing when work finished), in
a device's primary context, every call checked. Each has an explicit ``close()``; one collected
unclosed is destroyed then.
"""
from __future__ import annotations

import sys
import weakref
from ctypes import byref, c_void_p
from typing import Any

from . import driver as drv
from ..errors import IpcError
from .device import Device

#: A stream as callers name it: None (the legacy default stream), an int CUstream, or a PyTorch, CuPy
#: or cuda.core stream object.
StreamLike = Any


def stream_handle(stream: StreamLike) -> int:
    """The CUstream of ``stream``: None (the legacy default stream, 0), an int handle, or a stream
    object of PyTorch (``cuda_stream``), cuda.core (``__cuda_stream__``) or CuPy (``ptr``)."""
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0:
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if callable(proto):
        return int(proto()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if v is not None:
            try:
                h = int(v)
            except (TypeError, ValueError):
                break
            if h >= 0:
                return h
            break
    raise IpcError("ERR_INVALID_ARG", f"stream must be None, an int CUstream, or a PyTorch, CuPy or cuda.core stream; got {type(stream).__qualname__}")


#: cuStreamCreate flags: the stream does not wait for the legacy default stream (nor it for this one).
CU_STREAM_NON_BLOCKING = 1
CU_EVENT_BLOCKING_SYNC = 1
CU_EVENT_DISABLE_TIMING = 2


def _destroy(device: Device, call: str, handle: int) -> None:
    try:
        with device.activate():
            drv.driver().call(call, c_void_p(handle))
    except Exception:  # noqa: BLE001 - at collection or interpreter exit: nothing to report to
        pass


class Stream:
    """A stream of this package's own on ``device`` (non-blocking: not ordered with the legacy default
    stream; order it with events)."""

    __slots__ = ("device", "handle", "_finalizer", "__weakref__")

    def __init__(self, device: Device, flags: int = CU_STREAM_NON_BLOCKING):
        self.device = device
        h = c_void_p()
        with device.activate():
            drv.call_extra("cuStreamCreate", byref(h), flags)
        self.handle: int = h.value or 0
        self._finalizer = weakref.finalize(self, _destroy, device, "cuStreamDestroy", self.handle)

    def wait(self, event: Event) -> None:
        """Work queued on this stream from now on waits for ``event`` (its last record)."""
        with self.device.activate():
            drv.driver().call("cuStreamWaitEvent", c_void_p(self.handle), c_void_p(event.handle), 0)

    def synchronize(self) -> None:
        with self.device.activate():
            drv.driver().call("cuStreamSynchronize", c_void_p(self.handle))

    def close(self) -> None:
        """Destroys the stream (work queued on it still runs to its end). Idempotent."""
        self._finalizer()


class Event:
    """An event on ``device`` without timing. ``blocking``: a thread in ``synchronize()`` sleeps
    instead of spinning (for waits that may be long: whole transfers)."""

    __slots__ = ("device", "handle", "_finalizer", "__weakref__")

    def __init__(self, device: Device, blocking: bool = False):
        self.device = device
        h = c_void_p()
        with device.activate():
            drv.call_extra("cuEventCreate", byref(h), CU_EVENT_DISABLE_TIMING | (CU_EVENT_BLOCKING_SYNC if blocking else 0))
        self.handle: int = h.value or 0
        self._finalizer = weakref.finalize(self, _destroy, device, "cuEventDestroy", self.handle)

    def record(self, stream: int) -> None:
        """Records the event on ``stream`` (a CUstream handle; 0 the legacy default stream)."""
        with self.device.activate():
            drv.call_extra("cuEventRecord", c_void_p(self.handle), c_void_p(stream))

    def synchronize(self) -> None:
        """Waits until the work before its last record finished (at once if never recorded)."""
        with self.device.activate():
            drv.driver().call("cuEventSynchronize", c_void_p(self.handle))

    def close(self) -> None:
        """Destroys the event (a wait queued on it still completes). Idempotent."""
        self._finalizer()


def producer_stream(obj: Any, ordinal: int) -> int | None:
    """The stream whose work produces ``obj`` as far as the object says: PyTorch's current stream
    of its device for a torch tensor, the ``stream`` of ``__cuda_array_interface__`` (1 and 2, the
    legacy and per-thread default streams, are valid CUstream handles too), else None (unknown: the
    caller synchronizes the device, as share() does)."""
    mod = type(obj).__module__ or ""
    if mod.startswith("torch") and hasattr(obj, "is_cuda"):
        torch = sys.modules["torch"]
        handle: int = torch.cuda.current_stream(ordinal).cuda_stream
        return handle
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict) and cai.get("stream") is not None:
        return int(cai["stream"])
    return None


def after_producer(device: Device, stream: int | None) -> Event | None:
    """An event recorded now on ``stream`` (the producer's), for another stream to wait on; with
    ``stream`` None the device is synchronized here instead (every stream's work so far) and None
    is returned."""
    if stream is None:
        device.synchronize()
        return None
    ev = Event(device)
    try:
        ev.record(stream)
    except BaseException:
        ev.close()
        raise
    return ev

