"""ipc_mem_pool (cuda_ipc/tensors/torch_pool.py) where it cannot work: no PyTorch, no native helper, no driver;
each says why (ERR_UNSUPPORTED) instead of failing later as an out-of-memory error. The GPU machine
runs the real thing (test/gpu/python-tensors.test.ts: a trainer's model in the pool)."""
import importlib.util
import os
import unittest

from cuda_ipc import IpcError, native_helper
from cuda_ipc.tensors import torch_pool

HELPER = native_helper()
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_DRIVER = any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia/version"))


class TorchPoolTests(unittest.TestCase):
    @unittest.skipIf(HAVE_TORCH, "torch is installed here")
    def test_without_torch_it_says_so(self):
        with self.assertRaises(IpcError) as e:
            torch_pool.ipc_mem_pool()
        self.assertEqual(e.exception.code, "ERR_UNSUPPORTED")
        self.assertIn("PyTorch", str(e.exception))

    @unittest.skipIf(not HELPER.active or HAVE_DRIVER, "needs the native helper and no NVIDIA driver")
    def test_without_a_driver_the_pool_says_why(self):
        with self.assertRaises(IpcError) as e:
            torch_pool.pool_handle(0)
        self.assertEqual(e.exception.code, "ERR_UNSUPPORTED")
        self.assertIn("libcuda.so.1", str(e.exception))
        self.assertIn("libcuda.so.1", torch_pool.last_error())

    @unittest.skipIf(not HELPER.active, "needs the native helper")
    def test_stats_of_a_pool_never_used_are_zero_and_a_bad_device_is_refused(self):
        # Bookkeeping only: no driver call, so this holds with or without a GPU.
        self.assertEqual(torch_pool.pool_stats(3), {"chunks": 0, "reserved": 0, "used": 0})
        for bad in (-1, 64):
            with self.assertRaises(IpcError) as e:
                torch_pool.pool_stats(bad)
            self.assertEqual(e.exception.code, "ERR_INVALID_ARG")
            self.assertIn(str(bad), str(e.exception))

    @unittest.skipIf(HELPER.active, "the native helper is in use here")
    def test_without_the_native_helper_stats_say_why(self):
        with self.assertRaises(IpcError) as e:
            torch_pool.pool_stats(0)
        self.assertEqual(e.exception.code, "ERR_UNSUPPORTED")

    @unittest.skipIf(HELPER.active, "the native helper is in use here")
    def test_without_the_native_helper_it_says_why(self):
        with self.assertRaises(IpcError) as e:
            torch_pool.pool_handle(0)
        self.assertEqual(e.exception.code, "ERR_UNSUPPORTED")
        self.assertIn("native helper", str(e.exception))


if __name__ == "__main__":
    unittest.main()
