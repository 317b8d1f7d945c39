"""A received pool (cuda_ipc/ipc/pool.py PoolImport) with a fake driver (tests/fake_cuda.py): a set
decoded on one thread retains the pool without waiting for the pointer imports another thread is
making (a first sync's mapping runs while its update plans), and the pool still goes once the last
user lets go."""
import os
import threading
import unittest

from cuda_ipc.cuda import driver as drv
from cuda_ipc.cuda.device import Device
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


if __name__ == "__main__":
    unittest.main()
