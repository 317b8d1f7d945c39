"""Interprocess CUDA events a peer sent (src/ipc/event.ts): opened on the device they belong to, where
streams wait for them on the GPU and threads on the CPU.
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from ..cuda import driver as drv
from ..cuda.device import Device
from ..errors import IpcError
from ..leak import Resource

if TYPE_CHECKING:
    from ..leak import ReceivedLease


class IpcEvent(Resource):
    """An interprocess CUDA event a peer sent: ``wait(stream)`` makes a stream (an int handle, e.g.
    ``torch.cuda.current_stream().cuda_stream``) wait for it on the GPU; ``synchronize()`` waits on
    the CPU; ``close()`` releases it."""

    def __init__(self, handle_bytes: bytes, device_uuid: str, lease: ReceivedLease | None):
        self._bytes = handle_bytes
        self.device_uuid = device_uuid
        self._lease = lease
        self._event: int | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def handle(self) -> int:
        if self._closed:
            raise IpcError("ERR_CLOSED", "this event is closed")
        event = self._event
        if event is None:
            h = drv.CUipcEventHandle()
            ctypes.memmove(ctypes.addressof(h), self._bytes, 64)
            ev = drv.CUevent()
            with Device.by_uuid(self.device_uuid).activate():
                drv.driver().call("cuIpcOpenEventHandle", ctypes.byref(ev), h)
            event = self._event = ev.value or 0
        return event

    def wait(self, stream: int) -> None:
        with Device.by_uuid(self.device_uuid).activate():
            drv.driver().call("cuStreamWaitEvent", ctypes.c_void_p(stream), ctypes.c_void_p(self.handle), 0)

    def synchronize(self) -> None:
        with Device.by_uuid(self.device_uuid).activate():
            drv.driver().call("cuEventSynchronize", ctypes.c_void_p(self.handle))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ev, self._event = self._event, None
        try:
            if ev is not None:
                with Device.by_uuid(self.device_uuid).activate():
                    drv.driver().call("cuEventDestroy", ctypes.c_void_p(ev))
        finally:
            if self._lease is not None:
                self._lease.end()
