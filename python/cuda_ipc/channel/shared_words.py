"""Sequentially consistent atomics on the 32- and 64-bit words of a shared mapping (a channel's
control block), from the standard library: libatomic's sized functions through ctypes for the
read-modify-writes and stores, as docs/channel-protocol.md says.

Loads: on x86-64 a sequentially consistent load is a plain ``mov`` (the compilers' mapping, which
Node's ``Atomics.load`` and the addon use too), and an aligned 4- or 8-byte read through a
memoryview is exactly that, at a tenth of a ctypes call. On other machines loads go through
libatomic as well. Stores always go through libatomic (``xchg`` on x86-64: a plain store could be
reordered after a later load, which the doorbell protocol forbids).

64-bit values are positions and counters below 2^53; a larger stored value reads as -1 (corrupt),
as on the Node side. Offsets are checked against the mapping on every call: a bad one raises
IndexError, never touches memory outside it.
"""
from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable
from ctypes import byref, c_int, c_uint32, c_uint64, c_void_p

from typing import Any

from ..errors import IpcError

SEQ_CST = 5
MAX_U53 = 2**53
_FAST_LOADS = platform.machine().lower() in ("x86_64", "amd64")

_lib: ctypes.CDLL | None = None


def _libatomic() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libatomic.so.1")
        except OSError as e:
            raise IpcError("ERR_UNSUPPORTED", f"channels need libatomic.so.1 for their shared atomics ({e}); install it (Debian/Ubuntu: apt install libatomic1)") from None
        for name, res, args in (
            ("__atomic_load_4", c_uint32, [c_void_p, c_int]),
            ("__atomic_load_8", c_uint64, [c_void_p, c_int]),
            ("__atomic_store_4", None, [c_void_p, c_uint32, c_int]),
            ("__atomic_store_8", None, [c_void_p, c_uint64, c_int]),
            ("__atomic_compare_exchange_4", ctypes.c_bool, [c_void_p, c_void_p, c_uint32, c_int, c_int]),
            ("__atomic_compare_exchange_8", ctypes.c_bool, [c_void_p, c_void_p, c_uint64, c_int, c_int]),
            ("__atomic_fetch_add_4", c_uint32, [c_void_p, c_uint32, c_int]),
            ("__atomic_fetch_add_8", c_uint64, [c_void_p, c_uint64, c_int]),
            ("__atomic_fetch_and_4", c_uint32, [c_void_p, c_uint32, c_int]),
            ("__atomic_fetch_or_4", c_uint32, [c_void_p, c_uint32, c_int]),
        ):
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        _lib = lib
    return _lib


class SharedWords:
    """Atomics on the words of ``buffer`` (an mmap or another writable buffer, 8-byte aligned),
    ``length`` bytes from its start. Keeps the buffer exported (it cannot be closed) until close()."""

    __slots__ = ("length", "_anchor", "_base", "_bytes", "_u32", "_u64", "_n32", "_n64", "_load4", "_load8", "_store4", "_store8",
                 "_cas4", "_cas8", "_add4", "_add8", "_and4", "_or4", "__weakref__")
    length: int
    _anchor: Any  # the ctypes array over the buffer (None once closed)
    _base: int
    _bytes: memoryview
    _u32: memoryview
    _u64: memoryview
    _n32: int
    _n64: int
    # libatomic's functions: (address, ..., memory order) -> the old value, or None for stores.
    _load4: Callable[[int, int], int]
    _load8: Callable[[int, int], int]
    _store4: Callable[[int, int, int], None]
    _store8: Callable[[int, int, int], None]
    _cas4: Callable[[int, Any, int, int, int], bool]
    _cas8: Callable[[int, Any, int, int, int], bool]
    _add4: Callable[[int, int, int], int]
    _add8: Callable[[int, int, int], int]
    _and4: Callable[[int, int, int], int]
    _or4: Callable[[int, int, int], int]

    def __init__(self, buffer: Any, length: int):
        lib = _libatomic()
        if length <= 0 or length % 8:
            raise ValueError("shared words: the length must be a positive multiple of 8")
        self._anchor = (ctypes.c_char * length).from_buffer(buffer)
        self._base = ctypes.addressof(self._anchor)
        if self._base % 8:
            raise ValueError("shared words: the buffer is not 8-byte aligned")
        self.length = length
        mv = memoryview(self._anchor).cast("B")
        self._bytes = mv
        self._u32 = mv.cast("I")
        self._u64 = mv.cast("Q")
        self._n32 = length // 4
        self._n64 = length // 8
        self._load4 = getattr(lib, "__atomic_load_4")
        self._load8 = getattr(lib, "__atomic_load_8")
        self._store4 = getattr(lib, "__atomic_store_4")
        self._store8 = getattr(lib, "__atomic_store_8")
        self._cas4 = getattr(lib, "__atomic_compare_exchange_4")
        self._cas8 = getattr(lib, "__atomic_compare_exchange_8")
        self._add4 = getattr(lib, "__atomic_fetch_add_4")
        self._add8 = getattr(lib, "__atomic_fetch_add_8")
        self._and4 = getattr(lib, "__atomic_fetch_and_4")
        self._or4 = getattr(lib, "__atomic_fetch_or_4")

    @property
    def address(self) -> int:
        """Where the words start in this process."""
        return self._base

    def _a32(self, off: int) -> int:
        if off & 3 or not 0 <= off < self.length:
            raise IndexError(f"shared word at {off} is outside the {self.length} bytes, or not aligned")
        return self._base + off

    def _a64(self, off: int) -> int:
        if off & 7 or not 0 <= off < self.length:
            raise IndexError(f"shared word at {off} is outside the {self.length} bytes, or not aligned")
        return self._base + off

    # -- 32-bit --

    if _FAST_LOADS:
        def load32(self, off: int) -> int:
            if off & 3:
                raise IndexError(f"shared word at {off} is not aligned")
            return self._u32[off >> 2]

        def load64(self, off: int) -> int:
            if off & 7:
                raise IndexError(f"shared word at {off} is not aligned")
            v = self._u64[off >> 3]
            return v if v <= MAX_U53 else -1
    else:  # pragma: no cover - other architectures
        def load32(self, off: int) -> int:
            return self._load4(self._a32(off), SEQ_CST)

        def load64(self, off: int) -> int:
            v = self._load8(self._a64(off), SEQ_CST)
            return v if v <= MAX_U53 else -1

    def store32(self, off: int, value: int) -> None:
        self._store4(self._a32(off), value & 0xFFFFFFFF, SEQ_CST)

    def cas32(self, off: int, expected: int, desired: int) -> int:
        """Compare-and-swap; returns the value seen (== expected when it swapped)."""
        e = c_uint32(expected & 0xFFFFFFFF)
        self._cas4(self._a32(off), byref(e), desired & 0xFFFFFFFF, SEQ_CST, SEQ_CST)
        return e.value

    def add32(self, off: int, delta: int) -> int:
        return self._add4(self._a32(off), delta & 0xFFFFFFFF, SEQ_CST)

    def and32(self, off: int, mask: int) -> int:
        return self._and4(self._a32(off), mask & 0xFFFFFFFF, SEQ_CST)

    def or32(self, off: int, mask: int) -> int:
        return self._or4(self._a32(off), mask & 0xFFFFFFFF, SEQ_CST)

    # -- 64-bit (values below 2^53) --

    def store64(self, off: int, value: int) -> None:
        if not 0 <= value <= MAX_U53:
            raise ValueError("a 64-bit shared word holds 0..2^53")
        self._store8(self._a64(off), value, SEQ_CST)

    def cas64(self, off: int, expected: int, desired: int) -> int:
        if not (0 <= expected <= MAX_U53 and 0 <= desired <= MAX_U53):
            raise ValueError("a 64-bit shared word holds 0..2^53")
        e = c_uint64(expected)
        self._cas8(self._a64(off), byref(e), desired, SEQ_CST, SEQ_CST)
        v = e.value
        return v if v <= MAX_U53 else -1

    def add64(self, off: int, delta: int) -> int:
        v = self._add8(self._a64(off), delta & 0xFFFFFFFFFFFFFFFF, SEQ_CST)
        return v if v <= MAX_U53 else -1

    # -- plain access (fields only their owner writes) --

    def plain32(self, off: int) -> int:
        return self._u32[off >> 2]

    def set_plain32(self, off: int, value: int) -> None:
        self._u32[off >> 2] = value & 0xFFFFFFFF

    # -- bytes (a slot record's meta: only its publisher writes them, before it publishes) --

    def read_bytes(self, off: int, n: int) -> bytes:
        return bytes(self._bytes[off:off + n])

    def write_bytes(self, off: int, data: bytes) -> None:
        self._bytes[off:off + len(data)] = data

    def close(self) -> None:
        """Lets go of the buffer (its mapping may close after this). Every later call fails."""
        u32, u64, b = self._u32, self._u64, self._bytes
        self._u32 = self._u64 = self._bytes = memoryview(b"")
        self.length = 0
        for v in (u32, u64, b):
            try:
                v.release()
            except (BufferError, AttributeError):
                pass
        self._anchor = None
        self._base = 0
