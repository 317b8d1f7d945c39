"""The order of a communicator's transfers (cuda_ipc/link/nccl/nccl_order.py): strict sequence order whoever
submits first, a deferred transfer forced by a later one (and left alone otherwise), failures of
what waits and of what comes after, and a blocked take() woken by a submit of another thread. No
CUDA, no NCCL."""
import threading
import time
import unittest

from cuda_ipc.errors import IpcError
from cuda_ipc.link.nccl.nccl_order import TransferOrder



def waiting_in_take(order: TransferOrder) -> None:
    """Returns once a thread waits in ``order.take(block=True)`` (on its condition), failing after 30 s."""
    deadline = time.monotonic() + 30
    while not order._cond._waiters:  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise AssertionError("no thread came to wait in take()")
        time.sleep(0.001)

class Recorder:
    def __init__(self):
        self.ran = []
        self.failed = []

    def start(self, name):
        return lambda: self.ran.append(name)

    def fail(self, name):
        return lambda e: self.failed.append((name, e.code))


def run_all(order):
    """Starts every transfer take() gives now."""
    while True:
        start = order.take()
        if start is None:
            return
        start()


class TransferOrderTests(unittest.TestCase):
    def test_transfers_start_in_sequence_order_whoever_submits_first(self):
        order, r = TransferOrder(), Recorder()
        order.submit(2, r.start("c"), r.fail("c"))
        order.submit(1, r.start("b"), r.fail("b"))
        run_all(order)
        self.assertEqual(r.ran, [])  # 0 has not come
        order.submit(0, r.start("a"), r.fail("a"))
        run_all(order)
        self.assertEqual(r.ran, ["a", "b", "c"])
        self.assertEqual(order.next, 3)

    def test_a_deferred_transfer_waits_for_its_user_until_a_later_one_needs_the_way(self):
        order, r = TransferOrder(), Recorder()
        forced = []

        def force():
            forced.append(0)
            order.submit(0, r.start("fetched"), r.fail("fetched"))
        order.defer(0, force, r.fail("lazy"))
        run_all(order)
        self.assertEqual((r.ran, forced), ([], []), "nothing behind it: it waits")
        order.submit(1, r.start("next"), r.fail("next"))
        run_all(order)
        self.assertEqual(r.ran, ["fetched", "next"])
        self.assertEqual(forced, [0])

    def test_a_deferred_transfer_its_user_submits_runs_without_being_forced(self):
        order, r = TransferOrder(), Recorder()
        order.defer(0, lambda: self.fail("never forced"), r.fail("x"))
        order.submit(0, r.start("used"), r.fail("used"))
        run_all(order)
        self.assertEqual(r.ran, ["used"])

    def test_a_force_that_cannot_submit_ends_the_order(self):
        order, r = TransferOrder(), Recorder()

        def broken():
            raise RuntimeError("no memory")
        order.defer(0, broken, r.fail("lazy"))
        order.submit(1, r.start("next"), r.fail("next"))
        self.assertIsNone(order.take())
        self.assertEqual(r.ran, [])
        self.assertEqual(r.failed, [("lazy", "ERR_NCCL"), ("next", "ERR_NCCL")])
        self.assertIn("no memory", str(order.failed))

    def test_fail_fails_what_waits_and_everything_later(self):
        order, r = TransferOrder(), Recorder()
        order.submit(1, r.start("b"), r.fail("b"))
        order.defer(2, lambda: None, r.fail("c"))
        order.fail(IpcError("ERR_PEER_GONE", "gone"))
        order.fail(IpcError("ERR_NCCL", "second"))  # the first reason stays
        order.submit(0, r.start("a"), r.fail("a"))
        order.defer(3, lambda: None, r.fail("d"))
        self.assertIsNone(order.take())
        self.assertEqual(r.ran, [])
        self.assertEqual(sorted(r.failed), [("a", "ERR_PEER_GONE"), ("b", "ERR_PEER_GONE"), ("c", "ERR_PEER_GONE"), ("d", "ERR_PEER_GONE")])

    def test_a_blocked_take_wakes_for_a_submit_of_another_thread_and_for_the_end(self):
        order, r = TransferOrder(), Recorder()
        got = []
        t = threading.Thread(target=lambda: got.append(order.take(block=True)))
        t.start()
        waiting_in_take(order)
        self.assertTrue(t.is_alive())
        order.submit(0, r.start("a"), r.fail("a"))
        t.join(5)
        self.assertFalse(t.is_alive())
        got[0]()
        self.assertEqual(r.ran, ["a"])
        t = threading.Thread(target=lambda: got.append(order.take(block=True)))
        t.start()
        waiting_in_take(order)
        order.fail(IpcError("ERR_LINK_CLOSED", "closed"))
        t.join(5)
        self.assertFalse(t.is_alive())
        self.assertIsNone(got[1])

    def test_a_blocked_take_is_woken_when_a_later_transfer_makes_a_deferred_one_forceable(self):
        order, r = TransferOrder(), Recorder()
        order.defer(0, lambda: order.submit(0, r.start("forced"), r.fail("forced")), r.fail("x"))
        got = []
        t = threading.Thread(target=lambda: got.append(order.take(block=True)))
        t.start()
        waiting_in_take(order)
        self.assertTrue(t.is_alive(), "a deferred transfer alone does not start")
        order.submit(1, r.start("later"), r.fail("later"))
        t.join(5)
        got[0]()
        self.assertEqual(r.ran, ["forced"])
        order.take()()
        self.assertEqual(r.ran, ["forced", "later"])


if __name__ == "__main__":
    unittest.main()
