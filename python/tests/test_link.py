"""Links between two Python ends of a socketpair: messages, leases, release rules, closing and hostile
frames. Standard library only (no GPU)."""
import array
import errno
import gc
import os
import socket
import struct
import time
import unittest

from cuda_ipc import HostBuffer, IpcError
from cuda_ipc.link.transport import frame as fr
from cuda_ipc import link as link_mod
from cuda_ipc.link.messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler, unregister_transfer_handler
from cuda_ipc.link import Link
from cuda_ipc.link.connection import outbox as outbox_mod
from cuda_ipc.native import native_helper


def open_fds() -> set:
    """Open fds, without the one listdir used for the listing (closed by the time we look)."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
            out.add(name)
        except OSError:
            pass
    return out


def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    la = Link(a, peer_name="peer a", _token=link_mod._CREATE)
    lb = Link(b, peer_name="peer b", _token=link_mod._CREATE)
    la.poll()
    lb.poll()
    return la, lb


def deliver_releases(receiver, sender):
    """The receiver's next link call sends its releases; the sender's reads them."""
    receiver.poll()
    sender.poll()


def raw_pair():
    """A Link and the raw socket of its peer (which already said HELLO)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.send(fr.hello_frame())
    la = Link(a, peer_name="raw peer", _token=link_mod._CREATE)
    la.poll()
    assert b.recv(100)[:4] == struct.pack("<I", fr.FRAME_MAGIC)
    return la, b


class LinkTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()

    def tearDown(self):
        gc.collect()
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_handshake_and_messages(self):
        la, lb = pair()
        self.assertEqual(la.state, "open")
        self.assertEqual(la.peer.pid, os.getpid())
        value = {"s": "héllo", "n": [1, 2.5, None, True], "big": 2**70, "neg": -(2**60), "f": array.array("f", [1.5, 2.5]),
                 "q": array.array("q", [-1, 2**62]), "b": b"\x00\xff", "t": (1, 2)}
        la.send(value)
        got = lb.receive(timeout=5)
        self.assertEqual(got["s"], "héllo")
        self.assertEqual(got["big"], 2**70)
        self.assertEqual(got["neg"], -(2**60))
        self.assertEqual(got["f"], array.array("f", [1.5, 2.5]))
        self.assertEqual(got["q"], array.array("q", [-1, 2**62]))
        self.assertEqual(got["b"], b"\x00\xff")
        self.assertEqual(got["t"], [1, 2])
        self.assertEqual(got["n"], [1, 2.5, None, True])
        la.send(b"raw bytes")
        self.assertEqual(lb.receive(timeout=5), b"raw bytes")
        la.send(None)
        self.assertIsNone(lb.receive(timeout=5))
        la.close()
        lb.close()

    def test_refuses_values_it_cannot_send(self):
        la, lb = pair()
        for bad, code in ((float("nan"), "ERR_NOT_TRANSFERABLE"), ({1: 2}, "ERR_NOT_TRANSFERABLE"), (object(), "ERR_NOT_TRANSFERABLE"),
                          (memoryview(b"abcd")[::2], "ERR_NOT_TRANSFERABLE")):
            with self.assertRaises(IpcError) as cm:
                la.send({"v": bad})
            self.assertEqual(cm.exception.code, code, repr(bad)[:40])
        deep = []
        for _ in range(300):
            deep = [deep]
        with self.assertRaises(IpcError):
            la.send(deep)
        la.send("still open")
        self.assertEqual(lb.receive(timeout=5), "still open")
        la.close()
        lb.close()

    def test_receive_timeout(self):
        la, lb = pair()
        with self.assertRaises(IpcError) as cm:
            lb.receive(timeout=0.05)
        self.assertEqual(cm.exception.code, "ERR_TIMEOUT")
        la.close()
        lb.close()

    def test_host_buffer_lease_ends_on_close(self):
        la, lb = pair()
        hb = HostBuffer.allocate(8192)
        hb.fill(3)
        la.send({"buffer": hb})
        hb.close()  # the lease keeps it alive for the peer
        self.assertEqual(tuple(la.leases), (1, 8192))
        got = lb.receive(timeout=5)["buffer"]
        self.assertEqual(lb.received_leases, 1)
        self.assertTrue(all(b == 3 for b in got.memory))
        got.write(b"\x09\x08", 10)
        self.assertEqual(got.read(9, 3), b"\x03\x09\x08")
        got.close()
        self.assertEqual(lb.received_leases, 0)
        deliver_releases(lb, la)
        self.assertEqual(tuple(la.leases), (0, 0))
        la.close()
        lb.close()

    def test_a_memoryview_keeps_the_lease_until_it_is_released(self):
        la, lb = pair()
        hb = HostBuffer.allocate(4096)
        la.send(hb)
        got = lb.receive(timeout=5)
        mv = got.memory
        got.close()
        deliver_releases(lb, la)
        self.assertEqual(la.leases.count, 1, "a live memoryview keeps the memory mapped and leased")
        mv.release()
        del mv
        gc.collect()
        deliver_releases(lb, la)
        self.assertEqual(la.leases.count, 0)
        hb.close()
        la.close()
        lb.close()

    def test_a_memoryview_outliving_its_buffer_object_still_releases_the_lease_when_dropped(self):
        la, lb = pair()
        hb = HostBuffer.allocate(4096)
        la.send(hb)
        got = lb.receive(timeout=5)
        mv = got.memory
        del got  # the HostBuffer object (and its mapping bookkeeping) can go; the view lives on
        gc.collect()
        deliver_releases(lb, la)
        self.assertEqual(la.leases.count, 1)
        self.assertEqual(mv[0], 0)
        del mv
        gc.collect()
        deliver_releases(lb, la)
        self.assertEqual(la.leases.count, 0)
        hb.close()
        la.close()
        lb.close()

    def test_a_collected_buffer_releases_its_lease(self):
        la, lb = pair()
        hb = HostBuffer.allocate(4096)
        la.send([hb, hb.view(100, 200)])
        got = lb.receive(timeout=5)
        self.assertEqual(len(got[1]), 200)
        del got
        gc.collect()
        deliver_releases(lb, la)
        self.assertEqual(la.leases.count, 0)
        hb.close()
        la.close()
        lb.close()

    def _reply_after_close(self, send_pair):
        """la sends a leased buffer; lb closes it and replies (its RELEASE waits for that reply) through
        ``send_pair`` as its outbox's native call (None: the two-sendmsg path). The reply arrives
        before the RELEASE (la still holds the lease when receive() returns it), and the lease then ends."""
        la, lb = pair()
        lb._outbox._send_pair = send_pair
        hb = HostBuffer.allocate(4096)
        la.send({"buffer": hb})
        hb.close()
        lb.receive(timeout=5)["buffer"].close()
        self.assertEqual(lb.received_leases, 0)
        lb.send("done")
        self.assertEqual(la.receive(timeout=5), "done")
        self.assertEqual(la.leases.count, 1, "the reply comes first, its RELEASE behind it")
        deadline = time.monotonic() + 5
        while la.leases.count and time.monotonic() < deadline:
            la.poll()
        self.assertEqual(la.leases.count, 0)
        return la, lb

    def test_a_reply_and_the_release_behind_it_go_in_one_system_call_with_the_native_helper(self):
        real = outbox_mod.helper_function("cip_send_pair")
        if real is None:
            self.skipTest(f"the native helper is not in use: {native_helper().reason}")
        calls = []

        def counted(*args):
            calls.append(real(*args))
            return calls[-1]
        la, lb = self._reply_after_close(counted)
        self.assertEqual(calls, [2], "one sendmmsg carried both records")
        lb.send("no release waits")  # nothing pending: the plain path
        self.assertEqual(la.receive(timeout=5), "no release waits")
        self.assertEqual(calls, [2])
        la.close()
        lb.close()

    def test_a_reply_and_its_release_arrive_in_order_on_every_path(self):
        def partial_send(fd, frame, frame_len, fds, nfds, release, release_len):  # the kernel took the frame only
            os.write(fd, frame[:frame_len])
            return 1
        for name, send_pair in [("no helper", None), ("socket full", lambda *a: 0), ("frame only", partial_send)]:
            with self.subTest(name):
                la, lb = self._reply_after_close(send_pair)
                la.close()
                lb.close()

    def test_a_failed_paired_send_keeps_the_releases_for_the_next(self):
        la, lb = pair()
        hb = HostBuffer.allocate(4096)
        la.send({"buffer": hb})
        hb.close()
        lb.receive(timeout=5)["buffer"].close()
        lb._outbox._send_pair = lambda *a: -errno.EMSGSIZE
        with self.assertRaises(IpcError) as cm:
            lb.send("too large, as the kernel says")
        self.assertEqual(cm.exception.code, "ERR_MESSAGE_TOO_LARGE")
        self.assertEqual(la.leases.count, 1)
        lb._outbox._send_pair = None
        lb.send("next")
        self.assertEqual(la.receive(timeout=5), "next")
        la.poll()
        self.assertEqual(la.leases.count, 0, "the RELEASE went with the next send")
        la.close()
        lb.close()

    def test_views_travel_with_their_offset(self):
        la, lb = pair()
        hb = HostBuffer.allocate(4096)
        hb.write(bytes(range(256)) * 16)
        with hb.view(300, 10) as v:
            la.send(v)
        got = lb.receive(timeout=5)
        self.assertEqual(got.read(), bytes((300 + i) & 255 for i in range(10)))
        self.assertEqual(got.offset, 300)
        got.close()
        hb.close()
        la.close()
        lb.close()

    def test_goodbye_and_peer_gone(self):
        la, lb = pair()
        lb.close()
        with self.assertRaises(IpcError) as cm:
            la.receive(timeout=5)
        self.assertEqual(cm.exception.code, "ERR_LINK_CLOSED")
        self.assertEqual(list(la), [])
        la.close()

        la, lb = pair()
        hb = HostBuffer.allocate(4096)
        la.send(hb)
        mapping = hb._mapping
        hb.close()
        self.assertEqual(mapping.users, 1, "only the lease holds the mapping")
        lb._sock.close()  # the peer vanishes without a goodbye
        with self.assertRaises(IpcError) as cm:
            la.receive(timeout=5)
        self.assertEqual(cm.exception.code, "ERR_PEER_GONE")
        self.assertTrue(mapping.unmapped, "the peer's death ended its lease")
        with self.assertRaises(IpcError) as cm:
            la.send("x")
        self.assertEqual(cm.exception.code, "ERR_PEER_GONE")
        la.close()
        lb._inbox.clear()
        lb._shutdown(None, "local")

    def test_close_from_another_thread_wakes_a_blocked_receive(self):
        import threading
        la, lb = pair()
        errors = []

        def wait():
            try:
                la.receive()
            except IpcError as e:
                errors.append(e.code)
        t = threading.Thread(target=wait)
        t.start()
        # The thread is inside receive() once it holds the receive lock (and nothing can arrive).
        deadline = time.monotonic() + 30
        while not la._recv_lock.locked():
            self.assertLess(time.monotonic(), deadline, "the thread never entered receive()")
            time.sleep(0.001)
        la.close()
        t.join(5)
        self.assertFalse(t.is_alive())
        self.assertEqual(errors, ["ERR_LINK_CLOSED"])
        self.assertEqual(la._sock.fileno(), -1, "the receiving thread closed the socket on its way out")
        with self.assertRaises(IpcError) as cm:
            lb.receive(timeout=5)
        self.assertEqual(cm.exception.code, "ERR_LINK_CLOSED", "the peer saw a goodbye")
        lb.close()

    def test_unread_messages_are_released_at_close(self):
        la, lb = pair()
        hb = HostBuffer.allocate(4096)
        la.send(hb)
        la.send(hb)
        lb.poll()
        self.assertEqual(lb.pending_receives, 2)
        lb.close()
        self.assertEqual(lb.received_leases, 0)
        hb.close()
        self.assertFalse(hb._mapping.unmapped, "leased until the sender learns the link closed")
        deliver_releases(lb, la)
        self.assertTrue(la.closed)
        self.assertTrue(hb._mapping.unmapped, "the goodbye ended every lease")
        la.close()

    def test_a_message_that_fails_to_decode_ends_its_leases_and_the_link_stays_open(self):
        class Probe(TransferHandler):
            kind = "test-probe"

            def can_transfer(self, v):
                return isinstance(v, Probe.Thing)

            def encode(self, v, link):
                return TransferEncoding(data=b"x", hold=v)

            def decode(self, data, fds, link, lease):
                raise ValueError("cannot rebuild this")

            class Thing:
                released = 0
                bytes = 1

                def release(self):
                    self.released += 1

        register_transfer_handler(Probe())
        try:
            la, lb = pair()
            thing = Probe.Thing()
            hb = HostBuffer.allocate(4096)
            la.send({"ok": hb, "bad": thing})
            with self.assertRaises(IpcError) as cm:
                lb.receive(timeout=5)
            self.assertEqual(cm.exception.code, "ERR_DESCRIPTOR_INVALID")
            deliver_releases(lb, la)
            self.assertEqual(thing.released, 1, "the failed message's lease went back")
            self.assertEqual(la.leases.count, 0, "and so did the host buffer decoded before the failure")
            la.send("next")
            self.assertEqual(lb.receive(timeout=5), "next")
            hb.close()
            la.close()
            lb.close()
        finally:
            unregister_transfer_handler("test-probe")

    def test_hostile_frames_close_the_link_and_their_fds(self):
        cases = [
            ("bad magic", b"\x00" * 16, []),
            ("short", b"CIPL", []),
            ("fds with JSON", fr.header(fr.MESSAGE, fr.ENC_JSON, 2, 1) + b"{}", "fd"),
            ("unknown type", fr.header(9, 0, 0, 0), []),
            ("release of an unknown lease", fr.release_frame([12345]), []),
            ("second hello", fr.hello_frame(), []),
            ("record past the end", fr.header(fr.MESSAGE, fr.ENC_JSON_WITH_RECORDS, 6, 0) + struct.pack("<IH", 50, 1), []),
            ("bad JSON", fr.header(fr.MESSAGE, fr.ENC_JSON, 3, 0) + b"{x}", []),
            ("NaN in the JSON", fr.header(fr.MESSAGE, fr.ENC_JSON, 3, 0) + b"NaN", []),
            ("unknown protocol version", fr.header(fr.MESSAGE, fr.ENC_JSON, 2, 0)[:4] + b"\x03" + fr.header(fr.MESSAGE, fr.ENC_JSON, 2, 0)[5:] + b"{}", []),
            ("payload length that lies", fr.header(fr.MESSAGE, fr.ENC_JSON, 100, 0) + b"{}", []),
            ("fd count that lies (header 2, 1 sent)", fr.header(fr.MESSAGE, fr.ENC_JSON_WITH_RECORDS, 2, 2) + b"{}", "fd"),
            ("oversized record (150 KiB)", fr.header(fr.MESSAGE, fr.ENC_RAW, 150 * 1024, 0) + bytes(150 * 1024), []),
            ("RELEASE of a negative id (2^64-1)", fr.header(fr.RELEASE, 0, 16, 0) + struct.pack("<IIQ", 1, 0, 2**64 - 1), []),
            ("unknown message flags", fr.header(fr.MESSAGE, 0x0200, 2, 0) + b"{}", []),
        ]
        for name, data, fds in cases:
            with self.subTest(name):
                la, raw = raw_pair()
                before = open_fds()
                if fds == "fd":
                    r, w = os.pipe()
                    raw.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))])
                    os.close(r)
                    os.close(w)
                else:
                    raw.send(data)
                with self.assertRaises(IpcError) as cm:
                    la.receive(timeout=5)
                self.assertIn(cm.exception.code, ("ERR_FRAME_INVALID",))
                self.assertTrue(la.closed)
                self.assertLessEqual(open_fds() - before, set(), "every fd that came with the frame was closed")
                raw.close()

    def test_two_records_for_one_placeholder_close_the_link_and_their_fds(self):
        # The second record would replace the first one's value, stranding its fd: malformed.
        la, raw = raw_pair()
        js = b"[null]"
        rec = bytes([11]) + b"host-buffer" + bytes([1]) + struct.pack("<BI", 0, 0) + struct.pack("<BQI", 1, 0, 24) + struct.pack("<QQQ", 10, 0, 10)
        payload = struct.pack("<I", len(js)) + js + struct.pack("<H", 2) + rec + rec
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        before = open_fds() - {str(r1), str(w1), str(r2), str(w2)}
        raw.sendmsg([fr.header(fr.MESSAGE, fr.ENC_JSON_WITH_RECORDS, len(payload), 2) + payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r1, r2]))])
        for fd in (r1, w1, r2, w2):
            os.close(fd)
        with self.assertRaises(IpcError) as cm:
            la.receive(timeout=5)
        self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID")
        self.assertIn("same placeholder", str(cm.exception))
        self.assertTrue(la.closed)
        self.assertEqual(open_fds() - before, set(), "both fds that came with the frame were closed")
        raw.close()

    def test_a_leased_record_with_garbage_fds_is_closed(self):
        la, raw = raw_pair()
        # A host-buffer record whose fd is a pipe: not sealed -> this message fails, the fd is closed.
        js = b"[null]"
        rec = bytes([11]) + b"host-buffer" + bytes([1]) + struct.pack("<BI", 0, 0) + struct.pack("<BQI", 1, 7, 24) + struct.pack("<QQQ", 10, 0, 10)
        payload = struct.pack("<I", len(js)) + js + struct.pack("<H", 1) + rec
        r, w = os.pipe()
        before = open_fds() - {str(r), str(w)}
        raw.sendmsg([fr.header(fr.MESSAGE, fr.ENC_JSON_WITH_RECORDS, len(payload), 1) + payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))])
        os.close(r)
        os.close(w)
        with self.assertRaises(IpcError) as cm:
            la.receive(timeout=5)
        self.assertEqual(cm.exception.code, "ERR_DESCRIPTOR_INVALID")
        self.assertFalse(la.closed)
        self.assertEqual(open_fds() - before, set())
        # The lease of the failed record went back to the sender.
        frame = raw.recv(1000)
        self.assertEqual(frame[5], fr.RELEASE)
        self.assertEqual(fr.read_release_ids(frame, len(frame) - fr.HEADER_BYTES), [7])
        la.close()
        raw.close()


if __name__ == "__main__":
    unittest.main()
