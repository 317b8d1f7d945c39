"""Sequentially consistent atomics on the 32- and 64-bit words of a shared mapping (a channel's
control block), from the standard library: libatomic's sized functions through ctypes for the
read-modify-writes and stores, as docs/channel-protocol.md says.

Calls: a ctypes call with ``argtypes`` converts each argument through its type (~400 ns a call);
these functions have none, and get the word's address as a ``c_void_p`` made once per word and
cached, the values as ints (32-bit: passed as C ints, which is what the ABI passes a uint32_t as) or
``c_uint64`` objects (64-bit): about half the cost, which a channel's hot path pays several times a
message.

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
import struct
from collections.abc import Callable
from ctypes import byref, c_uint32, c_uint64, c_void_p

from typing import Any

from ..errors import IpcError

SEQ_CST = 5
MAX_U53 = 2**53
_FAST_LOADS = platform.machine().lower() in ("x86_64", "amd64")
# Words whose address objects are kept (the header's and the first slots' state words): bounds
# the cache of a block with tens of thousands of slots.
_CACHED_WORDS = 4096

_lib: ctypes.CDLL | None = None


def _libatomic() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libatomic.so.1")
        except OSError as e:
            raise IpcError("ERR_UNSUPPORTED", f"channels need libatomic.so.1 for their shared atomics ({e}); install it (Debian/Ubuntu: apt install libatomic1)") from None
        # No argtypes (see the module's docstring): every caller passes a c_void_p address, C ints or
        # c_uint64 values, and byref() pointers, which is what each parameter is.
        for name, res in (
            ("__atomic_load_4", c_uint32),
            ("__atomic_load_8", c_uint64),
            ("__atomic_store_4", None),
            ("__atomic_store_8", None),
            ("__atomic_compare_exchange_4", None),
            ("__atomic_compare_exchange_8", None),
            ("__atomic_fetch_add_4", c_uint32),
            ("__atomic_fetch_add_8", c_uint64),
            ("__atomic_fetch_and_4", c_uint32),
            ("__atomic_fetch_or_4", c_uint32),
        ):
            fn = getattr(lib, name)
            fn.restype = res
        _lib = lib
    return _lib


class SharedWords:
    """Atomics on the words of ``buffer`` (an mmap or another writable buffer, 8-byte aligned),
    ``length`` bytes from its start. Keeps the buffer exported (it cannot be closed) until close()."""

    __slots__ = ("length", "_anchor", "_base", "_bytes", "_u32", "_u64", "_n32", "_n64", "_load4", "_load8", "_store4", "_store8",
                 "_cas4", "_cas8", "_add4", "_add8", "_and4", "_or4", "_p32", "_p64", "__weakref__")
    length: int
    _anchor: Any  # the ctypes array over the buffer (None once closed)
    _base: int
    _bytes: memoryview
    _u32: memoryview
    _u64: memoryview
    _n32: int
    _n64: int
    # The c_void_p address of each word used so far, by offset (32- and 64-bit words apart: their
    # offsets are checked for different alignments).
    _p32: dict[int, c_void_p]
    _p64: dict[int, c_void_p]
    # libatomic's functions: (address, ..., memory order) -> the old value, or None for stores.
    _load4: Callable[[c_void_p, int], int]
    _load8: Callable[[c_void_p, int], int]
    _store4: Callable[[c_void_p, int, int], None]
    _store8: Callable[[c_void_p, c_uint64, int], None]
    _cas4: Callable[[c_void_p, Any, int, int, int], None]
    _cas8: Callable[[c_void_p, Any, c_uint64, int, int], None]
    _add4: Callable[[c_void_p, int, int], int]
    _add8: Callable[[c_void_p, c_uint64, int], int]
    _and4: Callable[[c_void_p, int, int], int]
    _or4: Callable[[c_void_p, int, int], int]

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
        self._p32 = {}
        self._p64 = {}
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

    def _a32(self, off: int) -> c_void_p:
        p = self._p32.get(off)
        if p is None:
            if off & 3 or not 0 <= off < self.length:
                raise IndexError(f"shared word at {off} is outside the {self.length} bytes, or not aligned")
            p = c_void_p(self._base + off)
            if len(self._p32) < _CACHED_WORDS:
                self._p32[off] = p
        return p

    def _a64(self, off: int) -> c_void_p:
        p = self._p64.get(off)
        if p is None:
            if off & 7 or not 0 <= off < self.length:
                raise IndexError(f"shared word at {off} is outside the {self.length} bytes, or not aligned")
            p = c_void_p(self._base + off)
            if len(self._p64) < _CACHED_WORDS:
                self._p64[off] = p
        return p

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

    if _FAST_LOADS:
        def release_store32(self, off: int, value: int) -> None:
            """A store that needs only to be seen after the stores before it (a release store): a plain
            ``mov`` on x86-64, whose stores are seen in program order (TSO). Unlike store32 it may pass
            a later load: the caller makes a locked read-modify-write before any load that must not."""
            if off & 3:
                raise IndexError(f"shared word at {off} is not aligned")
            self._u32[off >> 2] = value & 0xFFFFFFFF

        def release_store64(self, off: int, value: int) -> None:
            """release_store32 for a 64-bit word (0..2^53)."""
            if off & 7:
                raise IndexError(f"shared word at {off} is not aligned")
            if not 0 <= value <= MAX_U53:
                raise ValueError("a 64-bit shared word holds 0..2^53")
            self._u64[off >> 3] = value

        def bump32(self, off: int) -> None:
            """Changes a change counter (a channel's data or space sequence): its value + 1 with a
            release store, no locked add. Two racing bumps may store the same value; that is enough,
            as the counter only tells spinners that something changed, and each bump follows its own
            locked operation (the state change it announces), which orders it (x86-64, TSO)."""
            if off & 3:
                raise IndexError(f"shared word at {off} is not aligned")
            u32 = self._u32
            i = off >> 2
            u32[i] = (u32[i] + 1) & 0xFFFFFFFF
    else:  # pragma: no cover - other architectures: sequentially consistent, as store32
        def release_store32(self, off: int, value: int) -> None:
            self.store32(off, value)

        def bump32(self, off: int) -> None:
            self.add32(off, 1)

        def release_store64(self, off: int, value: int) -> None:
            self.store64(off, value)

    # The read-modify-writes below look their word's cached address up inline rather than through
    # _a32/_a64: on the channel's hot path a method call costs as much as the lookup.

    def cas32(self, off: int, expected: int, desired: int) -> int:
        """Compare-and-swap; returns the value seen (== expected when it swapped)."""
        e = c_uint32(expected & 0xFFFFFFFF)
        self._cas4(self._p32.get(off) or self._a32(off), byref(e), desired & 0xFFFFFFFF, SEQ_CST, SEQ_CST)
        return e.value

    def add32(self, off: int, delta: int) -> int:
        return self._add4(self._p32.get(off) or self._a32(off), delta & 0xFFFFFFFF, SEQ_CST)

    def and32(self, off: int, mask: int) -> int:
        return self._and4(self._p32.get(off) or self._a32(off), mask & 0xFFFFFFFF, SEQ_CST)

    def or32(self, off: int, mask: int) -> int:
        return self._or4(self._p32.get(off) or self._a32(off), mask & 0xFFFFFFFF, SEQ_CST)

    # -- 64-bit (values below 2^53) --

    def store64(self, off: int, value: int) -> None:
        if not 0 <= value <= MAX_U53:
            raise ValueError("a 64-bit shared word holds 0..2^53")
        self._store8(self._a64(off), c_uint64(value), SEQ_CST)

    def cas64(self, off: int, expected: int, desired: int) -> int:
        if not (0 <= expected <= MAX_U53 and 0 <= desired <= MAX_U53):
            raise ValueError("a 64-bit shared word holds 0..2^53")
        e = c_uint64(expected)
        self._cas8(self._p64.get(off) or self._a64(off), byref(e), c_uint64(desired), SEQ_CST, SEQ_CST)
        v = e.value
        return v if v <= MAX_U53 else -1

    def add64(self, off: int, delta: int) -> int:
        v = self._add8(self._a64(off), c_uint64(delta & 0xFFFFFFFFFFFFFFFF), SEQ_CST)
        return v if v <= MAX_U53 else -1

    # -- plain access (fields only their owner writes) --

    def plain32(self, off: int) -> int:
        return self._u32[off >> 2]

    def set_plain32(self, off: int, value: int) -> None:
        self._u32[off >> 2] = value & 0xFFFFFFFF

    # -- bytes (a slot record's meta: only its publisher writes them, before it publishes) --

    def unpack(self, layout: struct.Struct, off: int) -> tuple[Any, ...]:
        """Plain fields at ``off`` read with one ``layout.unpack_from`` (fields only their owner writes)."""
        return layout.unpack_from(self._bytes, off)

    def pack(self, layout: struct.Struct, off: int, *values: Any) -> None:
        """Plain fields at ``off`` written with one ``layout.pack_into``."""
        layout.pack_into(self._bytes, off, *values)

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
        self._p32 = {}
        self._p64 = {}
        self._anchor = None
        self._base = 0
