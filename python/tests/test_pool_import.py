"""A received pool (cuda_ipc/ipc/pool.py PoolImport) with a fake driver (tests/fake_cuda.py): a set
decoded on one thread retains the pool without waiting for the pointer imports another thread is
making (a first sync's mapping runs while its update plans), and the pool still goes once the last
user lets go; a set's buffers mapped in one batch (as the native helper does them) are each mapped
once, a buffer named twice shares its mapping, a refused one is ERR_HANDLE_STALE and the others
still map. (The helper's own call: test_torch_pool_arena.py.)"""
import os
import threading
import unittest

from cuda_ipc.cuda import driver as drv
from cuda_ipc.cuda.device import Device
from cuda_ipc.errors import IpcError
from cuda_ipc.ipc import pool as pool_mod
from cuda_ipc.ipc.pool import PoolImport

from . import fake_cuda


class PoolImportTests(unittest.TestCase):
    def setUp(self):
        self.fake = fake_cuda.install()

    def tearDown(self):
        fake_cuda.uninstall(self.fake)

    def test_retain_does_not_wait_for_an_import_in_flight(self):
        pool = self.fake.create_pool()
        base = self.fake.alloc(1 << 20, pool)
        dev = Device.get(0)
        with dev.activate():
            export = drv.pool_export_pointer(base)
        received = PoolImport(b"p" * 16, dev.uuid, 1 << 30, os.dup(self.fake.pools[pool]["fd"]))
        entered, gate = threading.Event(), threading.Event()
        real = self.fake.cuMemPoolImportPointer

        def slow_import(*args):
            entered.set()
            gate.wait(30)  # the driver mapping a large chunk
            return real(*args)
        self.fake.cuMemPoolImportPointer = slow_import
        results = []
        importer = threading.Thread(target=lambda: results.extend(received.import_pointers([export], dev)))
        importer.start()
        try:
            self.assertTrue(entered.wait(10), "the import started")
            retainer = threading.Thread(target=received.retain)
            retainer.start()
            retainer.join(10)
            self.assertFalse(retainer.is_alive(), "retain() returned while the import was still in the driver")
        finally:
            gate.set()
            importer.join(10)
        self.assertEqual(results, [base])
        self.assertEqual(received.users, 3, "the link's, the retain's and the import's")
        received.unmap(export)
        received.release()
        self.assertEqual(self.fake.destroyed, [], "a user is left: the pool stays")
        received.release()
        self.assertEqual(len(self.fake.destroyed), 1, "the last user gone, the pool is destroyed")
        self.assertEqual(received.fd, -1)

    def test_a_batch_maps_each_buffer_once_and_answers_each_place(self):
        pool = self.fake.create_pool()
        a, b = self.fake.alloc(4096, pool), self.fake.alloc(4096, pool)
        dev = Device.get(0)
        with dev.activate():
            ea, eb = drv.pool_export_pointer(a), drv.pool_export_pointer(b)
        gone = b"E" + (0xDEAD000).to_bytes(8, "little") + bytes(55)  # export data of no buffer
        received = PoolImport(b"p" * 16, dev.uuid, 1 << 30, os.dup(self.fake.pools[pool]["fd"]))
        calls = []

        def batch(context, h, exports):  # what the native helper does, through the fake driver
            calls.append(list(exports))
            out = []
            for e in exports:
                if e not in self.fake.exports:
                    out.append((drv.CUDA_ERROR_INVALID_VALUE, 0))
                    continue
                with dev.activate():
                    out.append((0, drv.pool_import_pointer(h, e)))
            return out
        real = pool_mod._batch_imports
        pool_mod._batch_imports = lambda: batch
        try:
            got = received.import_pointers([ea, gone, eb, ea], dev)
        finally:
            pool_mod._batch_imports = real
        self.assertEqual(calls, [[ea, gone, eb]], "one batch, each buffer once")
        self.assertEqual([got[0], got[2], got[3]], [a, b, a])
        self.assertIsInstance(got[1], IpcError)
        self.assertEqual(got[1].code, "ERR_HANDLE_STALE")
        self.assertEqual(self.fake.imported, {a: 1, b: 1}, "the driver mapped each once")
        self.assertEqual(received.users, 3, "the link's and one per buffer mapped")
        received.unmap(ea)
        self.assertEqual(self.fake.freed, [], "a still holds its second user")
        received.unmap(ea)
        received.unmap(eb)
        self.assertEqual(sorted(self.fake.freed), sorted([a, b]))
        received.release()
        self.assertEqual(len(self.fake.destroyed), 1)


if __name__ == "__main__":
    unittest.main()
