"""The copy kernels of the tensor layer (kernels/tensors.cu, shipped as PTX next to this module) and the
driver entry points update.py needs beyond driver.py's.

``copy_runs`` copies many runs of bytes (the contiguous pairs of an in-place update) in one launch: a
table of 32-byte rows ``(dst, src, bytes, first_chunk)`` in device memory, blocks taking tiles of up
to 16 chunks of ``CHUNK_BYTES`` grid-stride. ``plan_runs`` builds that table on the host (no driver needed, so the CPU
tests check it); ``DeviceTable`` keeps one uploaded per update plan, so that a repeated update of the
same tensors uploads nothing and is one launch. src/tensors/kernels.ts is the Node side of the same.
"""
from __future__ import annotations

import ctypes
import struct
import threading
import weakref
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
from pathlib import Path
from typing import Any, NamedTuple

from ..cuda import driver as drv
from ..cuda.device import Device
from ..errors import CudaError

#: Bytes per chunk of a run (a multiple of 16: every chunk starts as aligned as its run).
CHUNK_BYTES = 64 << 10
#: Threads per block of copy_runs.
BLOCK_THREADS = 256
#: Blocks per SM of a copy_runs launch (at most; fewer where there are fewer chunks).
BLOCKS_PER_SM = 4
#: One row of the table (struct CopyRun in kernels/tensors.cu).
ROW = struct.Struct("<QQQQ")
#: The PTX, a copy of kernels/tensors.ptx (scripts/gen-ptx.sh writes both; a test checks they agree).
PTX_FILE = Path(__file__).parent.parent / "tensors.ptx"

# ------------------------------------------------------------------------------------------------
# Driver entry points beyond the driver's table: cuda/driver.py resolves them (extra_entry, call_extra).

entry = drv.extra_entry
call = drv.call_extra
CUmemcpyAttributes = drv.CUmemcpyAttributes
CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = drv.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
CU_EVENT_DISABLE_TIMING = 2
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16


# ------------------------------------------------------------------------------------------------
# The table (host side, no driver)


class RunTable(NamedTuple):
    #: the rows, ROW.size bytes each
    data: bytes
    #: rows in the table (runs after splitting; zero-length runs dropped)
    runs: int
    #: chunks over all rows: the launch's work items
    chunks: int


def plan_runs(dsts: list[int], srcs: list[int], sizes: list[int], chunk_bytes: int = CHUNK_BYTES) -> RunTable:
    """The copy_runs table for dsts[i] <- srcs[i], sizes[i] bytes. A run whose two addresses share a
    misalignment (the same address mod 16, not 0) is split: its head up to the next 16-byte boundary in
    a row of its own, so that the rest is copied with 16-byte loads. Zero-byte runs are left out."""
    if chunk_bytes <= 0 or chunk_bytes % 16:
        raise ValueError(f"chunk_bytes must be a positive multiple of 16, got {chunk_bytes}")
    out = bytearray()
    pack = ROW.pack
    chunks = 0
    rows = 0
    for d, s, n in zip(dsts, srcs, sizes):
        if n <= 0:
            continue
        mis = d & 15
        if mis and mis == (s & 15):
            head = min(16 - mis, n)
            out += pack(d, s, head, chunks)
            chunks += 1
            rows += 1
            d, s, n = d + head, s + head, n - head
            if n == 0:
                continue
        out += pack(d, s, n, chunks)
        chunks += -(-n // chunk_bytes)
        rows += 1
    return RunTable(bytes(out), rows, chunks)


def grid_for(chunks: int, multiprocessors: int) -> int:
    """Blocks of a copy_runs launch: enough to fill every SM, never more than there are chunks."""
    return max(1, min(chunks, multiprocessors * BLOCKS_PER_SM))


# ------------------------------------------------------------------------------------------------
# The module, per device


_functions: dict[int, int] = {}
_sms: dict[int, int] = {}
_functions_lock = threading.Lock()


def copy_runs_function(ordinal: int) -> tuple[int, int]:
    """(the copy_runs CUfunction, the device's SM count); the device's context must be current."""
    with _functions_lock:
        f = _functions.get(ordinal)
        if f is None:
            try:
                ptx = PTX_FILE.read_bytes() + b"\0"
            except OSError as e:
                raise CudaError(-1, "CUDA_ERROR_FILE_NOT_FOUND",
                                f"the copy kernels' PTX {PTX_FILE} is missing ({e}): reinstall cuda_ipc", "open(tensors.ptx)") from None
            buf = ctypes.create_string_buffer(ptx, len(ptx))
            module = c_void_p()
            call("cuModuleLoadData", byref(module), buf)
            fn = c_void_p()
            call("cuModuleGetFunction", byref(fn), module, b"copy_runs")
            n = c_int()
            dev = drv.CUdevice()
            drv.driver().call("cuDeviceGet", byref(dev), ordinal)
            drv.driver().call("cuDeviceGetAttribute", byref(n), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
            f = _functions[ordinal] = fn.value or 0
            _sms[ordinal] = n.value
        return f, _sms[ordinal]


class _TableState:
    """The device side of a DeviceTable, freed by a finalizer (so it holds no reference to its owner)."""

    __slots__ = ("ordinal", "ptr", "capacity", "event", "recorded")

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self.ptr = 0
        self.capacity = 0
        self.event = 0
        self.recorded = False

    def wait(self) -> None:
        """Until the last launch that read the table finished."""
        if self.recorded:
            drv.driver().call("cuEventSynchronize", c_void_p(self.event))
            self.recorded = False

    def free(self) -> None:
        try:
            with Device.get(self.ordinal).activate():
                self.wait()
                if self.ptr:
                    drv.driver().call("cuMemFree", drv.CUdeviceptr(self.ptr))
                if self.event:
                    drv.driver().call("cuEventDestroy", c_void_p(self.event))
        except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone; the process ends anyway
            pass
        self.ptr = self.capacity = self.event = 0


class DeviceTable:
    """A RunTable uploaded to one device, kept while the same table is launched again: ``launch`` uploads
    only when the rows changed (after the last launch that read them finished), then launches once and
    records an event. ``close()`` (or the finalizer) frees the device memory."""

    def __init__(self, ordinal: int):
        self._state = _TableState(ordinal)
        self._data = b""
        self._args: tuple[Any, ...] | None = None
        self._finalizer = weakref.finalize(self, self._state.free)

    def upload(self, table: RunTable, stream: int) -> bool:
        """Makes the device rows ``table``'s; True when that took a copy. The device's context must be current."""
        st = self._state
        if table.data is self._data or table.data == self._data:
            return False
        st.wait()  # the previous launch still reads the old rows
        self._data = b""  # until the upload below went out: a failure leaves the device rows unknown
        self._args = None
        if st.capacity < len(table.data):
            if st.ptr:
                drv.driver().call("cuMemFree", drv.CUdeviceptr(st.ptr))
                st.ptr = st.capacity = 0
            p = drv.CUdeviceptr()
            drv.driver().call("cuMemAlloc", byref(p), max(len(table.data), 4096))
            st.ptr, st.capacity = p.value or 0, max(len(table.data), 4096)
        if table.data:
            call("cuMemcpyHtoDAsync", c_uint64(st.ptr), table.data, c_size_t(len(table.data)), c_void_p(stream))
        self._data = table.data
        self._args = None
        return True

    def launch(self, table: RunTable, stream: int) -> None:
        """One copy_runs launch over the uploaded rows (upload first) on ``stream``."""
        st = self._state
        if table.runs == 0:
            return
        fn, sms = copy_runs_function(st.ordinal)
        if self._args is None:
            values = (c_uint64(st.ptr), ctypes.c_uint32(table.runs), c_uint64(table.chunks), c_uint64(CHUNK_BYTES))
            pointers = (c_void_p * 4)(*[ctypes.addressof(v) for v in values])
            self._args = (values, pointers, grid_for(table.chunks, sms))
        _, pointers, grid = self._args
        call("cuLaunchKernel", c_void_p(fn), grid, 1, 1, BLOCK_THREADS, 1, 1, 0, c_void_p(stream), pointers, None)
        if not st.event:
            ev = c_void_p()
            call("cuEventCreate", byref(ev), CU_EVENT_DISABLE_TIMING)
            st.event = ev.value or 0
        call("cuEventRecord", c_void_p(st.event), c_void_p(stream))
        st.recorded = True

    def close(self) -> None:
        self._finalizer()
