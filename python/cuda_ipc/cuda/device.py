"""CUDA devices, named by UUID across processes (ordinals change with CUDA_VISIBLE_DEVICES).

Everything cuda_ipc maps lives in the device's *primary* context, the one PyTorch, CuPy, Numba
and cuda.core use, so their kernels can touch it. Driver calls run with that context current and
leave the calling thread's current context as they found it.
"""
from __future__ import annotations

import ctypes
import os
import threading
from ctypes import byref, c_int

from . import driver as drv
from ..errors import IpcError

_lock = threading.Lock()
_devices: list["Device"] | None = None
_by_uuid: dict[str, "Device"] = {}


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
        devices = _devices if _devices is not None else Device.all()
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
        ctx = self._ctx
        if ctx is None:
            with self._ctx_lock:
                if self._ctx is None:
                    c = drv.CUcontext()
                    drv.driver().call("cuDevicePrimaryCtxRetain", byref(c), self._handle)
                    self._ctx = c.value or 0
                ctx = self._ctx
        return ctx

    def activate(self) -> "_Active":
        """``with device.activate():`` runs the block with this device's primary context current on
        the calling thread, and restores the thread's context after it."""
        return _Active(self.context)

    def can_access_peer(self, other: "Device") -> bool:
        """Whether kernels on this device can use memory that lives on ``other`` (cuDeviceCanAccessPeer)."""
        if other is self or other.uuid == self.uuid:
            return True
        v = c_int()
        drv.driver().call("cuDeviceCanAccessPeer", byref(v), self._handle, other._handle)
        return bool(v.value)

    def enable_peer_access(self, other: "Device") -> None:
        """Lets this device's context use allocations of ``other``'s context (idempotent)."""
        if other is self or other.uuid == self.uuid:
            return
        assert_peer_reachable(self, other)
        with self.activate():
            r = drv.driver().status("cuCtxEnablePeerAccess", drv.CUcontext(other.context), 0)
            if r not in (0, drv.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
                raise drv.driver().error(r, "cuCtxEnablePeerAccess")

    def synchronize(self) -> None:
        """Waits for all work queued in the primary context (every stream of PyTorch, CuPy, ...)."""
        with self.activate():
            drv.driver().call("cuCtxSynchronize")

    def __repr__(self) -> str:
        return f"<cuda_ipc.Device {self.ordinal} {self.name} {self.uuid}>"


# A CUcontext cell per thread for cuCtxGetCurrent's answer (made once, not per driver call).
_current = threading.local()


class _Active:
    """The context manager of Device.activate (a class: this runs on every driver call path)."""

    __slots__ = ("_ctx", "_pushed")

    def __init__(self, ctx: int):
        self._ctx = ctx
        self._pushed = False

    def __enter__(self) -> "_Active":
        d = drv.driver()
        cur = _current.__dict__.get("cell")
        if cur is None:
            cur = _current.cell = drv.CUcontext()
        d.call("cuCtxGetCurrent", byref(cur))
        if cur.value != self._ctx:
            d.call("cuCtxPushCurrent", drv.CUcontext(self._ctx))
            self._pushed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pushed:
            self._pushed = False
            popped = drv.CUcontext()
            drv.driver().call("cuCtxPopCurrent", byref(popped))


def assert_peer_reachable(user: Device, resident: Device) -> None:
    """Raises ERR_PEER_UNREACHABLE unless ``user`` can use memory that lives on ``resident``."""
    if user is resident or user.uuid == resident.uuid or user.can_access_peer(resident):
        return
    raise IpcError(
        "ERR_PEER_UNREACHABLE",
        f"GPU {user.ordinal} ({user.uuid}) cannot use memory that lives on GPU {resident.ordinal} ({resident.uuid}): the driver "
        "reports no peer access between them. Work on the device the memory lives on for it (spawn({ device }) in Node, "
        "set_working_device() here), or copy it through host memory",
    )


# ------------------------------------------------------------------------------------------------
# The working device: which GPU this process maps imported memory for (as Node's workingDevice()).
# Unset, an import maps the memory for the device it lives on; Node's spawn({ device }) sets it in the
# child through CUDA_IPC_DEVICE (the device's UUID); set_working_device() overrides the environment.

WORKING_DEVICE_ENV = "CUDA_IPC_DEVICE"
_working: Device | None = None
_working_from_env = True


def _normalize_uuid(uuid: str) -> str:
    u = uuid.strip().lower()
    return "GPU-" + u[4:] if u.startswith("gpu-") else u


def working_device() -> Device | None:
    """The device this process works on, if one was chosen: with set_working_device(), or by the
    parent (Node's spawn option ``device``, which sets CUDA_IPC_DEVICE to its UUID). None when none
    was: imports then use the device the memory lives on. Raises ERR_UNKNOWN_DEVICE when the parent
    named a GPU this process cannot see."""
    if not _working_from_env:
        return _working
    uuid = os.environ.get(WORKING_DEVICE_ENV)
    if not uuid:
        return None
    try:
        return Device.by_uuid(_normalize_uuid(uuid))
    except IpcError as e:
        raise IpcError(
            "ERR_UNKNOWN_DEVICE",
            f"this process was told to work on GPU {uuid} ({WORKING_DEVICE_ENV}, set by its parent's spawn({{ device }})), but {e}",
        ) from None


def set_working_device(device: "Device | str | None") -> None:
    """Chooses the device this process maps imported memory for (a Device or its UUID), wherever the
    memory lives; None goes back to mapping imports for the device the memory lives on. The
    environment (CUDA_IPC_DEVICE) is no longer consulted either way."""
    global _working, _working_from_env
    if isinstance(device, str):
        device = Device.by_uuid(_normalize_uuid(device))
    elif device is not None and not isinstance(device, Device):
        raise IpcError("ERR_INVALID_ARG", "set_working_device expects a Device, a device UUID ('GPU-...') or None")
    _working = device
    _working_from_env = False


def importing_device(resident: Device) -> Device:
    """The device an import of memory living on ``resident`` is mapped for: the working device, else
    ``resident``; checked for peer access."""
    user = working_device() or resident
    if user is not resident:
        assert_peer_reachable(user, resident)
    return user
