"""listen(name) in Python: a Python process accepts links from another (or from Node, see
test/cpu/python-tensors.test.ts), with the protocol's directory rules, stale sockets replaced, a live
name refused, and tensor sets over the accepted link."""
import os
import select
import stat
import tempfile
import threading
import time
import unittest

from cuda_ipc import HostArray, IpcError, connect, listen, share_tensors

from .test_link import open_fds


class ListenerTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()
        self.dir = tempfile.mkdtemp()
        os.chmod(self.dir, 0o700)

    def tearDown(self):
        os.rmdir(self.dir)
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_a_python_listener_accepts_a_python_peer_and_a_tensor_set_crosses(self):
        with listen("weights-test", directory=self.dir) as server:
            self.assertEqual(stat.S_IMODE(os.stat(server.path).st_mode), 0o600)
            out = {}

            def client():
                with connect("weights-test", directory=self.dir) as link:
                    ts = link.receive(timeout=5)
                    out["values"] = ts.view("w").tolist()
                    ts.close()
                    link.send({"done": True})
                    try:
                        link.receive(timeout=5)  # until the listener's side closes
                    except IpcError as e:
                        out["end"] = e.code
            t = threading.Thread(target=client)
            t.start()
            link = server.accept(timeout=5)
            self.assertEqual(link.peer.pid, os.getpid())
            a = HostArray.allocate("int32", (4,))
            for i in range(4):
                a.values()[i] = i * 7
            link.send(share_tensors({"w": a}))
            self.assertEqual(link.receive(timeout=5), {"done": True})
            # The client's release follows its reply (its frame first): it may not be here yet.
            deadline = time.monotonic() + 5
            link.poll()
            while link.leases.count and time.monotonic() < deadline:
                select.select([link], [], [], 0.05)
                link.poll()
            self.assertEqual(link.leases.count, 0)
            link.close()
            t.join(5)
            a.close()
            self.assertFalse(t.is_alive())
            self.assertEqual(out["values"], [0, 7, 14, 21])
            self.assertEqual(out.get("end"), "ERR_LINK_CLOSED", "the client saw the listener close its side")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "weights-test.sock")), "close removed the socket file")

    def test_timeout_0_tries_once_and_a_listener_that_is_there_gets_the_default_time_for_its_handshake(self):
        with listen("once", directory=self.dir) as server:
            out: dict = {}

            def client():
                try:
                    with connect("once", directory=self.dir, timeout=0) as link:
                        out["connected"] = True
                        link.send("through the link")
                        link.receive(timeout=5)  # until the listener's side closes
                except IpcError as e:
                    out.setdefault("connected", False)
                    out["code"] = e.code
            t = threading.Thread(target=client)
            t.start()
            # The listener answers handshakes in accept(): a slow one. What is left of a 0 s timeout
            # (as there was) runs out meanwhile; the default allowance does not.
            time.sleep(0.3)
            link = server.accept(timeout=5)
            self.assertEqual(link.receive(timeout=5), "through the link")
            link.close()
            t.join(5)
            self.assertFalse(t.is_alive())
            self.assertEqual(out.get("connected"), True, out)
        with self.assertRaises(IpcError) as cm:
            connect("once", directory=self.dir, timeout=0)
        self.assertEqual(cm.exception.code, "ERR_NO_LISTENER", "nobody there: at once")

    def test_a_live_name_is_refused_and_a_stale_socket_replaced(self):
        with listen("taken", directory=self.dir):
            with self.assertRaises(IpcError) as cm:
                listen("taken", directory=self.dir)
            self.assertEqual(cm.exception.code, "ERR_ADDRESS_IN_USE")
        import socket
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        stale.bind(os.path.join(self.dir, "stale.sock"))
        stale.close()  # the file stays, nobody listens
        with listen("stale", directory=self.dir) as server:
            with self.assertRaises(IpcError) as cm:
                server.accept(timeout=0.05)
            self.assertEqual(cm.exception.code, "ERR_TIMEOUT")

    def test_a_directory_that_is_a_file_is_named_in_the_error(self):
        path = os.path.join(self.dir, "not-a-dir")
        with open(path, "w") as f:
            f.write("x")
        try:
            for what, call in (("listen", lambda: listen("x", directory=path)),
                               ("connect", lambda: connect("x", directory=path, timeout=0)),
                               ("connect", lambda: connect("x", directory=path))):
                with self.assertRaises(NotADirectoryError) as cm:
                    call()
                self.assertTrue(cm.exception.strerror.startswith(f'{what}: "{path}" is not a directory'), cm.exception)
                self.assertEqual(cm.exception.filename, path)
            with open(path) as f:
                self.assertEqual(f.read(), "x", "the file untouched")
        finally:
            os.unlink(path)


if __name__ == "__main__":
    unittest.main()
