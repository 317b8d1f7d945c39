"""The ring protocol over a channel control block: every operation a participant performs on shared
state (docs/channel-protocol.md section 4-6), the same steps as the Node side (src/channel/slot-ring.ts),
so that a Python end and Node ends share one channel. Every read and write of the control block's
words by a Python end is here (through SharedWords, shared_words.py), the fields of a slot record
and of a participant entry included: the ends above name no offset.

Values read from shared memory are never trusted: slot indices and positions are range-checked and
a bad one raises ERR_CHANNEL_CORRUPT. Loops over shared state are bounded.
"""
from __future__ import annotations

import struct
import time
from functools import partial
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .layout import (
    FLAG_REDELIVERED, GEN_MASK, GEN_SHIFT, H_CONSUMERS_ATTACHED, H_CONSUMERS_DIED, H_CONSUMERS_LIVE,
    H_CONSUMER_MASK, H_DATA_SEQ, H_DATA_SLEEPERS, H_HEAD, H_LOCK, H_PRODUCERS_ATTACHED, H_PRODUCERS_DIED,
    H_PRODUCERS_LIVE, H_SPACE_SEQ, H_SPACE_SLEEPERS, H_TAIL, KIND_FREE, KIND_PUBLISHED, KIND_TAKEN, KIND_WRITING,
    Layout, META_BYTES, META_NONE, PFLAG_HUB_LOCAL, P_CURSOR, P_FLAGS, P_GENERATION, P_PID, P_ROLE, P_STATE,
    ST_ALIVE, S_DELIVERIES, S_HOLDERS, S_LAST_HOLDERS, S_LENGTH, S_META, S_POSITION, S_PUBLISHER, S_RELEASED_BY,
    S_RELEASE_TICKET, S_STATE, S_TICKET, gen_of, slot_word,
)
from ..errors import IpcError

if TYPE_CHECKING:
    from .doorbells import Doorbells
    from .shared_words import SharedWords

#: How long a publisher spins for the publish lock before retrying later (seconds).
LOCK_SPIN = 200e-6
_MASK32 = 0xFFFFFFFF
_SLOT = 0xFFFFFF
_MAX_U53 = 2**53
#: A slot record from S_POSITION: position, length, meta length, meta kind, publisher, last holders,
#: deliveries, ticket (layout.py's S_* offsets 8..44).
_RECORD = struct.Struct("<QQIIIIII")
#: What a producer writes of its message from S_LENGTH: length, meta length, meta kind.
_MESSAGE = struct.Struct("<QII")
#: Set on a taken slot (take_message, take_messages) when this end was found detached right after taking it.
TAKEN_DETACHED = 1 << 24
#: Set on a taken slot when its message's record does not fit the layout (the slot stays taken).
TAKEN_BAD = 1 << 25
#: A message taken (take_message, take_messages): slot (with TAKEN_* flags), position, length,
#: publisher, redelivered, ticket, meta kind, meta length; the first six are the record a
#: ChannelMessage keeps (consumer.py). The meta's bytes: read_meta.
Taken = tuple[int, int, int, int, bool, int, int, int]
#: take_message's result when there is nothing to take.
NOTHING: Taken = (-1, 0, 0, 0, False, 0, 0, 0)
#: What a publish gives (publish_message), in the order of the raw results' codes (publish_raw).
PUBLISH_RESULTS = ("ok", "busy", "dropped", "detached")


def corrupt(what: str) -> IpcError:
    return IpcError("ERR_CHANNEL_CORRUPT", f"the channel's shared control block is inconsistent ({what}); a peer wrote garbage into it. Close the channel")


class Ring:
    """The ring protocol as participant ``me`` over ``words`` (SharedWords of the control block).
    NativeRing (native_slot_ring.py) does the per-message operations in C: ``hot_path`` says which runs."""

    hot_path = "python"

    def __init__(self, words: SharedWords, layout: Layout, bells: Doorbells, me: int):
        self.w = words
        self.l = layout
        self.n = layout.slot_count
        self.bells = bells
        self.me = me
        self._hint = 0
        self._rotor = 0
        #: Work sharing: the state word this participant set on each slot it took (for its release).
        self.taken_words = [0] * layout.slot_count
        self._records = layout.slot_records_offset
        self._record_bytes = layout.slot_record_bytes
        self._ring = layout.ring_offset
        self._parts = layout.participants_offset
        #: Consumers: the tail read last. Tail only grows, so positions below it stay published (or
        #: taken): the publish line is read again only once they are used up (slot-ring.ts, #tailSeen).
        self._tail_seen = 0
        # The hot path's calls (producer.py, consumer.py: one call per operation, int results as
        # NativeRing's C calls give them without a Python frame): acquire_raw() as acquire_slot();
        # publish_raw(s, length) publishes slot s without meta, length below 2**31: an index of
        # PUBLISH_RESULTS; release_raw(s): 1 released, 0 not held; take_raw(): take_message()'s slot
        # (with its TAKEN_* flags; -1 nothing to take), its record then take_record() (the Taken tuple).
        # Any other negative result: fail(rc).
        self.acquire_raw: Callable[[], int] = self.acquire_slot
        self.publish_raw: Callable[[int, int], int] = self.publish_bare
        self.release_raw: Callable[[int], int] = self.release_taken
        self.take_raw: Callable[[], int] = self._take_raw
        self.take_record: Callable[[], Taken] = partial(getattr, self, "_taken_last")
        self._taken_last: Taken = NOTHING

    def close(self) -> None:
        """The end is closing (NativeRing detaches its C state)."""

    def slot_off(self, s: int) -> int:
        return self._records + s * self._record_bytes

    def part_off(self, k: int) -> int:
        return self._parts + k * 64

    def ring_off(self, p: int) -> int:
        return self._ring + (p % self.n) * 4

    def _pos(self, off: int, what: str) -> int:
        v = self.w.load64(off)
        if v < 0:
            raise corrupt(f"{what} out of range")
        return v

    # -- wake-ups ------------------------------------------------------------------------------

    def signal_data(self, all_: bool = False) -> None:
        w = self.w
        # A locked add: it also orders publish()'s release stores (tail) before the sleepers' load.
        w.add32(H_DATA_SEQ, 1)
        if w.load32(H_DATA_SLEEPERS) != 0:
            self._wake(H_DATA_SLEEPERS, all_ or self.l.broadcast)

    def signal_space(self) -> None:
        w = self.w
        # No locked add: every caller freed the slot with a locked operation just before, which
        # orders that change before the sleepers' load (shared_words.bump32).
        w.bump32(H_SPACE_SEQ)
        if w.load32(H_SPACE_SLEEPERS) != 0:
            self._wake(H_SPACE_SLEEPERS, True)

    def wake_everyone(self) -> None:
        w = self.w
        w.add32(H_DATA_SEQ, 1)
        w.add32(H_SPACE_SEQ, 1)
        asleep = w.and32(H_DATA_SLEEPERS, 0) | w.and32(H_SPACE_SLEEPERS, 0)
        for k in range(self.l.max_participants):
            if asleep & (1 << k) or w.load32(self.part_off(k) + P_STATE) == ST_ALIVE:
                self.bells.ring(k)

    def _wake(self, mask_off: int, all_: bool) -> None:
        w = self.w
        if all_:
            m = w.and32(mask_off, 0)
            k = 0
            while m:
                if m & 1:
                    self.bells.ring(k)
                m >>= 1
                k += 1
            return
        m = w.load32(mask_off)
        while m:
            high = m & ~((1 << self._rotor) - 1) & _MASK32
            pick = high if high else m
            k = (pick & -pick).bit_length() - 1
            bit = 1 << k
            old = w.and32(mask_off, ~bit)
            if old & bit:
                self._rotor = 0 if k + 1 == 32 else k + 1
                self.bells.ring(k)
                return
            m = old & ~bit  # someone else woke k: try another

    def enter_sleep(self, mask_off: int) -> None:
        self.w.or32(mask_off, 1 << self.me)

    def leave_sleep(self, mask_off: int) -> None:
        self.w.and32(mask_off, ~(1 << self.me))

    # -- producers -----------------------------------------------------------------------------

    def claim_slot(self) -> int:
        """Claims a free slot for writing; -1 when every slot is in flight."""
        w = self.w
        n = self.n
        desired = slot_word(KIND_WRITING, self.me)
        s = self._hint
        # The slot after the last one claimed is usually free: one compare-and-swap claims it (a load
        # first would move its line twice; channel_ring.c, slot-ring.ts). Else the scan.
        if w.cas32(self._records + s * self._record_bytes, KIND_FREE, desired) == KIND_FREE:
            self._hint = 0 if s + 1 == n else s + 1
            return s
        for _ in range(n):
            off = self._records + s * self._record_bytes
            v = w.load32(off)
            if v & 0xFF == KIND_FREE and w.cas32(off, v, desired) == v:
                self._hint = 0 if s + 1 == n else s + 1
                return s
            s = 0 if s + 1 == n else s + 1
        return -1

    def claim_slots(self, most: int) -> list[int]:
        """Up to ``most`` claim_slot()s (fewer once no slot is free)."""
        got: list[int] = []
        while len(got) < most and (s := self.claim_slot()) >= 0:
            got.append(s)
        return got

    def has_free(self) -> bool:
        w = self.w
        for s in range(self.n):
            if w.load32(self._records + s * self._record_bytes) & 0xFF == KIND_FREE:
                return True
        return False

    def acquire_slot(self) -> int:
        """producer.py's checks, then claim_slot: the slot; -1 none free (or, broadcast, a consumer not
        attached yet); -2 this end is not alive; -3 every expected consumer attached and left."""
        if self.participant_state(self.me) != ST_ALIVE:
            return -2
        if self.consumers_gone():
            return -3
        return -1 if self.l.broadcast and self.consumers_missing() else self.claim_slot()

    def publish_message(self, s: int, length: int, meta_kind: int, meta: bytes) -> str:
        self.write_message(s, length, meta_kind, meta)
        return self.publish(s)

    def publish_bare(self, s: int, length: int) -> int:
        """publish_message() without meta: the index of its result in PUBLISH_RESULTS."""
        return PUBLISH_RESULTS.index(self.publish_message(s, length, META_NONE, b""))

    def fail(self, rc: int) -> IpcError:
        """The error of a negative result of a raw call (NativeRing's C codes; this ring gives none)."""
        return IpcError("ERR_INVALID_ARG", f"the channel ring refused a call ({rc}): a bug of cuda_ipc")

    def publish_many(self, slots: list[int], length: int) -> tuple[int, str]:
        """publish_message() without meta for each of ``slots`` in turn until one does not go through:
        how many did ('ok' or 'dropped'), and the result of the one that stopped ('ok' when none did)."""
        for i, s in enumerate(slots):
            r = self.publish_message(s, length, META_NONE, b"")
            if r != "ok" and r != "dropped":
                return i, r
        return len(slots), "ok"

    def take_message(self) -> Taken:
        """Work sharing: take() and the message's record (read_message's fields but the meta bytes);
        its slot with TAKEN_BAD set when the record does not fit the layout, and TAKEN_DETACHED when
        this end was found detached right after taking it. NOTHING when there is nothing to take."""
        s = self.take()
        if s < 0:
            return NOTHING
        m = self._taken_message(s)
        if self.participant_state(self.me) != ST_ALIVE:
            m = (m[0] | TAKEN_DETACHED,) + m[1:]
        return m

    def _take_raw(self) -> int:
        got = self._taken_last = self.take_message()
        return got[0]

    def take_messages(self, most: int) -> tuple[list[Taken], bool]:
        """Up to ``most`` take_message()s (oldest first; stops after one with TAKEN_BAD), and whether
        this end was found detached after them (their slots have no TAKEN_DETACHED)."""
        got: list[Taken] = []
        try:
            while len(got) < most and (s := self.take()) >= 0:
                m = self._taken_message(s)
                got.append(m)
                if m[0] != s:
                    break
        except IpcError:
            if not got:
                raise
        return got, bool(got) and self.participant_state(self.me) != ST_ALIVE

    def _taken_message(self, s: int) -> Taken:
        so = self._records + s * self._record_bytes
        position, length, meta_length, meta_kind, publisher, _last, _deliveries, ticket = self.w.unpack(_RECORD, so + S_POSITION)
        l = self.l
        if length > l.slot_bytes or meta_length > l.meta_bytes or meta_kind > META_BYTES:
            s |= TAKEN_BAD
        return (s, position if position <= _MAX_U53 else -1, length, publisher, bool(self.taken_words[s & _SLOT] & FLAG_REDELIVERED),
                ticket, meta_kind, meta_length)

    def read_meta(self, s: int, length: int) -> bytes:
        """The meta bytes of the message in slot ``s`` (held by this consumer; ``length`` checked)."""
        return self.w.read_bytes(self.slot_off(s) + S_META, length)

    def spin_while(self, off: int, expected: int, seconds: float) -> bool:
        """Spins while the word at ``off`` holds ``expected``, up to ``seconds``: True once it changed."""
        load32, clock = self.w.load32, time.perf_counter
        end = clock() + seconds
        while load32(off) == expected:
            if clock() >= end:
                return False
        return True

    def discard(self, s: int) -> None:
        word = slot_word(KIND_WRITING, self.me)
        if self.w.cas32(self.slot_off(s) + S_STATE, word, KIND_FREE) == word:
            self.signal_space()

    def spin_lock(self, spin: float = LOCK_SPIN) -> bool:
        w = self.w
        mine = self.me + 1
        if w.cas32(H_LOCK, 0, mine) == 0:
            return True
        deadline = time.perf_counter() + spin
        while time.perf_counter() < deadline:
            if w.load32(H_LOCK) == 0 and w.cas32(H_LOCK, 0, mine) == 0:
                return True
        return False

    def publish(self, s: int) -> str:
        """'ok', 'busy' (the lock stayed taken: nothing changed, try again), 'dropped' (broadcast, no
        consumer: the slot was freed) or 'detached' (recovery took the slot back)."""
        w = self.w
        me = self.me
        # A free lock is taken with one swap; only a busy one pays for the spin.
        if w.cas32(H_LOCK, 0, me + 1) != 0 and not self.spin_lock():
            return "busy"
        result = "ok"
        writing = KIND_WRITING | (me << 8)
        try:
            so = self._records + s * self._record_bytes
            t = w.load64(H_TAIL)
            if t < 0:
                raise corrupt("tail out of range")
            w.set_plain32(so + S_PUBLISHER, me)
            w.set_plain32(so + S_DELIVERIES, 0)
            # Release stores: the commit's swap below, and signal_data's add after the unlock, are
            # the locked operations that order them before every load that follows.
            w.release_store64(so + S_POSITION, t)
            if self.l.broadcast:
                mask = w.load32(H_CONSUMER_MASK)
                w.set_plain32(so + S_LAST_HOLDERS, mask)
                w.store32(so + S_HOLDERS, mask)
                if mask == 0:
                    result = "dropped" if w.cas32(so + S_STATE, writing, KIND_FREE) == writing else "detached"
                    return result
            # The commit point: a swap, so that a slot recovery took back is never published over.
            if w.cas32(so + S_STATE, writing, (KIND_PUBLISHED | (me << 8) | (t % 0x8000) << GEN_SHIFT) & _MASK32) != writing:
                result = "detached"
                return result
            w.release_store32(self._ring + (t % self.n) * 4, s)
            w.release_store64(H_TAIL, t + 1)
        finally:
            w.release_store32(H_LOCK, 0)
            if result == "dropped":
                self.signal_space()
        if result == "ok":
            self.signal_data()
        return result

    def last_holders(self, s: int) -> int:
        return self.w.plain32(self.slot_off(s) + S_LAST_HOLDERS)

    # -- what a message says: slot record fields only its publisher writes, before it publishes --

    def write_message(self, s: int, length: int, meta_kind: int, meta: bytes) -> None:
        """Producer, holding slot ``s`` (writing): the message's length and meta."""
        w = self.w
        so = self._records + s * self._record_bytes
        if meta:
            w.write_bytes(so + S_META, meta)
        w.pack(_MESSAGE, so + S_LENGTH, length, len(meta), meta_kind)

    def next_ticket(self, s: int) -> int:
        """Producer, holding slot ``s`` (writing, device slots): the ticket of the message it is about to
        publish, stored: the previous one + 1, wrapping, never 0 (0: never published)."""
        w = self.w
        off = self._records + s * self._record_bytes + S_TICKET
        ticket = ((w.plain32(off) + 1) & 0xFFFFFFFF) or 1
        w.set_plain32(off, ticket)
        return ticket

    def read_message(self, s: int) -> tuple[int, int, int, bytes, int, bool, int]:
        """Consumer, holding slot ``s``: (position, length, meta kind, meta bytes, publisher, redelivered,
        ticket) of its message. ERR_CHANNEL_CORRUPT when the fields do not fit the layout."""
        w = self.w
        l = self.l
        so = self._records + s * self._record_bytes
        # One unpack of the record's fields (S_POSITION .. S_TICKET); only its publisher wrote them,
        # before the state word change that handed the slot on.
        position, length, meta_length, meta_kind, publisher, _last, _deliveries, ticket = w.unpack(_RECORD, so + S_POSITION)
        if length > l.slot_bytes or meta_length > l.meta_bytes or meta_kind > META_BYTES:
            raise corrupt(f"message in slot {s}: length {length}, meta {meta_length} bytes of kind {meta_kind}")
        meta = w.read_bytes(so + S_META, meta_length) if meta_kind != META_NONE else b""
        word = self.taken_words[s] if not l.broadcast else 0
        return (position if position <= _MAX_U53 else -1, length, meta_kind, meta, publisher, bool(word & FLAG_REDELIVERED), ticket)

    def note_release(self, s: int, ticket: int) -> None:
        """Work sharing, device slots: this consumer releases ``ticket`` of slot ``s`` (its producer's
        next use of the slot waits for this participant's release fence)."""
        so = self.slot_off(s)
        self.w.set_plain32(so + S_RELEASED_BY, self.me)
        self.w.set_plain32(so + S_RELEASE_TICKET, ticket)

    def release_waits(self, s: int) -> list[tuple[int, int]]:
        """Producer, holding slot ``s`` (device slots): the (release fence, ticket) pairs its previous
        message must reach before the slot is written again."""
        w = self.w
        l = self.l
        so = self.slot_off(s)
        if not l.broadcast:
            ticket = w.plain32(so + S_RELEASE_TICKET)
            if ticket == 0:
                return []
            k = w.plain32(so + S_RELEASED_BY)
            if k >= l.max_participants:
                raise corrupt(f"slot {s} was released by participant {k}")
            return [(l.release_fence(s, k), ticket)]
        ticket = w.plain32(so + S_TICKET)
        if ticket == 0:
            return []
        holders = self.last_holders(s)
        return [(l.release_fence(s, k), ticket) for k in range(l.max_participants) if holders & (1 << k)]

    # -- consumers -----------------------------------------------------------------------------

    def take(self) -> int:
        """Work sharing: takes the oldest published message; -1 when there is none."""
        # The hot path of a Python consumer: words and methods bound to locals, helpers inlined.
        w = self.w
        n = self.n
        load32 = w.load32
        load64 = w.load64
        cas64 = w.cas64
        ring = self._ring
        records = self._records
        record_bytes = self._record_bytes
        t = self._tail_seen
        for _ in range(4 * n + 64):
            h = load64(H_HEAD)
            if h >= t or h < 0:
                # Tail first, then head again: both only grow, so t - h <= slots.
                t = self._tail_seen = self._pos(H_TAIL, "tail")
                h = self._pos(H_HEAD, "head")
                if h >= t:
                    return -1
            if t - h > n:
                raise corrupt(f"{t - h} messages in a ring of {n} slots")
            s = load32(ring + (h % n) * 4)
            if s >= n:
                raise corrupt(f"ring entry names slot {s} of {n}")
            so = records + s * record_bytes
            word = load32(so)
            # The generation in the word ties it to position h (no ABA; layout.gen_of).
            if word & 0xFF == KIND_PUBLISHED and word & GEN_MASK == (h % 0x8000) << GEN_SHIFT and load64(so + S_POSITION) == h:
                taken = (KIND_TAKEN | (self.me << 8) | (word & 0xFFFF0000)) & _MASK32
                if w.cas32(so, word, taken) == word:
                    self.taken_words[s] = taken
                    cas64(H_HEAD, h, h + 1)
                    w.set_plain32(so + S_DELIVERIES, w.plain32(so + S_DELIVERIES) + 1)
                    return s
                continue
            cas64(H_HEAD, h, h + 1)  # position h was taken (its taker may not have advanced head yet)
        return -1

    def peek_at(self, cursor: int) -> int:
        """Broadcast: the slot published at ``cursor``; -1 nothing there yet, -2 not held for us (skip)."""
        w = self.w
        t = self._tail_seen
        if cursor >= t:
            t = self._tail_seen = self._pos(H_TAIL, "tail")
            if cursor >= t:
                return -1
        if t - cursor > self.n:
            raise corrupt(f"{t - cursor} messages ahead of a consumer in a ring of {self.n} slots")
        s = w.load32(self.ring_off(cursor))
        if s >= self.n:
            raise corrupt(f"ring entry names slot {s} of {self.n}")
        so = self.slot_off(s)
        if w.load64(so + S_POSITION) != cursor or not w.load32(so + S_HOLDERS) & (1 << self.me):
            return -2
        return s

    def release_taken(self, s: int) -> bool:
        word = self.taken_words[s]
        if self.w.cas32(self.slot_off(s) + S_STATE, word, KIND_FREE) != word:
            return False
        self.signal_space()
        return True

    def release_held(self, s: int, k: int | None = None) -> bool:
        bit = 1 << (self.me if k is None else k)
        so = self.slot_off(s)
        old = self.w.and32(so + S_HOLDERS, ~bit)
        if not old & bit:
            return False
        if not old & ~bit:
            word = self.w.load32(so + S_STATE)
            if word & 0xFF == KIND_PUBLISHED:
                self.w.cas32(so + S_STATE, word, KIND_FREE)
            self.signal_space()
        return True

    def is_empty(self, cursor: int) -> bool:
        t = self._pos(H_TAIL, "tail")
        return (cursor if self.l.broadcast else self._pos(H_HEAD, "head")) >= t

    def cursor(self) -> int:
        """Broadcast: the position this consumer reads from next (set by the hub at attach)."""
        return self.w.load64(self.part_off(self.me) + P_CURSOR)

    # -- membership ----------------------------------------------------------------------------

    def counter(self, off: int) -> int:
        return self.w.load32(off)

    def producers_gone(self) -> bool:
        """Every producer the channel expects attached, and all left."""
        return self.w.load32(H_PRODUCERS_LIVE) == 0 and self.w.load32(H_PRODUCERS_ATTACHED) >= self.l.expect_producers

    def consumers_gone(self) -> bool:
        """Every consumer the channel expects attached, and all left."""
        return self.w.load32(H_CONSUMERS_LIVE) == 0 and self.w.load32(H_CONSUMERS_ATTACHED) >= self.l.expect_consumers

    def consumers_missing(self) -> bool:
        """Fewer consumers attached so far than the channel expects (a broadcast producer waits)."""
        return self.w.load32(H_CONSUMERS_ATTACHED) < self.l.expect_consumers

    def participant_generation(self, k: int) -> int:
        return self.w.plain32(self.part_off(k) + P_GENERATION)

    def hub_local(self, k: int) -> bool:
        """Participant ``k`` is an end the hub opened in its own process."""
        return bool(self.w.load32(self.part_off(k) + P_FLAGS) & PFLAG_HUB_LOCAL)

    def participant_state(self, k: int) -> int:
        return self.w.load32(self.part_off(k) + P_STATE)

    def participant_role(self, k: int) -> int:
        return self.w.plain32(self.part_off(k) + P_ROLE)

    def participant_pid(self, k: int) -> int:
        return self.w.plain32(self.part_off(k) + P_PID)

    def stats(self) -> dict[str, Any]:
        """Slot states and membership, read now."""
        c = self.counter
        return {
            "slots": self.slot_counts(),
            "producers": {"attached": c(H_PRODUCERS_ATTACHED), "live": c(H_PRODUCERS_LIVE), "died": c(H_PRODUCERS_DIED)},
            "consumers": {"attached": c(H_CONSUMERS_ATTACHED), "live": c(H_CONSUMERS_LIVE), "died": c(H_CONSUMERS_DIED)},
            "published": self.w.load64(H_TAIL),
        }

    def slot_counts(self) -> dict[str, int]:
        c = {"free": 0, "writing": 0, "published": 0, "taken": 0}
        names = ("free", "writing", "published", "taken")
        for s in range(self.n):
            kind = self.w.load32(self.slot_off(s) + S_STATE) & 0xFF
            if kind < 4:
                c[names[kind]] += 1
        return c

    def in_flight_from(self, k: int) -> int:
        n = 0
        w = self.w
        for s in range(self.n):
            so = self.slot_off(s)
            kind = w.load32(so + S_STATE) & 0xFF
            if kind in (KIND_PUBLISHED, KIND_TAKEN) and w.plain32(so + S_PUBLISHER) == k:
                n += 1
        return n
