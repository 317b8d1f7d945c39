"""Which calls keep Python's GIL. A ctypes call that gives the GIL away waits a whole switch interval
(5 ms) to get it back whenever another Python thread is busy, so the calls made per chunk or per
operation (queueing NCCL work, context push and pop, event record, stream wait, kernel launch) keep
it, and only the calls that may wait give it away. Observed, not declared: stand-in libraries
(test/fixtures/fake-nccl.c, fake_libcuda_gil.c; compiled here, skipped without a compiler) count
the calls made with the GIL held (PyGILState_Check) and without it.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from ctypes import byref, c_int

from cuda_ipc.cuda import driver as drv
from cuda_ipc.nccl import NcclCommunicator, load_nccl
from cuda_ipc.nccl import abi
from cuda_ipc.nccl import library as library_mod

from .nccl_fixture import fake_nccl, use_fake_nccl

HERE = os.path.dirname(os.path.abspath(__file__))
CC = os.environ.get("CC", "cc")
# Driver calls that may wait (for the GPU, another process or a copy from pageable memory).
DRIVER_WAITS = ("cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemAlloc", "cuIpcOpenMemHandle",
                "cuMemcpyHtoDAsync")

# Run in a child whose libcuda.so.1 is the stand-in: calls every entry point named on the command line
# with placeholder arguments (the stand-in ignores them), then prints the stand-in's counts.
_CHILD = """
import ctypes, json, sys
from ctypes import byref, c_int
from cuda_ipc.cuda import driver as drv

def placeholder(t):
    if isinstance(t, type) and issubclass(t, ctypes.Structure):
        return t()
    if isinstance(t, type) and issubclass(t, (ctypes._Pointer, ctypes.c_void_p, ctypes.c_char_p)):
        return None
    return 0

d = drv.driver()
names = sys.argv[1:]
for name in names:
    if name in drv._SIGNATURES:
        r = d.status(name, *[placeholder(t) for t in drv._SIGNATURES[name]])
    else:
        fn = drv.extra_entry(name)
        assert fn is not None, name
        r = fn(*[placeholder(t) for t in drv._EXTRA[name][1]])
    assert r == 0, (name, r)
lib = ctypes.CDLL("libcuda.so.1")
counts = {}
for name in names:
    held, released = c_int(), c_int()
    assert lib.fake_gil(name.encode(), byref(held), byref(released)) == 0, name
    counts[name] = [held.value, released.value]
print(json.dumps(counts))
"""


class DriverCallsKeepTheGilWhereTheyCannotWait(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="cuda-ipc-fake-libcuda-gil-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        try:
            r = subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", os.path.join(self.dir, "libcuda.so.1"),
                                os.path.join(HERE, "fake_libcuda_gil.c")], capture_output=True, text=True)
        except OSError as e:
            self.skipTest(f"no C compiler ({CC}: {e})")
        if r.returncode != 0:
            self.skipTest(f"{CC} could not build fake_libcuda_gil.c: {r.stderr.strip()[-300:]}")

    def test_every_quick_entry_point_keeps_it_and_every_waiting_one_gives_it_away(self) -> None:
        known = set(drv._SIGNATURES) | set(drv._EXTRA)
        self.assertEqual(sorted(drv.KEEPS_GIL - known), [], "KEEPS_GIL names only entry points the driver module resolves")
        names = sorted(drv.KEEPS_GIL) + list(DRIVER_WAITS)
        env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(p for p in (self.dir, os.environ.get("LD_LIBRARY_PATH")) if p),
                   PYTHONPATH=os.pathsep.join(p for p in (os.path.dirname(HERE), os.environ.get("PYTHONPATH")) if p))
        r = subprocess.run([sys.executable, "-c", _CHILD, *names], capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        counts = json.loads(r.stdout.strip().splitlines()[-1])
        for name in sorted(drv.KEEPS_GIL):
            self.assertEqual(counts[name], [1, 0], f"{name}: [calls with the GIL held, without it]")
        for name in DRIVER_WAITS:
            self.assertEqual(counts[name], [0, 1], f"{name} may wait: [calls with the GIL held, without it]")


def _gil_counts(path: str, call: str) -> tuple[int, int]:
    held, released = c_int(), c_int()
    if ctypes.CDLL(path).fake_nccl_gil(call.encode(), byref(held), byref(released)) != 0:
        raise AssertionError(f"the fake counts no {call}")
    return held.value, released.value


class NcclQueueingKeepsTheGil(unittest.TestCase):
    def setUp(self) -> None:
        saved = use_fake_nccl(self, move_timeout_ms=5000)

        def restore() -> None:
            os.environ.clear()
            os.environ.update(saved)
            library_mod._forget_discoveries()

        self.addCleanup(restore)
        library_mod._forget_discoveries()
        path, _ = fake_nccl()
        assert path
        self.path = path

    def test_a_receive_polled_holding_the_gil_still_gets_bytes_a_python_thread_sends_later(self) -> None:
        # The receiving thread queues first and polls holding the GIL; the sender is another Python
        # thread of this process that needs the GIL to send: nothing may wait on it for good.
        lib = load_nccl()
        uid = lib.unique_id()
        comms = [NcclCommunicator.init(uid, 2, rank) for rank in (0, 1)]
        for c in comms:
            self.addCleanup(c.abort)
        before = {name: _gil_counts(self.path, name) for name in abi.KEEPS_GIL | {"ncclCommInitRankConfig", "ncclCommAbort"}}
        src = (ctypes.c_ubyte * 4096)(*[i % 251 for i in range(4096)])
        dst = (ctypes.c_ubyte * 4096)()
        seen = (ctypes.c_ubyte * 4096)()
        spread = (ctypes.c_ubyte * 4096)()
        queued = threading.Event()
        failures: list[BaseException] = []

        def receive() -> None:
            try:
                queued.set()
                comms[1].recv(ctypes.addressof(dst), 4096, 0)
                comms[1].group([{"op": "recv", "buffer": ctypes.addressof(seen), "bytes": 4096, "peer": 0},
                                {"op": "send", "buffer": ctypes.addressof(dst), "bytes": 4096, "peer": 0}])
                comms[1].broadcast(ctypes.addressof(spread), 4096, 0)
            except BaseException as e:  # reported by the test thread
                failures.append(e)

        t = threading.Thread(target=receive)
        t.start()
        queued.wait(5)
        comms[0].send(ctypes.addressof(src), 4096, 1)
        back = (ctypes.c_ubyte * 4096)()
        comms[0].group([{"op": "recv", "buffer": ctypes.addressof(back), "bytes": 4096, "peer": 1},
                        {"op": "send", "buffer": ctypes.addressof(src), "bytes": 4096, "peer": 1}])
        comms[0].broadcast(ctypes.addressof(src), 4096, 0)
        t.join(10)
        self.assertFalse(t.is_alive(), "the receiving thread finished")
        self.assertEqual(failures, [])
        self.assertEqual(bytes(dst), bytes(src))
        self.assertEqual(bytes(seen), bytes(src))
        self.assertEqual(bytes(back), bytes(src), "a group that receives before it sends, on both ranks, completes")
        self.assertEqual(bytes(spread), bytes(src))
        for name in sorted(abi.KEEPS_GIL):
            held, released = (a - b for a, b in zip(_gil_counts(self.path, name), before[name]))
            self.assertGreater(held, 0, f"{name} was called")
            self.assertEqual(released, 0, f"{name} kept the GIL on every call")
        for c in comms:
            c.abort()
        held, released = (a - b for a, b in zip(_gil_counts(self.path, "ncclCommAbort"), before["ncclCommAbort"]))
        self.assertEqual((held, released), (0, 2), "abort (which may wait for NCCL's threads) gives the GIL away")

    def test_init_gives_the_gil_away(self) -> None:
        lib = load_nccl()
        held0, released0 = _gil_counts(self.path, "ncclCommInitRankConfig")
        NcclCommunicator.init(lib.unique_id(), 1, 0).abort()
        held, released = _gil_counts(self.path, "ncclCommInitRankConfig")
        self.assertEqual((held - held0, released - released0), (0, 1))


if __name__ == "__main__":
    unittest.main()
