"""The ring protocol's hot path through the native helper (cuda_ipc/native/addon.py, native/py/channel_ring.c):
``NativeRing`` is a ``Ring`` whose per-message operations (acquire, publish, take with the message's
record, a batch of them, release, the producer's batches, the wake-ups, the spin before sleeping) are one C call each, the
same steps with the same memory orders as slot_ring.py's methods of the same names; everything else (leaving, recovery,
membership, stats) is slot_ring.py's own. ``make_ring`` picks it where the library loaded.

The C side keeps its state in a ``_RingState`` this object owns: the control block's address and
layout, this participant's index, the doorbells' fds, and the taken words (``taken_words``, shared
with slot_ring.py's code of the slow paths). ``close()`` detaches it (every later call fails, no doorbell
is rung) before the end unmaps the block and closes the doorbells.

Calls pass no argtypes (a ctypes call converts each argument through its argtypes entry, which costs
more than the call): the state as a cached ``c_void_p``, 32-bit values as Python ints (C ints), a
64-bit value as two of them. A take fills records (struct cip_message) in a buffer this object owns,
read back with one ``struct`` unpack. The ends' per-message paths (producer.py, consumer.py) call the
raw ones (``acquire_raw``, ``publish_raw``, ``take_raw`` / ``take_record``, ``release_raw``: slot_ring.py
says what each gives): the C function with the state bound (``functools.partial``), so that no Python
frame lies between the end and the C call (about a third of a ctypes call's cost each).
"""
from __future__ import annotations

import ctypes
import struct
from functools import partial
from ctypes import c_int32, c_uint32, c_uint64, c_void_p
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..errors import IpcError
from ..native.addon import library
from .layout import Layout
from .slot_ring import NOTHING, PUBLISH_RESULTS, TAKEN_DETACHED, Taken, Ring, corrupt

if TYPE_CHECKING:
    from .doorbells import Doorbells
    from .shared_words import SharedWords

# Results of the C functions (channel_ring.c).
NONE, NOT_ALIVE, CONSUMERS_GONE, CORRUPT, SKIP, INVALID, CLOSED = -1, -2, -3, -4, -5, -6, -100
#: struct cip_message (channel_ring.c): slot, position, length, publisher, redelivered, ticket, meta
#: kind, meta length (slot_ring.py's Taken).
_MESSAGE = struct.Struct("<I4xqQI?3xIII4x")


class _RingState(ctypes.Structure):
    """struct cip_ring (channel_ring.c), field for field."""
    _fields_ = [
        ("base", c_uint64), ("length", c_uint64), ("taken", c_uint64), ("tail_seen", c_uint64),
        ("error_a", c_uint64), ("error_b", c_uint64),
        ("slot_count", c_uint32), ("me", c_uint32), ("max_participants", c_uint32), ("broadcast", c_uint32),
        ("participants_offset", c_uint32), ("ring_offset", c_uint32), ("slot_records_offset", c_uint32),
        ("slot_record_bytes", c_uint32), ("meta_bytes", c_uint32), ("slot_bytes_lo", c_uint32), ("slot_bytes_hi", c_uint32),
        ("expect_consumers", c_uint32), ("hint", c_uint32),
        ("rotor", c_uint32), ("error", c_uint32), ("nbells", c_uint32), ("bells", c_int32 * 32),
    ]


def make_ring(words: SharedWords, layout: Layout, bells: Doorbells, me: int) -> Ring:
    """A NativeRing where the native helper loaded, else slot_ring.py's Ring."""
    lib = library("channels")
    if lib is None:
        return Ring(words, layout, bells, me)
    return NativeRing(words, layout, bells, me, lib)


class NativeRing(Ring):
    """slot_ring.py's Ring with its per-message operations in C (see the module notes)."""

    hot_path = "native"

    def __init__(self, words: SharedWords, layout: Layout, bells: Doorbells, me: int, lib: tuple[Any, Any]):
        super().__init__(words, layout, bells, me)
        fast, waits = lib
        if fast.cip_ring_size() != ctypes.sizeof(_RingState):
            raise IpcError("ERR_UNSUPPORTED", f"the native helper's ring state is {fast.cip_ring_size()} bytes, this package's {ctypes.sizeof(_RingState)}: rebuild it")
        if fast.cip_message_size() != _MESSAGE.size:
            raise IpcError("ERR_UNSUPPORTED", f"the native helper's message record is {fast.cip_message_size()} bytes, this package's {_MESSAGE.size}: rebuild it")
        n = layout.slot_count
        self._taken = (c_uint32 * n)()
        self.taken_words = memoryview(self._taken).cast("B").cast("I")  # type: ignore[assignment]
        # take_message's record (the first) and take_messages' (n of them): a bytearray, which struct
        # unpacks fastest, never resized (the C array over it keeps it exported).
        self._messages = bytearray(n * _MESSAGE.size)
        self._messages_view = memoryview(self._messages)
        self._messages_c = (ctypes.c_char * len(self._messages)).from_buffer(self._messages)
        self._messages_p = c_void_p(ctypes.addressof(self._messages_c))
        # claim_slots' and publish_many's slot lists, and publish_many's stopping result.
        self._claimed = (c_uint32 * n)()
        self._claimed_p = c_void_p(ctypes.addressof(self._claimed))
        self._publishing = (c_uint32 * n)()
        self._publishing_p = c_void_p(ctypes.addressof(self._publishing))
        self._stopped = c_int32()
        self._stopped_p = c_void_p(ctypes.addressof(self._stopped))
        st = self._st = _RingState()
        st.base, st.length, st.taken = words.address, words.length, ctypes.addressof(self._taken)
        st.slot_count, st.me, st.max_participants, st.broadcast = n, me, layout.max_participants, int(layout.broadcast)
        st.participants_offset, st.ring_offset = layout.participants_offset, layout.ring_offset
        st.slot_records_offset, st.slot_record_bytes = layout.slot_records_offset, layout.slot_record_bytes
        st.meta_bytes, st.expect_consumers = layout.meta_bytes, layout.expect_consumers
        st.slot_bytes_lo, st.slot_bytes_hi = layout.slot_bytes & 0xFFFFFFFF, layout.slot_bytes >> 32
        fds = bells.fds[:32]
        st.nbells = len(fds)
        for k, fd in enumerate(fds):
            st.bells[k] = fd
        self._p = c_void_p(ctypes.addressof(st))
        if fast.cip_ring_init(self._p) != 0:
            raise IpcError("ERR_UNSUPPORTED", "the native helper refused the channel's layout (an offset outside the control block)")
        self._acquire = fast.cip_acquire
        self._has_free = fast.cip_has_free
        self._publish = fast.cip_publish
        self._publish_bare = fast.cip_publish_bare
        self._claim_slots = fast.cip_claim_slots
        self._publish_many = fast.cip_publish_many
        self._discard = fast.cip_discard
        self._take_message = fast.cip_take_message
        self._take_messages = fast.cip_take_messages
        self._release = fast.cip_release
        self._release_held = fast.cip_release_held
        self._peek = fast.cip_peek
        self._signal_data = fast.cip_signal_data
        self._signal_space = fast.cip_signal_space
        self._detach = fast.cip_ring_detach
        self._spin = waits.cip_spin_while_equal
        # The raw calls (slot_ring.py's Ring says what they give): the C functions with the state bound.
        self.acquire_raw = partial(fast.cip_acquire, self._p)
        self.publish_raw = partial(fast.cip_publish_bare, self._p)
        self.release_raw = partial(fast.cip_release, self._p)
        self.take_raw = partial(fast.cip_take_message, self._p, self._messages_p)
        self.take_record = cast("Callable[[], Taken]", partial(_MESSAGE.unpack_from, self._messages))

    def close(self) -> None:
        self._detach(self._p)

    def fail(self, rc: int) -> IpcError:
        """The error of a negative result other than NONE / SKIP."""
        if rc == CORRUPT:
            st = self._st
            what, a, b = st.error, st.error_a, st.error_b
            if what == 1:
                return corrupt("tail out of range")
            if what == 2:
                return corrupt("head out of range")
            if what == 3:
                return corrupt(f"{a} messages in a ring of {b} slots")
            if what == 4:
                return corrupt(f"ring entry names slot {a} of {b}")
            if what == 5:
                return corrupt(f"{a} messages ahead of a consumer in a ring of {b} slots")
            return corrupt("unknown")
        if rc == CLOSED:
            return IpcError("ERR_CHANNEL_CLOSED", "the channel end is closed")
        return IpcError("ERR_INVALID_ARG", f"the native channel helper refused a call ({rc}): a bug of cuda_ipc")

    # -- wake-ups --

    def signal_data(self, all_: bool = False) -> None:
        self._signal_data(self._p, 1 if all_ else 0)

    def signal_space(self) -> None:
        self._signal_space(self._p)

    def spin_while(self, off: int, expected: int, seconds: float) -> bool:
        rc: int = self._spin(self._p, off, expected, min(int(seconds * 1e9), 0xFFFFFFFF))
        if rc < 0:
            raise self.fail(rc)
        return rc == 1

    # -- producers --

    def acquire_slot(self) -> int:
        rc: int = self._acquire(self._p)
        if rc < NONE and rc not in (NOT_ALIVE, CONSUMERS_GONE):
            raise self.fail(rc)
        return rc

    def claim_slot(self) -> int:
        # (the checks acquire_slot adds only read the control block)
        rc = self.acquire_slot()
        return rc if rc >= 0 else -1

    def claim_slots(self, most: int) -> list[int]:
        rc: int = self._claim_slots(self._p, self._claimed_p, min(most, self.n))
        if rc < 0:
            raise self.fail(rc)
        return self._claimed[:rc]

    def has_free(self) -> bool:
        rc: int = self._has_free(self._p)
        if rc < 0:
            raise self.fail(rc)
        return rc == 1

    def discard(self, s: int) -> None:
        rc: int = self._discard(self._p, s)
        if rc < 0:
            raise self.fail(rc)

    def publish_message(self, s: int, length: int, meta_kind: int, meta: bytes) -> str:
        if not meta and meta_kind == 0 and length < 0x80000000:
            rc: int = self._publish_bare(self._p, s, length)
        else:
            rc = self._publish(self._p, s, length & 0xFFFFFFFF, length >> 32, meta_kind, meta or None, len(meta))
        if rc < 0:
            raise self.fail(rc)
        return PUBLISH_RESULTS[rc]

    def publish_many(self, slots: list[int], length: int) -> tuple[int, str]:
        n = len(slots)
        if length >= 0x80000000 or n > self.n:
            return super().publish_many(slots, length)
        self._publishing[:n] = slots  # type: ignore[assignment]  # (ctypes takes ints; the stubs ask for c_uint32 too)
        rc: int = self._publish_many(self._p, self._publishing_p, n, length, self._stopped_p)
        if rc < 0:
            raise self.fail(rc)
        stopped = self._stopped.value
        if stopped < 0:
            raise self.fail(stopped)
        return rc, PUBLISH_RESULTS[stopped]

    # -- consumers --

    def take_message(self) -> Taken:
        rc: int = self._take_message(self._p, self._messages_p)
        if rc < 0:
            if rc == NONE:
                return NOTHING
            raise self.fail(rc)
        return _MESSAGE.unpack_from(self._messages)  # type: ignore[return-value]  # (a typing.cast costs a call)

    def take_messages(self, most: int) -> tuple[list[Taken], bool]:
        rc: int = self._take_messages(self._p, self._messages_p, min(most, self.n))
        if rc < 0:
            raise self.fail(rc)
        n = rc & 0xFFFFFF
        return cast("list[Taken]", list(_MESSAGE.iter_unpack(self._messages_view[:n * _MESSAGE.size]))), bool(rc & TAKEN_DETACHED)

    def release_taken(self, s: int) -> bool:
        rc: int = self._release(self._p, s)
        if rc < 0:
            raise self.fail(rc)
        return rc == 1

    def release_held(self, s: int, k: int | None = None) -> bool:
        rc: int = self._release_held(self._p, s, self.me if k is None else k)
        if rc < 0:
            raise self.fail(rc)
        return rc == 1

    def peek_at(self, cursor: int) -> int:
        rc: int = self._peek(self._p, cursor & 0xFFFFFFFF, cursor >> 32)
        if rc >= 0 or rc == NONE:
            return rc
        if rc == SKIP:
            return -2
        raise self.fail(rc)
