"""Both ends of TCP links with NCCL transfers in one process, for the CPU tests of the NCCL layer
(test_nccl_link.py, test_nccl_tensors.py): the fake libnccl (test/fixtures/fake-nccl.c, compiled once
with ``cc``; FAKE_NCCL_MOVE=1 moves the bytes between communicators of this process), the fake
driver (fake_cuda.py: device memory is host memory, copy_runs runs on the CPU), and TCP links on
127.0.0.1. Tests skip, with the reason, where no C compiler builds the fake."""
from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import tempfile
import threading
import time
import unittest

import cuda_ipc
from cuda_ipc.nccl import NCCL_LIBRARY_ENV
from cuda_ipc.nccl import library as library_mod

from . import fake_cuda
from .test_tcp import TOKEN, linked

SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "test", "fixtures", "fake-nccl.c")
_built: dict[str, str] = {}


def fake_nccl() -> tuple[str | None, str | None]:
    """(the fake library's path, None) or (None, why it could not be built); built once per process."""
    if "path" in _built or "why" in _built:
        return _built.get("path"), _built.get("why")
    d = tempfile.mkdtemp(prefix="cuda-ipc-fake-nccl-link-")
    out = os.path.join(d, "libnccl.so.2")
    cc = os.environ.get("CC", "cc")
    try:
        r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", out, SOURCE], capture_output=True, text=True)
        if r.returncode != 0:
            _built["why"] = f"{cc} could not build fake-nccl.c: {r.stderr.strip()[-300:]}"
        else:
            _built["path"] = out
            _built["dir"] = d
    except OSError as e:
        _built["why"] = f"no C compiler ({cc}: {e})"
    return _built.get("path"), _built.get("why")


def nccl_threads() -> list[threading.Thread]:
    """The NCCL layer's per-communicator threads still alive (the watchdog aside)."""
    return [t for t in threading.enumerate() if t.name.startswith("cuda-ipc nccl ") and "watchdog" not in t.name]


def f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def use_fake_nccl(case: unittest.TestCase, move_timeout_ms: int) -> dict[str, str]:
    """Points NCCL discovery at the fake libnccl (skipping ``case`` where it cannot be built), its
    FAKE_NCCL_* settings cleared but for moving bytes with ``move_timeout_ms``; returns the environment
    as it was, for the test's tearDown to put back."""
    path, why = fake_nccl()
    if why:
        case.skipTest(why)
    saved = dict(os.environ)
    for k in list(os.environ):
        if k.startswith("FAKE_NCCL_"):
            del os.environ[k]
    os.environ[NCCL_LIBRARY_ENV] = str(path)
    os.environ["FAKE_NCCL_MOVE"] = "1"
    os.environ["FAKE_NCCL_MOVE_TIMEOUT_MS"] = str(move_timeout_ms)
    return saved


class NcclCase(unittest.TestCase):
    """A listener ``server`` and one linked pair: ``a`` (the listener's end, usually the sender) and ``b``."""

    links = 1

    def setUp(self) -> None:
        self.saved_env = use_fake_nccl(self, move_timeout_ms=5000)
        self.log = os.path.join(_built["dir"], f"calls-{os.getpid()}.log")
        if os.path.exists(self.log):
            os.unlink(self.log)
        os.environ["FAKE_NCCL_LOG"] = self.log
        library_mod._forget_discoveries()
        self.fake = fake_cuda.install()
        self.server = cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN)
        self.pairs = [linked(self.server) for _ in range(self.links)]
        self.a, self.b = self.pairs[0]

    def tearDown(self) -> None:
        for x, y in self.pairs:
            x.close()
            y.close()
        self.server.close()
        # The communicators' threads end once their links closed (they may still free what they held).
        deadline = time.monotonic() + 10
        while nccl_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        left = nccl_threads()
        fake_cuda.uninstall(self.fake)
        os.environ.clear()
        os.environ.update(self.saved_env)
        library_mod._forget_discoveries()
        self.assertEqual(left, [], "every communicator's threads ended with its links")

    # -- helpers --

    def array(self, values: list[float], ptr: int | None = None) -> fake_cuda.FakeArray:
        """A float32 array in fake device memory (its own allocation unless ``ptr``) holding ``values``."""
        if ptr is None:
            ptr = self.fake.alloc(4 * len(values))
        ctypes.memmove(ptr, f32(values), 4 * len(values))
        return fake_cuda.FakeArray(ptr, (len(values),), "<f4")

    def lines(self, word: str = "") -> list[str]:
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [line.rstrip("\n") for line in f if line.startswith(word)]

    def wait_for(self, check: object, what: str, seconds: float = 5.0, poll: object = None) -> None:
        deadline = time.monotonic() + seconds
        while not check():  # type: ignore[operator]
            if time.monotonic() > deadline:
                self.fail(f"timed out waiting for {what}")
            if poll is not None:
                poll()  # type: ignore[operator]
            time.sleep(0.01)


def read_f32(ptr: int, n: int) -> list[float]:
    return list(struct.unpack(f"<{n}f", ctypes.string_at(ptr, 4 * n)))
