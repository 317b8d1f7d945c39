"""TCP listeners and TLS (docs/PROTOCOL.md 1.1, 2.3): silent connections do not hold up another client,
max_pending and the handshake timeout, close() waking accept(), addresses, IPv6, a forked child's copy,
many links without an fd left behind, a peer killed in the middle of a message, TLS links. Standard
library only (TLS tests make a certificate with the openssl command, and skip without it)."""
import gc
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import cuda_ipc
from cuda_ipc import HostBuffer, IpcError
from cuda_ipc.link.transport import frame as fr
from cuda_ipc.link.transport.tcp_auth import ROLE_CONNECTOR, challenge

from .test_link import open_fds
from .test_tcp import PACKAGE_DIR, TOKEN, InThread, linked, raw_client, read_to_end


class TcpListenerTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()

    def tearDown(self):
        gc.collect()
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_silent_connections_do_not_hold_up_another_client(self):
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN, handshake_timeout=2, max_pending=4) as server:
            port = int(server.url.rsplit(":", 1)[1])
            silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
            silent[1].sendall(challenge(ROLE_CONNECTOR, bytes(32))[:20])  # half a challenge
            half = InThread(lambda: raw_client(port, hello=False))  # authenticated, then nothing
            a, b = linked(server)
            a.send("through")
            self.assertEqual(b.receive(timeout=5), "through")
            a.close()
            b.close()
            while not half.done:
                with self.assertRaises(IpcError):
                    server.accept(timeout=0.05)  # the listener's side of the authentication runs in accept()
            half = half.result()
            silent.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            while server.pending < 4:
                with self.assertRaises(IpcError):
                    server.accept(timeout=0.05)
            extra = socket.create_connection(("127.0.0.1", port), timeout=5)
            with self.assertRaises(IpcError):
                server.accept(timeout=0.2)
            self.assertEqual(extra.recv(100), b"", "over max_pending: closed at once")
            self.assertEqual(server.last_refusal.code, "ERR_LIMIT_REACHED")
            # accept() runs the handshakes: called until each silent one was dropped at its timeout.
            deadline = time.monotonic() + 30
            while server.pending > 0:
                self.assertLess(time.monotonic(), deadline, "the silent connections were never dropped")
                with self.assertRaises(IpcError):
                    server.accept(timeout=0.05)
            with self.assertRaises(IpcError) as cm:
                server.accept(timeout=0)
            self.assertEqual(cm.exception.code, "ERR_TIMEOUT")
            self.assertEqual(server.pending, 0, "each silent connection was dropped at its handshake timeout")
            self.assertEqual(server.last_refusal.code, "ERR_TIMEOUT")
            for s in silent:
                self.assertEqual(len(read_to_end(s)), 48, "the listener's challenge, then the end: no HELLO")
            self.assertEqual(read_to_end(half), fr.hello_frame(fr.OUR_FEATURES | fr.FEATURE_NCCL) + fr.goodbye_frame(),
                             "after the proofs the listener's HELLO, then (no HELLO back) its GOODBYE and the end")
            for s in silent + [half, extra]:
                s.close()

    def test_close_from_another_thread_ends_accept_and_iteration(self):
        server = cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN)
        got = []

        def serve():
            for link in server:
                got.append(link.receive(timeout=5))
                link.close()
            got.append("done")
        t = threading.Thread(target=serve)
        t.start()
        with cuda_ipc.connect(server.url, token=TOKEN) as link:
            link.send("one")
        deadline = time.monotonic() + 30
        while got != ["one"]:  # the serving thread took the link and its message
            self.assertLess(time.monotonic(), deadline, "the serving thread never got the message")
            time.sleep(0.001)
        server.close()
        t.join(5)
        self.assertFalse(t.is_alive())
        self.assertEqual(got, ["one", "done"])
        with self.assertRaises(IpcError) as cm:
            server.accept(timeout=1)
        self.assertEqual(cm.exception.code, "ERR_LINK_CLOSED")

    def test_a_forked_child_closing_its_copy_leaves_the_listener_working(self):
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN) as server:
            pid = os.fork()
            if pid == 0:
                server.close()
                os._exit(0)
            self.assertEqual(os.waitpid(pid, 0)[1], 0)
            a, b = linked(server)
            a.close()
            b.close()

    def test_addresses_are_checked_and_written_out(self):
        for bad in ("tcp://localhost:0", "tcp://127.0.0.1", "tcp://127.0.0.1:70000", "tcp://::1:5000", "udp://127.0.0.1:1",
                    "tcp://[::g]:1", "tcp://user@127.0.0.1:1", "tcp://127.0.0.1:1/path"):
            with self.subTest(bad=bad):
                with self.assertRaises(IpcError) as cm:
                    cuda_ipc.listen(bad, token=TOKEN)
                self.assertEqual(cm.exception.code, "ERR_INVALID_URL")
        with self.assertRaises(IpcError) as cm:
            cuda_ipc.connect("tcp://127.0.0.1:0", token=TOKEN)
        self.assertEqual(cm.exception.code, "ERR_INVALID_URL")
        with self.assertRaises(TypeError):
            cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN, cert="x.pem")
        with self.assertRaises(TypeError):
            cuda_ipc.listen("a-name", token=TOKEN)
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN) as server:
            with self.assertRaises(IpcError) as cm:
                cuda_ipc.listen(server.url, token=TOKEN)
            self.assertEqual(cm.exception.code, "ERR_ADDRESS_IN_USE")
            port = server.url.rsplit(":", 1)[1]
        with self.assertRaises(IpcError) as cm:
            cuda_ipc.connect(f"tcp://127.0.0.1:{port}", token=TOKEN, timeout=0)
        self.assertEqual(cm.exception.code, "ERR_NO_LISTENER")
        with self.assertRaises(IpcError) as cm:
            cuda_ipc.connect(f"tcp://127.0.0.1:{port}", token=TOKEN, timeout=0.2)
        self.assertEqual(cm.exception.code, "ERR_NO_LISTENER", "after its retries: still nobody listening, said as such")
        self.assertIn(f"nothing listens at tcp://127.0.0.1:{port} (connection refused)", str(cm.exception))

    def test_ipv6_loopback(self):
        try:
            server = cuda_ipc.listen("tcp://[::1]:0", token=TOKEN)
        except (IpcError, OSError) as e:
            self.skipTest(f"no IPv6 loopback here: {e}")
        with server:
            self.assertRegex(server.url, r"^tcp://\[::1\]:[0-9]+$")
            a, b = linked(server)
            with a, b:
                self.assertEqual(b.remote.family, "IPv6")
                self.assertEqual(b.remote.address, "::1")
                a.send({"over": "IPv6"})
                self.assertEqual(b.receive(timeout=5), {"over": "IPv6"})

    def test_many_links_leave_no_fd_behind(self):
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN) as server:
            for i in range(40):
                a, b = linked(server)
                h = HostBuffer.allocate(4096)
                h.fill(i)
                b.send({"i": i, "h": h})
                got = a.receive(timeout=5)
                self.assertEqual(got["h"].read(0, 2), bytes([i, i]))
                got["h"].close()
                h.close()
                (a if i % 2 else b).close()
                (b if i % 2 else a).close()

    def test_a_peer_killed_in_the_middle_of_a_message(self):
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN) as server:
            code = ("import cuda_ipc\n"
                    f"link = cuda_ipc.connect({server.url!r}, token={TOKEN!r})\n"
                    "link.send(bytes(64 << 20))\n")
            child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": PACKAGE_DIR})
            try:
                link = server.accept(timeout=10)
                # Its message is arriving: the child waits in send() for this side to read on.
                # The frame (64 MiB) cannot all be in the socket buffers while this side does not read:
                # once its first bytes are here, the child is in the middle of it.
                self.assertTrue(select.select([link], [], [], 10)[0])
                os.kill(child.pid, signal.SIGKILL)
                child.wait(10)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            with self.assertRaises(IpcError) as cm:
                link.receive(timeout=10)
            self.assertEqual(cm.exception.code, "ERR_PEER_GONE")
            self.assertIn("middle of a frame", str(cm.exception))
            link.close()


def _openssl_cert(directory: str) -> tuple[str, str] | None:
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    r = subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                        "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], capture_output=True)
    return (cert, key) if r.returncode == 0 else None


class TlsTests(unittest.TestCase):
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
        self.fds = open_fds()

    def tearDown(self):
        gc.collect()
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_a_tls_link_carries_messages_and_host_buffers(self):
        cert, key = self.files
        with cuda_ipc.listen("tls://127.0.0.1:0", token=TOKEN, cert=cert, key=key) as server:
            self.assertTrue(server.url.startswith("tls://127.0.0.1:"))
            a, b = linked(server, ca=cert)
            with a, b:
                self.assertTrue(a.tls and b.tls)
                self.assertEqual(a.transport, "tcp")
                raw = os.urandom(3 << 20)
                h = HostBuffer.allocate(100_000)
                h.write(raw[:100_000])
                b.send({"raw": raw, "h": h})
                got = a.receive(timeout=20)
                self.assertEqual(got["raw"], raw)
                self.assertEqual(got["h"].read(), raw[:100_000])
                got["h"].close()
                h.close()
                for i in range(300):
                    a.send(i)
                self.assertEqual([b.receive(timeout=5) for _ in range(300)], list(range(300)))
            # A connector that does not trust the certificate fails, before authentication.
            with self.assertRaises(IpcError) as cm:
                linked(server)
            self.assertEqual(cm.exception.code, "ERR_AUTH_FAILED")
            self.assertIn("certificate", str(cm.exception).lower())
            # The token is still checked inside TLS.
            with self.assertRaises(IpcError) as cm:
                linked(server, token="another-token-0123456789", ca=cert)
            self.assertEqual(cm.exception.code, "ERR_AUTH_FAILED")

    def test_a_tls_peer_closing_or_vanishing(self):
        cert, key = self.files
        with cuda_ipc.listen("tls://127.0.0.1:0", token=TOKEN, cert=cert, key=key) as server:
            a, b = linked(server, ca=cert)
            for i in range(20):
                b.send({"unread": i})
            a.close()
            with self.assertRaises(IpcError) as cm:
                while True:
                    b.receive(timeout=5)
            self.assertEqual(cm.exception.code, "ERR_LINK_CLOSED")
            b.close()
            a, b = linked(server, ca=cert)
            b._sock.close()  # gone without GOODBYE (and without a TLS close_notify)
            with self.assertRaises(IpcError) as cm:
                a.receive(timeout=5)
            self.assertEqual(cm.exception.code, "ERR_PEER_GONE")
            a.close()
            b.close()


if __name__ == "__main__":
    unittest.main()
