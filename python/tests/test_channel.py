"""Python channel ends against a Python test hub (tests/channel_hub.py, which makes the control block
and attaches ends as Node's hub does): ordering, meta, wake-ups, broadcast, a dead consumer's
messages redelivered, the hub's death, timeouts, refusals, a corrupt block, and device-slot fences
with the fake driver. Node is the real hub in test/cpu/python-channel.test.ts."""
import gc
import struct
import threading
import time
import unittest

from cuda_ipc import ChannelConsumer, ChannelProducer, IpcError, dlpack, native_helper
from cuda_ipc.ipc import cache as memory_mod
from cuda_ipc.channel.layout import H_LOCK, PFLAG_HUB_LOCAL, S_META, S_LENGTH, S_META_KIND, S_META_LENGTH, S_STATE

from . import fake_cuda
from .channel_hub import HubCase, TestHub, native_setting
from .test_link import open_fds


def publish_from(ring, layout, slots_mem, value: int) -> int:
    """The hub publishing as the participant ``ring.me`` (an end in the hub's own process)."""
    s = ring.claim_slot()
    assert s >= 0
    struct.pack_into("<I", slots_mem, s * layout.slot_bytes, value)
    so = ring.slot_off(s)
    ring.w.set_plain32(so + S_LENGTH, 4)
    ring.w.set_plain32(so + S_LENGTH + 4, 0)
    ring.w.set_plain32(so + S_META_LENGTH, 0)
    ring.w.set_plain32(so + S_META_KIND, 0)
    assert ring.publish(s) == "ok"
    return s


class ChannelTests(HubCase):
    def test_messages_in_order_with_meta_and_wakeups_across_threads(self):
        hub = self.hub(slots=4, slot_bytes=128)
        producer = hub.attach("producer", role="producer", memory="host")
        consumer = hub.attach("consumer", wait="sleep")
        self.assertIsInstance(producer, ChannelProducer)
        self.assertIsInstance(consumer, ChannelConsumer)
        self.assertEqual((consumer.topology, consumer.memory, consumer.slot_count, consumer.slot_bytes), ("queue", "host", 4, 128))
        total = 2000
        errors = []

        def produce():
            try:
                for i in range(total):
                    slot = producer.acquire(timeout=10)
                    n = 4 + i % 100
                    mem = slot.memory
                    struct.pack_into("<I", mem, 0, i)
                    mem[4:n] = bytes((i + j) & 0xFF for j in range(n - 4))
                    del mem
                    meta = {"i": i, "text": "héllo"} if i % 3 == 0 else (struct.pack("<I", i) if i % 3 == 1 else None)
                    producer.publish(slot, length=n, meta=meta)
                producer.end(timeout=10)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
        t = threading.Thread(target=produce)
        t.start()
        got = 0
        for msg in consumer:
            with msg:
                i = struct.unpack_from("<I", msg.memory, 0)[0]
                self.assertEqual(i, got)
                self.assertEqual(msg.position, i)
                self.assertEqual(msg.length, 4 + i % 100)
                self.assertEqual(bytes(msg.memory[4:]), bytes((i + j) & 0xFF for j in range(msg.length - 4)))
                self.assertEqual(msg.meta, {"i": i, "text": "héllo"} if i % 3 == 0 else (struct.pack("<I", i) if i % 3 == 1 else None))
                self.assertFalse(msg.redelivered)
            got += 1
        t.join(10)
        self.assertEqual(errors, [])
        self.assertEqual(got, total)
        self.assertTrue(consumer.ended)
        self.assertIsNone(consumer.receive(timeout=1), "an ended channel keeps answering None")
        stats = consumer.wait_stats
        self.assertEqual(stats["spin_hits"], 0, "wait='sleep' never spins")
        self.assertGreater(stats["rung"], 0, "sleeps were ended by the doorbell")
        self.assertEqual(stats["rescued"], 0, "no wake-up was lost")
        self.assertEqual(consumer.stats()["slots"]["free"], 4)
        self.assertTrue(producer.closed)
        consumer.close()

    def test_broadcast_every_consumer_gets_every_message(self):
        hub = self.hub(slots=4, broadcast=True, consumers=2)
        producer = hub.attach("producer")
        a = hub.attach("consumer")
        b = hub.attach("consumer")
        self.assertEqual(a.topology, "broadcast")

        def produce():
            for i in range(200):
                slot = producer.acquire(timeout=10)
                struct.pack_into("<I", slot.memory, 0, i)
                producer.publish(slot, length=4)
            producer.end(timeout=10)
        t = threading.Thread(target=produce)
        t.start()
        seen = {0: [], 1: []}

        def consume(k, c):
            for msg in c:
                seen[k].append(struct.unpack_from("<I", msg.memory, 0)[0])
                msg.release()
        tb = threading.Thread(target=consume, args=(1, b))
        tb.start()
        consume(0, a)
        tb.join(10)
        t.join(10)
        self.assertEqual(seen[0], list(range(200)))
        self.assertEqual(seen[1], list(range(200)))
        a.close()
        b.close()

    def test_a_dead_consumers_messages_go_to_another_flagged_once(self):
        hub = self.hub(slots=8, consumers=2)
        producer = hub.attach("producer")
        victim = hub.attach("consumer")
        other = hub.attach("consumer")
        for i in range(3):
            slot = producer.acquire(timeout=5)
            struct.pack_into("<I", slot.memory, 0, 100 + i)
            producer.publish(slot, length=4)
        held = [victim.receive(timeout=5) for _ in range(2)]
        self.assertEqual([m.position for m in held], [0, 1])
        first = other.receive(timeout=5)
        self.assertEqual(struct.unpack_from("<I", first.memory, 0)[0], 102)
        first.release()
        hub.kill(victim.index)  # its link closed: the hub repairs the control block
        again = [other.receive(timeout=5) for _ in range(2)]
        self.assertTrue(all(m.redelivered for m in again))
        self.assertEqual(sorted(struct.unpack_from("<I", m.memory, 0)[0] for m in again), [100, 101])
        self.assertEqual([m.position for m in again], [3, 4], "published again at the tail")
        for m in again:
            m.release()
        self.assertIsNone(other.poll(), "each exactly once")
        with self.assertRaises(IpcError) as cm:
            victim.receive(timeout=1)
        self.assertEqual(cm.exception.code, "ERR_CHANNEL_CLOSED")
        for m in held:
            m.release()  # a no-op: they are not ours any more
        self.assertEqual(producer.stats()["consumers"], {"attached": 2, "live": 1, "died": 1})
        victim.close()
        other.close()
        producer.close()
        with self.assertRaises(IpcError) as cm:
            ChannelProducer.acquire(producer)
        self.assertEqual(cm.exception.code, "ERR_CHANNEL_CLOSED")

    def test_the_hubs_death_ends_a_consumer_after_what_was_published(self):
        from cuda_ipc.channel.slot_ring import Ring
        hub = self.hub(slots=8)
        # A producer in the hub's own process (flagged, so that peers repair it with the hub).
        k = hub.allocate("producer", PFLAG_HUB_LOCAL)
        hub.activate(k, "producer")
        local = Ring(hub.words, hub.layout, hub.bells, k)
        consumer = hub.attach("consumer")
        mem = hub.slots.memory
        for i in range(3):
            publish_from(local, hub.layout, mem, 10 + i)
        del mem
        hub_side, _ = hub.links[consumer.index]
        first = consumer.receive(timeout=5)
        self.assertEqual(struct.unpack_from("<I", first.memory, 0)[0], 10)
        first.release()
        hub_side.close()  # the hub "dies": its link closes
        got = []
        with self.assertRaises(IpcError) as cm:
            for msg in consumer:
                got.append(struct.unpack_from("<I", msg.memory, 0)[0])
                msg.release()
        self.assertEqual(cm.exception.code, "ERR_PEER_GONE")
        self.assertEqual(got, [11, 12])
        st = consumer.stats()
        self.assertEqual(st["producers"], {"attached": 1, "live": 0, "died": 1})
        consumer.close()

    def test_a_producer_whose_consumers_died_gets_err_peer_gone(self):
        hub = self.hub(slots=2)
        producer = hub.attach("producer")
        consumer = hub.attach("consumer")
        for _ in range(2):
            producer.publish(producer.acquire(timeout=5), length=0)
        hub.kill(consumer.index)
        with self.assertRaises(IpcError) as cm:
            producer.acquire(timeout=5)
        self.assertEqual(cm.exception.code, "ERR_PEER_GONE")
        with self.assertRaises(IpcError) as cm:
            producer.end(timeout=5)
        self.assertEqual(cm.exception.code, "ERR_PEER_GONE")
        consumer.close()

    def test_timeouts_and_close_from_another_thread(self):
        hub = self.hub(slots=1)
        producer = hub.attach("producer")
        consumer = hub.attach("consumer")
        with self.assertRaises(IpcError) as cm:
            consumer.receive(timeout=0.05)
        self.assertEqual(cm.exception.code, "ERR_TIMEOUT")
        producer.publish(producer.acquire(timeout=1), length=1)
        with self.assertRaises(IpcError) as cm:
            producer.acquire(timeout=0.05)  # the only slot is in flight
        self.assertEqual(cm.exception.code, "ERR_TIMEOUT")
        msg = consumer.receive(timeout=1)
        closer = threading.Timer(0.1, consumer.close)
        closer.start()
        msg.release()
        self.assertIsNone(consumer.receive(timeout=10), "close() from another thread ends a blocked receive")
        closer.join(10)
        self.assertTrue(consumer.closed)
        with self.assertRaises(IpcError) as cm:
            consumer.receive()
        self.assertEqual(cm.exception.code, "ERR_CHANNEL_CLOSED")
        producer.close()

    def test_refuses_a_block_that_does_not_check_out(self):
        hub = self.hub(slots=2)
        struct.pack_into("<I", hub.control.memory, 100, 1)  # a reserved header word
        with self.assertRaises(IpcError) as cm:
            hub.attach("consumer")
        self.assertEqual(cm.exception.code, "ERR_DESCRIPTOR_INVALID")
        struct.pack_into("<I", hub.control.memory, 100, 0)
        with self.assertRaises(IpcError) as cm:
            hub.attach("consumer", role="producer")
        self.assertEqual(cm.exception.code, "ERR_INVALID_ARG")
        with self.assertRaises(IpcError) as cm:
            hub.attach("consumer", memory="device")
        self.assertEqual(cm.exception.code, "ERR_INVALID_ARG")

    def test_a_corrupt_ring_entry_is_an_error_not_a_crash(self):
        hub = self.hub(slots=4)
        producer = hub.attach("producer")
        consumer = hub.attach("consumer")
        producer.publish(producer.acquire(timeout=1), length=1)
        hub.words.store32(hub.layout.ring_offset, 999)
        with self.assertRaises(IpcError) as cm:
            consumer.receive(timeout=1)
        self.assertEqual(cm.exception.code, "ERR_CHANNEL_CORRUPT")
        hub.words.store32(hub.layout.ring_offset, 0)
        so = hub.layout.slot_records_offset
        hub.words.set_plain32(so + S_META_LENGTH, 10_000)  # more than meta_bytes
        with self.assertRaises(IpcError) as cm:
            consumer.receive(timeout=1)
        self.assertEqual(cm.exception.code, "ERR_CHANNEL_CORRUPT")
        self.assertEqual(hub.words.load32(so + S_STATE), 0, "the slot was given back")
        self.assertGreater(S_META, 0)
        producer.close()
        consumer.close()

    def test_a_message_that_does_not_check_out_through_iteration_and_receive_many(self):
        hub = self.hub(slots=4)
        producer = hub.attach("producer")
        consumer = hub.attach("consumer")
        l = hub.layout

        def publish_three(bad: int) -> int:
            """Three messages (4 bytes each, the first holds its number); the `bad`th one's record is spoiled."""
            spoiled = -1
            for i in range(3):
                slot = producer.acquire(timeout=1)
                struct.pack_into("<I", slot.memory, 0, i)
                producer.publish(slot, length=4, meta=b"m" if i == 2 else None)
                if i == bad:
                    spoiled = slot.index
                    hub.words.store64(l.slot_records_offset + slot.index * l.slot_record_bytes + S_LENGTH, l.slot_bytes + 1)
            return spoiled

        # Iteration: the first message, then the error (the spoiled slot given back), then the third.
        s = publish_three(1)
        it = iter(consumer)
        first = next(it)
        self.assertEqual(struct.unpack_from("<I", first.memory, 0)[0], 0)
        first.release()
        with self.assertRaises(IpcError) as cm:
            next(it)
        self.assertEqual(cm.exception.code, "ERR_CHANNEL_CORRUPT")
        self.assertIn(f"message in slot {s}: length {l.slot_bytes + 1}", str(cm.exception))
        self.assertEqual(hub.words.load32(l.slot_records_offset + s * l.slot_record_bytes + S_STATE), 0, "the slot was given back")
        third = consumer.receive(timeout=1)
        self.assertEqual((struct.unpack_from("<I", third.memory, 0)[0], third.meta, third.redelivered), (2, b"m", False))
        third.release()
        # receive_many: the messages before it, then the error once, then the ones after it.
        s = publish_three(1)
        got = consumer.receive_many(8, timeout=1)
        self.assertEqual([struct.unpack_from("<I", m.memory, 0)[0] for m in got], [0])
        with self.assertRaises(IpcError) as cm:
            consumer.receive_many(8, timeout=1)
        self.assertEqual(cm.exception.code, "ERR_CHANNEL_CORRUPT")
        self.assertEqual(hub.words.load32(l.slot_records_offset + s * l.slot_record_bytes + S_STATE), 0, "the slot was given back")
        rest = consumer.receive_many(8, timeout=1)
        self.assertEqual([(struct.unpack_from("<I", m.memory, 0)[0], m.meta) for m in rest], [(2, b"m")])
        for m in got + rest:
            m.release()
        # The first message spoiled: receive_many raises at once.
        publish_three(0)
        with self.assertRaises(IpcError) as cm:
            consumer.receive_many(8, timeout=1)
        self.assertEqual(cm.exception.code, "ERR_CHANNEL_CORRUPT")
        self.assertEqual([struct.unpack_from("<I", m.memory, 0)[0] for m in consumer.receive_many(8, timeout=1)], [1, 2])
        producer.close()
        consumer.close()

    def test_acquire_many_and_publish_many_on_both_hot_paths(self):
        paths = ["python"] + (["native"] if native_helper().active else [])
        for path in paths:
            with self.subTest(path=path), native_setting("0" if path == "python" else "1"):
                self._batches(path)

    def _batches(self, path: str):
        hub = self.hub(slots=8, slot_bytes=64)
        producer = hub.attach("producer")
        consumer = hub.attach("consumer")
        self.assertEqual((producer.hot_path, consumer.hot_path), (path, path))
        for bad in (0, -1, 1.5, True, "2"):
            with self.assertRaises(IpcError) as cm:
                producer.acquire_many(bad)
            self.assertEqual(cm.exception.code, "ERR_OUT_OF_RANGE")
        # Five at once, published in their order, each its own message.
        slots = producer.acquire_many(5, timeout=1)
        self.assertEqual(len({s.index for s in slots}), 5)
        for i, slot in enumerate(slots):
            struct.pack_into("<I", slot.memory, 0, 100 + i)
        producer.publish_many(slots, length=4)
        self.assertTrue(all(not s.pending for s in slots))
        got = consumer.receive_many(8, timeout=1)
        self.assertEqual([(struct.unpack_from("<I", m.memory, 0)[0], m.length, m.meta) for m in got], [(100 + i, 4, None) for i in range(5)])
        for m in got:
            m.release()
        # More than there are: every free slot, then none free within the timeout.
        slots = producer.acquire_many(64, timeout=1)
        self.assertEqual(len(slots), 8)
        with self.assertRaises(IpcError) as cm:
            producer.acquire_many(2, timeout=0.05)
        self.assertEqual(cm.exception.code, "ERR_TIMEOUT")
        # Checked before anything goes: a slot not ours, one listed twice, a bad length.
        for args, code in (((slots[:2] + [object()],), "ERR_INVALID_ARG"), (([slots[0], slots[1], slots[0]],), "ERR_INVALID_ARG"),
                           ((slots, 65), "ERR_OUT_OF_RANGE")):
            with self.assertRaises(IpcError) as cm:
                producer.publish_many(*args)
            self.assertEqual(cm.exception.code, code)
        self.assertIsNone(consumer.poll(), "nothing was published")
        for i, slot in enumerate(slots):
            struct.pack_into("<I", slot.memory, 0, 200 + i)
        producer.publish_many(reversed(slots))  # the whole slot by default; any iterable
        with self.assertRaises(IpcError) as cm:
            producer.publish_many(slots[:1])
        self.assertEqual(cm.exception.code, "ERR_INVALID_ARG", "a published slot cannot go again")
        got = consumer.receive_many(64, timeout=1)
        self.assertEqual([struct.unpack_from("<I", m.memory, 0)[0] for m in got], [207 - i for i in range(8)])
        self.assertEqual({m.length for m in got}, {64})
        for m in got:
            m.release()
        # The publish lock held a while by another live participant: the batch waits for it, then
        # every message goes, in its order.
        slots = producer.acquire_many(3, timeout=1)
        for i, slot in enumerate(slots):
            struct.pack_into("<I", slot.memory, 0, 300 + i)
        ring = producer._end.ring
        w = ring.w
        w.store32(H_LOCK, consumer._end.ring.me + 1)
        # Unlocked once a publish found the lock busy (the event), not after a guess at a delay.
        busy = threading.Event()
        real_many, real_one = ring.publish_many, ring.publish

        def many(indices: list[int], length: int) -> tuple[int, str]:
            done, r = real_many(indices, length)
            if r == "busy":
                busy.set()
            return done, r

        def one(s: int) -> str:
            r = real_one(s)
            if r == "busy":
                busy.set()
            return r

        ring.publish_many, ring.publish = many, one  # type: ignore[method-assign]

        def unlock_when_busy() -> None:
            busy.wait(30)
            w.store32(H_LOCK, 0)

        unlock = threading.Thread(target=unlock_when_busy)
        unlock.start()
        try:
            producer.publish_many(slots, length=4)
        finally:
            unlock.join()
            del ring.publish_many, ring.publish
        self.assertTrue(busy.is_set(), "it waited for the lock")
        got = consumer.receive_many(8, timeout=1)
        self.assertEqual([struct.unpack_from("<I", m.memory, 0)[0] for m in got], [300, 301, 302])
        for m in got:
            m.release()
        producer.end(timeout=1)
        self.assertEqual(consumer.receive_many(8, timeout=1), [])
        consumer.close()


class _Forgetful(dict):
    def __setitem__(self, key, value):
        pass


class DeviceChannelTests(unittest.TestCase):
    """Device slots with the fake driver: the fence protocol of docs/channel-protocol.md section 7."""

    def setUp(self):
        self.fds = open_fds()
        self.fake = fake_cuda.install()

    def tearDown(self):
        gc.collect()
        fake_cuda.uninstall(self.fake)
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_fences_order_gpu_work_only_where_needed(self):
        pool = self.fake.create_pool()
        ptr = self.fake.alloc(2 * 256, pool=pool)
        hub = TestHub(slots=2, slot_bytes=256, device_slots=fake_cuda.FakeArray(ptr, (512,), "|u1"))
        try:
            # As in another process: import the slots instead of finding them among our own exports.
            real = memory_mod._local_pool_exports
            memory_mod._local_pool_exports = _Forgetful()
            self.addCleanup(setattr, memory_mod, "_local_pool_exports", real)
            producer = hub.attach("producer", memory="device")
            consumer = hub.attach("consumer")
            l = hub.layout
            p_at = producer._end.w.address  # where each end maps the control block
            c_at = consumer._end.w.address
            self.assertEqual(len(self.fake.registered), 2, "each end registered its control block with the GPU")
            self.assertEqual(self.fake.imported.get(ptr), 2, "each end mapped the slots once")
            # First message: nothing to wait for; an idle stream gets its fence written by the CPU.
            slot = producer.acquire(stream=5)
            self.assertEqual(self.fake.stream_ops, [])
            self.assertEqual(slot.buffer.ptr, ptr + 256 * slot.index)
            cai = slot.view("float32").__cuda_array_interface__
            self.assertEqual((cai["shape"], cai["data"][0]), ((64,), ptr + 256 * slot.index))
            producer.publish(slot, stream=5, length=128, meta={"n": 1})
            s = slot.index
            self.assertEqual(hub.words.load32(l.publish_fence(s)), 1, "ticket 1 stored from the CPU")
            msg = consumer.receive(timeout=1)
            self.assertEqual((msg.index, msg.ticket, msg.length, msg.meta), (s, 1, 128, {"n": 1}))
            self.assertEqual(msg.__cuda_array_interface__["shape"], (128,))
            msg.wait_on(9)
            self.assertEqual(self.fake.stream_ops, [], "a reached fence costs no stream operation")
            self.fake.busy_streams.add(9)
            msg.release(stream=9)
            self.assertEqual(self.fake.stream_ops, [("write", 9, c_at + l.release_fence(s, consumer.index), 1)])
            # The next message in that slot waits on the GPU for the consumer's release.
            self.fake.stream_ops.clear()
            self.fake.busy_streams.add(5)
            again = None
            for _ in range(2):
                again = producer.acquire(stream=5)
                if again.index == s:
                    break
                producer.discard(again)
            self.assertEqual(again.index, s)
            self.assertEqual(self.fake.stream_ops, [("wait", 5, p_at + l.release_fence(s, consumer.index), 1)])
            self.fake.stream_ops.clear()
            producer.publish(again, stream=5)
            self.assertEqual(self.fake.stream_ops, [("write", 5, p_at + l.publish_fence(s), 2)])
            # A consumer that releases without waiting: its release waits for the publish first.
            self.fake.stream_ops.clear()
            msg2 = consumer.receive(timeout=1)
            self.assertEqual(msg2.ticket, 2)
            with self.assertRaises(IpcError) as cm:
                msg2.synchronize(timeout=0.02)
            self.assertEqual(cm.exception.code, "ERR_TIMEOUT")
            msg2.release(stream=9)
            self.assertEqual(self.fake.stream_ops, [
                ("wait", 9, c_at + l.publish_fence(s), 2),
                ("write", 9, c_at + l.release_fence(s, consumer.index), 2),
            ])
            self.fake.run_stream_writes()
            self.assertEqual(hub.words.load32(l.release_fence(s, consumer.index)), 2)
            # Without a stream, acquire waits on the CPU for the release fences.
            self.fake.stream_ops.clear()
            for _ in range(2):
                third = producer.acquire(timeout=1)
                if third.index == s:
                    break
                producer.discard(third)
            self.assertEqual(self.fake.stream_ops, [], "reached on the CPU: no stream operation")
            producer.discard(third)
            consumer.close()
            producer.close()
            self.assertEqual(self.fake.registered, {}, "both ends unregistered the control block")
            self.assertGreaterEqual(self.fake.syncs, 1, "after the device finished the queued fence operations")
        finally:
            hub.close()

    def test_acquire_many_that_times_out_on_a_device_slot_gives_every_slot_back(self):
        pool = self.fake.create_pool()
        ptr = self.fake.alloc(2 * 256, pool=pool)
        hub = TestHub(slots=2, slot_bytes=256, device_slots=fake_cuda.FakeArray(ptr, (512,), "|u1"))
        try:
            producer = hub.attach("producer", memory="device")
            consumer = hub.attach("consumer")
            producer.publish_many(producer.acquire_many(2, timeout=1, stream=5), length=8, stream=5)
            first, second = consumer.receive_many(2, timeout=1)
            first.release()  # its release fence reached now
            self.fake.busy_streams.add(9)
            second.release(stream=9)  # its release fence queued on a busy stream, not reached
            with self.assertRaises(IpcError) as cm:
                producer.acquire_many(2, timeout=0.05)  # the first is ready, the second never gets there
            self.assertEqual(cm.exception.code, "ERR_TIMEOUT")
            self.assertEqual(producer._writing, {}, "the slot acquired before the wait was given back too")
            self.fake.run_stream_writes()
            again = producer.acquire_many(2, timeout=1)
            self.assertEqual(sorted(s.index for s in again), [first.index, second.index], "both slots free again")
            for slot in again:
                producer.discard(slot)
            consumer.close()
            producer.close()
        finally:
            hub.close()

    def test_device_slots_are_arrays_to_cuda_libraries_and_host_slots_are_not(self):
        pool = self.fake.create_pool()
        ptr = self.fake.alloc(2 * 256, pool=pool)
        hub = TestHub(slots=2, slot_bytes=256, device_slots=fake_cuda.FakeArray(ptr, (512,), "|u1"))
        try:
            producer = hub.attach("producer", memory="device")
            consumer = hub.attach("consumer")
            slot = producer.acquire(stream=5)
            at = ptr + 256 * slot.index
            self.assertEqual(slot.__cuda_array_interface__["data"][0], at)
            self.assertEqual(slot.__dlpack_device__(), (dlpack.DL_CUDA, 0))
            producer.publish(slot, length=100, stream=5)
            msg = consumer.receive(timeout=1)
            cai = msg.__cuda_array_interface__
            self.assertEqual((cai["data"][0], cai["shape"]), (at, (100,)))
            live = dlpack.live_tensors()
            capsule = msg.__dlpack__()
            self.assertEqual(dlpack.live_tensors(), live + 1, "a capsule of the message's bytes")
            del capsule
            self.assertEqual(dlpack.live_tensors(), live, "freed with its unconsumed capsule")
            msg.release(stream=9)
            consumer.close()
            producer.close()
        finally:
            hub.close()
        host = TestHub(slots=2, slot_bytes=64)
        try:
            producer = host.attach("producer")
            consumer = host.attach("consumer")
            producer.publish(producer.acquire(), length=8)
            msg = consumer.receive(timeout=1)
            self.assertFalse(hasattr(msg, "__cuda_array_interface__"), "host slots are not device memory")
            self.assertEqual(msg.__dlpack_device__(), (dlpack.DL_CPU, 0))
            msg.release()
            consumer.close()
            producer.close()
        finally:
            host.close()


if __name__ == "__main__":
    unittest.main()
