"""Taking a participant out of the ring (docs/channel-protocol.md section 6; src/channel/ring-recovery.ts):
the steps on the shared control block when an end leaves or died, and the work-sharing redelivery of
taken slots. recovery.py decides when and by whom they run (the hub's link closing, a repair
retried while a live publisher holds the lock); slot_ring.py holds every other step of the ring.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .layout import (
    FLAG_REDELIVERED, H_CONSUMERS_DIED, H_CONSUMERS_LIVE, H_CONSUMER_MASK, H_DATA_SLEEPERS, H_HEAD, H_LOCK,
    H_PRODUCERS_DIED, H_PRODUCERS_LIVE, H_SPACE_SLEEPERS, H_TAIL, KIND_FREE, KIND_PUBLISHED, KIND_TAKEN,
    KIND_WRITING, P_STATE, ROLE_CONSUMER, ROLE_PRODUCER, ST_ALIVE, ST_DEAD, ST_ENDED, ST_RECOVERING, S_HOLDERS,
    S_POSITION, S_PUBLISHER, S_STATE, S_TICKET, gen_of, slot_word,
)
from .slot_ring import Ring

if TYPE_CHECKING:
    from .fences import Fences


def leave(ring: Ring, k: int, died: bool, resuming: bool = False) -> str:
    """Takes participant k out of the channel (section 6): 'done', 'not-alive' or 'busy' (the
    publish lock is held by a live publisher: call again later with ``resuming``)."""
    w = ring.w
    po = ring.part_off(k)
    if not resuming and w.cas32(po + P_STATE, ST_ALIVE, ST_RECOVERING) != ST_ALIVE:
        return "not-alive"
    role = ring.participant_role(k)
    bit = 1 << k
    # 1. The lock it died holding.
    if w.load32(H_LOCK) == k + 1:
        t = ring._pos(H_TAIL, "tail")
        for s in range(ring.n):
            so = ring.slot_off(s)
            word = w.load32(so + S_STATE)
            if word & 0xFF == KIND_PUBLISHED and w.load64(so + S_POSITION) == t:
                w.store32(ring.ring_off(t), s)
                w.store64(H_TAIL, t + 1)
                break
        w.cas32(H_LOCK, k + 1, 0)
    # 2. Its slots.
    if ring.l.broadcast:
        if role == ROLE_CONSUMER:
            if not ring.spin_lock():
                return "busy"
            try:
                w.and32(H_CONSUMER_MASK, ~bit)
            finally:
                w.store32(H_LOCK, 0)
    else:
        w.and32(H_CONSUMER_MASK, ~bit)
        if holds_taken(ring, k):
            if not ring.spin_lock():
                return "busy"
            try:
                redeliver_taken(ring, k)
            finally:
                w.store32(H_LOCK, 0)
    for s in range(ring.n):
        so = ring.slot_off(s)
        word = w.load32(so + S_STATE)
        kind = word & 0xFF
        if kind == KIND_WRITING and (word >> 8) & 0xFF == k:
            w.cas32(so + S_STATE, word, KIND_FREE)
        elif ring.l.broadcast and kind == KIND_PUBLISHED:
            if w.load32(so + S_HOLDERS) & bit:
                ring.release_held(s, k)
            elif w.load32(so + S_HOLDERS) == 0:
                w.cas32(so + S_STATE, word, KIND_FREE)  # its last holder died mid-release
    # 3. Sleeper bits and counters.
    w.and32(H_DATA_SLEEPERS, ~bit)
    w.and32(H_SPACE_SLEEPERS, ~bit)
    if role == ROLE_PRODUCER:
        w.add32(H_PRODUCERS_LIVE, -1)
        if died:
            w.add32(H_PRODUCERS_DIED, 1)
    elif role == ROLE_CONSUMER:
        w.add32(H_CONSUMERS_LIVE, -1)
        if died:
            w.add32(H_CONSUMERS_DIED, 1)
    w.store32(po + P_STATE, ST_DEAD if died else ST_ENDED)
    # 4.
    ring.wake_everyone()
    return "done"

def return_taken(ring: Ring, s: int) -> bool:
    """Work sharing: publishes slot ``s``, which this participant took, again (flagged
    redelivered). False when the lock stayed busy for 50 ms."""
    deadline = time.perf_counter() + 0.05
    while not ring.spin_lock():
        if time.perf_counter() > deadline:
            return False
    try:
        redeliver_taken(ring, ring.me, s)
    finally:
        ring.w.store32(H_LOCK, 0)
    ring.signal_data()
    return True

def holds_taken(ring: Ring, k: int) -> bool:
    w = ring.w
    for s in range(ring.n):
        word = w.load32(ring.slot_off(s) + S_STATE)
        if word & 0xFF == KIND_TAKEN and (word >> 8) & 0xFF == k:
            return True
    return False

def redeliver_taken(ring: Ring, k: int, only: int = -1) -> None:
    w = ring.w
    for s in range(ring.n):
        if only >= 0 and s != only:
            continue
        so = ring.slot_off(s)
        word = w.load32(so + S_STATE)
        if word & 0xFF != KIND_TAKEN or (word >> 8) & 0xFF != k:
            continue
        pos = w.load64(so + S_POSITION)
        if pos >= 0:
            w.cas64(H_HEAD, pos, pos + 1)  # it took it but had not advanced head
        t = ring._pos(H_TAIL, "tail")
        w.store64(so + S_POSITION, t)
        publisher = w.plain32(so + S_PUBLISHER) & 0xFF
        if w.cas32(so + S_STATE, word, slot_word(KIND_PUBLISHED, publisher, FLAG_REDELIVERED | gen_of(t))) != word:
            continue
        w.store32(ring.ring_off(t), s)
        w.store64(H_TAIL, t + 1)


def raise_fences_of(ring: Ring, k: int, fences: Fences) -> None:
    """Device slots, participant ``k``'s process is gone: raises the fences its queued GPU work would
    have raised (its releases of every slot, its publishes of the messages it published)."""
    w, l = ring.w, ring.l
    for s in range(l.slot_count):
        so = ring.slot_off(s)
        before = w.load32(so + S_STATE)
        ticket = w.plain32(so + S_TICKET)
        if ticket == 0:
            continue
        fences.raise_(l.release_fence(s, k), ticket)
        kind = before & 0xFF
        if kind in (KIND_PUBLISHED, KIND_TAKEN) and w.plain32(so + S_PUBLISHER) == k and \
                w.load32(so + S_STATE) == before and w.plain32(so + S_TICKET) == ticket:
            fences.raise_(l.publish_fence(s), ticket)
