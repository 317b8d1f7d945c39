"""Hostile peers on TCP links (docs/PROTOCOL.md 1.1, 2.3, 3): a raw socket that authenticates correctly
and then lies (lengths, fds, the memfd flag, frame rings, a second HELLO, malformed NCCL_ABORT, records
that never travel on TCP, host-bytes that do not add up), raw peers that cheat in the authentication
itself, and a seeded fuzz of frame headers. Each header is judged before its payload is read: the tests
send the header alone and expect the verdict at once. (Unix-socket hostile cases: test_hostile.py.)"""
import gc
import random
import secrets
import socket
import struct
import threading
import unittest

import cuda_ipc
from cuda_ipc import IpcError
from cuda_ipc.link.transport import frame as fr
from cuda_ipc.link.transport.tcp_auth import ROLE_CONNECTOR, ROLE_LISTENER, challenge, proof, read_challenge

from .test_link import open_fds, raw_pair
from .test_tcp import TOKEN, InThread, raw_accepted, read_to_end, recv_exact

U64 = struct.Struct("<Q")


def records(json_text: bytes, recs) -> bytes:
    """A JsonWithRecords payload: ``recs`` are (kind, key, lease id, data) placed at ``key`` of the root."""
    out = struct.pack("<I", len(json_text)) + json_text + struct.pack("<H", len(recs))
    for kind, key, lease, data in recs:
        k = key.encode()
        out += bytes([len(kind)]) + kind.encode() + b"\x01" + b"\x01" + struct.pack("<H", len(k)) + k
        out += struct.pack("<BQI", 0, lease, len(data)) + data
    return out


def message(payload: bytes, encoding: int = fr.ENC_JSON_WITH_RECORDS) -> bytes:
    return fr.header(fr.MESSAGE, encoding, len(payload), 0) + payload


def nccl_abort(reason=1, reserved=0, text=b"", communicator=bytes(16), flags=0) -> bytes:
    payload = communicator + struct.pack("<II", reason, reserved) + text
    return fr.header(fr.NCCL_ABORT, flags, len(payload), 0) + payload


class HostileTcpPeerTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()
        self.server = cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN, max_message_bytes=1 << 20)

    def tearDown(self):
        self.server.close()
        gc.collect()
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def verdict(self, data: bytes, code: str = "ERR_FRAME_INVALID") -> bytes:
        """Sends ``data`` from an authenticated raw peer and expects the link to close with ``code`` at
        once; returns what the raw peer got back before the end."""
        link, raw = raw_accepted(self.server)
        try:
            raw.sendall(data)
            with self.assertRaises(IpcError) as cm:
                link.receive(timeout=5)
            self.assertEqual(cm.exception.code, code, str(cm.exception))
            self.assertTrue(link.closed)
            return read_to_end(raw)
        finally:
            link.close()
            raw.close()

    def test_headers_out_of_spec_close_the_link_before_their_payload(self):
        cases = {
            "fds announced": struct.pack("<IBBHIHH", fr.FRAME_MAGIC, 2, fr.MESSAGE, fr.ENC_JSON, 100, 1, 0),
            "fds announced on a control frame": struct.pack("<IBBHIHH", fr.FRAME_MAGIC, 2, fr.RELEASE, 0, 16, 2, 0),
            "the memfd flag": fr.header(fr.MESSAGE, fr.ENC_RAW | fr.LARGE_PAYLOAD, 8, 0) + U64.pack(10 << 20),
            "RING": fr.header(fr.RING, 0, 8, 0),
            "RING_START": fr.header(fr.RING_START, 0, 0, 0),
            "a control frame of 1 MiB": fr.header(fr.RELEASE, 0, 1 << 20, 0),
            "a GONE longer than a frame": fr.header(fr.GONE, 0, fr.MAX_PAYLOAD_BYTES + 1, 0),
            "bad magic": b"XIPL" + fr.header(fr.MESSAGE, 0, 2, 0)[4:],
            "version 1": struct.pack("<IBBHIHH", fr.FRAME_MAGIC, 1, fr.MESSAGE, 0, 2, 0, 0),
            "reserved bytes": struct.pack("<IBBHIHH", fr.FRAME_MAGIC, 2, fr.MESSAGE, 0, 2, 0, 7),
            "unknown type": fr.header(10, 0, 0, 0),
            "a lying length of 4 GiB - 1": fr.header(fr.HELLO, 0, 0xFFFFFFFF, 0),
        }
        for name, head in cases.items():
            with self.subTest(name):
                self.verdict(head)

    def test_a_message_over_the_bound_is_refused_before_its_payload(self):
        back = self.verdict(fr.header(fr.MESSAGE, fr.ENC_RAW, (1 << 20) + 1, 0), "ERR_MESSAGE_TOO_LARGE")
        self.assertEqual(back[5], fr.REFUSE, "REFUSE went back")
        self.assertEqual(struct.unpack_from("<H", back, 16)[0], fr.REFUSE_TOO_LARGE)
        self.assertEqual(len(back), 16 + struct.unpack_from("<I", back, 8)[0], "then the end")

    def test_frames_whose_payload_breaks_the_rules(self):
        cases = {
            "a second HELLO": fr.hello_frame(),
            "HELLO with reserved bits": fr.header(fr.HELLO, 0, 8, 0) + struct.pack("<II", 1, 5),
            "GOODBYE with a payload": fr.header(fr.GOODBYE, 0, 1, 0) + b"x",
            "RELEASE of a lease never granted": fr.release_frame([77]),
            "RELEASE count and length disagree": fr.header(fr.RELEASE, 0, 16, 0) + struct.pack("<IIQ", 2, 0, 1),
            "flags on a control frame": fr.header(fr.GOODBYE, 4, 0, 0),
            "encoding 3": message(b"{}", 3),
            "JSON that does not parse": message(b"{nope", fr.ENC_JSON),
            "a record past the end": message(struct.pack("<I", 1000) + b"{}"),
            "a record path to nowhere": message(records(b'{"a":1}', [("@bigint", "zz", 0, b"12")])),
        }
        for name, data in cases.items():
            with self.subTest(name):
                self.verdict(data)

    def test_malformed_nccl_abort_closes_the_link_and_a_sound_one_reaches_its_hook(self):
        cases = {
            "reason 0": nccl_abort(reason=0),
            "reason 4": nccl_abort(reason=4),
            "reserved bits": nccl_abort(reserved=1),
            "text over 1024 bytes": nccl_abort(text=b"x" * 1025),
            "shorter than its head": fr.header(fr.NCCL_ABORT, 0, 20, 0) + bytes(20),
            "flags": nccl_abort(flags=1),
        }
        for name, data in cases.items():
            with self.subTest(name):
                self.verdict(data)
        link, raw = raw_accepted(self.server)
        with link:
            seen = []
            cuda_ipc.link.on_nccl_abort(link, lambda _link, abort: seen.append(abort))
            comm = secrets.token_bytes(16)
            raw.sendall(nccl_abort(reason=3, text="no NCCL here ✓".encode(), communicator=comm)
                        + nccl_abort(reason=2, text=b"bad \xff bytes") + message(b'"next"', fr.ENC_JSON))
            self.assertEqual(link.receive(timeout=5), "next")
            self.assertEqual(seen, [cuda_ipc.link.NcclAbort(comm, 3, "no NCCL here ✓"), cuda_ipc.link.NcclAbort(bytes(16), 2, "bad \ufffd bytes")],
                             "text that is not UTF-8 is read as REFUSE's is")
            raw.close()

    def test_nccl_abort_on_a_unix_link_closes_it(self):
        link, raw = raw_pair()
        with link:
            raw.send(nccl_abort(reason=1))
            with self.assertRaises(IpcError) as cm:
                link.receive(timeout=5)
            self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID")
            raw.close()

    def test_records_that_do_not_travel_on_tcp_fail_their_message_only(self):
        link, raw = raw_accepted(self.server)
        with link:
            cases = {
                "a legacy-buffer": (records(b'{"b":null}', [("legacy-buffer", "b", 0, bytes(128))]), "ERR_NOT_TRANSFERABLE"),
                "a host-buffer": (records(b'{"b":null}', [("host-buffer", "b", 0, bytes(24))]), "ERR_NOT_TRANSFERABLE"),
                "an unknown kind": (records(b'{"b":null}', [("no-such-kind", "b", 0, b"")]), "ERR_NOT_TRANSFERABLE"),
                "host-bytes shorter than announced": (records(b'{"b":null}', [("host-bytes", "b", 0, U64.pack(100) + bytes(50))]),
                                                      "ERR_DESCRIPTOR_INVALID"),
                "host-bytes of length 0": (records(b'{"b":null}', [("host-bytes", "b", 0, U64.pack(0))]), "ERR_DESCRIPTOR_INVALID"),
                "host-bytes without its length": (records(b'{"b":null}', [("host-bytes", "b", 0, b"abc")]), "ERR_DESCRIPTOR_INVALID"),
            }
            for name, (payload, code) in cases.items():
                with self.subTest(name):
                    raw.sendall(message(payload))
                    with self.assertRaises(IpcError) as cm:
                        link.receive(timeout=5)
                    self.assertEqual(cm.exception.code, code, str(cm.exception))
                    raw.sendall(message(b'{"honest":1}', fr.ENC_JSON))
                    self.assertEqual(link.receive(timeout=5), {"honest": 1}, "the link goes on")
            # A leased host-bytes fails too, and its lease goes back at once.
            raw.sendall(message(records(b'{"b":null}', [("host-bytes", "b", 41, U64.pack(3) + b"abc")])))
            with self.assertRaises(IpcError) as cm:
                link.receive(timeout=5)
            self.assertEqual(cm.exception.code, "ERR_DESCRIPTOR_INVALID")
            self.assertEqual(recv_exact(raw, 32), fr.release_frame([41]))
            # A sound one: a new buffer of the receiver's own holding the bytes.
            raw.sendall(message(records(b'{"b":null,"n":2}', [("host-bytes", "b", 0, U64.pack(5) + b"hello")])))
            got = link.receive(timeout=5)
            self.assertEqual((got["b"].read(), got["n"]), (b"hello", 2))
            got["b"].close()
            raw.close()

    def test_host_bytes_on_a_unix_link_fail_their_message(self):
        link, raw = raw_pair()
        with link:
            raw.send(message(records(b'{"b":null}', [("host-bytes", "b", 0, U64.pack(3) + b"abc")])))
            with self.assertRaises(IpcError) as cm:
                link.receive(timeout=5)
            self.assertEqual(cm.exception.code, "ERR_NOT_TRANSFERABLE")
            raw.send(message(b"7", fr.ENC_JSON))
            self.assertEqual(link.receive(timeout=5), 7)
            raw.close()

    def test_frames_that_arrive_in_pieces_are_put_back_together(self):
        rng = random.Random(7)
        link, raw = raw_accepted(self.server)
        with link:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            blob = bytes(rng.randrange(256) for _ in range(200_000))
            data = (message(records(b'{"a":null}', [("@bigint", "a", 0, b"98765432109876543210")]))
                    + message(blob, fr.ENC_RAW) + message(b'"last"', fr.ENC_JSON))
            at = 0
            while at < len(data):
                n = rng.choice((1, 2, 7, 15, 16, 17, 300, 5000))
                raw.sendall(data[at:at + n])
                at += n
                if at < 40:
                    self.assertEqual(link.poll(), 0, "a frame in part is not a message")
            self.assertEqual(link.receive(timeout=5), {"a": 98765432109876543210})
            self.assertEqual(link.receive(timeout=5), blob)
            self.assertEqual(link.receive(timeout=5), "last")
            raw.close()

    def test_a_stream_cut_in_the_middle_of_a_frame(self):
        link, raw = raw_accepted(self.server)
        with link:
            raw.sendall(fr.header(fr.MESSAGE, fr.ENC_RAW, 1000, 0) + bytes(10))
            raw.close()
            with self.assertRaises(IpcError) as cm:
                link.receive(timeout=5)
            self.assertEqual(cm.exception.code, "ERR_PEER_GONE")
            self.assertIn("middle of a frame", str(cm.exception))

    def test_a_seeded_fuzz_of_frames_never_escapes_the_error_codes(self):
        rng = random.Random(26)
        sound = {"a": 123456789012345678901234567890, "b": [1, 2]}
        good = message(records(b'{"a":null,"b":[1,2]}', [("@bigint", "a", 0, b"123456789012345678901234567890")]))
        allowed = {"ERR_FRAME_INVALID", "ERR_MESSAGE_TOO_LARGE", "ERR_PEER_GONE", "ERR_LINK_CLOSED", "ERR_PEER_REFUSED",
                   "ERR_NOT_TRANSFERABLE", "ERR_DESCRIPTOR_INVALID"}
        outcomes = set()
        for i in range(150):
            data = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            link, raw = raw_accepted(self.server)
            with self.subTest(i=i), link:
                # The mutant, a sound frame, then the end of the stream: whatever the mutant says, the
                # link ends with one of the protocol's errors (a raised length waits for bytes that
                # never come: the end of the stream, ERR_PEER_GONE).
                raw.sendall(bytes(data) + good)
                raw.close()
                with self.assertRaises(IpcError) as cm:
                    while True:
                        value = link.receive(timeout=5)
                        outcomes.add("sound" if value == sound else "other value")
                self.assertIn(cm.exception.code, allowed, str(cm.exception))
                outcomes.add(cm.exception.code)
        self.assertTrue({"ERR_FRAME_INVALID", "ERR_PEER_GONE"} <= outcomes, outcomes)


class HostileAuthenticationTests(unittest.TestCase):
    """Peers that cheat in the token exchange itself, against both roles."""

    def setUp(self):
        self.fds = open_fds()

    def tearDown(self):
        gc.collect()
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def connect_to_raw_listener(self, script):
        """Runs cuda_ipc.connect against a raw listener that plays ``script(sock)``; the connect error."""
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        lsock.settimeout(5)
        url = f"tcp://127.0.0.1:{lsock.getsockname()[1]}"
        try:
            dial = InThread(lambda: cuda_ipc.connect(url, token=TOKEN, timeout=5))
            conn, _ = lsock.accept()
            conn.settimeout(5)
            try:
                script(conn)
            finally:
                conn.close()
            with self.assertRaises(IpcError) as cm:
                dial.result()
            return cm.exception
        finally:
            lsock.close()

    def test_a_listener_that_reflects_the_challenge_or_the_proof_is_refused(self):
        def reflect_challenge(conn):
            conn.sendall(recv_exact(conn, 48))
        e = self.connect_to_raw_listener(reflect_challenge)
        self.assertEqual(e.code, "ERR_FRAME_INVALID", str(e))

        def reflect_proof(conn):
            theirs = recv_exact(conn, 48)
            conn.sendall(challenge(ROLE_LISTENER, secrets.token_bytes(32)))
            read_challenge(theirs, ROLE_CONNECTOR, "connector")
            conn.sendall(recv_exact(conn, 32))  # its own proof, sent back
        e = self.connect_to_raw_listener(reflect_proof)
        self.assertEqual(e.code, "ERR_AUTH_FAILED", str(e))

        def hang_up(conn):  # before its challenge: as a listener with no room does, so connect tries again, then says so
            recv_exact(conn, 48)
        e = self.connect_to_raw_listener(hang_up)
        self.assertEqual(e.code, "ERR_LISTENER_BUSY", str(e))

        def frame_before_hello(conn):
            nonce = secrets.token_bytes(32)
            theirs = read_challenge(recv_exact(conn, 48), ROLE_CONNECTOR, "connector")
            conn.sendall(challenge(ROLE_LISTENER, nonce))
            recv_exact(conn, 32)
            conn.sendall(proof(TOKEN.encode(), ROLE_LISTENER, nonce, theirs) + nccl_abort())
        e = self.connect_to_raw_listener(frame_before_hello)
        self.assertEqual(e.code, "ERR_FRAME_INVALID", str(e))
        self.assertIn("before the link handshake", str(e))

    def test_a_listener_of_authentication_version_1_gets_no_proof_and_both_versions_are_named(self):
        got = {}

        def old_listener(conn):
            old = bytearray(challenge(ROLE_LISTENER, secrets.token_bytes(32)))
            old[4] = 1  # version 1: both sides proved at once
            conn.sendall(bytes(old))
            got["bytes"] = read_to_end(conn)
        e = self.connect_to_raw_listener(old_listener)
        self.assertEqual(e.code, "ERR_FRAME_INVALID", str(e))
        self.assertIn("authentication version 1, this build 2", str(e))
        self.assertIn("update the older side", str(e))
        self.assertEqual(len(got["bytes"]), 48, "its challenge and no proof")

    def test_a_connector_that_cheats_is_dropped_by_the_listener(self):
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN) as server:
            port = int(server.url.rsplit(":", 1)[1])

            def play(script):
                def run():
                    s = socket.create_connection(("127.0.0.1", port), timeout=5)
                    try:
                        script(s)
                        return read_to_end(s)
                    finally:
                        s.close()
                peer = InThread(run)
                with self.assertRaises(IpcError) as cm:
                    server.accept(timeout=1)
                self.assertEqual(cm.exception.code, "ERR_TIMEOUT")
                return peer.result()

            # Its challenge claims the listener's role.
            play(lambda s: s.sendall(challenge(ROLE_LISTENER, bytes(32))))
            self.assertEqual(server.last_refusal.code, "ERR_FRAME_INVALID")

            # It proves with the listener's role byte (what a listener's proof sent back would be): refused, and
            # the listener's own proof never comes (it proves only to a peer whose proof checked out).
            def reflect(s):
                nonce = secrets.token_bytes(32)
                s.sendall(challenge(ROLE_CONNECTOR, nonce))
                theirs = read_challenge(recv_exact(s, 48), ROLE_LISTENER, "listener")
                s.sendall(proof(TOKEN.encode(), ROLE_LISTENER, theirs, nonce))
            self.assertEqual(play(reflect), b"", "nothing after the listener's challenge")
            self.assertEqual(server.last_refusal.code, "ERR_AUTH_FAILED")
            self.assertEqual(server.refused, 2)
            self.assertEqual(server.pending, 0)

    def test_a_connector_that_sends_its_challenge_and_no_proof_gets_no_proof(self):
        """The connecting side proves first (PROTOCOL.md 2.3): one connection that waits for the listener
        to prove first gets its challenge and then the end, nothing to test guesses of the token against."""
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN, handshake_timeout=0.5) as server:
            port = int(server.url.rsplit(":", 1)[1])

            def run():
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                try:
                    s.sendall(challenge(ROLE_CONNECTOR, secrets.token_bytes(32)))
                    theirs = recv_exact(s, 48)
                    read_challenge(theirs, ROLE_LISTENER, "listener")
                    return read_to_end(s)
                finally:
                    s.close()
            peer = InThread(run)
            for _ in range(40):  # the listener works in accept(); bounded (20 s), the peer ends at the handshake timeout
                if peer.done:
                    break
                with self.assertRaises(IpcError) as cm:
                    server.accept(timeout=0.5)
                self.assertEqual(cm.exception.code, "ERR_TIMEOUT")
            self.assertEqual(peer.result(), b"", "no proof, nothing at all after the challenge")
            self.assertEqual(server.last_refusal.code, "ERR_TIMEOUT")
            self.assertEqual(server.refused, 1)


if __name__ == "__main__":
    unittest.main()
