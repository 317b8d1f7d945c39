"""CUDA devices, named by UUID across processes (ordinals change with CUDA_VISIBLE_DEVICES).

Everything cuda_ipc maps lives in the device's *primary* context, the one PyTorch, CuPy, Numba
and cuda.core use, so their kernels can touch it. Driver calls run with that context current and
leave the calling thread's current context as they found it.
"""
from __future__ import annotations

import ctypes
import threading
from ctypes import byref, c_int

from . import driver as drv
from .errors import IpcError

_lock = threading.Lock()
_devices: list["Device"] | None = None
_by_uuid: dict = {}


def format_uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def uuid_bytes(uuid: str) -> bytes:
    if not isinstance(uuid, str) or not uuid.startswith("GPU-"):
        raise IpcError("ERR_INVALID_ARG", f"device UUID {uuid!r} must look like 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx'")
    raw = bytes.fromhex(uuid[4:].replace("-", ""))
    if len(raw) != 16:
        raise IpcError("ERR_INVALID_ARG", f"device UUID {uuid!r} must hold 16 bytes")
    return raw


class Device:
    """A CUDA device of this process: ``ordinal`` (this process's numbering), ``uuid``, ``name``."""

    def __init__(self, ordinal: int, handle: int, uuid: str, name: str):
        self.ordinal = ordinal
        self._handle = handle
        self.uuid = uuid
        self.name = name
        self._ctx: int | None = None
        self._ctx_lock = threading.Lock()

    @staticmethod
    def all() -> list["Device"]:
        global _devices
        with _lock:
            if _devices is None:
                d = drv.driver()
                n = c_int()
                d.call("cuDeviceGetCount", byref(n))
                found = []
                for i in range(n.value):
                    h = drv.CUdevice()
                    d.call("cuDeviceGet", byref(h), i)
                    u = drv.CUuuid()
                    d.call("cuDeviceGetUuid", byref(u), h)
                    name = ctypes.create_string_buffer(256)
                    d.call("cuDeviceGetName", name, 256, h)
                    found.append(Device(i, h.value, format_uuid(bytes(u.bytes)), name.value.decode(errors="replace")))
                _devices = found
            return list(_devices)

    @staticmethod
    def get(ordinal: int) -> "Device":
        devices = Device.all()
        if not 0 <= ordinal < len(devices):
            raise IpcError("ERR_UNKNOWN_DEVICE", f"there is no CUDA device {ordinal} in this process ({len(devices)} visible)")
        return devices[ordinal]

    @staticmethod
    def by_uuid(uuid: str) -> "Device":
        dev = _by_uuid.get(uuid)
        if dev is not None:
            return dev
        for dev in Device.all():
            if dev.uuid == uuid:
                _by_uuid[uuid] = dev
                return dev
        raise IpcError(
            "ERR_UNKNOWN_DEVICE",
            f"no visible CUDA device has the UUID {uuid}: it is hidden from this process (CUDA_VISIBLE_DEVICES) or on another machine",
        )

    @property
    def context(self) -> int:
        """The primary context (retained once, for the life of the process)."""
        if self._ctx is None:
            with self._ctx_lock:
                if self._ctx is None:
                    ctx = drv.CUcontext()
                    drv.driver().call("cuDevicePrimaryCtxRetain", byref(ctx), self._handle)
                    self._ctx = ctx.value
        return self._ctx

    def activate(self) -> "_Active":
        """``with device.activate():`` runs the block with this device's primary context current on
        the calling thread, and restores the thread's context after it."""
        return _Active(self.context)

    def synchronize(self) -> None:
        """Waits for all work queued in the primary context (every stream of PyTorch, CuPy, ...)."""
        with self.activate():
            drv.driver().call("cuCtxSynchronize")

    def __repr__(self) -> str:
        return f"<cuda_ipc.Device {self.ordinal} {self.name} {self.uuid}>"


class _Active:
    """The context manager of Device.activate (a class: this runs on every driver call path)."""

    __slots__ = ("_ctx", "_pushed")

    def __init__(self, ctx: int):
        self._ctx = ctx
        self._pushed = False

    def __enter__(self) -> "_Active":
        d = drv.driver()
        cur = drv.CUcontext()
        d.call("cuCtxGetCurrent", byref(cur))
        if cur.value != self._ctx:
            d.call("cuCtxPushCurrent", drv.CUcontext(self._ctx))
            self._pushed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._pushed:
            self._pushed = False
            popped = drv.CUcontext()
            drv.driver().call("cuCtxPopCurrent", byref(popped))
