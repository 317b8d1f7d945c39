"""Device memory over links with a fake driver (tests/fake_cuda.py): what gets exported, imported,
mapped, viewed, unmapped and released, without a GPU. The GPU machine runs the real thing
(test/gpu/python-companion.test.ts)."""
import array
import ctypes
import gc
import os
import struct
import unittest

from cuda_ipc import DeviceBuffer, IpcError, share
from cuda_ipc.ipc import cache as memory_mod
from cuda_ipc.ipc.descriptor import ArrayMeta

from . import fake_cuda
from .test_link import open_fds, pair


def f32(ptr, n):
    return list(struct.unpack(f"<{n}f", ctypes.string_at(ptr, 4 * n)))


class DeviceMemoryTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()
        self.fake = fake_cuda.install()
        self.la, self.lb = pair()

    def tearDown(self):
        self.la.close()
        self.lb.close()
        gc.collect()
        fake_cuda.uninstall(self.fake)
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def fill(self, ptr, values):
        ctypes.memmove(ptr, struct.pack(f"<{len(values)}f", *values), 4 * len(values))

    def test_an_array_travels_as_the_handle_of_its_allocation_plus_offset(self):
        block = self.fake.alloc(1 << 16)
        ptr = block + 4096 + 12  # a sub-allocation, viewed 3 float32 in
        self.fill(ptr, [float(i) for i in range(100)])
        arr = fake_cuda.FakeArray(ptr, (10, 10), "<f4", stream=7)
        self.la.send({"t": arr, "shape": [10, 10]})
        self.assertEqual(self.fake.stream_syncs, [7], "the array's stream was synchronized before sending")
        del arr
        got = self.lb.receive(timeout=5)["t"]
        self.assertIsInstance(got, DeviceBuffer)
        self.assertEqual((got.kind, got.nbytes, got.offset), ("legacy", 400, 4096 + 12))
        self.assertEqual(got.array, ArrayMeta.make("float32", (10, 10)))
        self.assertFalse(got.is_mapped, "mapped on first use only")
        memory_mod._local_exports.clear()  # as in another process: open the handle for real
        self.assertEqual(got.ptr, ptr)
        self.assertEqual(self.fake.opened[block], 1)
        cai = got.__cuda_array_interface__
        self.assertEqual((cai["shape"], cai["typestr"], cai["version"], cai["data"]), ((400,), "|u1", 3, (ptr, False)))
        view = got.view("float32", (5, 20))
        self.assertEqual(view.__cuda_array_interface__["shape"], (5, 20))
        self.assertIsNone(view.__cuda_array_interface__["strides"])
        strided = got.view("<f4", (10,), strides=(40,), offset=4)
        self.assertEqual(strided.__cuda_array_interface__["strides"], (40,))
        self.assertEqual(strided.ptr, ptr + 4)
        self.assertEqual(f32(view.ptr, 3), [0.0, 1.0, 2.0])
        self.assertEqual(struct.unpack("<3f", got.read(4, 12)), (1.0, 2.0, 3.0))
        got.write(struct.pack("<f", -1.0), 396)
        self.assertEqual(f32(ptr + 396, 1), [-1.0])
        with self.assertRaises(IpcError):
            got.view("float32", (101,))
        self.assertEqual(self.la.leases.count, 1)
        got.close()
        stats = memory_mod.legacy_cache_stats()
        self.assertGreaterEqual(stats.pop("opened"), 1)
        self.assertEqual(stats, {"mappings": 1, "idle": 1, "idle_limit": 16, "references": 0},
                         "closing let go of the mapping, which stays open (idle) for a reopen")
        again = memory_mod._legacy_acquire(bytes(got._origin.descriptor.handle), got.device)
        self.assertEqual(again, (block, 1 << 16), "a reopen finds it without the driver")
        self.assertEqual(self.fake.opened[block], 1)
        memory_mod._legacy_release(bytes(got._origin.descriptor.handle), got.device)
        memory_mod.configure_import_cache(0)
        self.assertEqual(self.fake.opened[block], 0, "trimming the idle mappings closed it")
        memory_mod.configure_import_cache(16)
        self.assertGreaterEqual(self.fake.syncs, 1, "after waiting for the device's queued work")
        self.lb.poll()  # the receiver's next link call sends its releases
        self.la.poll()
        self.assertEqual(self.la.leases.count, 0, "and released the sender's lease")
        with self.assertRaises(IpcError):
            got.ptr

    def test_a_handle_that_comes_back_maps_to_the_original_memory(self):
        block = self.fake.alloc(8192)
        arr = fake_cuda.FakeArray(block + 64, (16,), "<u4")
        self.la.send(arr)
        got = self.lb.receive(timeout=5)
        self.lb.send({"back": got})  # sent on, leased from our handle on it
        got.close()
        back = self.la.receive(timeout=5)["back"]
        self.assertEqual(back.ptr, block + 64, "the exporter sees its own memory, not a failed open")
        self.assertEqual(self.fake.opened.get(block, 0), 0, "without opening its own handle")
        back.close()
        self.la.poll()  # sends la's release of "back"; lb's ends its hold, so lb releases the original
        self.lb.poll()
        self.la.poll()
        self.assertEqual((self.la.leases.count, self.lb.leases.count), (0, 0))

    def test_pool_memory_travels_as_pool_buffers_with_the_fd_once_per_link(self):
        pool = self.fake.create_pool()
        a = self.fake.alloc(1 << 20, pool)
        b = self.fake.alloc(4096, pool)
        self.fill(a + 256, [1.5, 2.5])
        self.la.send([share(fake_cuda.FakeArray(a + 256, (2,)), sync=False), fake_cuda.FakeArray(b, (1024,))])
        self.la.send(fake_cuda.FakeArray(a, (8,)))
        self.assertEqual(self.fake.syncs, 2, "the arrays without a stream synchronized the device; sync=False did not")
        first, second = self.lb.receive(timeout=5)
        third = self.lb.receive(timeout=5)
        self.assertEqual((first.kind, first.offset, first.nbytes, first.allocation_size), ("pool", 256, 8, 1 << 20))
        memory_mod._local_pool_exports.clear()  # as in another process
        self.assertEqual(f32(first.ptr, 2), [1.5, 2.5])
        self.assertEqual(third.ptr, a, "the same allocation, imported once")
        self.assertEqual(self.fake.imported[a], 1)
        self.assertEqual(second.ptr, b)
        pools = self.lb.handler_state[memory_mod._POOLS_RECEIVED]
        self.assertEqual(len(pools), 1, "one pool, its fd sent once")
        first.close()
        self.assertEqual(self.fake.imported[a], 1, "still mapped for the other buffer of the allocation")
        third.close()
        self.assertEqual(self.fake.imported[a], 0)
        second.close()
        self.lb.poll()  # the receiver's next link call sends its releases
        self.la.poll()
        self.assertEqual(self.la.leases.count, 0)
        self.lb.close()
        self.assertEqual(len(self.fake.destroyed), 1, "the imported pool is destroyed once the link and its buffers let go")

    def test_a_buffer_never_mapped_still_releases_and_the_link_close_ends_everything(self):
        pool = self.fake.create_pool()
        a = self.fake.alloc(4096, pool)
        kept = []
        self.la.send(fake_cuda.FakeArray(a, (1024,)))
        got = self.lb.receive(timeout=5)
        del got
        gc.collect()
        self.lb.poll()  # the receiver's next link call sends its releases
        self.la.poll()
        self.assertEqual(self.la.leases.count, 0, "collected without mapping: released at once")
        self.assertEqual(self.fake.imported.get(a, 0), 0)

        block = self.fake.alloc(4096)
        arr = fake_cuda.FakeArray(block, (1024,))
        self.la.send(arr)
        got = self.lb.receive(timeout=5)
        kept.append(got.ptr)
        self.assertEqual(self.la.leases.count, 1)
        self.lb._sock.close()  # the receiver dies
        with self.assertRaises(IpcError):
            self.la.receive(timeout=5)
        self.assertEqual(self.la.leases.count, 0, "the sender's holds ended with the link")
        got.close(sync=False)

    def test_cuda_core_ipc_is_refused_for_a_pool_cuda_ipc_mapped(self):
        pool = self.fake.create_pool()
        a = self.fake.alloc(4096, pool)
        b = self.fake.alloc(4096, pool)
        self.la.send([fake_cuda.FakeArray(a, (1024,)), fake_cuda.FakeArray(b, (1024,))])
        x, y = self.lb.receive(timeout=5)
        memory_mod._local_pool_exports.clear()
        x.ptr
        with self.assertRaises(IpcError) as cm:
            y.cuda_core_ipc()
        self.assertEqual(cm.exception.code, "ERR_INVALID_ARG")
        self.assertEqual(y.ptr, b, "and the buffer stays usable through cuda_ipc")
        x.close()
        y.close()

    def test_what_cannot_be_shared(self):
        with self.assertRaises(IpcError) as cm:
            self.la.send(fake_cuda.FakeArray(0, (0,)))
        self.assertEqual(cm.exception.code, "ERR_NOT_EXPORTABLE")
        block = self.fake.alloc(100)
        with self.assertRaises(IpcError) as cm:
            self.la.send(fake_cuda.FakeArray(block, (100,)))  # 400 bytes in a 100-byte allocation
        self.assertEqual(cm.exception.code, "ERR_OUT_OF_RANGE")
        self.assertEqual(self.la.leases.count, 0)

    def test_a_legacy_buffer_opens_only_inside_its_allocation(self):
        block = self.fake.alloc(1000)
        self.la.send(fake_cuda.FakeArray(block, (250,)))
        got = self.lb.receive(timeout=5)
        memory_mod._local_exports.clear()
        self.fake.allocs[block] = (self.fake.allocs[block][0], 100, 0)  # the allocation shrank: a bad descriptor
        with self.assertRaises(IpcError) as cm:
            got.ptr
        self.assertEqual(cm.exception.code, "ERR_OUT_OF_RANGE")
        self.assertEqual(memory_mod.legacy_cache_stats()["references"], 0, "the failed open is not in use")
        memory_mod.configure_import_cache(0)
        self.assertEqual(self.fake.opened[block], 0, "the failed open was closed again")
        memory_mod.configure_import_cache(16)
        got.close()

    def test_an_allocation_is_asked_for_its_handle_once(self):
        block = self.fake.alloc(4096)
        for i in range(3):
            self.la.send(fake_cuda.FakeArray(block + 256 * i, (64,)))
            self.lb.receive(timeout=5).close()
        self.assertEqual(self.fake.calls.count("cuIpcGetMemHandle"), 1, "the handle of an allocation does not change")
        self.assertEqual(self.fake.calls.count("cuPointerGetAttributes"), 3, "one pointer query per send")
        # A new allocation at the same address (its buffer id differs) gets a handle of its own.
        del self.fake.allocs[block]
        self.fake.allocs[block] = (ctypes.create_string_buffer(4096), 4096, 0)
        self.fake.buffer_ids[block] = 999
        self.la.send(fake_cuda.FakeArray(block, (64,)))
        self.lb.receive(timeout=5).close()
        self.assertEqual(self.fake.calls.count("cuIpcGetMemHandle"), 2)

    def test_the_working_device_maps_received_memory_for_itself(self):
        from cuda_ipc.cuda import device as device_mod
        self.fake.devices = 2
        device_mod._devices = None
        device_mod._by_uuid.clear()
        uuid1 = device_mod.format_uuid(fake_cuda.UUIDS[1])
        os.environ[device_mod.WORKING_DEVICE_ENV] = "gpu-" + uuid1[4:].upper()  # as spawn({ device }) sets it, any case
        self.addCleanup(os.environ.pop, device_mod.WORKING_DEVICE_ENV, None)
        pool = self.fake.create_pool()
        pooled = self.fake.alloc(4096, pool=pool)
        plain = self.fake.alloc(4096)
        self.la.send({"p": fake_cuda.FakeArray(pooled, (1024,)), "l": fake_cuda.FakeArray(plain, (1024,))})
        msg = self.lb.receive(timeout=5)
        memory_mod._local_pool_exports.clear()  # as in another process
        memory_mod._local_exports.clear()
        self.assertEqual(device_mod.working_device().uuid, uuid1)
        for key, base in (("p", pooled), ("l", plain)):
            buf = msg[key]
            self.assertEqual(buf.ptr, base)
            self.assertEqual(self.fake.mapped_in[base], 0xC1, f"{key}: mapped in device 1's context")
            self.assertEqual((buf.device.ordinal, buf.resident_device.ordinal), (1, 0))
            self.assertEqual(buf.__dlpack_device__(), (2, 1), "DLPack consumers put the tensor on device 1")
            buf.close()
        self.assertIn(1, [ordinal for _, ordinal in self.fake.access], "device 1 was granted access to the imported pool")
        # set_working_device overrides the environment; None maps where the memory lives.
        device_mod.set_working_device(None)
        self.addCleanup(setattr, device_mod, "_working_from_env", True)
        self.assertIsNone(device_mod.working_device())
        os.environ[device_mod.WORKING_DEVICE_ENV] = "GPU-00000000-0000-0000-0000-000000000000"
        device_mod._working_from_env = True
        with self.assertRaises(IpcError) as cm:
            device_mod.working_device()
        self.assertEqual(cm.exception.code, "ERR_UNKNOWN_DEVICE")


if __name__ == "__main__":
    unittest.main()
