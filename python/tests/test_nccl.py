"""cuda_ipc.nccl over the fake libnccl (test/fixtures/fake-nccl.c, compiled here with ``cc -shared
-fPIC``; skipped without a compiler): discovery order (path > CUDA_IPC_NCCL_LIBRARY > system > wheel),
the error naming every place looked in, broken libraries failing in the probe process, versions,
errors, non-blocking init and enqueues polled through ncclInProgress, timeouts, close and abort.
The same fake serves the Node tests (test/cpu/nccl-*.test.ts)."""
from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import warnings

from cuda_ipc.errors import IpcError
from cuda_ipc.nccl import NCCL_LIBRARY_ENV, NcclCommunicator, NcclError, NcclUnavailableError, format_version, load_nccl
from cuda_ipc.nccl import library as library_mod

SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "test", "fixtures", "fake-nccl.c")
CC = os.environ.get("CC", "cc")
_dir: str | None = None
_why_skip: str | None = None


def setUpModule() -> None:
    global _dir, _why_skip
    _dir = tempfile.mkdtemp(prefix="cuda-ipc-fake-nccl-py-")
    for out, flags in (("good/libnccl.so.2", []), ("crash.so", ["-DFAKE_NCCL_CRASH"]), ("old.so", ["-DFAKE_NCCL_OLD"])):
        os.makedirs(os.path.dirname(os.path.join(_dir, out)), exist_ok=True)
        try:
            r = subprocess.run([CC, "-shared", "-fPIC", "-O1", *flags, "-o", os.path.join(_dir, out), SOURCE], capture_output=True, text=True)
        except OSError as e:
            _why_skip = f"no C compiler ({CC}: {e})"
            return
        if r.returncode != 0:
            _why_skip = f"{CC} could not build fake-nccl.c: {r.stderr.strip()[-300:]}"
            return
    with open(os.path.join(_dir, "not-elf.so"), "w") as f:
        f.write("this is not a shared library\n" * 200)


def tearDownModule() -> None:
    if _dir:
        shutil.rmtree(_dir, ignore_errors=True)


def path(name: str) -> str:
    assert _dir
    return os.path.join(_dir, name)


def copy(relative: str) -> str:
    p = path(relative)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    shutil.copyfile(path("good/libnccl.so.2"), p)
    return p


class FakeNcclCase(unittest.TestCase):
    def setUp(self) -> None:
        if _why_skip:
            self.skipTest(_why_skip)
        self.saved_env = dict(os.environ)
        self.saved_path = list(sys.path)
        for k in list(os.environ):
            if k.startswith("FAKE_NCCL_") or k == NCCL_LIBRARY_ENV:
                del os.environ[k]
        self.log = path("calls-py.log")
        if os.path.exists(self.log):
            os.unlink(self.log)
        os.environ["FAKE_NCCL_LOG"] = self.log
        library_mod._forget_discoveries()

    def tearDown(self) -> None:
        os.environ.clear()
        os.environ.update(self.saved_env)
        sys.path[:] = self.saved_path

    def fake(self, **settings: object) -> None:
        for k, v in settings.items():
            os.environ[f"FAKE_NCCL_{k}"] = str(v)

    def lines(self, word: str = "") -> list[str]:
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [line.rstrip("\n") for line in f if line.startswith(word)]


class DiscoveryTests(FakeNcclCase):
    def system_nccl(self) -> str | None:
        o = library_mod.probe_libraries(["libnccl.so.2"])[0]
        return str(o["path"]) if o["ok"] else None

    def test_the_path_given_comes_first_and_the_library_says_what_it_is(self) -> None:
        os.environ[NCCL_LIBRARY_ENV] = path("crash.so")  # never tried
        lib = load_nccl(path("good/libnccl.so.2"))
        self.assertEqual((lib.path, lib.version, lib.version_code, lib.source), (path("good/libnccl.so.2"), "2.28.9", 22809, "option"))
        self.assertIs(load_nccl(path("good/libnccl.so.2")), lib)

    def test_the_environment_variable_comes_before_the_system_library_and_is_never_replaced(self) -> None:
        copy("py-system-a/libnccl.so.2")
        os.environ["LD_LIBRARY_PATH"] = path("py-system-a")  # the probe process reads it as it starts
        chosen = copy("py-env-a/libnccl.so.2")
        os.environ[NCCL_LIBRARY_ENV] = chosen
        lib = load_nccl()
        self.assertEqual((lib.path, lib.source), (chosen, "env"))
        library_mod._forget_discoveries()
        os.environ[NCCL_LIBRARY_ENV] = path("old.so")
        with self.assertRaises(NcclUnavailableError) as caught:
            load_nccl()
        self.assertEqual([(a.source, a.path) for a in caught.exception.attempts], [("env", path("old.so"))])
        self.assertIn("does not export ncclCommInitRankConfig, ncclCommFinalize", str(caught.exception))

    def test_system_library_then_wheel(self) -> None:
        found = self.system_nccl()
        if found:
            self.skipTest(f"this machine has a system libnccl.so.2 ({found}), which comes first")
        system = copy("py-system-b/libnccl.so.2")
        wheel = copy("py-site-b/nvidia/nccl/lib/libnccl.so.2")
        sys.path.insert(0, path("py-site-b"))
        import importlib
        importlib.invalidate_caches()
        os.environ["LD_LIBRARY_PATH"] = path("py-system-b")
        lib = load_nccl()
        self.assertEqual((lib.path, lib.source), (system, "system"))
        library_mod._forget_discoveries()
        del os.environ["LD_LIBRARY_PATH"]
        lib = load_nccl()
        self.assertEqual((os.path.realpath(lib.path), lib.source), (os.path.realpath(wheel), "wheel"))

    def test_nothing_found_names_every_place_looked_in(self) -> None:
        found = self.system_nccl()
        if found:
            self.skipTest(f"this machine has a system libnccl.so.2 ({found})")
        if library_mod.wheel_libraries()[0]:
            self.skipTest("this Python sees a wheel copy of NCCL")
        with self.assertRaises(NcclUnavailableError) as caught:
            load_nccl()
        e = caught.exception
        self.assertIsInstance(e, IpcError)
        self.assertEqual(e.code, "ERR_NCCL_UNAVAILABLE")
        self.assertEqual([a.source for a in e.attempts], ["system", "wheel"])
        self.assertIn("libnccl.so.2: cannot open shared object file", e.attempts[0].error)
        self.assertIn("the dynamic loader's search path", str(e))
        self.assertIn("PyTorch's NCCL wheel", str(e))
        self.assertIn(f"{NCCL_LIBRARY_ENV}=/path/to/libnccl.so.2", str(e))

    def test_broken_libraries_fail_in_the_probe_process(self) -> None:
        with self.assertRaises(NcclUnavailableError) as caught:
            load_nccl(path("crash.so"))
        self.assertIn("loading it killed the probe process with SIGABRT", caught.exception.attempts[0].error)
        with self.assertRaises(NcclUnavailableError) as caught:
            load_nccl(path("not-elf.so"))
        self.assertRegex(caught.exception.attempts[0].error, "invalid ELF header|file too short")
        outcomes = library_mod.probe_libraries([path("crash.so"), path("not-elf.so"), path("good/libnccl.so.2"), path("old.so")])
        self.assertEqual([o["ok"] for o in outcomes], [False, False, True])
        self.assertEqual(outcomes[2], {"ok": True, "path": path("good/libnccl.so.2"), "version": 22809})

    def test_versions(self) -> None:
        self.assertEqual([format_version(c) for c in (22809, 22803, 21903, 2804, 30001)], ["2.28.9", "2.28.3", "2.19.3", "2.8.4", "3.0.1"])
        self.fake(VERSION=21903)
        self.assertEqual(load_nccl(copy("py-v21903/libnccl.so.2")).version, "2.19.3")


class CommunicatorTests(FakeNcclCase):
    def setUp(self) -> None:
        super().setUp()
        self.lib = load_nccl(path("good/libnccl.so.2"))
        self.uid = self.lib.unique_id()

    def init(self, **kw: object) -> NcclCommunicator:
        args: dict[str, object] = {"library": self.lib, **kw}
        return NcclCommunicator.init(self.uid, 2, 1, **args)  # type: ignore[arg-type]

    def test_init_hands_nccl_the_versioned_config_and_the_id_by_value_and_polls(self) -> None:
        self.fake(INIT_POLLS=3, CUDA_DEVICE=2)
        comm = self.init()
        (line,) = self.lines("init ")
        self.assertTrue(line.startswith("init nranks=2 rank=1 size=40 magic=cafebeef version=21700 blocking=0 cga=-2147483648 "), line)
        self.assertEqual(line.split(" id=")[1], self.uid.hex())
        self.assertEqual([x.split("state=")[1] for x in self.lines("asyncError")][:4], ["7", "7", "7", "0"])
        self.assertEqual((comm.rank, comm.nranks, comm.cuda_device, comm.async_error()), (1, 2, 2, "ncclSuccess"))
        comm.close()
        self.assertEqual([x.split(" ")[0] for x in self.lines()][-3:], ["finalize", "asyncError", "destroy"])

    def test_errors_are_typed(self) -> None:
        self.fake(INIT_RESULT=4)
        with self.assertRaises(NcclError) as caught:
            self.init()
        e = caught.exception
        self.assertEqual((e.code, e.result, e.status, e.call), ("ERR_NCCL", "ncclInvalidArgument", 4, "ncclCommInitRankConfig"))
        self.assertEqual((e.description, e.last_error), ("fake: invalid argument", "fake: ncclCommInitRankConfig failed"))
        self.fake(INIT_RESULT=0, INIT_POLLS=1, INIT_ASYNC=6)
        with self.assertRaises(NcclError) as caught:
            self.init()
        self.assertEqual(caught.exception.result, "ncclRemoteError")
        self.assertEqual(len(self.lines("abort")), 1)
        self.fake(UNIQUE_ID_RESULT=2)
        with self.assertRaises(NcclError) as caught:
            self.lib.unique_id()
        self.assertEqual((caught.exception.result, caught.exception.call), ("ncclSystemError", "ncclGetUniqueId"))

    def test_init_that_never_completes_times_out_and_is_aborted(self) -> None:
        self.fake(INIT_HANG=1)
        with self.assertRaises(IpcError) as caught:
            self.init(timeout=0.05)
        self.assertEqual(caught.exception.code, "ERR_TIMEOUT")
        self.assertEqual(len(self.lines("abort")), 1)

    def test_operations_reach_nccl_as_byte_counts_and_in_progress_is_polled(self) -> None:
        comm = self.init()

        class Array:
            __cuda_array_interface__ = {"data": (0x2000, False), "shape": (4, 2), "typestr": "<f4", "strides": None, "version": 3}

        self.fake(OP_POLLS=2)
        comm.send(0x1000, 64, 0)
        comm.recv(Array(), 32, 0, stream=0x77)
        comm.broadcast(0x3000, 5 << 32, 1)
        comm.group([{"op": "send", "buffer": 0x10, "bytes": 8, "peer": 0}, {"op": "recv", "buffer": 0x20, "bytes": 8, "peer": 0}])
        ops = [x.split(" ", 2)[2] for x in self.lines() if x.split(" ")[0] in ("send", "recv", "broadcast")]
        self.assertEqual(ops, [
            "ptr=1000 count=64 type=1 peer=0 stream=0 group=0", "ptr=2000 count=32 type=1 peer=0 stream=77 group=0",
            "send=3000 recv=3000 count=21474836480 type=1 root=1 stream=0 group=0",
            "ptr=10 count=8 type=1 peer=0 stream=0 group=1", "ptr=20 count=8 type=1 peer=0 stream=0 group=1",
        ])
        words = [x.split(" ")[0] + x.split("state=")[-1] if "state=" in x else x.split(" ")[0] for x in self.lines()]
        self.assertEqual(words[words.index("groupStart"):], ["groupStart", "send", "recv", "groupEnd", "asyncError7", "asyncError7", "asyncError0"])
        with self.assertRaises(ValueError):
            comm.recv(Array(), 33, 0)  # 32 bytes fit
        with self.assertRaises(ValueError):
            comm.send(0x10, 1, 2)  # no rank 2
        with self.assertRaises(ValueError):
            comm.group([{"op": "gather"}])  # type: ignore[list-item]
        comm.close()

    def test_failed_operations_are_typed_and_a_group_is_still_ended(self) -> None:
        comm = self.init()
        self.fake(OP_RESULT=5)
        with self.assertRaises(NcclError) as caught:
            comm.group([{"op": "send", "buffer": 0x10, "bytes": 1, "peer": 0}])
        self.assertEqual((caught.exception.result, caught.exception.call), ("ncclInvalidUsage", "ncclSend"))
        self.assertEqual([x.split(" ")[0] for x in self.lines()][-3:], ["groupStart", "send", "groupEnd"])
        self.fake(OP_RESULT=0, OP_POLLS=1, OP_ASYNC=6)
        with self.assertRaises(NcclError) as caught:
            comm.recv(0x10, 1, 0)
        self.assertEqual(caught.exception.result, "ncclRemoteError")
        self.assertEqual(comm.async_error(), "ncclRemoteError")
        comm.close()  # broken: aborted, not finalized
        self.assertEqual((len(self.lines("finalize")), len(self.lines("abort"))), (0, 1))

    def test_an_enqueue_never_taken_times_out_and_aborts(self) -> None:
        comm = self.init()
        self.fake(OP_POLLS=1_000_000)
        with self.assertRaises(IpcError) as caught:
            comm.send(0x10, 1, 0, timeout=0.05)
        self.assertEqual(caught.exception.code, "ERR_TIMEOUT")
        self.assertTrue(comm.closed)
        self.assertEqual(len(self.lines("abort")), 1)
        with self.assertRaises(IpcError) as closed:
            comm.send(0x10, 1, 0)
        self.assertEqual(closed.exception.code, "ERR_CLOSED")

    def test_close_timeout_aborts_and_abort_is_idempotent(self) -> None:
        comm = self.init()
        self.fake(FINALIZE_HANG=1)
        with self.assertRaises(IpcError) as caught:
            comm.close(timeout=0.05)
        self.assertEqual(caught.exception.code, "ERR_TIMEOUT")
        comm.abort()
        comm.close()
        self.assertEqual((len(self.lines("finalize")), len(self.lines("destroy")), len(self.lines("abort"))), (1, 0, 1))

    def test_with_closes_or_aborts_and_a_leak_is_aborted_with_a_warning(self) -> None:
        with self.init() as comm:
            self.assertFalse(comm.closed)
        self.assertEqual(len(self.lines("destroy")), 1)
        with self.assertRaises(RuntimeError):
            with self.init():
                raise RuntimeError("inside")
        self.assertEqual(len(self.lines("abort")), 1)
        leaked = self.init()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            del leaked
            gc.collect()
        self.assertEqual(len(self.lines("abort")), 2)
        self.assertTrue(any(issubclass(w.category, ResourceWarning) and "NcclCommunicator" in str(w.message) for w in seen))

    def test_one_still_open_at_exit_is_aborted_and_the_exit_code_kept(self) -> None:
        # Held by a daemon thread, it is never collected: only the atexit hook aborts it.
        code = "\n".join([
            "import sys, threading, time",
            "from cuda_ipc.nccl import NcclCommunicator, load_nccl",
            "lib = load_nccl(sys.argv[1])",
            "ready = threading.Event()",
            "def hold():",
            "    comm = NcclCommunicator.init(lib.unique_id(), 1, 0, library=lib)",
            "    ready.set()",
            "    while True: time.sleep(1)",
            "threading.Thread(target=hold, daemon=True).start()",
            "ready.wait()",
            "sys.exit(7)",
        ])
        package = os.path.join(os.path.dirname(__file__), "..")
        r = subprocess.run([sys.executable, "-c", code, path("good/libnccl.so.2")], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": package})
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertEqual(len(self.lines("abort")), 1)
        self.assertEqual(self.lines("destroy"), [])

    def test_destroy_failing_is_reported(self) -> None:
        comm = self.init()
        self.fake(DESTROY_RESULT=3)
        with self.assertRaises(NcclError) as caught:
            comm.close()
        self.assertEqual((caught.exception.result, caught.exception.call), ("ncclInternalError", "ncclCommDestroy"))
        self.assertTrue(comm.closed)

    def test_bad_arguments(self) -> None:
        with self.assertRaises(ValueError):
            NcclCommunicator.init(self.uid[:64], 2, 0, library=self.lib)
        with self.assertRaises(ValueError):
            NcclCommunicator.init(self.uid, 2, 2, library=self.lib)
        with self.assertRaises(TypeError):
            NcclCommunicator.init(self.uid, 2, 0, device="gpu0", library=self.lib)  # type: ignore[arg-type]
        self.assertEqual(self.lines("init"), [])


if __name__ == "__main__":
    unittest.main()
