"""Issue 40.8, the Python side (test/cpu/nccl-tls.test.ts is the Node one): device memory on a tls://
link moves over NCCL, which does not encrypt. Without ``allow_nccl_in_clear=True`` the sender's path
raises ERR_NCCL_UNENCRYPTED before NCCL is looked for, and a receiver fails such a message with
ERR_NCCL_UNENCRYPTED, tells the sender (NCCL_ABORT) and keeps the link. With the option both go on to
NCCL (there is none here: CUDA_IPC_NCCL_LIBRARY names a missing file). No GPU: the record is written
by hand, and the sender's path is entered without a device."""
import os
import shutil
import struct
import tempfile
import unittest
from unittest import mock

import cuda_ipc
from cuda_ipc import IpcError
from cuda_ipc.link.transport import frame as fr
from cuda_ipc.link.nccl.nccl_outgoing import begin_outgoing
from cuda_ipc.link.messages.nccl_records import CommReference, encode_nccl_buffer

from .test_tcp import TOKEN, linked
from .test_tcp_listener import _openssl_cert


def nccl_buffer_frame(comm_id: bytes) -> bytes:
    """A MESSAGE of one nccl-buffer record (no lease) on a new communicator, its unique id with it."""
    data = encode_nccl_buffer(CommReference(comm_id, 2, 1, False, os.urandom(128)), 0, 4096, bytes(16))
    kind = b"nccl-buffer"
    payload = (struct.pack("<I", 4) + b"null" + struct.pack("<H", 1) + bytes([len(kind)]) + kind + bytes([0])
               + bytes([0]) + struct.pack("<QI", 0, len(data)) + data)
    return fr.header(fr.MESSAGE, fr.ENC_JSON_WITH_RECORDS, len(payload), 0) + payload


@mock.patch.dict(os.environ, {"CUDA_IPC_NCCL_LIBRARY": "/nonexistent/cuda-ipc-test/libnccl.so.2"})
class NcclOverTlsTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.files = _openssl_cert(cls.dir)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def setUp(self):
        if self.files is None:
            self.skipTest("no openssl command to make a test certificate")

    def check(self, allow: bool) -> None:
        cert, key = self.files
        options = {"allow_nccl_in_clear": True} if allow else {}
        with cuda_ipc.listen("tls://127.0.0.1:0", token=TOKEN, cert=cert, key=key, **options) as server:
            a, b = linked(server, ca=cert, **options)
            with a, b:
                self.assertTrue(a.tls and b.tls)
                # The sender's path.
                try:
                    begin_outgoing(b, None)  # type: ignore[arg-type]
                    code = None
                except IpcError as e:
                    code = e.code
                    if not allow:
                        self.assertIn("NCCL does not encrypt", str(e))
                        self.assertIn("allow_nccl_in_clear=True", str(e))
                except Exception:  # noqa: BLE001 - past the check, the missing device fails otherwise
                    code = "past the check"
                self.assertEqual(code == "ERR_NCCL_UNENCRYPTED", not allow)
                # The receiver's.
                b._outbox.send_now(nccl_buffer_frame(os.urandom(16)))
                with self.assertRaises(IpcError) as cm:
                    a.receive(timeout=30)
                self.assertEqual(cm.exception.code, "ERR_NCCL_UNAVAILABLE" if allow else "ERR_NCCL_UNENCRYPTED")
                b.send("after")
                self.assertEqual(a.receive(timeout=30), "after", "the link goes on")

    def test_refused_both_ways_without_the_option(self):
        self.check(False)

    def test_the_option_lets_it_on_to_nccl(self):
        self.check(True)

    def test_tcp_links_are_not_affected_and_the_option_is_a_bool(self):
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN) as server:
            a, b = linked(server)
            with a, b:
                with self.assertRaises(IpcError) as cm:
                    b._outbox.send_now(nccl_buffer_frame(os.urandom(16)))
                    a.receive(timeout=30)
                self.assertEqual(cm.exception.code, "ERR_NCCL_UNAVAILABLE")
            with self.assertRaises(TypeError):
                cuda_ipc.connect(server.url, token=TOKEN, allow_nccl_in_clear="yes")


if __name__ == "__main__":
    unittest.main()
