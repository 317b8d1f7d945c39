"""The native helper's channel hot path (native/py/channel_ring.c, channel/native_slot_ring.py) against
slot_ring.py's: the same random operations on two control blocks, one driven by slot_ring.py's Ring and one by
NativeRing, must leave the same bytes in both blocks, give the same results and errors, and ring the
same doorbells; every operation of the hot path, work sharing and broadcast, with sleepers, meta,
a detached end, and a corrupt block. Also: which path runs, and the environment variable that
turns the native one off. Skips the comparison where the library is not built (native_helper() says
why)."""
import os
import random
import unittest

from cuda_ipc import IpcError, native_helper
from cuda_ipc.native import addon as native_mod
from cuda_ipc.channel.layout import H_DATA_SLEEPERS, H_HEAD, H_SPACE_SLEEPERS, P_STATE, ST_DEAD
from cuda_ipc.channel.native_slot_ring import NativeRing, make_ring
from cuda_ipc.channel.slot_ring import Ring

from .channel_hub import TestHub, native_setting

HELPER = native_helper()
NO_NATIVE = None if HELPER.active else f"the native helper is not in use: {HELPER.reason}"


class _Side:
    """One control block (a TestHub, no links) with a producer and two consumers as ``kind`` rings."""

    def __init__(self, native: bool, broadcast: bool):
        self.hub = TestHub(slots=4, slot_bytes=64, meta_bytes=64, max_participants=4, consumers=2, broadcast=broadcast)
        lib = native_mod.library("test") if native else None
        self.rings = []
        for role in ("producer", "consumer", "consumer"):
            k = self.hub.allocate(role)
            self.hub.activate(k, role)
            self.rings.append(NativeRing(self.hub.words, self.hub.layout, self.hub.bells, k, lib) if native
                              else Ring(self.hub.words, self.hub.layout, self.hub.bells, k))
        self.cursors = [0, self.rings[1].cursor(), self.rings[2].cursor()]

    def block(self) -> bytes:
        return bytes(self.hub.control.memory[: self.hub.layout.total_bytes])

    def bells(self) -> list[int]:
        """Each doorbell's count, read (and so reset)."""
        out = []
        for fd in self.hub.bells.fds:
            try:
                out.append(os.eventfd_read(fd))
            except BlockingIOError:
                out.append(0)
        return out

    def close(self) -> None:
        for r in self.rings:
            r.close()
        self.hub.close()


def _outcome(fn):
    try:
        return ("ok", fn())
    except IpcError as e:
        return ("error", e.code, str(e))


@unittest.skipIf(NO_NATIVE, NO_NATIVE)
class NativeRingMatchesRingTests(unittest.TestCase):
    def run_sequence(self, seed: int, broadcast: bool, steps: int = 400) -> None:
        sides = [_Side(False, broadcast), _Side(True, broadcast)]
        try:
            rng = random.Random(seed)
            writing: list[int] = []  # the producer's claimed slots (the same on both sides)
            held: list[list[int]] = [[], [], []]  # each consumer's taken (or held) slots
            for step in range(steps):
                op = rng.choice(["acquire", "acquire", "publish", "publish", "discard", "take", "take", "take_many", "release",
                                 "release", "sleep", "detach"] if step % 97 else ["corrupt"])
                c = rng.choice([1, 2])
                args = (rng.randrange(0, 65), rng.choice([0, 1, 2]), bytes(rng.randrange(256) for _ in range(rng.randrange(0, 9))))
                pick = rng.random()
                results = []
                for side in sides:
                    r = side.rings
                    if op == "acquire":
                        res = _outcome(r[0].acquire_slot)
                    elif op == "publish" and writing:
                        s = writing[int(pick * len(writing))]
                        length, kind, meta = args
                        res = _outcome(lambda: r[0].publish_message(s, length, kind if meta else 0, meta))
                    elif op == "discard" and writing:
                        s = writing[int(pick * len(writing))]
                        res = _outcome(lambda: r[0].discard(s))
                    elif op == "take":
                        if broadcast:
                            res = _outcome(lambda: r[c].peek_at(side.cursors[c]))
                        else:
                            res = _outcome(r[c].take_message)
                    elif op == "take_many" and not broadcast:
                        res = _outcome(lambda: r[c].take_messages(1 + int(pick * 3)))
                    elif op == "release" and held[c]:
                        s = held[c][int(pick * len(held[c]))]
                        res = _outcome(lambda: r[c].release_held(s) if broadcast else r[c].release_taken(s))
                    elif op == "sleep":
                        who = 0 if pick < 0.5 else c
                        r[who].enter_sleep(H_SPACE_SLEEPERS if who == 0 else H_DATA_SLEEPERS)
                        res = ("ok", None)
                    elif op == "detach" and pick < 0.05:
                        # The hub found consumer c dead: its state word leaves alive (take_message says so).
                        side.hub.words.store32(r[c].part_off(r[c].me) + P_STATE, ST_DEAD)
                        res = ("ok", None)
                    elif op == "corrupt":
                        # A ring entry naming no slot, at the next position to take: the take fails alike.
                        w = side.hub.words
                        at = r[1].ring_off(side.cursors[c] if broadcast else w.load64(H_HEAD))
                        orig = w.load32(at)
                        w.store32(at, 1000)
                        res = _outcome(lambda: r[c].peek_at(side.cursors[c]) if broadcast else r[c].take_message())
                        w.store32(at, orig)
                    else:
                        res = ("skip",)
                    results.append(res)
                self.assertEqual(results[0], results[1], f"seed {seed} step {step}: {op} gave different results")
                self.assertEqual(sides[0].block(), sides[1].block(), f"seed {seed} step {step}: {op} left different control blocks")
                self.assertEqual(sides[0].bells(), sides[1].bells(), f"seed {seed} step {step}: {op} rang different doorbells")
                res = results[0]
                if res[0] != "ok":
                    continue
                value = res[1]
                if op == "acquire" and value >= 0:
                    writing.append(value)
                elif op in ("publish", "discard"):
                    writing.remove(s)
                elif op == "take" and broadcast and value != -1:
                    for side in sides:
                        side.cursors[c] += 1
                    if value >= 0:
                        held[c].append(value)
                elif op == "take" and not broadcast and value[0] >= 0:
                    held[c].append(value[0] & 0xFFFFFF)
                elif op == "take_many":
                    held[c].extend(m[0] & 0xFFFFFF for m in value[0])
                elif op == "release":
                    held[c].remove(s)
        finally:
            for side in sides:
                side.close()

    def test_work_sharing_operations_match_ring_py(self):
        for seed in range(12):
            self.run_sequence(seed, broadcast=False)

    def test_broadcast_operations_match_ring_py(self):
        for seed in range(12):
            self.run_sequence(100 + seed, broadcast=True)

    def test_a_corrupt_ring_entry_is_the_same_error(self):
        for native in (False, True):
            side = _Side(native, False)
            try:
                p, c = side.rings[0], side.rings[1]
                s = p.acquire_slot()
                self.assertEqual(p.publish_message(s, 8, 0, b""), "ok")
                side.hub.words.store32(p.ring_off(0), 77)
                with self.assertRaises(IpcError) as e:
                    c.take_message()
                self.assertEqual(e.exception.code, "ERR_CHANNEL_CORRUPT")
                self.assertIn("ring entry names slot 77 of 4", str(e.exception))
            finally:
                side.close()

    def test_a_closed_native_ring_touches_nothing(self):
        side = _Side(True, False)
        try:
            p = side.rings[0]
            before = side.block()
            p.close()
            with self.assertRaises(IpcError) as e:
                p.acquire_slot()
            self.assertEqual(e.exception.code, "ERR_CHANNEL_CLOSED")
            self.assertEqual(side.block(), before)
        finally:
            side.close()


class HotPathTests(unittest.TestCase):
    def test_the_environment_variable_turns_the_native_path_off_and_ends_say_which_runs(self):
        with native_setting("0"):
            info = native_helper()
            self.assertFalse(info.active)
            self.assertIn("CUDA_IPC_PY_NATIVE=0", info.reason)
            hub = TestHub(slots=2, slot_bytes=16)
            try:
                self.assertEqual(type(make_ring(hub.words, hub.layout, hub.bells, 0)), Ring)
                end = hub.attach("consumer")
                self.assertEqual(end.hot_path, "python")
                end.close()
            finally:
                hub.close()
        self.assertEqual(native_helper(), HELPER)

    @unittest.skipIf(NO_NATIVE, NO_NATIVE)
    def test_ends_run_the_native_path_where_the_helper_loads(self):
        hub = TestHub(slots=2, slot_bytes=16)
        try:
            end = hub.attach("producer")
            self.assertEqual(end.hot_path, "native")
            self.assertTrue(HELPER.path and HELPER.path.endswith("cuda_ipc_py.so"))
            end.close()
        finally:
            hub.close()

    def test_a_library_of_another_interface_version_is_refused(self):
        saved = {k: os.environ.get(k) for k in ("CUDA_IPC_PY_NATIVE", "CUDA_IPC_PY_NATIVE_LIB")}
        try:
            os.environ.pop("CUDA_IPC_PY_NATIVE", None)
            os.environ["CUDA_IPC_PY_NATIVE_LIB"] = "/nonexistent/cuda_ipc_py.so"
            native_mod._reset_for_tests()
            info = native_helper()
            self.assertFalse(info.active)
            self.assertIn("does not load", info.reason)
            os.environ["CUDA_IPC_PY_NATIVE"] = "1"
            with self.assertRaises(IpcError) as e:
                native_mod.library("channels")
            self.assertEqual(e.exception.code, "ERR_UNSUPPORTED")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            native_mod._reset_for_tests()


if __name__ == "__main__":
    unittest.main()
