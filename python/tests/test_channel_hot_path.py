"""The per-message hot path of the Python channel ends (issue 38): the rings' raw calls
(Ring.acquire_raw / publish_raw / take_raw + take_record / release_raw, NativeRing's C functions
with their state bound) give the values and codes slot_ring.py documents, on both rings; and the
ends' written-out paths (acquire, publish without meta, iteration, release, receive_many,
acquire_many) behave as the general ones: the message's fields, refusals with their codes, a
release after close, a publish that meets the publish lock held, on both hot paths."""
import struct
import threading
import unittest

from cuda_ipc import IpcError, native_helper
from cuda_ipc.channel.layout import H_LOCK, P_STATE, ST_DEAD
from cuda_ipc.channel.native_slot_ring import CLOSED, INVALID, NativeRing
from cuda_ipc.channel.slot_ring import PUBLISH_RESULTS, TAKEN_DETACHED, Ring
from cuda_ipc.native import addon as native_mod

from .channel_hub import HubCase, TestHub, native_setting

PATHS = ["python"] + (["native"] if native_helper().active else [])


class _Rings:
    """A control block (a TestHub, no links) with a producer and a consumer ring of one kind."""

    def __init__(self, native: bool):
        self.hub = TestHub(slots=4, slot_bytes=64, meta_bytes=64, max_participants=4)
        lib = native_mod.library("test") if native else None
        rings = []
        for role in ("producer", "consumer"):
            k = self.hub.allocate(role)
            self.hub.activate(k, role)
            rings.append(NativeRing(self.hub.words, self.hub.layout, self.hub.bells, k, lib) if native
                         else Ring(self.hub.words, self.hub.layout, self.hub.bells, k))
        self.producer, self.consumer = rings

    def close(self) -> None:
        self.producer.close()
        self.consumer.close()
        self.hub.close()


class RawCallTests(unittest.TestCase):
    def test_raw_calls_give_slots_records_and_codes_on_both_rings(self):
        for path in PATHS:
            with self.subTest(path=path):
                r = _Rings(path == "native")
                try:
                    p, c = r.producer, r.consumer
                    self.assertEqual(c.take_raw(), -1, "nothing to take")
                    claimed = [p.acquire_raw() for _ in range(4)]
                    self.assertEqual(sorted(claimed), [0, 1, 2, 3])
                    self.assertEqual(p.acquire_raw(), -1, "every slot in flight")
                    self.assertEqual(p.publish_raw(claimed[0], 5), PUBLISH_RESULTS.index("ok"))
                    self.assertEqual(p.publish_raw(claimed[1], 0), 0)
                    # The record: slot, position, length, publisher, redelivered, ticket, meta kind, meta length.
                    self.assertEqual(c.take_raw(), claimed[0])
                    self.assertEqual(c.take_record()[:5] + c.take_record()[6:], (claimed[0], 0, 5, p.me, False, 0, 0))
                    self.assertEqual(c.take_raw(), claimed[1])
                    self.assertEqual(c.take_record()[:3], (claimed[1], 1, 0))
                    self.assertEqual(c.take_raw(), -1)
                    self.assertEqual(c.release_raw(claimed[0]), 1)
                    self.assertEqual(c.release_raw(claimed[0]), 0, "no longer held")
                    self.assertEqual(p.acquire_raw(), claimed[0], "the released slot is free again")
                    # Detached after taking: the slot comes with TAKEN_DETACHED, as take_message's.
                    self.assertEqual(p.publish_raw(claimed[2], 7), 0)
                    r.hub.words.store32(c.part_off(c.me) + P_STATE, ST_DEAD)
                    self.assertEqual(c.take_raw(), claimed[2] | TAKEN_DETACHED)
                    self.assertEqual(c.take_record()[2], 7)
                    # A producer no longer alive: acquire_raw says so (-2), as acquire_slot.
                    r.hub.words.store32(p.part_off(p.me) + P_STATE, ST_DEAD)
                    self.assertEqual(p.acquire_raw(), -2)
                    self.assertEqual(p.acquire_slot(), -2)
                finally:
                    r.close()

    @unittest.skipUnless("native" in PATHS, f"the native helper is not in use: {native_helper().reason}")
    def test_native_raw_calls_give_negative_codes_and_fail_names_them(self):
        r = _Rings(True)
        try:
            p, c = r.producer, r.consumer
            self.assertEqual(p.publish_raw(99, 1), INVALID, "a slot index past the ring")
            self.assertEqual(p.fail(INVALID).code, "ERR_INVALID_ARG")
            self.assertEqual(c.release_raw(4), INVALID)
            p.close()
            c.close()
            for call in (p.acquire_raw, lambda: p.publish_raw(0, 1), c.take_raw, lambda: c.release_raw(0)):
                self.assertEqual(call(), CLOSED)
            err = p.fail(CLOSED)
            self.assertEqual((err.code, str(err)), ("ERR_CHANNEL_CLOSED", "the channel end is closed"))
        finally:
            r.hub.close()

    def test_the_pure_rings_fail_is_a_typed_error(self):
        r = _Rings(False)
        try:
            err = r.producer.fail(-6)
            self.assertEqual(err.code, "ERR_INVALID_ARG")
            self.assertIn("(-6)", str(err))
        finally:
            r.close()


class EndHotPathTests(HubCase):
    def ends(self, path: str, slots: int = 4):
        hub = self.hub(slots=slots, slot_bytes=64)
        producer = hub.attach("producer")
        consumer = hub.attach("consumer")
        self.assertEqual((producer.hot_path, consumer.hot_path), (path, path))
        return hub, producer, consumer

    def on_both_paths(self, check) -> None:
        for path in PATHS:
            with self.subTest(path=path), native_setting("0" if path == "python" else "1"):
                check(path)

    def test_a_message_keeps_its_fields_after_release_and_releases_once(self):
        def check(path: str) -> None:
            _hub, producer, consumer = self.ends(path)
            for i in range(3):
                slot = producer.acquire(timeout=1)
                struct.pack_into("<I", slot.memory, 0, 40 + i)
                producer.publish(slot, length=4 + i)
            it = iter(consumer)
            got = [next(it) for _ in range(3)]
            self.assertEqual([(m.position, m.length, m.producer, m.redelivered, m.ticket, m.meta) for m in got],
                             [(i, 4 + i, producer.index, False, 0, None) for i in range(3)])
            self.assertEqual([struct.unpack_from("<I", m.memory, 0)[0] for m in got], [40, 41, 42])
            self.assertEqual(len(got[2].memory), 6)
            got[0].release()
            got[0].release()  # idempotent: nothing else is freed
            self.assertTrue(got[0].released)
            self.assertEqual((got[0].position, got[0].length), (0, 4), "its fields stay readable")
            with self.assertRaises(IpcError) as cm:
                got[0].memory
            self.assertEqual(cm.exception.code, "ERR_CLOSED")
            self.assertEqual(consumer.stats()["slots"]["taken"], 2)
            # A batch: the same fields, and each release frees its own slot.
            slot = producer.acquire(timeout=1)
            producer.publish(slot, length=1)
            batch = consumer.receive_many(8, timeout=1)
            self.assertEqual([(m.position, m.length) for m in batch], [(3, 1)])
            for m in batch + got[1:]:
                m.release()
            self.assertEqual(consumer.stats()["slots"]["taken"], 0)
            # Released after close: nothing happens (close handed it back already).
            slot = producer.acquire(timeout=1)
            producer.publish(slot, length=2)
            late = next(it)
            consumer.close()
            late.release()
            self.assertTrue(late.released)
            producer.close()
        self.on_both_paths(check)

    def test_publish_refuses_what_the_written_out_path_would_not_check(self):
        def check(path: str) -> None:
            _hub, producer, consumer = self.ends(path)
            slot = producer.acquire(timeout=1)
            for length in (65, -1, 1.5, True):
                with self.assertRaises(IpcError) as cm:
                    producer.publish(slot, length=length)
                self.assertEqual(cm.exception.code, "ERR_OUT_OF_RANGE")
            for bad in (object(), 0, None):
                with self.assertRaises(IpcError) as cm:
                    producer.publish(bad)
                self.assertEqual(cm.exception.code, "ERR_INVALID_ARG")
            self.assertIsNone(consumer.poll(), "nothing was published")
            producer.publish(slot)  # the whole slot by default
            with self.assertRaises(IpcError) as cm:
                producer.publish(slot, length=1)
            self.assertEqual(cm.exception.code, "ERR_INVALID_ARG", "a published slot cannot go again")
            with self.assertRaises(IpcError) as cm:
                slot.memory
            self.assertEqual(cm.exception.code, "ERR_CLOSED")
            m = consumer.poll()
            self.assertEqual((m.length, m.meta), (64, None))
            m.release()
            # A closed producer: acquire and publish say so.
            slot = producer.acquire(timeout=1)
            producer.close()
            for call in (producer.acquire, lambda: producer.publish(slot)):
                with self.assertRaises(IpcError) as cm:
                    call()
                self.assertEqual(cm.exception.code, "ERR_CHANNEL_CLOSED")
            consumer.close()
        self.on_both_paths(check)

    def test_a_publish_that_finds_the_lock_held_waits_for_it(self):
        def check(path: str) -> None:
            _hub, producer, consumer = self.ends(path)
            slot = producer.acquire(timeout=1)
            struct.pack_into("<I", slot.memory, 0, 77)
            ring = producer._end.ring
            ring.w.store32(H_LOCK, consumer._end.ring.me + 1)
            # Unlocked once the publish's retry found the lock busy (the event), not after a delay.
            busy = threading.Event()
            real = ring.publish

            def one(s: int) -> str:
                r = real(s)
                if r == "busy":
                    busy.set()
                return r

            ring.publish = one

            def unlock_when_busy() -> None:
                busy.wait(30)
                ring.w.store32(H_LOCK, 0)

            unlock = threading.Thread(target=unlock_when_busy)
            unlock.start()
            try:
                producer.publish(slot, length=4)
            finally:
                unlock.join()
                del ring.publish
            self.assertTrue(busy.is_set(), "it waited for the lock")
            m = consumer.receive(timeout=1)
            self.assertEqual((struct.unpack_from("<I", m.memory, 0)[0], m.length), (77, 4))
            m.release()
            producer.close()
            consumer.close()
        self.on_both_paths(check)

    def test_acquire_many_claims_every_free_slot_under_one_call(self):
        def check(path: str) -> None:
            _hub, producer, consumer = self.ends(path)
            one = producer.acquire_many(1, timeout=1)
            self.assertEqual(len(one), 1)
            rest = producer.acquire_many(64, timeout=1)
            self.assertEqual(sorted(s.index for s in one + rest), [0, 1, 2, 3])
            self.assertIsNone(producer.try_acquire())
            producer.publish_many(one + rest, length=2)
            got = consumer.receive_many(2, timeout=1)
            self.assertEqual([m.position for m in got], [0, 1])
            got += consumer.receive_many(8, timeout=1)
            self.assertEqual([m.position for m in got], [0, 1, 2, 3])
            for m in got:
                m.release()
            producer.close()
            consumer.close()
        self.on_both_paths(check)


if __name__ == "__main__":
    unittest.main()
