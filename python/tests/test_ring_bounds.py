"""The ring's corruption checks at their exact bounds, in the pure-Python ring (channel/slot_ring.py):
the cases of test/cpu/channel-corrupt.test.ts (issue 41). A broadcast ring entry naming a slot past
the ring is ERR_CHANNEL_CORRUPT, never an IndexError or a read out of the block."""
from __future__ import annotations

import re
import struct
import unittest

from cuda_ipc import IpcError
from cuda_ipc.channel.layout import H_HEAD, H_TAIL, S_HOLDERS
from cuda_ipc.channel.slot_ring import Ring

from .channel_hub import TestHub

SLOTS = 4


class RingBoundsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.hubs: list[TestHub] = []

    def tearDown(self) -> None:
        for h in self.hubs:
            h.close()

    def block(self, broadcast: bool):  # type: ignore[no-untyped-def]
        hub = TestHub(slots=SLOTS, broadcast=broadcast)
        self.hubs.append(hub)
        p = hub.allocate("producer")
        hub.activate(p, "producer")
        c = hub.allocate("consumer")
        hub.activate(c, "consumer")
        producer = Ring(hub.words, hub.layout, hub.bells, p)

        def consumer() -> Ring:  # a fresh view: a Ring remembers the tail it read last
            return Ring(hub.words, hub.layout, hub.bells, c)

        def publish() -> int:
            s = producer.claim_slot()
            self.assertGreaterEqual(s, 0)
            self.assertEqual(producer.publish(s), "ok")
            return s

        return hub, consumer, publish

    def corrupt(self, pattern: str, f) -> None:  # type: ignore[no-untyped-def]
        with self.assertRaises(IpcError) as cm:
            f()
        self.assertEqual(cm.exception.code, "ERR_CHANNEL_CORRUPT")
        self.assertRegex(str(cm.exception), pattern)

    def test_broadcast_ring_entry_past_the_ring(self) -> None:
        hub, consumer, publish = self.block(True)
        s = publish()
        self.assertEqual(consumer().peek_at(0), s)
        for bad in (SLOTS, SLOTS + 1, 0xFFFF_FFFF):
            hub.words.store32(hub.ring.ring_off(0), bad)
            self.corrupt(f"ring entry names slot {bad} of {SLOTS}", lambda: consumer().peek_at(0))
        hub.words.store32(hub.ring.ring_off(0), 0 if s == SLOTS - 1 else SLOTS - 1)
        self.assertEqual(consumer().peek_at(0), -2, "the last slot is a valid index: skipped, not refused")
        hub.words.store32(hub.ring.ring_off(0), s)
        self.assertEqual(consumer().peek_at(0), s)

    def test_broadcast_more_than_a_ringful_ahead(self) -> None:
        hub, consumer, publish = self.block(True)
        s = publish()
        hub.words.store64(H_TAIL, SLOTS)
        self.assertEqual(consumer().peek_at(0), s, "exactly a ringful")
        hub.words.store64(H_TAIL, SLOTS + 1)
        self.corrupt(re.escape(f"({SLOTS + 1} messages ahead of a consumer in a ring of {SLOTS} slots)"), lambda: consumer().peek_at(0))
        hub.words.store64(H_TAIL, 2 + SLOTS)
        self.assertEqual(consumer().peek_at(2), -2)
        hub.words.store64(H_TAIL, 3 + SLOTS)
        self.corrupt(re.escape(f"({SLOTS + 1} messages ahead"), lambda: consumer().peek_at(2))

    def test_broadcast_entry_of_another_position_or_not_held(self) -> None:
        hub, consumer, publish = self.block(True)
        a, b = publish(), publish()
        self.assertEqual((consumer().peek_at(0), consumer().peek_at(1)), (a, b))
        hub.words.store32(hub.ring.ring_off(0), b)
        self.assertEqual(consumer().peek_at(0), -2, "held for us, but published at position 1")
        hub.words.store32(hub.ring.ring_off(0), a)
        hub.words.store32(hub.ring.slot_off(a) + S_HOLDERS, 0)
        self.assertEqual(consumer().peek_at(0), -2, "at position 0, but not held for us")

    def test_work_sharing_ring_entry_and_window(self) -> None:
        hub, consumer, publish = self.block(False)
        s = publish()
        for bad in (SLOTS, 0xFFFF_FFFF):
            hub.words.store32(hub.ring.ring_off(0), bad)
            self.corrupt(f"ring entry names slot {bad} of {SLOTS}", lambda: consumer().take())
        hub.words.store32(hub.ring.ring_off(0), s)
        hub.words.store64(H_TAIL, SLOTS + 1)
        self.corrupt(re.escape(f"({SLOTS + 1} messages in a ring of {SLOTS} slots)"), lambda: consumer().take())
        hub.words.store64(H_HEAD, 1)
        hub.words.store64(H_TAIL, 2 + SLOTS)
        self.corrupt(re.escape(f"({SLOTS + 1} messages in a ring of {SLOTS} slots)"), lambda: consumer().take())
        hub.words.store64(H_HEAD, 0)
        hub.words.store64(H_TAIL, SLOTS)
        self.assertEqual(consumer().take(), s, "a ringful is not corrupt")

    def test_tail_or_head_past_2_53(self) -> None:
        for broadcast in (True, False):
            hub, consumer, _ = self.block(broadcast)
            look = (lambda: consumer().peek_at(0)) if broadcast else (lambda: consumer().take())
            self.assertEqual(look(), -1, "an empty ring")
            m = hub.control.memory  # past what store64 accepts: written as raw bytes
            struct.pack_into("<Q", m, H_TAIL, 1 << 60)
            self.corrupt("tail out of range", look)
            if not broadcast:
                struct.pack_into("<Q", m, H_TAIL, 1)
                struct.pack_into("<Q", m, H_HEAD, 1 << 60)
                self.corrupt("head out of range", look)
            del m


if __name__ == "__main__":
    unittest.main()
