"""Device memory of this process's own, as a DeviceBuffer of kind 'owned': where bytes received over
NCCL on a TCP link land when PyTorch is not there to allocate a tensor for them (a received
nccl-buffer, a tensor set fetched into memory of its own). cuMemAlloc in the device's primary
context; freed once the buffer and every slice of it are closed or collected (after the device's
queued work, unless closed with ``sync=False``). ``retain()``/``release()`` of its origin let a
transfer still writing into it keep it: the user closing it early frees nothing under NCCL.
"""
from __future__ import annotations

from ctypes import byref

from ..cuda import driver as drv
from ..cuda.device import Device
from .device_array import _CREATE, DeviceBuffer, _Origin


def allocate_device_buffer(nbytes: int, device: Device) -> DeviceBuffer:
    """``nbytes`` (> 0) of device memory on ``device``, owned by the returned buffer."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"nbytes must be a positive int, got {nbytes!r}")
    p = drv.CUdeviceptr()
    with device.activate():
        drv.driver().call("cuMemAlloc", byref(p), nbytes)
    base = p.value
    origin = _Origin("owned", None, device.uuid, nbytes)
    origin.base = base
    origin.user = device

    def free() -> None:
        with device.activate():
            drv.driver().call("cuMemFree", drv.CUdeviceptr(base))
    origin._unmap = free
    return DeviceBuffer(origin, 0, nbytes, _CREATE)


def hold(buffer: DeviceBuffer) -> None:
    """Keeps ``buffer``'s memory while a transfer writes into it (end with ``unhold``)."""
    buffer._origin.retain()


def unhold(buffer: DeviceBuffer) -> None:
    """The transfer is done with the memory (the stream passed it): it goes once nobody else uses it."""
    buffer._origin.release(sync=False)
