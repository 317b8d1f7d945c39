"""Issue 40.3 on the Python side, at the size the second review used: JSON nested 1,000,000 deep (2 MB,
so it travels as a large message in a sealed memfd) closes the link with ERR_FRAME_INVALID, as Node
does (test/cpu/security-json-depth.test.ts). The text is built as a string, never parsed here."""
import os
import socket
import struct
import unittest

from cuda_ipc import IpcError
from cuda_ipc.link.transport import frame as fr
from cuda_ipc.link.transport.large_message import LARGE_PAYLOAD, write_large_payload
from cuda_ipc.link.messages.message_decoder import MAX_JSON_DEPTH

from .test_link import raw_pair


class MillionDeepJsonTests(unittest.TestCase):
    def test_a_million_levels_in_a_large_message_close_the_link_typed(self):
        la, raw = raw_pair()
        body = b"[" * 1_000_000 + b"]" * 1_000_000
        fd = write_large_payload(body)
        try:
            head = fr.header(fr.MESSAGE, fr.ENC_JSON | LARGE_PAYLOAD, 8, 1) + struct.pack("<Q", len(body))
            raw.sendmsg([head], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
        finally:
            os.close(fd)
        with self.assertRaises(IpcError) as cm:
            la.receive(timeout=20)
        self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID")
        self.assertIn(f"deeper than {MAX_JSON_DEPTH}", str(cm.exception))
        self.assertTrue(la.closed)
        raw.close()


if __name__ == "__main__":
    unittest.main()
