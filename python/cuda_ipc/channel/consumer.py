"""A consumer's end of a channel (src/channel/consumer.ts): receive messages (or iterate), release each
once done with its slot. Device slots: ``msg.wait_on(stream)`` before reading a message on the GPU,
``msg.release(stream=stream)`` after.
"""
from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Iterator, NoReturn, TypeVar

from ..errors import IpcError
from ..host.host_buffer import HostBuffer
from ..arrays.device_array import DeviceArray, DeviceBuffer
from .endpoint import Endpoint, closed_error, cuda_array_interface, typed_view
from .fences import Stream
from .layout import H_PRODUCERS_DIED, META_BYTES, META_NONE
from . import ring_recovery
from .part import ChannelEnd
from .slot_ring import TAKEN_BAD, TAKEN_DETACHED, Taken, corrupt
from .._renamed import renamed_attribute

#: What a consumer's poll gives: a message (or None), or a list of them.
_Got = TypeVar("_Got")


class ChannelConsumer(ChannelEnd):
    """This process's consumer end (from accept_channel). ``receive(timeout)`` or iterate; release each
    message once done with its slot (``msg.release()`` or ``with msg:``)."""

    role = "consumer"

    def __init__(self, end: Endpoint):
        super().__init__(end)
        self._held: dict[int, ChannelMessage] = {}
        self._ended = False
        self._end_error: IpcError | None = None
        self._deferred = False  # _end_error is receive_many's deferred error, raised once
        self._cursor = end.ring.cursor() if end.layout.broadcast else 0
        self._fences = end.block.fences
        self._broadcast = end.layout.broadcast
        # Host slots, work sharing: a release is the ring's one call (ChannelMessage.release).
        self._plain = not self._broadcast and self._fences is None
        self._release_raw = end.ring.release_raw
        self._lock = end.lock

    @property
    def ended(self) -> bool:
        """True once every producer left and every message was taken (receive() returns None)."""
        return self._ended

    def _can_receive(self) -> bool:
        e = self._end
        return e.closed or e.hub_lost or not e.ring.is_empty(self._cursor) or e.ring.producers_gone() or not e.alive()

    def receive(self, timeout: float | None = None) -> "ChannelMessage | None":
        """The next message; None once the channel ended cleanly (every producer ended and all their
        messages were taken) or this end was closed. Raises ERR_PEER_GONE, after the messages already
        published, when a producer died; ERR_TIMEOUT after ``timeout`` seconds."""
        if self._end.closed:
            raise closed_error("receive")
        return self._wait_for(self._poll, timeout, "receive")

    def receive_many(self, max_count: int = 64, timeout: float | None = None) -> "list[ChannelMessage]":
        """Every message there is now, up to ``max_count`` (taken with one call where the native helper
        runs), oldest first; blocks until there is at least one. An empty list once the channel ended
        cleanly or this end was closed; raises as receive() does. Release each message (in any order).
        A work-sharing consumer takes them all at once: other consumers get the messages after them."""
        e = self._end
        if e.closed:
            raise closed_error("receive_many")
        if type(max_count) is not int or max_count < 1:
            raise IpcError("ERR_OUT_OF_RANGE", f"receive_many: max_count must be a positive int; got {max_count!r}")
        if not self._broadcast:
            # Messages there now (the usual case): _poll_many's steps, written out; anything else
            # (nothing there, the end, housekeeping due): the wait below.
            lock = self._lock
            lock.acquire()
            try:
                if self._end_error is None and not self._ended and not e.closed and not (e.hub_lost or e._pending or e._fence_repairs):
                    ms = self._take_many(max_count)
                    if ms:
                        return ms
            finally:
                lock.release()
        return self._wait_for(lambda: self._poll_many(max_count), timeout, "receive_many")

    def _wait_for(self, poll: Callable[[], _Got], timeout: float | None, what: str) -> _Got:
        """What ``poll()`` gives (a message, or a non-empty list of them), waiting until there is some;
        an empty result once the channel ended cleanly or this end closed. ERR_TIMEOUT after ``timeout``."""
        e = self._end
        deadline = None  # read from the clock only once a wait begins (not in the usual case)
        with e.lock:
            while True:
                got = poll()
                if got or self._ended or e.closed:
                    return got
                if timeout is not None:
                    if deadline is None:
                        deadline = time.monotonic() + timeout
                    if time.monotonic() >= deadline:
                        # A wake-up meant for this end must not be lost with its timeout: pass it on.
                        if not e.closed and not e.ring.is_empty(self._cursor):
                            e.ring.signal_data()
                        raise IpcError("ERR_TIMEOUT", f"channel {what}: no message within the timeout")
                e.park(self._can_receive, deadline)

    def poll(self) -> "ChannelMessage | None":
        """A message now, or None when there is none (or the channel ended: see ``ended``)."""
        e = self._end
        e.assert_open("poll")
        with e.lock:
            return self._poll()

    def __iter__(self) -> Iterator["ChannelMessage"]:
        e = self._end
        held = self._held
        lock = e.lock
        take, record = e.ring.take_raw, e.ring.take_record
        message = ChannelMessage
        queue = not self._broadcast
        while True:
            m = None
            if queue and not e.closed:
                # receive()'s steps for a message that is there now (the usual case), written out: a
                # call per step costs as much as the step (and `with lock` twice lock.acquire/release).
                # Anything else goes through receive().
                lock.acquire()
                try:
                    if self._end_error is None and not self._ended and not e.closed and not (e.hub_lost or e._pending or e._fence_repairs):
                        s = take()
                        if s >= 0:  # (else nothing to take, or an error: receive() below says which)
                            got = record()
                            if s < TAKEN_DETACHED and not got[6]:  # (no meta)
                                m = held[s] = message(self, got)
                            else:
                                m = self._taken(got)
                finally:
                    lock.release()
            if m is None:
                m = self.receive()
                if m is None:
                    return
            yield m

    def _raise_end_error(self) -> NoReturn:
        err = self._end_error
        assert err is not None
        if self._deferred:  # (receive_many's: raised once)
            self._end_error = None
            self._deferred = False
        raise err

    def _poll(self) -> ChannelMessage | None:
        if self._end_error is not None:
            self._raise_end_error()
        e = self._end
        if self._ended or e.closed:
            return None
        if e.hub_lost or e._pending or e._fence_repairs:
            e.service()
        m = self._take_one()
        if m is not None:
            return m
        if not e.ring.producers_gone():
            return None
        m = self._take_one()  # every producer left: drain what they published, then end
        if m is not None:
            return m
        self._end_now()
        return None

    def _poll_many(self, most: int) -> list[ChannelMessage]:
        if self._end_error is not None:
            self._raise_end_error()
        e = self._end
        if self._ended or e.closed:
            return []
        if e.hub_lost or e._pending or e._fence_repairs:
            e.service()
        ms = self._take_many(most)
        if ms or not e.ring.producers_gone():
            return ms
        ms = self._take_many(most)  # every producer left: drain what they published, then end
        if not ms:
            self._end_now()
        return ms

    def _end_now(self) -> None:
        """Nothing left to take and every producer left: the end (ERR_PEER_GONE if one died)."""
        self._ended = True
        died = self._end.ring.counter(H_PRODUCERS_DIED)
        if died > 0:
            self._end_error = IpcError("ERR_PEER_GONE", f"the channel's producer{'s' if died > 1 else ''} died ({died}); every message published before was delivered")
            raise self._end_error

    def _detached(self, slots: list[int]) -> NoReturn:
        """Detached while taking (a recovery already ran for us): hand them back, then stop."""
        e = self._end
        for s in slots:
            if not ring_recovery.return_taken(e.ring, s):
                warnings.warn(f"cuda_ipc channel: a message taken after this end was detached could not be handed back (slot {s})", RuntimeWarning, stacklevel=4)
        raise e.detached_error("receive")

    def _take_one(self) -> ChannelMessage | None:
        e = self._end
        ring = e.ring
        if not e.layout.broadcast:
            got = ring.take_message()
            if got[0] < 0:
                if not e.alive():
                    raise e.detached_error("receive")
                return None
            return self._taken(got)
        while True:
            s = ring.peek_at(self._cursor)
            if s == -1:
                if not e.alive():
                    raise e.detached_error("receive")
                return None
            self._cursor += 1
            if s == -2:
                continue  # not ours (published before we attached, or we were removed)
            return self._message(s)

    def _take_many(self, most: int) -> list[ChannelMessage]:
        e = self._end
        if e.layout.broadcast:
            ms: list[ChannelMessage] = []
            while len(ms) < most and (m := self._take_one()) is not None:
                ms.append(m)
            return ms
        got, detached = e.ring.take_messages(most)
        if not got:
            if not e.alive():
                raise e.detached_error("receive")
            return []
        if detached:
            self._detached([g[0] & ~TAKEN_BAD for g in got])
        ms = []
        held = self._held
        for i, g in enumerate(got):
            s = g[0]
            if s < TAKEN_DETACHED and not g[6]:  # (no meta: _taken's steps written out)
                m = held[s] = ChannelMessage(self, g)
                ms.append(m)
                continue
            try:
                ms.append(self._taken(g))
            except IpcError as err:
                # A message that does not check out (_taken gave its slot back; a bad record ends the
                # batch, a meta that is not JSON may not): the ones after it go back to the channel
                # (redelivered); the error comes now, or after the ones before it.
                for later in got[i + 1:]:
                    ring_recovery.return_taken(e.ring, later[0])
                if not ms:
                    raise
                self._end_error, self._deferred = err, True
                break
        return ms

    def _taken(self, got: Taken) -> "ChannelMessage":
        """The message of a take_message() (a slot, not NOTHING): raises when this end was detached
        (the slot is handed back) or the message does not check out (its slot is given back)."""
        s, position, length, publisher, redelivered, ticket, meta_kind, meta_length = got
        if s >= TAKEN_DETACHED:
            if s & TAKEN_DETACHED:
                self._detached([s & ~(TAKEN_DETACHED | TAKEN_BAD)])
            s &= ~TAKEN_BAD
            self._abandon(s)
            raise corrupt(f"message in slot {s}: length {length}, meta {meta_length} bytes of kind {meta_kind}")
        meta = None if meta_kind == META_NONE else self._meta(s, meta_kind, self._end.ring.read_meta(s, meta_length))
        m = ChannelMessage(self, (s, position, length, publisher, redelivered, ticket), meta)
        self._held[s] = m
        return m

    def _message(self, s: int) -> "ChannelMessage":
        try:
            position, length, meta_kind, raw, publisher, redelivered, ticket = self._end.ring.read_message(s)
        except IpcError:
            self._abandon(s)
            raise
        meta = None if meta_kind == META_NONE else self._meta(s, meta_kind, raw)
        m = ChannelMessage(self, (s, position, length, publisher, redelivered, ticket), meta)
        self._held[s] = m
        return m

    def _meta(self, s: int, kind: int, raw: bytes) -> Any:
        """The meta of the message in slot ``s`` from its bytes; gives the slot back when it is not JSON."""
        if kind == META_BYTES:
            return raw
        try:
            return json.loads(raw)
        except ValueError:
            self._abandon(s)
            raise corrupt(f"message in slot {s}: its meta is not JSON") from None

    def _abandon(self, s: int) -> None:
        if self._end.layout.broadcast:
            self._end.ring.release_held(s)
        else:
            self._end.ring.release_taken(s)

    def _release(self, m: ChannelMessage, stream: Stream, streamed: bool) -> None:
        e = self._end
        with e.lock:
            held = self._held
            if held.get(m.index) is not m:
                return
            del held[m.index]
            if e.closed:
                return
            ring = e.ring
            f = self._fences
            if f is not None:
                l = e.layout
                if not l.broadcast:
                    ring.note_release(m.index, m.ticket)
                publish = l.publish_fence(m.index)
                # A release must never land before its publish (a fence would go backwards).
                if m._waited is not True and (not streamed or m._waited != stream) and not f.reached(publish, m.ticket):
                    f.wait_on(stream, publish, m.ticket)
                f.signal(stream, l.release_fence(m.index, e.index), m.ticket)
            if self._broadcast:
                ring.release_held(m.index)
            else:
                ring.release_taken(m.index)

    def close(self) -> None:
        """Closes this end now. Unreleased messages go to other consumers (work sharing: flagged
        redelivered) or are dropped (broadcast). Idempotent."""
        e = self._end

        def settle() -> None:
            f = e.block.fences
            if f is not None and e.layout.broadcast:
                for m in self._held.values():
                    f.raise_(e.layout.release_fence(m.index, e.index), m.ticket)
            for m in self._held.values():
                m._released = True
            self._held.clear()
            self._slots.close()
        e.close(settle)


class ChannelMessage:
    """A message a consumer received: ``memory`` (host slots: a memoryview of its ``length`` bytes),
    ``buffer`` (the whole slot: HostBuffer or DeviceBuffer), ``view(dtype, shape)``, ``meta``. Valid
    until ``release()``."""

    __slots__ = ("_consumer", "index", "_record", "meta", "_released", "_waited")

    def __init__(self, consumer: ChannelConsumer, record: Sequence[Any], meta: Any = None):
        # record: the slot, position, length, publisher, redelivered, ticket (a take's record, slot_ring.py
        # Taken, whose first six fields these are), kept as it is: one store instead of six per message.
        self._consumer = consumer
        self.index: int = record[0]
        self._record = record
        self.meta = meta
        self._released = False
        self._waited: Stream | bool = None  # the stream its publish fence was waited on, or True once synchronized

    @property
    def position(self) -> int:
        """The message's position in the channel (0, 1, ...; -1 past 2**53)."""
        return self._record[1]  # type: ignore[no-any-return]

    @property
    def length(self) -> int:
        """Bytes of the slot the message uses."""
        return self._record[2]  # type: ignore[no-any-return]

    @property
    def producer(self) -> int:
        """The participant index of the producer that published it."""
        return self._record[3]  # type: ignore[no-any-return]

    @property
    def redelivered(self) -> bool:
        """True when another consumer took it before and left without releasing it."""
        return self._record[4]  # type: ignore[no-any-return]

    @property
    def ticket(self) -> int:
        return self._record[5]  # type: ignore[no-any-return]

    @property
    def released(self) -> bool:
        return self._released

    def _check(self, what: str) -> None:
        if self._released:
            raise IpcError("ERR_CLOSED", f"msg.{what}: the message was released")

    @property
    def memory(self) -> memoryview:
        """Host slots: the message's bytes (zero-copy; valid until release())."""
        if self._released:
            self._check("memory")
        slots = self._consumer._slots
        base = slots._base
        if base is None:  # (device slots: it says so)
            return slots.memory(self.index, self.length)
        start = self.index * slots.bytes
        return base[start:start + self._record[2]]

    @property
    def buffer(self) -> HostBuffer | DeviceBuffer:
        """The slot's memory: a HostBuffer (host slots) or DeviceBuffer (device slots), the whole slot."""
        self._check("buffer")
        return self._consumer._slots.buffer(self.index)

    def view(self, dtype: object = "uint8", shape: int | Sequence[int] | None = None, strides: Sequence[int] | None = None,
             offset: int = 0) -> DeviceArray | memoryview:
        """A typed view of the slot: device slots a DeviceArray (``__cuda_array_interface__`` and
        DLPack); host slots a memoryview cast to the dtype's format. Default shape: as many elements
        as ``length`` holds."""
        return typed_view(self.buffer, self.length, dtype, shape, strides, offset)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        cai = dict(cuda_array_interface(self.buffer))
        cai["shape"] = (self.length,)
        if not self.length:
            cai["data"] = (0, False)
        return cai

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: bool | None = None) -> object:
        if copy:
            raise BufferError("ChannelMessage.__dlpack__: copy=True is not supported; it shares memory")
        buf = self.buffer
        if isinstance(buf, DeviceBuffer):
            from ..dlpack import DL_CUDA, make_capsule
            return make_capsule(buf.ptr, (DL_CUDA, buf.device.ordinal), "|u1", (self.length,), None, owner=self)
        return buf.view(0, self.length).__dlpack__() if self.length else buf.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.buffer.__dlpack_device__()

    def wait_on(self, stream: Stream = None) -> None:
        """Device slots: GPU work queued on ``stream`` after this waits for the producer's work on the
        message (its publish fence). No-op for host slots."""
        self._check("wait_on")
        f = self._consumer._end.block.fences
        if f is None:
            return
        f.wait_on(stream, self._consumer._end.layout.publish_fence(self.index), self.ticket)
        if self._waited is not True:
            self._waited = stream

    def synchronize(self, timeout: float | None = None) -> None:
        """Waits on this thread until the producer's GPU work on the message is done (host reads of
        device slots). No-op for host slots."""
        self._check("synchronize")
        e = self._consumer._end
        f = e.block.fences
        if f is None:
            return
        f.synchronize([(e.layout.publish_fence(self.index), self.ticket)], timeout)
        self._waited = True

    def release(self, stream: Stream = None) -> None:
        """Returns the slot to the producers. Device slots: pass the stream your GPU work on the
        message ran on; the producer's next use of the slot waits for it. Idempotent."""
        if self._released:
            return
        self._released = True
        c = self._consumer
        if c._plain:
            # Host slots, work sharing: _release's steps, written out (one call fewer per message).
            lock = c._lock
            lock.acquire()
            try:
                s = self.index
                held = c._held.pop(s, None)
                if held is self:
                    if not c._end.closed:
                        rc = c._release_raw(s)
                        if rc < 0:
                            raise c._end.ring.fail(rc)
                elif held is not None:
                    c._held[s] = held  # (another message of that slot: not ours to drop)
            finally:
                lock.release()
            return
        c._release(self, stream, stream is not None)

    def __enter__(self) -> "ChannelMessage":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<cuda_ipc.ChannelMessage #{self.position} slot {self.index} {self.length} bytes{' released' if self._released else ''}>"


def __getattr__(name: str) -> Any:
    # The old names of these (_renamed.py): each use warns, for one release.
    return renamed_attribute(__name__, {"ChannelMessage": ChannelMessage}, name)
