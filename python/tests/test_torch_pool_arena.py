"""The IPC pool allocator of the native helper (native/py/torch_pool.cc, behind ipc_mem_pool) over a
stand-in libcuda (fake_libcuda_pool.c, compiled here): PyTorch's segments carved out of a few pool
allocations (chunks), first fit with coalescing, chunks growing with the pool and one of its own for
a large segment, a chunk given back once its segments are all freed, the growth given up (not the
allocation) when the device is nearly full, and an address it never handed out ignored. What the
GPU machine adds (test/gpu/python-tensors.test.ts): PyTorch calling it, and the values."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from cuda_ipc import native_helper

HERE = os.path.dirname(os.path.abspath(__file__))
CC = os.environ.get("CC", "cc")
HELPER = native_helper()
MiB = 1 << 20
GiB = 1 << 30

# Runs in a child whose loader finds the fake as libcuda.so.1; prints what it saw as JSON.
CHILD = r"""
import ctypes, json
from cuda_ipc import native_helper
from cuda_ipc.tensors import torch_pool
h = ctypes.CDLL(native_helper().path)
fake = ctypes.CDLL("libcuda.so.1")
for f in ("fake_live_base", "fake_live_size", "fake_live_bytes", "fake_last_asked"):
    getattr(fake, f).restype = ctypes.c_ulonglong
fake.fake_set_limit.argtypes = [ctypes.c_ulonglong]
alloc = h.cip_torch_alloc
alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
free = h.cip_torch_free
free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
MiB, GiB = 1 << 20, 1 << 30

def chunks():
    return sorted((fake.fake_live_base(i), fake.fake_live_size(i)) for i in range(fake.fake_live_count()))

def inside(segments):
    # every segment within one chunk, no two overlapping
    cs = chunks()
    ok = all(any(b <= p and p + n <= b + s for b, s in cs) for p, n in segments)
    ranges = sorted(segments)
    return ok and all(p + n <= q for (p, n), (q, _) in zip(ranges, ranges[1:]))

out = {}
a, b, c = (alloc(MiB, 0, None) for _ in range(3))
out["first"] = {"chunks": [s for _, s in chunks()], "adjacent": [b - a, c - b], "inside": inside([(a, MiB), (b, MiB), (c, MiB)])}
free(b, MiB, 0, None)
d = alloc(MiB, 0, None)
free(a, MiB, 0, None)
free(d, MiB, 0, None)
e = alloc(2 * MiB, 0, None)
f = alloc(1000, 0, None)
g = alloc(1000, 0, None)
out["reuse"] = {"d_is_b": d == b, "e_is_a": e == a, "f_align": f % 512, "g_minus_f": g - f}
for p, n in ((c, MiB), (e, 2 * MiB), (f, 1000), (g, 1000)):
    free(p, n, 0, None)
out["emptied"] = {"live": fake.fake_live_count(), "stats": torch_pool.pool_stats(0), "ctx_syncs": fake.fake_ctx_syncs()}
ps = [alloc(2 * MiB, 0, None) for _ in range(150)]
big = alloc(3 * GiB + 5, 0, None)
segs = [(p, 2 * MiB) for p in ps] + [(big, 3 * GiB + 512)]
out["growth"] = {"chunks": [s // MiB for _, s in chunks()], "inside": inside(segs), "stats": torch_pool.pool_stats(0),
                 "stream_syncs": fake.fake_stream_syncs()}
fake.fake_set_limit(fake.fake_live_bytes() + GiB + GiB // 2)
near_full = alloc(GiB, 0, None)
asked = fake.fake_last_asked()
none = alloc(GiB, 0, None)
err = torch_pool.last_error()
out["oom"] = {"got": bool(near_full), "asked_mib": asked // MiB, "second": none, "error": err,
              "inside": inside(segs + [(near_full, GiB)])}
free(0x1234000, 4096, 0, None)
out["stray"] = {"error": torch_pool.last_error(), "bad_frees": fake.fake_bad_frees()}
for p, n in segs + [(near_full, GiB)]:
    free(p, n, 0, None)
out["end"] = {"live": fake.fake_live_count(), "stats": torch_pool.pool_stats(0), "bad_frees": fake.fake_bad_frees()}
print(json.dumps(out))
"""


def _run_child() -> dict:  # type: ignore[type-arg]
    tmp = tempfile.mkdtemp(prefix="cuda-ipc-fake-libcuda-")
    try:
        lib = os.path.join(tmp, "libcuda.so.1")
        built = subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", lib, os.path.join(HERE, "fake_libcuda_pool.c")],
                               capture_output=True, text=True)
        if built.returncode != 0:
            raise AssertionError(f"{CC} could not build fake_libcuda_pool.c: {built.stderr[-500:]}")
        env = dict(os.environ, LD_LIBRARY_PATH=tmp + (os.pathsep + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else ""))
        r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env,
                           cwd=os.path.dirname(HERE), timeout=60)
        if r.returncode != 0:
            raise AssertionError(f"the child failed ({r.returncode}): {r.stderr[-2000:]}")
        result: dict = json.loads(r.stdout)  # type: ignore[type-arg]
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@unittest.skipIf(not HELPER.active, f"needs the native helper ({HELPER.reason})")
@unittest.skipIf(shutil.which(CC) is None, f"needs a C compiler ({CC}; set CC) to build the stand-in libcuda")
class PoolArenaTests(unittest.TestCase):
    seen: dict  # type: ignore[type-arg]

    @classmethod
    def setUpClass(cls) -> None:
        cls.seen = _run_child()

    def test_segments_come_from_one_chunk_side_by_side(self) -> None:
        first = self.seen["first"]
        self.assertEqual(first["chunks"], [32 * MiB], "one chunk, the smallest")
        self.assertEqual(first["adjacent"], [MiB, MiB])
        self.assertTrue(first["inside"])

    def test_freed_ranges_are_reused_first_fit_and_coalesced(self) -> None:
        reuse = self.seen["reuse"]
        self.assertTrue(reuse["d_is_b"], "a freed 1 MiB hole is the first fit for the next 1 MiB")
        self.assertTrue(reuse["e_is_a"], "two freed neighbours joined hold a 2 MiB segment")
        self.assertEqual(reuse["f_align"], 0)
        self.assertEqual(reuse["g_minus_f"], 1024, "1000 bytes take 1024 (512-byte boundaries)")

    def test_a_chunk_whose_segments_were_all_freed_goes_back(self) -> None:
        emptied = self.seen["emptied"]
        self.assertEqual(emptied["live"], 0)
        self.assertEqual(emptied["stats"], {"chunks": 0, "reserved": 0, "used": 0})
        self.assertEqual(emptied["ctx_syncs"], 1, "the device synchronized once, before the chunk went back")

    def test_chunks_grow_with_the_pool_and_a_large_segment_gets_its_own(self) -> None:
        growth = self.seen["growth"]
        self.assertEqual(growth["chunks"], [32, 32, 64, 128, 256, 3 * 1024 + 2], "doubling from 32 MiB; 3 GiB + 5 rounded to 2 MiB")
        self.assertTrue(growth["inside"], "150 segments and the large one, each inside a chunk, none overlapping")
        self.assertEqual(growth["stats"], {"chunks": 6, "reserved": (512 + 3 * 1024 + 2) * MiB, "used": 300 * MiB + 3 * GiB + 512})
        self.assertEqual(growth["stream_syncs"], 7, "each chunk made (these six and the one given back) synchronized on its stream before use")

    def test_a_nearly_full_device_gives_up_the_growth_not_the_allocation(self) -> None:
        oom = self.seen["oom"]
        self.assertTrue(oom["got"] and oom["inside"])
        self.assertEqual(oom["asked_mib"], 1024, "after 2 GiB (the growth) failed, exactly the segment")
        self.assertIsNone(oom["second"], "no room for another: NULL, which PyTorch raises as out of memory")
        self.assertIn("cuMemAllocFromPoolAsync", oom["error"])
        self.assertIn("CUDA_ERROR_OUT_OF_MEMORY", oom["error"])

    def test_an_address_it_did_not_hand_out_is_ignored_and_said(self) -> None:
        stray = self.seen["stray"]
        self.assertIn("did not hand out", stray["error"])
        self.assertEqual(stray["bad_frees"], 0, "nothing reached the driver")

    def test_everything_freed_leaves_nothing(self) -> None:
        end = self.seen["end"]
        self.assertEqual(end, {"live": 0, "stats": {"chunks": 0, "reserved": 0, "used": 0}, "bad_frees": 0})


if __name__ == "__main__":
    unittest.main()
