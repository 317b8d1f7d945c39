"""Backpressure on a Python link: a peer that does not read makes send() wait (nothing queues up in
this process), and ``timeout`` bounds that wait; poll() reads ahead at most ``inbox_limit`` messages,
so a peer that floods cannot grow the receiver without bound. Nothing is lost or reordered."""
import gc
import os
import resource
import unittest

from cuda_ipc import HostBuffer, IpcError

from .test_link import deliver_releases, open_fds, pair


class BackpressureTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()

    def tearDown(self):
        gc.collect()
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_send_waits_while_the_peer_is_behind_and_timeout_bounds_the_wait(self):
        la, lb = pair()
        chunk = bytes(100_000)
        sent = 0
        with self.assertRaises(IpcError) as cm:
            for _ in range(10_000):
                la.send({"seq": sent, "data": chunk}, timeout=0.2)
                sent += 1
        self.assertEqual(cm.exception.code, "ERR_TIMEOUT")
        self.assertGreater(sent, 0)
        # The receiver catches up: every message that went out arrives, in order; sending goes on.
        for seq in range(sent):
            self.assertEqual(lb.receive(timeout=5)["seq"], seq)
        la.send({"seq": sent, "data": b""}, timeout=0.2)
        self.assertEqual(lb.receive(timeout=5)["seq"], sent)
        la.close()
        lb.close()

    def test_poll_reads_ahead_at_most_the_inbox_limit(self):
        la, lb = pair()
        lb.inbox_limit = 50
        sent = 0
        try:
            while sent < 5_000:
                la.send(sent, timeout=0.05)
                sent += 1
        except IpcError as e:
            self.assertEqual(e.code, "ERR_TIMEOUT")
        self.assertGreater(sent, 50, "more was sent than the inbox bound")
        self.assertEqual(lb.poll(), 50, "poll() stops at the bound; the rest waits in the socket")
        self.assertEqual([lb.receive(timeout=5) for _ in range(sent)], list(range(sent)))
        la.close()
        lb.close()

    def test_a_message_whose_fds_find_no_room_fails_alone_and_the_link_goes_on(self):
        # As Node's link-limits test: a receiver out of fds (EMFILE) loses that message's fds in the
        # kernel (MSG_CTRUNC); the message fails with ERR_FD_LIMIT, its lease goes back to the
        # sender, and the link carries the next message, buffers included once fds are back.
        la, lb = pair()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        filler: list[int] = []
        hb = HostBuffer.allocate(4096)
        try:
            hb.fill(7)
            la.send({"buffer": hb})
            la.send({"plain": "still flows"})
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
            while True:
                try:
                    filler.append(os.open("/dev/null", os.O_RDONLY))
                except OSError:
                    break
            with self.assertRaises(IpcError) as cm:
                lb.receive(timeout=5)
            self.assertEqual(cm.exception.code, "ERR_FD_LIMIT")
            self.assertIn("ulimit -n", str(cm.exception))
            self.assertEqual(lb.receive(timeout=5), {"plain": "still flows"})
            self.assertFalse(lb.closed)
        finally:
            for fd in filler:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        deliver_releases(lb, la)
        self.assertEqual(la.leases.count, 0, "the lease of the message that could not arrive went back")
        la.send({"buffer": hb})
        got = lb.receive(timeout=5)["buffer"]
        self.assertEqual(got.read(0, 2), b"\x07\x07")
        got.close()
        hb.close()
        deliver_releases(lb, la)
        self.assertEqual(la.leases.count, 0)
        la.close()
        lb.close()


if __name__ == "__main__":
    unittest.main()
