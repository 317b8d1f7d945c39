"""A producer's end of a channel (src/channel/producer.ts): acquire a free slot, write it, publish it
(or several at once: acquire_many, publish_many); ``end()`` when done. Device slots:
``acquire(stream=...)`` orders your writes after the consumers' work on the slot's previous message,
``publish(slot, stream=...)`` makes the consumers' work wait for yours.
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ..errors import IpcError
from ..host.host_buffer import HostBuffer
from ..arrays.device_array import DeviceArray, DeviceBuffer
from .endpoint import Endpoint, closed_error, cuda_array_interface, typed_view
from .fences import Stream
from .layout import H_CONSUMERS_DIED, META_BYTES, META_JSON, META_NONE
from .part import ChannelEnd
from .recovery import RECOVERY_GIVE_UP, RETRY
from .slot_ring import PUBLISH_RESULTS
from .._renamed import renamed_attribute


class ChannelProducer(ChannelEnd):
    """This process's producer end (from accept_channel): ``slot = acquire()``, write into the slot,
    ``publish(slot, length=..., meta=...)``; ``end()`` when done."""

    role = "producer"

    def __init__(self, end: Endpoint):
        super().__init__(end)
        self._writing: dict[int, ChannelSlot] = {}
        self._ending = False
        # Host slots: acquire and publish (without meta) are the ring's one call each (acquire, publish).
        self._plain = end.block.fences is None
        self._acquire_raw = end.ring.acquire_raw
        self._publish_raw = end.ring.publish_raw
        self._slot_bytes = end.layout.slot_bytes

    def _gone_error(self, what: str) -> IpcError:
        died = self._end.ring.counter(H_CONSUMERS_DIED)
        if died > 0:
            return IpcError("ERR_PEER_GONE", f"{what}: every consumer of the channel is gone ({died} died)")
        return IpcError("ERR_CHANNEL_CLOSED", f"{what}: every consumer has closed the channel")

    def _try_acquire(self) -> ChannelSlot | None:
        e = self._end
        if self._ending:
            raise closed_error("acquire (end() was called)")
        if e.hub_lost or e._pending or e._fence_repairs:
            e.service()
        # This end alive, the consumers not all gone, (broadcast) all attached, a slot claimed: one call.
        s = e.ring.acquire_slot()
        if s < 0:
            if s == -1:
                return None
            raise e.detached_error("acquire") if s == -2 else self._gone_error("acquire")
        slot = ChannelSlot(self, s)
        self._writing[s] = slot
        return slot

    def _can_acquire(self) -> bool:
        e = self._end
        if e.closed or e.hub_lost or e.ring.consumers_gone() or not e.alive():
            return True
        if e.layout.broadcast and e.ring.consumers_missing():
            return False
        return e.ring.has_free()

    def acquire(self, timeout: float | None = None, stream: Stream = None) -> ChannelSlot:
        """A free slot to write into; blocks while every slot is in flight (ERR_TIMEOUT after
        ``timeout`` seconds). Raises ERR_PEER_GONE once every consumer died (ERR_CHANNEL_CLOSED once
        they all left). Device slots: with ``stream``, GPU work queued there after this waits for the
        consumers' work on the slot's previous message; without, this waits on the CPU."""
        e = self._end
        if self._plain and not (e.closed or self._ending or e.hub_lost or e._pending or e._fence_repairs):
            # A slot free now (the usual case): _try_acquire's steps written out (with `with lock`
            # twice lock.acquire/release). Anything else: the loop below.
            lock = e.lock
            lock.acquire()
            try:
                s = self._acquire_raw()
                if s >= 0:
                    got = self._writing[s] = ChannelSlot(self, s)
                    return got
            finally:
                lock.release()
        # The same loop as ChannelConsumer.receive's, written out: a shared one would cost a call per message.
        if e.closed:
            raise closed_error("acquire")
        deadline = None  # read from the clock only once a wait begins (not in the usual case)
        with e.lock:
            while True:
                slot = self._try_acquire()
                if slot is not None:
                    break
                e.assert_open("acquire")
                if timeout is not None:
                    if deadline is None:
                        deadline = time.monotonic() + timeout
                    if time.monotonic() >= deadline:
                        raise IpcError("ERR_TIMEOUT", "channel acquire: no free slot within the timeout")
                e.park(self._can_acquire, deadline)
        if e.block.fences is not None:
            if timeout is not None and deadline is None:
                deadline = time.monotonic() + timeout
            self._after_consumers([slot], stream, deadline)
        return slot

    def _after_consumers(self, slots: list[ChannelSlot], stream: Stream, deadline: float | None) -> None:
        """Device slots: orders the writes into ``slots`` after the consumers' work on their previous
        messages (on ``stream``, else waiting here until ``deadline``); on failure they are all given back."""
        try:
            for slot in slots:
                if stream is not None:
                    slot.wait_on(stream)
                else:
                    slot.ready(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except BaseException:
            for slot in slots:
                self.discard(slot)
            raise

    def acquire_many(self, max_count: int = 64, timeout: float | None = None, stream: Stream = None) -> "list[ChannelSlot]":
        """Up to ``max_count`` free slots at once: blocks as acquire() until one is free, then claims
        the others free now (one call where the native helper runs). Write each, then publish_many()
        them (or publish or discard each). Raises as acquire() does; device slots: as acquire()."""
        if type(max_count) is not int or max_count < 1:
            raise IpcError("ERR_OUT_OF_RANGE", f"acquire_many: max_count must be a positive int; got {max_count!r}")
        e = self._end
        if self._plain and not (e.closed or self._ending or e.hub_lost or e._pending or e._fence_repairs):
            # Slots free now (the usual case): acquire()'s and the claim's steps under one lock.
            lock = e.lock
            lock.acquire()
            try:
                s = self._acquire_raw()
                if s >= 0:
                    writing = self._writing
                    first = writing[s] = ChannelSlot(self, s)  # (ours before anything else can raise)
                    slots = [first]
                    if max_count > 1:
                        for k in e.ring.claim_slots(max_count - 1):
                            slot = writing[k] = ChannelSlot(self, k)
                            slots.append(slot)
                    return slots
            finally:
                lock.release()
        deadline = None if timeout is None else time.monotonic() + timeout
        slots = [self.acquire(timeout, stream)]
        if max_count == 1:
            return slots
        with e.lock:
            more = [] if e.closed else e.ring.claim_slots(max_count - 1)
            for s in more:
                slot = ChannelSlot(self, s)
                self._writing[s] = slot
                slots.append(slot)
        if more and e.block.fences is not None:
            try:
                self._after_consumers(slots[1:], stream, deadline)  # (gives those back on failure)
            except BaseException:
                self.discard(slots[0])  # the caller never sees it: nobody else would give it back
                raise
        return slots

    def try_acquire(self) -> "ChannelSlot | None":
        """A free slot now, or None when every slot is in flight. Device slots: order your writes
        after the consumers' work yourself (``slot.wait_on(stream)`` or ``slot.ready()``)."""
        e = self._end
        e.assert_open("try_acquire")
        with e.lock:
            return self._try_acquire()

    def publish(self, slot: ChannelSlot, length: int | None = None, meta: Any = None, stream: Stream = None) -> None:
        """Publishes ``slot``: the consumers can take it at once. ``length``: bytes of the slot the
        message uses (default: all); ``meta``: JSON-serialisable data or bytes (at most meta_bytes
        once encoded). Device slots: the consumers' GPU work waits for the work queued on ``stream``
        (default: the legacy default stream) so far."""
        e = self._end
        if e.closed:
            raise closed_error("publish")
        lock = e.lock
        lock.acquire()
        try:
            if not isinstance(slot, ChannelSlot) or self._writing.get(s := slot.index) is not slot:
                raise IpcError("ERR_INVALID_ARG", "publish: that slot is not one this producer acquired and has not yet published")
            if length is None:
                length = self._slot_bytes
            elif type(length) is not int or not 0 <= length <= self._slot_bytes:
                raise IpcError("ERR_OUT_OF_RANGE", f"publish: length must be an int in 0..{self._slot_bytes}; got {length!r}")
            if meta is None and self._plain and length < 0x80000000:
                # Host slots, no meta (the usual case): the ring's one call.
                del self._writing[s]
                slot._done = True
                rc = self._publish_raw(s, length)
                if rc:
                    if rc < 0:
                        raise e.ring.fail(rc)
                    if rc != 2:  # busy or detached (2: dropped, nobody to read it)
                        self._commit(s, PUBLISH_RESULTS[rc])
                return
            self._publish(slot, s, length, meta, stream)
        finally:
            lock.release()

    def _publish(self, slot: ChannelSlot, s: int, length: int, meta: Any, stream: Stream) -> None:
        """publish()'s steps for a message with meta, or on device slots (the end's lock held)."""
        e = self._end
        l = e.layout
        kind = META_NONE
        raw = b""
        if meta is not None:
            if isinstance(meta, (bytes, bytearray, memoryview)):
                raw = bytes(meta)
                kind = META_BYTES
            else:
                try:
                    raw = json.dumps(meta, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
                except (TypeError, ValueError) as err:
                    raise IpcError("ERR_NOT_TRANSFERABLE", f"publish: meta must be JSON-serialisable or bytes ({err})") from None
                kind = META_JSON
            if len(raw) > l.meta_bytes:
                raise IpcError("ERR_MESSAGE_TOO_LARGE", f"publish: meta takes {len(raw)} bytes; this channel holds {l.meta_bytes} per message (metaBytes)")
        f = e.block.fences
        if f is not None:
            # The slot is ours (writing) until the commit below: nobody else touches its ticket.
            f.signal(stream, l.publish_fence(s), e.ring.next_ticket(s))
        del self._writing[s]
        slot._done = True
        r = e.ring.publish_message(s, length, kind, raw)  # the message's length and meta, then the commit
        if r != "ok" and r != "dropped":
            self._commit(s, r)

    def publish_many(self, slots: Sequence[ChannelSlot], length: int | None = None, stream: Stream = None) -> None:
        """Publishes ``slots`` in their order, each a message of ``length`` bytes (default: the whole
        slot) without meta: one call where the native helper runs. Every slot is checked before any is
        published (ERR_INVALID_ARG, nothing published); device slots: as publish()."""
        e = self._end
        if e.closed:
            raise closed_error("publish_many")
        slots = list(slots)
        lock = e.lock
        lock.acquire()
        try:
            sb = self._slot_bytes
            if length is None:
                length = sb
            elif type(length) is not int or not 0 <= length <= sb:
                raise IpcError("ERR_OUT_OF_RANGE", f"publish_many: length must be an int in 0..{sb}; got {length!r}")
            writing = self._writing
            indices = []
            for i, slot in enumerate(slots):
                if not isinstance(slot, ChannelSlot) or writing.get(s := slot.index) is not slot:
                    raise IpcError("ERR_INVALID_ARG", f"publish_many: slots[{i}] is not one this producer acquired and has not yet published")
                indices.append(s)
            if len(set(indices)) != len(indices):
                raise IpcError("ERR_INVALID_ARG", "publish_many: a slot is listed twice")
            f = e.block.fences
            if f is not None:
                l = e.layout
                for s in indices:
                    f.signal(stream, l.publish_fence(s), e.ring.next_ticket(s))
            for s, slot in zip(indices, slots):
                del writing[s]
                slot._done = True
            while indices:
                done, r = e.ring.publish_many(indices, length)
                if done == len(indices):
                    break
                self._commit(indices[done], r)  # it did not go through at once: as publish(), retried while busy
                indices = indices[done + 1:]
        finally:
            lock.release()

    def _commit(self, s: int, r: str) -> None:
        """A publish that did not go through at once (``r``: 'busy' or 'detached'): retried while busy."""
        e = self._end
        started = None  # read from the clock only once a retry begins (not in the usual case)
        while True:
            if r == "ok" or r == "dropped":
                return
            if r == "detached":
                raise e.detached_error("publish")
            # The lock stays taken: a live publisher holds it for microseconds, a dead one is
            # repaired by the hub (or by us, once the hub is gone).
            if started is None:
                started = time.monotonic()
            elif time.monotonic() - started > RECOVERY_GIVE_UP:
                raise IpcError("ERR_TIMEOUT", f"publish: the channel's publish lock stayed held for {RECOVERY_GIVE_UP} s (a process died inside it and was not repaired)")
            time.sleep(RETRY)
            e.service()
            r = e.ring.publish(s)

    def discard(self, slot: "ChannelSlot") -> None:
        """Gives back a slot acquired and not published."""
        e = self._end
        e.assert_open("discard")
        with e.lock:
            if self._writing.get(slot.index) is not slot:
                return
            del self._writing[slot.index]
            slot._done = True
            e.ring.discard(slot.index)

    def end(self, timeout: float | None = None) -> None:
        """No more messages from this end. Consumers finish once they took what was published. Returns
        once every message this end published was released (raises ERR_PEER_GONE if the consumers
        died first, ERR_TIMEOUT after ``timeout`` seconds), then closes this end."""
        e = self._end
        if e.closed:
            return
        self._ending = True
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            with e.lock:
                for slot in list(self._writing.values()):
                    self.discard(slot)
                e.recoveries.leave_self()  # first: consumers see the end even while they hold our last messages

                def done() -> bool:
                    return e.closed or e.hub_lost or e.ring.in_flight_from(e.index) == 0 or e.ring.consumers_gone()
                while not done():
                    if deadline is not None and time.monotonic() >= deadline:
                        raise IpcError("ERR_TIMEOUT", f"end: {e.ring.in_flight_from(e.index)} message(s) still unreleased after the timeout")
                    e.park(done, deadline)
                if not e.closed and not e.hub_lost and e.ring.in_flight_from(e.index) > 0 and e.ring.counter(H_CONSUMERS_DIED) > 0:
                    raise IpcError("ERR_PEER_GONE", f"end: the consumers died with {e.ring.in_flight_from(e.index)} message(s) unreleased")
        finally:
            self.close()

    def close(self) -> None:
        """Closes this end now: acquired slots are given back; what was published stays published.
        Idempotent."""
        def settle() -> None:
            for slot in self._writing.values():
                slot._done = True
            self._writing.clear()
            self._slots.close()
        self._end.close(settle)

    def _slot_waits(self, s: int) -> list[tuple[int, int]]:
        """The release fences slot s's previous message must reach (read while we hold the slot)."""
        e = self._end
        if e.block.fences is None:
            return []
        return e.ring.release_waits(s)


class ChannelSlot:
    """A slot a producer acquired: write into ``memory`` (host slots) or ``buffer`` / ``view()``
    (device slots), then publish it."""

    __slots__ = ("_producer", "index", "_done")

    def __init__(self, producer: ChannelProducer, index: int):
        self._producer = producer
        self.index = index
        self._done = False

    @property
    def pending(self) -> bool:
        """False once published or discarded."""
        return not self._done

    @property
    def memory(self) -> memoryview:
        """Host slots: the slot's bytes (zero-copy)."""
        if self._done:
            raise IpcError("ERR_CLOSED", "slot.memory: the slot was published or discarded")
        slots = self._producer._slots
        base = slots._base
        if base is None:  # (device slots: it says so)
            return slots.memory(self.index, slots.bytes)
        start = self.index * slots.bytes
        return base[start:start + slots.bytes]

    @property
    def buffer(self) -> HostBuffer | DeviceBuffer:
        """The slot's memory: a HostBuffer (host slots) or DeviceBuffer (device slots)."""
        if self._done:
            raise IpcError("ERR_CLOSED", "slot.buffer: the slot was published or discarded")
        return self._producer._slots.buffer(self.index)

    @property
    def nbytes(self) -> int:
        return self._producer._end.layout.slot_bytes

    def view(self, dtype: object = "uint8", shape: int | Sequence[int] | None = None, strides: Sequence[int] | None = None,
             offset: int = 0) -> DeviceArray | memoryview:
        """A typed view of the slot (see ChannelMessage.view)."""
        return typed_view(self.buffer, self.nbytes, dtype, shape, strides, offset)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return cuda_array_interface(self.buffer)

    def __dlpack__(self, **kw: Any) -> object:
        return self.buffer.__dlpack__(**kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.buffer.__dlpack_device__()

    def wait_on(self, stream: Stream = None) -> None:
        """Device slots: GPU work queued on ``stream`` after this waits until the consumers' work on
        the slot's previous message is done. acquire(stream=...) does this for you."""
        p = self._producer
        f = p._end.block.fences
        if f is None:
            return
        for off, v in p._slot_waits(self.index):
            f.wait_on(stream, off, v)

    def ready(self, timeout: float | None = None) -> None:
        """Device slots: waits on this thread until the consumers' GPU work on the previous message in
        this slot is done."""
        p = self._producer
        f = p._end.block.fences
        if f is not None:
            f.synchronize(p._slot_waits(self.index), timeout)

    def __repr__(self) -> str:
        return f"<cuda_ipc.ChannelSlot {self.index}{' done' if self._done else ''}>"


def __getattr__(name: str) -> Any:
    # The old names of these (_renamed.py): each use warns, for one release.
    return renamed_attribute(__name__, {"ChannelSlot": ChannelSlot}, name)
