"""HostArray: a typed view (dtype, shape, byte strides) over shared host memory, the twin of Node's
HostArray. Tensor sets of host memory carry them both ways, so the tensor machinery (sets over links,
in-place updates) runs on machines without a GPU with the same code paths.

``memory`` is a memoryview of the bytes from the first element to the end of the last, ``values()``
a typed memoryview of a C-contiguous array (bfloat16 and float16 as raw 'H' bits, bool and float8 as
'B': memoryview has no half type), ``tolist()`` the elements in C order (float16 as floats); DLPack (kDLCPU) lets
``torch.from_dlpack`` / ``numpy.from_dlpack`` view it without a copy.
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

from ..ipc.descriptor import DTYPES, ArrayMeta, dtype_name, numel
from ..errors import IpcError
from ..host.host_buffer import HostBuffer

# struct format of each dtype's elements as memoryview.cast reads them.
FORMATS = {
    "int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q",
    "float16": "e", "bfloat16": "H", "float32": "f", "float64": "d", "bool": "B", "float8_e4m3fn": "B", "float8_e5m2": "B",
}

# memoryview.cast takes no 'e': float16 values() are their raw bits.
_VIEW_FORMATS = {"float16": "H"}


def c_offsets(shape: Sequence[int], strides: Sequence[int]) -> list[int]:
    """Byte offsets of the elements in C order."""
    out = [0]
    for n, s in zip(shape, strides):
        out = [o + i * s for o in out for i in range(n)]
    return out


class HostArray:
    """``HostArray(buffer, dtype, shape, strides=None, offset=0)``: ``shape`` elements of ``dtype`` at
    ``offset`` of a HostBuffer (strides in bytes; default C-contiguous). The array keeps the buffer
    (a view of it) and ``close()`` closes that view."""

    __slots__ = ("buffer", "meta", "__weakref__")

    def __init__(self, buffer: HostBuffer, dtype: object, shape: Sequence[int], strides: Sequence[int] | None = None, offset: int = 0):
        if not isinstance(buffer, HostBuffer):
            raise IpcError("ERR_INVALID_ARG", f"HostArray needs a HostBuffer, got {type(buffer).__qualname__}")
        meta = ArrayMeta.make(dtype_name(dtype), tuple(shape), strides)
        if offset < 0 or offset + meta.extent > buffer.nbytes or meta.extent == 0:
            raise IpcError("ERR_OUT_OF_RANGE", f"a {meta.dtype} array of shape {meta.shape} needs {meta.extent} bytes at offset {offset}; the buffer has {buffer.nbytes}")
        self.buffer = buffer.view(offset, meta.extent)
        self.meta = meta

    @staticmethod
    def allocate(dtype: object, shape: Sequence[int]) -> "HostArray":
        """A zeroed C-contiguous array in its own shared memory."""
        meta = ArrayMeta.make(dtype_name(dtype), tuple(shape))
        buf = HostBuffer.allocate(max(meta.extent, 1))
        try:
            return HostArray(buf, meta.dtype, meta.shape)
        finally:
            buf.close()

    @property
    def dtype(self) -> str:
        return self.meta.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.meta.shape

    @property
    def strides(self) -> tuple[int, ...]:
        return self.meta.strides

    @property
    def size(self) -> int:
        return numel(self.meta.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.meta.itemsize

    @property
    def memory(self) -> memoryview:
        """The bytes from the first element to the end of the last (no copy)."""
        return self.buffer.memory

    def values(self) -> memoryview:
        """A typed memoryview of a C-contiguous array (no copy; writes go to the shared memory)."""
        if not self.meta.c_contiguous:
            raise IpcError("ERR_INVALID_ARG", f"values() needs a C-contiguous array; this one has strides {self.meta.strides}: use tolist()")
        fmt = _VIEW_FORMATS.get(self.meta.dtype, FORMATS[self.meta.dtype])
        mem = self.buffer.memory
        return mem.cast(fmt, list(self.meta.shape)) if len(self.meta.shape) > 1 else mem.cast(fmt)

    def tolist(self) -> list[Any]:
        """The elements in C order, flat (raw bits for bfloat16 and float8)."""
        fmt = FORMATS[self.meta.dtype]
        mem = self.buffer.memory
        unpack = struct.Struct("<" + fmt).unpack_from
        return [unpack(mem, o)[0] for o in c_offsets(self.meta.shape, self.meta.strides)]

    def close(self) -> None:
        self.buffer.close()

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: bool | None = None) -> object:
        from ..dlpack import DL_CPU, make_capsule
        if copy:
            raise BufferError("HostArray.__dlpack__: copy=True is not supported; it shares memory")
        m = self.buffer._check()
        arr = (ctypes.c_char * self.buffer.nbytes).from_buffer(m.mmap, self.buffer.offset)
        meta = self.meta
        typestr = meta.typestr if meta.typestr != "|V1" else "|u1"  # float8: its bytes (view them with .view(dtype))
        return make_capsule(ctypes.addressof(arr), (DL_CPU, 0), typestr, meta.shape,
                            None if meta.c_contiguous else meta.strides, owner=(arr, self))

    def __dlpack_device__(self) -> tuple[int, int]:
        from ..dlpack import DL_CPU
        return (DL_CPU, 0)

    def __repr__(self) -> str:
        return f"<cuda_ipc.HostArray {self.meta.dtype}{list(self.meta.shape)}>"


assert set(FORMATS) == set(DTYPES), "every dtype needs a struct format"
