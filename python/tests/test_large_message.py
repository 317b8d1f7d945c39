"""Messages larger than a frame (docs/PROTOCOL.md 3.1): whole in a sealed memfd, both ways, with
records and their fds; the sender's and the receiver's bounds; a peer that lies about the memfd."""
import fcntl
import gc
import os
import socket
import struct
import unittest

from cuda_ipc import HostBuffer, IpcError
from cuda_ipc import link as link_mod
from cuda_ipc.link import Link
from cuda_ipc.link.transport import frame as fr
from cuda_ipc.link.transport.large_message import LARGE_PAYLOAD_SEALS

from .test_link import open_fds, pair


def many_entries(n: int) -> dict:
    return {f"layer.{i}.weight": {"shape": [i % 7 + 1, 64], "offset": i * 4096} for i in range(n)}


class LargeMessageTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()

    def tearDown(self):
        gc.collect()
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_json_raw_and_records_over_a_frame_arrive_whole(self):
        la, lb = pair()
        value = many_entries(10_000)
        la.send(value)
        self.assertEqual(lb.receive(timeout=5), value)
        blob = os.urandom(3 * 2**20 + 5)
        lb.send(blob)
        self.assertEqual(la.receive(timeout=5), blob)
        # Records and their fds follow the memfd in the same frame.
        buf = HostBuffer.allocate(4096)
        buf.write(b"\x01\x02\x03\x04")
        la.send({"buffer": buf, "table": "y" * 300_000})
        got = lb.receive(timeout=5)
        self.assertEqual(len(got["table"]), 300_000)
        self.assertEqual(got["buffer"].read(0, 4), b"\x01\x02\x03\x04")
        got["buffer"].close()
        buf.close()
        la.close()
        lb.close()

    def test_the_senders_bound_refuses_without_sending(self):
        la, lb = pair()
        la.max_message_bytes = 200_000
        with self.assertRaises(IpcError) as cm:
            la.send("x" * 300_000)
        self.assertEqual(cm.exception.code, "ERR_MESSAGE_TOO_LARGE")
        self.assertEqual(cm.exception.limit, "max_message_bytes")
        la.send("still open")
        self.assertEqual(lb.receive(timeout=5), "still open")
        la.close()
        lb.close()

    def test_the_receivers_bound_closes_both_ends_with_message_too_large(self):
        la, lb = pair()
        lb.max_message_bytes = 200_000
        la.send("x" * 300_000)
        with self.assertRaises(IpcError) as cm:
            lb.receive(timeout=5)
        self.assertEqual(cm.exception.code, "ERR_MESSAGE_TOO_LARGE")
        with self.assertRaises(IpcError) as cm:
            la.receive(timeout=5)
        self.assertEqual(cm.exception.code, "ERR_MESSAGE_TOO_LARGE", "the sender learns why from the REFUSE")
        la.close()
        lb.close()

    def test_a_peer_that_lies_about_its_memfd_gets_the_link_closed(self):
        cases = {
            "unsealed": (0, 200_000, 200_000),
            "not sealed against writes": (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW, 200_000, 200_000),
            "smaller than declared": (LARGE_PAYLOAD_SEALS, 150_000, 200_000),
            "would have fit a frame": (LARGE_PAYLOAD_SEALS, 1000, 1000),
            "length 2^63": (LARGE_PAYLOAD_SEALS, 200_000, 2**63),
        }
        for name, (seals, size, declared) in cases.items():
            with self.subTest(name):
                a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                b.send(fr.hello_frame())
                la = Link(a, peer_name="raw peer", _token=link_mod._CREATE)
                fd = os.memfd_create("hostile", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
                os.pwrite(fd, b'"' + b"x" * (size - 2) + b'"', 0)
                if seals:
                    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
                head = fr.header(fr.MESSAGE, fr.ENC_JSON | fr.LARGE_PAYLOAD, 8, 1) + struct.pack("<Q", declared)
                b.sendmsg([head], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
                os.close(fd)
                with self.assertRaises(IpcError) as cm:
                    la.receive(timeout=5)
                self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID", name)
                la.close()
                b.close()

    def test_a_peer_without_the_feature_gets_a_clear_error_and_the_link_stays(self):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        b.send(fr.hello_frame(0))
        la = Link(a, peer_name="old peer", _token=link_mod._CREATE)
        la.poll()
        with self.assertRaises(IpcError) as cm:
            la.send("x" * 300_000)
        self.assertEqual(cm.exception.code, "ERR_MESSAGE_TOO_LARGE")
        la.send("small")
        b.recv(200)  # our HELLO
        self.assertIn(b'"small"', b.recv(200))
        la.close()
        b.close()


if __name__ == "__main__":
    unittest.main()
