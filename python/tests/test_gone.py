"""GONE notices received by Python (docs/PROTOCOL.md 3.2), with a fake driver: an idle legacy mapping
whose exporter freed the allocation closes at once, a busy one at its last release instead of staying
idle; unknown kinds are ignored; a GONE that lies about its entries closes the link."""
import gc
import socket
import struct
import unittest

from cuda_ipc import IpcError
from cuda_ipc import link as link_mod
from cuda_ipc.ipc import cache as memory_mod
from cuda_ipc.link import Link
from cuda_ipc.link.transport import frame as fr

from . import fake_cuda
from .test_link import open_fds, pair


def gone_frame(entries, count=None):
    body = b"".join(bytes([len(k)]) + k.encode() + struct.pack("<H", len(key)) + key for k, key in entries)
    payload = struct.pack("<II", len(entries) if count is None else count, 0) + body
    return fr.header(fr.GONE, 0, len(payload), 0) + payload


class GoneTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()
        self.fake = fake_cuda.install()
        self.la, self.lb = pair()

    def tearDown(self):
        self.la.close()
        self.lb.close()
        gc.collect()
        fake_cuda.uninstall(self.fake)
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def receive_mapped(self, block):
        self.la.send(fake_cuda.FakeArray(block, (64,)))
        got = self.lb.receive(timeout=5)
        memory_mod._local_exports.clear()  # as in another process: open the handle for real
        got.ptr
        return got, bytes(got._origin.descriptor.handle)

    def test_python_announces_that_it_takes_gone_frames(self):
        self.assertEqual(self.la._peer_features & fr.FEATURE_GONE, fr.FEATURE_GONE)

    def test_an_idle_mapping_closes_at_the_notice_and_a_busy_one_at_its_last_release(self):
        block = self.fake.alloc(1 << 16)
        got, handle = self.receive_mapped(block)
        got.close()
        self.assertEqual(self.fake.opened[block], 1, "idle in the cache")
        self.la._outbox.send(gone_frame([("some-app-kind", b"x"), ("legacy-buffer", handle)]))
        self.lb.poll()
        self.assertEqual(self.fake.opened[block], 0, "the idle mapping closed at the notice")
        self.assertEqual(memory_mod.legacy_cache_stats()["mappings"], 0)

        got, handle = self.receive_mapped(block)
        self.la._outbox.send(gone_frame([("legacy-buffer", handle)]))
        self.lb.poll()
        self.assertEqual(self.fake.opened[block], 1, "a mapping in use stays")
        got.close()
        self.assertEqual(self.fake.opened[block], 0, "and closes at its last release instead of waiting idle")
        self.la.send("still open")
        self.assertEqual(self.lb.receive(timeout=5), "still open")

    def test_a_gone_frame_that_lies_closes_the_link(self):
        for name, frame in {
            "count larger than the entries": gone_frame([("legacy-buffer", b"k")], count=2),
            "no entries": gone_frame([], count=0),
            "a kind outside printable ASCII": gone_frame([("a b", b"k")]),
        }.items():
            with self.subTest(name):
                a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                b.send(fr.hello_frame())
                link = Link(a, peer_name="raw peer", _token=link_mod._CREATE)
                b.send(frame)
                with self.assertRaises(IpcError) as cm:
                    link.receive(timeout=5)
                self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID", name)
                link.close()
                b.close()


if __name__ == "__main__":
    unittest.main()
