"""The device data path of a sharded sync for one node (src/tensors/sharded/device-copy.ts): a
destination's 'local' and 'ipc' runs in ONE launch of the copy_runs kernel (kernels.py, as
update_in_place uses it) on the destination's GPU. A strided run becomes one row per block; the
table is built and uploaded once per epoch (the mapped addresses stay while the epoch lasts), so
a repeated sync is one launch and one stream synchronize. A source's memory is read where the
destination mapped it (peer access where the GPUs differ: the tensor set's mapping)."""
from __future__ import annotations

import ctypes
from typing import Sequence

from ...cuda import driver as drv
from ...cuda.device import Device
from ...errors import IpcError
from .. import kernels
from .host_copy import CopyPair, DeviceMemory, RunMemory, check_run_bounds


def table_rows(pairs: Sequence[CopyPair], destinations: Sequence[RunMemory]) -> tuple[list[int], list[int], list[int]]:
    """(dst addresses, src addresses, sizes) of every block of every run, checked against the memories."""
    dst = [_device(m, "destination") for m in destinations]
    dsts: list[int] = []
    srcs: list[int] = []
    sizes: list[int] = []
    for cp in pairs:
        src = [_device(m, f"rank {cp.pair.src}'s source") for m in cp.sources]
        check_run_bounds(cp.pair, [m.extent for m in src], [m.extent for m in dst])
        for r in cp.pair.runs:
            d = dst[r.dst_tensor].pointer + r.dst_offset
            s = src[r.src_tensor].pointer + r.src_offset
            for i in range(r.count):
                dsts.append(d + i * r.dst_stride)
                srcs.append(s + i * r.src_stride)
                sizes.append(r.bytes)
    return dsts, srcs, sizes


class DeviceRunCopier:
    """Copies a destination's runs on GPU ``ordinal``: ``compile`` builds the table, ``copy`` uploads
    it once and launches it, then waits for the copies; ``close`` frees the device table."""

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self._table: kernels.RunTable | None = None
        self._device: kernels.DeviceTable | None = None
        self._stream = 0
        self.bytes = 0

    def compile(self, pairs: Sequence[CopyPair], destinations: Sequence[RunMemory]) -> None:
        dsts, srcs, sizes = table_rows(pairs, destinations)
        self._table = kernels.plan_runs(dsts, srcs, sizes)
        self.bytes = sum(sizes)

    def copy(self) -> int:
        table = self._table
        if table is None or table.runs == 0:
            return 0
        with Device.get(self.ordinal).activate():
            if not self._stream:
                h = ctypes.c_void_p()
                kernels.call("cuStreamCreate", ctypes.byref(h), 1)  # non-blocking: no wait on the legacy stream
                self._stream = h.value or 0
            if self._device is None:
                self._device = kernels.DeviceTable(self.ordinal)
            self._device.upload(table, self._stream)
            self._device.launch(table, self._stream)
            drv.driver().call("cuStreamSynchronize", ctypes.c_void_p(self._stream))
        return self.bytes

    def close(self) -> None:
        if self._device is not None:
            self._device.close()
            self._device = None
        if self._stream:
            try:
                with Device.get(self.ordinal).activate():
                    drv.driver().call("cuStreamDestroy", ctypes.c_void_p(self._stream))
            except Exception:  # noqa: BLE001 - the stream goes with the process anyway
                pass
            self._stream = 0
        self._table = None


def synchronize_sources(ordinal: int, stream: int | None = None) -> None:
    """A source's memory holds this sync's values once the work that wrote it is done: ``stream`` (a
    CUstream handle) synchronized where given, else the GPU's whole context."""
    with Device.get(ordinal).activate():
        if stream is None:
            drv.driver().call("cuCtxSynchronize")
        else:
            drv.driver().call("cuStreamSynchronize", ctypes.c_void_p(stream))


def _device(m: RunMemory, what: str) -> DeviceMemory:
    if not isinstance(m, DeviceMemory):
        raise IpcError("ERR_INVALID_ARG", f"the device copier was given host memory for a {what} tensor; a rank's memories are all "
                       "host or all on its GPU")
    return m
