"""Issue 29, the Python side, within one user (test/cpu/security-links.test.ts runs the attacks as a second
user): deep JSON closes the link with ERR_FRAME_INVALID instead of a RecursionError; the listener
handshakes side by side, so silent connections delay nobody, and refuses past its bounds with a
REFUSE the connecting side reports as ERR_LISTENER_BUSY; the socket file appears with its final mode
and close() removes only its own file."""
import os
import socket
import stat
import struct
import tempfile
import threading
import time
import unittest

from cuda_ipc import IpcError, connect, listen
from cuda_ipc.link.transport import frame as fr
from cuda_ipc.link.messages.message_decoder import MAX_JSON_DEPTH

from .test_link import open_fds, raw_pair


def json_frame(text: str) -> bytes:
    body = text.encode()
    return fr.header(fr.MESSAGE, fr.ENC_JSON, len(body), 0) + body


class DeepJsonTests(unittest.TestCase):
    def test_json_nested_past_the_bound_closes_the_link_typed(self):
        for depth in (MAX_JSON_DEPTH + 1, 60_000):
            la, raw = raw_pair()
            raw.send(json_frame("[" * depth + "]" * depth))
            with self.assertRaises(IpcError) as cm:
                la.receive(timeout=5)
            self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID")
            self.assertIn(f"deeper than {MAX_JSON_DEPTH}", str(cm.exception))
            self.assertTrue(la.closed)
            raw.close()

    def test_json_at_the_bound_and_brackets_in_strings_decode(self):
        la, raw = raw_pair()
        deep = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
        raw.send(json_frame(deep))
        value = la.receive(timeout=5)
        for _ in range(MAX_JSON_DEPTH - 1):
            value = value[0]
        self.assertEqual(value, [])
        text = '["' + "[" * 2000 + '\\"]]", {"k": "{{{{"}]'
        raw.send(json_frame(text))
        self.assertEqual(la.receive(timeout=5), ["[" * 2000 + '"]]', {"k": "{{{{"}])
        la.close()
        raw.close()


class ListenerBoundsTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()
        self.dir = tempfile.mkdtemp()

    def tearDown(self):
        os.rmdir(self.dir)
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_silent_connections_do_not_delay_an_honest_one(self):
        with listen("silent", directory=self.dir) as server:
            silent = []
            for _ in range(3):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.connect(server.path)
                silent.append(s)
            got = {}

            def client():
                with connect("silent", directory=self.dir, timeout=10) as link:
                    got["hello"] = link.receive(timeout=10)

            t = threading.Thread(target=client)
            t.start()
            # The honest connection comes after three that never say HELLO: accept() returns it
            # without waiting out their handshake timeout.
            link = server.accept(timeout=10)
            self.assertEqual(link.peer.pid, os.getpid())
            self.assertEqual(len(server._pending), 3)
            link.send("hi")
            t.join(10)
            link.close()
            self.assertEqual(got, {"hello": "hi"})
            for s in silent:
                s.close()

    def test_past_max_pending_a_connect_says_the_listener_is_busy(self):
        with listen("full", directory=self.dir, max_pending=4) as server:
            silent = []
            for _ in range(6):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.connect(server.path)
                silent.append(s)
            with self.assertRaises(IpcError) as cm:
                server.accept(timeout=0.2)  # takes them all: 4 held, 2 refused
            self.assertEqual(cm.exception.code, "ERR_TIMEOUT")
            self.assertEqual(len(server._pending), 4)
            busy = 0
            for s in silent:
                s.setblocking(False)
                try:
                    record = s.recv(4096)
                except BlockingIOError:
                    continue
                if record[5] == fr.REFUSE and struct.unpack_from("<H", record, 16)[0] == fr.REFUSE_BUSY:
                    busy += 1
            self.assertEqual(busy, 2)
            out = {}

            def client():
                try:
                    connect("full", directory=self.dir, timeout=0.5)
                except IpcError as e:
                    out["code"] = e.code

            t = threading.Thread(target=client)
            t.start()
            with self.assertRaises(IpcError):
                server.accept(timeout=1)
            t.join(10)
            self.assertEqual(out, {"code": "ERR_LISTENER_BUSY"})
            for s in silent:
                s.close()

    def test_the_socket_file_appears_with_its_mode_and_close_removes_only_its_own(self):
        server = listen("mode", directory=self.dir, allow_uids=[12345])
        self.assertEqual(stat.S_IMODE(os.lstat(server.path).st_mode), 0o666)
        self.assertEqual(sorted(os.listdir(self.dir)), ["mode.sock"], "no private folder is left behind")
        os.unlink(server.path)
        with open(server.path, "w") as f:  # someone else's file at the name now
            f.write("theirs")
        server.close()
        self.assertTrue(os.path.exists(server.path), "close() left the file it did not make")
        os.unlink(server.path)


if __name__ == "__main__":
    unittest.main()
