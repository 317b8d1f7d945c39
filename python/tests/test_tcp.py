"""TCP links between two Python ends on 127.0.0.1 (docs/PROTOCOL.md 1.1, 2.3): messages of every
encoding and past a frame, host buffers arriving as copies, values that need fds refused, leases of a
TCP transfer handler, NCCL_ABORT hooks, backpressure, and the token (wrong, missing, from the
environment). The listener, TLS and killed peers: test_tcp_listener.py. Standard library only."""
import array
import contextlib
import gc
import os
import secrets
import select
import socket
import threading
import time
import unittest

import cuda_ipc
from cuda_ipc import HostArray, HostBuffer, IpcError, share_tensors
from cuda_ipc.link import TOKEN_ENV, NcclAbort, on_nccl_abort, peer_takes_nccl, send_nccl_abort
from cuda_ipc.link.transport import frame as fr
from cuda_ipc.link.messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler, unregister_transfer_handler
from cuda_ipc.link.lifetimes.lease import Hold
from cuda_ipc.link.transport.tcp_auth import ROLE_CONNECTOR, ROLE_LISTENER, challenge, proof, read_challenge

from .test_link import open_fds, pair


class Ticket:
    """A value leased over TCP by the test handler below (as the NCCL layer's records are)."""

    def __init__(self, n, lease=None):
        self.n, self.lease = n, lease

    def close(self):
        self.lease.end()


@contextlib.contextmanager
def _tickets():
    """A handler of the 'tcp' transport for Ticket, registered while the block runs: one byte each;
    yields the list of the numbers the peer released, in order."""
    released = []

    class TicketTransfer(TransferHandler):
        kind = "tcp-ticket-test"
        transports = frozenset({"tcp"})

        def can_transfer(self, value):
            return isinstance(value, Ticket)

        def encode(self, value, link):
            return TransferEncoding(data=bytes([value.n]), hold=Hold(lambda: released.append(value.n), 1))

        def decode(self, data, fds, link, lease):
            return Ticket(data[0], lease)

    register_transfer_handler(TicketTransfer())
    try:
        yield released
    finally:
        unregister_transfer_handler("tcp-ticket-test")


def _count_writes(link):
    """Wraps ``link``'s socket writes: each write's frame types (the first two frames it starts
    with), listed in the returned list as they happen."""
    outbox = link._outbox
    conn = outbox._conn
    writes = []

    class Counted:
        def __getattr__(self, name):
            return getattr(conn, name)

        def send(self, view):
            data = bytes(view)
            kinds = []
            at = 0
            while at + fr.HEADER_BYTES <= len(data) and len(kinds) < 2:
                kinds.append(data[at + 5])
                at += fr.HEADER_BYTES + int.from_bytes(data[at + 8:at + 12], "little")
            writes.append(tuple(kinds))
            return conn.send(view)

    outbox._conn = Counted()
    return writes

TOKEN = "test-token-" + "0123456789abcdef"
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def linked(server, token=TOKEN, **options):
    """(the listener's link, the connector's link) of one connection to ``server``."""
    out = {}

    def dial():
        try:
            out["link"] = cuda_ipc.connect(server.url, token=token, timeout=5, **options)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            out["error"] = e
    t = threading.Thread(target=dial)
    t.start()
    accepted = None
    try:
        deadline = time.monotonic() + 10
        while accepted is None and time.monotonic() < deadline and (t.is_alive() or "link" in out):
            try:
                accepted = server.accept(timeout=0.1)
            except IpcError as e:
                if e.code != "ERR_TIMEOUT":
                    raise
    finally:
        t.join(10)
    if "error" in out:
        if accepted is not None:
            accepted.close()
        raise out["error"]
    assert accepted is not None, "the listener accepted no link"
    return accepted, out["link"]


class InThread:
    """Runs ``fn()`` in a thread; ``result()`` joins it and returns its value (or raises its error)."""

    def __init__(self, fn):
        self._out = {}
        self._thread = threading.Thread(target=self._run, args=(fn,))
        self._thread.start()

    def _run(self, fn):
        try:
            self._out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by result()
            self._out["error"] = e

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self):
        self._thread.join(60)
        if "error" in self._out:
            raise self._out["error"]
        return self._out.get("value")


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"the connection ended after {len(data)} of {n} bytes")
        data += chunk
    return data


def read_to_end(sock: socket.socket) -> bytes:
    """Everything until the peer closes (a reset counts as the end); fails after 5 s without the end."""
    sock.settimeout(5)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def raw_client(port: int, token: str = TOKEN, hello: bool = True) -> socket.socket:
    """A raw socket that authenticates as a connector (PROTOCOL.md 2.3) and says HELLO."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    nonce = secrets.token_bytes(32)
    s.sendall(challenge(ROLE_CONNECTOR, nonce))
    listener_nonce = read_challenge(recv_exact(s, 48), ROLE_LISTENER, "listener")
    secret = token.encode()
    s.sendall(proof(secret, ROLE_CONNECTOR, listener_nonce, nonce))
    assert recv_exact(s, 32) == proof(secret, ROLE_LISTENER, listener_nonce, nonce)
    if hello:
        s.sendall(fr.hello_frame(fr.OUR_FEATURES | fr.FEATURE_NCCL))
    return s


def raw_accepted(server, **kw):
    """(the listener's link, a raw authenticated socket at the other end whose HELLO it read)."""
    out = {}
    t = threading.Thread(target=lambda: out.update(link=server.accept(timeout=5)))
    t.start()
    raw = raw_client(int(server.url.rsplit(":", 1)[1]), **kw)
    t.join(10)
    head = recv_exact(raw, 24)
    assert head[5] == fr.HELLO and int.from_bytes(head[16:20], "little") == fr.OUR_FEATURES | fr.FEATURE_NCCL, head
    return out["link"], raw


class _FakeCudaArray:
    """Looks like device memory to the encoder, without any (device memory crosses a TCP link over NCCL:
    test_nccl_link.py; this one is refused before NCCL is asked for anything)."""

    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}


class TcpLinkTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()
        self.server = cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN)

    def tearDown(self):
        self.server.close()
        gc.collect()
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_messages_of_every_encoding_cross_both_ways(self):
        self.assertRegex(self.server.url, r"^tcp://127\.0\.0\.1:[0-9]+$")
        a, b = linked(self.server)
        with a, b:
            self.assertEqual((a.transport, b.transport, a.tls), ("tcp", "tcp", False))
            port = int(self.server.url.rsplit(":", 1)[1])
            self.assertEqual(b.remote, cuda_ipc.RemoteAddress("127.0.0.1", port, "IPv4"))
            self.assertEqual((a.remote.address, a.remote.family), ("127.0.0.1", "IPv4"))
            self.assertEqual(a.remote.port, b._conn.sock.getsockname()[1])
            for link in (a, b):  # PROTOCOL.md 1.1: keepalive 10 s idle, 5 s apart, 3 probes; no Nagle
                sock = link._conn.sock
                self.assertEqual([sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0,
                                  sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                                  sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                                  sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                                  sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0], [True, 10, 5, 3, True])
            for link in (a, b):
                with self.assertRaises(IpcError) as cm:
                    link.peer
                self.assertEqual(cm.exception.code, "ERR_UNSUPPORTED")
                self.assertIn("link.remote", str(cm.exception))
            values = [
                {"text": "héllo ✓", "n": 3.5, "neg": -7, "list": [1, "two", [3, {"four": 4}]], "none": None, "flag": True},
                None, 42, 2.5, "just a string", [],
                b"raw bytes \x00\xff", bytes(range(256)) * 4,
                {"big": 2**80, "small": -(2**70), "f64": array.array("d", [1.5, -2.0]), "i16": array.array("h", [-3, 7]),
                 "u8": b"\x01\x02", "deep": [[[{"x": array.array("I", [1, 2, 3])}]]]},
            ]
            for v in values:
                a.send(v)
                self.assertEqual(b.receive(timeout=5), v)
                b.send(v)
                self.assertEqual(a.receive(timeout=5), v)
            self.assertEqual(a.leases.count + b.leases.count + a.received_leases + b.received_leases, 0)

    def test_messages_past_a_frame_travel_inline_both_ways(self):
        a, b = linked(self.server)
        with a, b:
            raw = os.urandom(5 << 20)
            table = {f"layer.{i}.weight": {"shape": [i % 7 + 1, 64], "offset": i * 4096} for i in range(8000)}
            mixed = {"blob": raw[:300_000], "n": 2**64, "table": table}
            for v in (raw, table, mixed):
                # A send past the socket buffers waits for the peer to read (nothing spills to a memfd).
                sent = InThread(lambda: a.send(v))
                self.assertEqual(b.receive(timeout=20), v)
                sent.result()
                sent = InThread(lambda: b.send(v))
                self.assertEqual(a.receive(timeout=20), v)
                sent.result()
            # Many frames in flight at once, read back in order.
            for i in range(200):
                a.send({"i": i, "pad": "x" * (i * 37)})
            self.assertEqual([b.receive(timeout=5)["i"] for _ in range(200)], list(range(200)))

    def test_a_message_over_the_receivers_bound_is_refused_before_its_payload(self):
        server = cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN, max_message_bytes=1 << 20)
        with server:
            a, b = linked(server)
            with a, b:
                b.send(b"x" * (2 << 20))  # b's own bound is 1 GiB
                with self.assertRaises(IpcError) as cm:
                    a.receive(timeout=5)
                self.assertEqual(cm.exception.code, "ERR_MESSAGE_TOO_LARGE")
                with self.assertRaises(IpcError) as cm:
                    b.receive(timeout=5)
                self.assertEqual(cm.exception.code, "ERR_MESSAGE_TOO_LARGE", "REFUSE reason 3 told the sender")
                self.assertTrue(a.closed and b.closed)

    def test_a_host_buffer_arrives_as_a_copy_with_its_bytes(self):
        a, b = linked(self.server)
        with a, b:
            h = HostBuffer.allocate(1 << 20)
            h.write(bytes(i & 255 for i in range(1 << 16)) * 16)
            view = h.view(1000, 300_000)
            a.send({"whole": h, "view": view, "pair": [view, 7]})
            got = b.receive(timeout=10)
            for name, sent in (("whole", h), ("view", view)):
                r = got[name]
                self.assertIsInstance(r, HostBuffer)
                self.assertEqual(r.nbytes, sent.nbytes)
                self.assertEqual(r.read(), sent.read(), name)
                self.assertNotEqual(os.fstat(r.fd).st_ino, os.fstat(h.fd).st_ino, "a memfd of the receiver's own")
            self.assertEqual(got["pair"][0].read(), view.read())
            self.assertEqual(a.leases.count, 0, "a copy is not leased")
            self.assertEqual(b.received_leases, 0)
            got["whole"].fill(0)
            self.assertNotEqual(h.read(0, 4), b"\x00" * 4, "the two buffers are unrelated")
            h.fill(5)
            self.assertEqual(got["view"].read(0, 4), bytes([1000 & 255, 1001 & 255, 1002 & 255, 1003 & 255]),
                             "the copy holds the bytes of the moment it was sent")
            for r in (got["whole"], got["view"], got["pair"][0]):
                r.close()
            view.close()
            h.close()

    def test_values_that_need_fds_are_refused_with_what_to_send_instead(self):
        a, b = linked(self.server)
        ha = HostArray.allocate("float32", (4,))
        with a, b:
            with self.assertRaises(IpcError) as cm:
                a.send({"x": [_FakeCudaArray()]})
            self.assertEqual(cm.exception.code, "ERR_NOT_TRANSFERABLE")
            self.assertIn("no bytes to send", str(cm.exception))
            with self.assertRaises(IpcError) as cm:
                a.send(share_tensors({"w": ha}))
            self.assertEqual(cm.exception.code, "ERR_NOT_TRANSFERABLE")
            self.assertIn("HostBuffer", str(cm.exception))
            a.send("still open")
            self.assertEqual(b.receive(timeout=5), "still open")
        ha.close()

    def test_a_closed_peer_and_a_vanished_peer(self):
        a, b = linked(self.server)
        b.close()
        with self.assertRaises(IpcError) as cm:
            a.receive(timeout=5)
        self.assertEqual(cm.exception.code, "ERR_LINK_CLOSED")
        a.close()
        link, raw = raw_accepted(self.server)
        raw.close()  # no GOODBYE
        with self.assertRaises(IpcError) as cm:
            link.receive(timeout=5)
        self.assertEqual(cm.exception.code, "ERR_PEER_GONE")
        self.assertIn("127.0.0.1", str(cm.exception))
        link.close()

    def test_nccl_abort_reaches_the_peers_hook(self):
        a, b = linked(self.server)
        with a, b:
            seen = []
            remove = on_nccl_abort(b, lambda link, abort: seen.append((link, abort)))
            comm = secrets.token_bytes(16)
            send_nccl_abort(a, comm, 2, "ncclSend failed: " + "é" * 600)  # cut to 1024 bytes at a character
            a.send("after")
            self.assertEqual(b.receive(timeout=5), "after")
            self.assertEqual(len(seen), 1)
            link, abort = seen[0]
            self.assertIs(link, b)
            self.assertEqual(abort, NcclAbort(comm, 2, ("ncclSend failed: " + "é" * 600).encode()[:1024].decode("utf-8", "ignore")))
            self.assertLessEqual(len(abort.text.encode()), 1024)
            remove()
            send_nccl_abort(a, comm, 1)  # nobody listens: ignored
            a.send("again")
            self.assertEqual(b.receive(timeout=5), "again")
            self.assertEqual(len(seen), 1)
            with self.assertRaises(ValueError):
                send_nccl_abort(a, comm, 4)
            with self.assertRaises(TypeError):
                send_nccl_abort(a, comm[:8], 1)
        ua, ub = pair()
        with ua, ub:
            with self.assertRaises(IpcError) as cm:
                send_nccl_abort(ua, comm, 1)
            self.assertEqual(cm.exception.code, "ERR_UNSUPPORTED")
        s1, s2 = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with s2, cuda_ipc.Link(s1, peer_name="raw", _token=cuda_ipc.link._CREATE):
            self.assertEqual(s2.recv(100), fr.hello_frame(fr.OUR_FEATURES), "a Unix link's HELLO: bits 0 and 1, not 3")
            self.assertEqual(fr.OUR_FEATURES, 3)

    def test_leases_work_on_tcp_for_a_handler_that_serves_it(self):
        # How the NCCL layer's records travel: a handler of the 'tcp' transport, leased to the peer.
        with _tickets() as released:
            a, b = linked(self.server)
            with a, b:
                self.assertTrue(peer_takes_nccl(a) and peer_takes_nccl(b))
                a.send({"t": Ticket(7), "u": Ticket(8)})
                got = b.receive(timeout=5)
                self.assertEqual((got["t"].n, got["u"].n, a.leases.count, b.received_leases), (7, 8, 2, 2))
                got["t"].close()
                b.poll()
                deadline = time.monotonic() + 5
                while a.leases.count != 1 and time.monotonic() < deadline:
                    select.select([a], [], [], 0.05)
                    a.poll()
                self.assertEqual((released, a.leases.count), ([7], 1), "the RELEASE crossed")
                ua, ub = pair()
                with ua, ub, self.assertRaises(IpcError) as cm:
                    ua.send(Ticket(1))  # not a handler of Unix links
                self.assertEqual(cm.exception.code, "ERR_NOT_TRANSFERABLE")
            self.assertEqual(sorted(released), [7, 8], "closing the link ended the other lease")

    def test_a_short_reply_after_a_close_takes_the_release_behind_it_in_one_write(self):
        with _tickets() as released:
            a, b = linked(self.server)
            with a, b:
                writes = _count_writes(b)
                for round_ in range(2):
                    a.send({"t": Ticket(7 + round_)})
                    b.receive(timeout=5)["t"].close()  # by the receiving thread: its RELEASE waits for the reply
                    before = len(writes)
                    b.send("done" if round_ == 0 else "x" * 20000)  # the second longer than PAIR_LIMIT
                    self.assertEqual(a.receive(timeout=5), "done" if round_ == 0 else "x" * 20000)
                    deadline = time.monotonic() + 5
                    while a.leases.count and time.monotonic() < deadline:
                        select.select([a], [], [], 0.05)
                        a.poll()
                    self.assertEqual((a.leases.count, released[-1:]), (0, [7 + round_]), "the RELEASE came behind the reply")
                    if round_ == 0:
                        self.assertEqual(len(writes) - before, 1, "the reply and its RELEASE in one write")
                        self.assertEqual(writes[-1][:2], (fr.MESSAGE, fr.RELEASE))
                    else:
                        self.assertEqual([w[0] for w in writes[before:]][-1:], [fr.RELEASE], "a long reply: the RELEASE on its own")

    def test_backpressure_a_send_that_times_out_sends_nothing_and_the_link_goes_on(self):
        a, b = linked(self.server)
        with a, b:
            sent = 0
            while True:
                try:
                    a.send({"i": sent, "pad": "p" * 200}, timeout=0.2)
                except IpcError as e:
                    self.assertEqual(e.code, "ERR_TIMEOUT")
                    break
                sent += 1
                self.assertLess(sent, 10_000_000)
            self.assertFalse(a.closed)
            self.assertEqual([b.receive(timeout=5)["i"] for _ in range(sent)], list(range(sent)))
            a.send("next")
            self.assertEqual(b.receive(timeout=5), "next")


class TcpTokenTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()
        self.saved = os.environ.pop(TOKEN_ENV, None)

    def tearDown(self):
        if self.saved is not None:
            os.environ[TOKEN_ENV] = self.saved
        gc.collect()
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_a_wrong_token_fails_on_both_sides_and_nothing_is_delivered(self):
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN) as server:
            out = {}
            t = threading.Thread(target=lambda: out.update(accept=self._accept_error(server)))
            t.start()
            with self.assertRaises(IpcError) as cm:
                cuda_ipc.connect(server.url, token="another-token-0123456789", timeout=5)
            t.join(10)
            self.assertEqual(cm.exception.code, "ERR_AUTH_FAILED")
            self.assertEqual(out["accept"], "ERR_TIMEOUT", "no link came out of it")
            self.assertEqual(server.refused, 1)
            self.assertEqual(server.last_refusal.code, "ERR_AUTH_FAILED")
            # A raw peer that proves a wrong token and sends a frame anyway: the listener closes
            # before a byte of it is read, and sends no HELLO.
            port = int(server.url.rsplit(":", 1)[1])
            t = threading.Thread(target=lambda: out.update(accept=self._accept_error(server)))
            t.start()
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            nonce = secrets.token_bytes(32)
            s.sendall(challenge(ROLE_CONNECTOR, nonce))
            listener_nonce = read_challenge(recv_exact(s, 48), ROLE_LISTENER, "listener")
            s.sendall(proof(b"wrong-token-0123456789", ROLE_CONNECTOR, listener_nonce, nonce) + fr.hello_frame()
                      + fr.header(fr.MESSAGE, fr.ENC_JSON, 2, 0) + b"{}")
            rest = read_to_end(s)
            s.close()
            t.join(10)
            self.assertEqual(len(rest), 0, "the listener proves nothing to a peer whose proof did not check out")
            self.assertEqual(out["accept"], "ERR_TIMEOUT")
            self.assertEqual(server.last_refusal.code, "ERR_AUTH_FAILED")

    def _accept_error(self, server) -> str:
        try:
            server.accept(timeout=1.0).close()
            return "a link"
        except IpcError as e:
            return e.code

    def test_a_missing_or_short_token_fails_at_once_and_sends_nothing(self):
        raw = socket.socket()
        raw.bind(("127.0.0.1", 0))
        raw.listen(4)
        raw.settimeout(0.2)
        url = f"tcp://127.0.0.1:{raw.getsockname()[1]}"
        try:
            for token in (None, "", "short", b"15 bytes long!!"):
                with self.subTest(token=token):
                    with self.assertRaises(IpcError) as cm:
                        cuda_ipc.connect(url, token=token)
                    self.assertEqual(cm.exception.code, "ERR_AUTH_FAILED")
                    with self.assertRaises(IpcError) as cm:
                        cuda_ipc.listen("tcp://127.0.0.1:0", token=token)
                    self.assertEqual(cm.exception.code, "ERR_AUTH_FAILED")
            with self.assertRaises(socket.timeout):
                raw.accept()  # no connection was even made
        finally:
            raw.close()

    def test_the_token_comes_from_the_environment_and_an_argument_wins(self):
        os.environ[TOKEN_ENV] = TOKEN
        with cuda_ipc.listen("tcp://127.0.0.1:0") as server:
            a, b = linked(server, token=None)
            with a, b:
                a.send("via the environment")
                self.assertEqual(b.receive(timeout=5), "via the environment")
            os.environ[TOKEN_ENV] = "not-the-listeners-token"
            with self.assertRaises(IpcError) as cm:
                linked(server, token=None)
            self.assertEqual(cm.exception.code, "ERR_AUTH_FAILED")
            a, b = linked(server, token=TOKEN.encode())
            a.close()
            b.close()


if __name__ == "__main__":
    unittest.main()
