"""Device memory over TCP links, the link layer of the NCCL transfers (cuda_ipc/link/nccl/nccl_comms.py,
nccl_buffer_transfer.py; docs/PROTOCOL.md 8.1, 8.2, 8.4), both ends in this process over the fake libnccl and
the fake driver (nccl_fixture.py): values arriving in memory of the receiver's own, the message
delivered once they are there and in its place, the sender's memory kept until then, one
communicator per link and device (made once, its unique id in the first record only), hostile
records failing their message alone (and telling the sender), NCCL missing on either side, the link
closing or the peer dying while transfers wait. The real thing runs in test/gpu/nccl-python-link.test.ts."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import weakref

from cuda_ipc import IpcError, share, share_tensors
from cuda_ipc.link import on_nccl_abort
from cuda_ipc.link.messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler, unregister_transfer_handler
from cuda_ipc.arrays.device_array import DeviceArray, DeviceBuffer
from cuda_ipc.arrays.owned import allocate_device_buffer
from cuda_ipc.nccl import NCCL_LIBRARY_ENV
from cuda_ipc.nccl import library as library_mod
from cuda_ipc.link.messages.nccl_records import CommReference, encode_nccl_buffer
from cuda_ipc.tensors.nccl_wire import encode_nccl_tensor_set, encode_packed_table

from . import fake_cuda
from .nccl_fixture import NcclCase, read_f32
from .test_tcp import TOKEN

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Record:
    """A record of ``kind`` with ``data``, whatever the data says (sent by Crafted: a hostile peer)."""

    def __init__(self, kind: str, data: bytes):
        self.kind = kind
        self.data = data


class Crafted(TransferHandler[Record]):
    kind = "test-crafted-nccl"
    transports = frozenset({"tcp"})

    def can_transfer(self, value: object) -> bool:
        return isinstance(value, Record)

    def encode(self, value: Record, link: object) -> TransferEncoding:  # type: ignore[override]
        return TransferEncoding(data=value.data, kind=value.kind)


def ref(comm_id: bytes, uid: bytes | None, rank: int = 1, nranks: int = 2) -> CommReference:
    return CommReference(comm_id, nranks, rank, False, uid)


UUID = bytes(16)


class NcclBufferTests(NcclCase):
    def test_an_array_arrives_in_memory_of_the_receivers_own_once_its_bytes_are_there(self) -> None:
        values = [i * 0.5 - 3 for i in range(16)]
        src = self.array(values)
        self.a.send({"x": src, "step": 1})
        self.a.send({"after": 2})
        got = self.b.receive(timeout=10)
        self.assertEqual(got["step"], 1)
        x = got["x"]
        self.assertIsInstance(x, DeviceArray)  # no torch here: a typed view over an owned buffer
        self.assertEqual((x.dtype, x.shape, x.buffer.kind), ("float32", (16,), "owned"))
        self.assertNotEqual(x.ptr, src.ptr)
        self.assertEqual(read_f32(x.ptr, 16), values)
        self.assertEqual(self.b.receive(timeout=10), {"after": 2}, "the next message comes after it")
        self.assertEqual(self.b.received_leases, 0, "the lease ended once the bytes were here")
        inits = [line.split(" id=") for line in self.lines("init ")]
        self.assertEqual([i[0].split()[1:3] for i in inits], [["nranks=2", "rank=0"], ["nranks=2", "rank=1"]])
        self.assertEqual(inits[0][1], inits[1][1], "both joined the communicator the first record named")
        (send,) = self.lines("send ")
        (recv,) = self.lines("recv ")
        self.assertIn(f"ptr={src.ptr:x} count=64 type=1 peer=1", send)
        self.assertIn(f"ptr={x.ptr:x} count=64 type=1 peer=0", recv)
        self.wait_for(lambda: self.a.leases.count == 0, "the sender's lease to end", poll=self.a.poll)

    def test_the_sender_keeps_its_memory_until_the_receiver_has_the_bytes(self) -> None:
        src = self.array([1.0, 2.0, 3.0])
        gone = weakref.ref(src)
        self.a.send({"x": src})
        del src
        gc.collect()
        self.assertIsNotNone(gone(), "held by the lease while the receiver may still need it")
        self.assertEqual(self.a.leases.count, 1)
        got = self.b.receive(timeout=10)["x"]
        self.assertEqual(read_f32(got.ptr, 3), [1.0, 2.0, 3.0])
        self.wait_for(lambda: gone() is None, "the sender to let go of the array", poll=lambda: (self.a.poll(), gc.collect()))

    def test_one_communicator_per_link_made_once_and_transfers_in_order(self) -> None:
        mine = allocate_device_buffer(40, self.fake_device())
        mine.write(bytes(range(40)))
        self.a.send({"buf": mine})
        arrays = [self.array([float(k)] * (k + 1)) for k in range(8)]
        for k, arr in enumerate(arrays):
            self.a.send({"k": k, "x": arr})
        buf = self.b.receive(timeout=10)["buf"]
        self.assertIsInstance(buf, DeviceBuffer)
        self.assertEqual((buf.kind, buf.read()), ("owned", bytes(range(40))))
        for k in range(8):
            m = self.b.receive(timeout=10)
            self.assertEqual(m["k"], k)
            self.assertEqual(read_f32(m["x"].ptr, k + 1), [float(k)] * (k + 1))
        self.assertEqual(len(self.lines("getUniqueId")), 1)
        self.assertEqual(len(self.lines("init ")), 2, "one communicator, joined once: later records carry no unique id")
        self.assertEqual((len(self.lines("send ")), len(self.lines("recv "))), (9, 9))
        mine.close()
        buf.close()

    def test_end_right_after_send_lets_the_transfer_arrive_close_would_cut_it_short(self) -> None:
        # Init takes a while here: end() comes before the worker sent anything.
        os.environ["FAKE_NCCL_INIT_POLLS"] = "30"
        values = [float(i) for i in range(8)]
        self.a.send({"x": self.array(values)})
        ended: list[BaseException | None] = []
        ender = threading.Thread(target=lambda: ended.append(_raised(self.a.end)))
        ender.start()
        # The sender's NCCL send, which comes only after the slow init and only if end() did not
        # close the link (closing aborts the communicator), is the event; end() must still wait then.
        self.wait_for(lambda: len(self.lines("send ")) == 1, "the sender's NCCL send", seconds=30)
        self.assertTrue(ender.is_alive(), "end() waits for the receiver to have the bytes")
        self.assertFalse(self.a.closed)
        got = self.b.receive(timeout=10)["x"]
        ender.join(10)
        self.assertEqual(ended, [None])
        self.assertTrue(self.a.closed)
        self.assertEqual(read_f32(got.ptr, 8), values)
        self.assertEqual(len(self.lines("send ")), 1)
        got.buffer.close()

    def test_end_whose_transfer_never_arrives_times_out_and_closes(self) -> None:
        os.environ["FAKE_NCCL_OP_POLLS"] = str(10**9)  # NCCL never takes the send
        self.a.send({"x": self.array([1.0])})
        with self.assertRaises(IpcError) as caught:
            self.a.end(timeout=0.3)
        self.assertEqual(caught.exception.code, "ERR_TIMEOUT")
        self.assertIn("had not arrived", str(caught.exception))
        self.assertTrue(self.a.closed, "closed at once, the transfer cut short")
        with self.assertRaises(IpcError) as bad:
            self.b.end(timeout=-1)
        self.assertEqual(bad.exception.code, "ERR_INVALID_ARG")

    def test_two_device_values_in_the_first_message_name_the_new_communicator_once(self) -> None:
        a, b = self.array([1.0, 2.0]), self.array([3.0, 4.0, 5.0])
        self.a.send({"a": a, "b": b})
        got = self.b.receive(timeout=10)
        self.assertEqual((read_f32(got["a"].ptr, 2), read_f32(got["b"].ptr, 3)), ([1.0, 2.0], [3.0, 4.0, 5.0]))
        self.assertEqual(len(self.lines("init ")), 2)

    def test_the_sender_refuses_what_cannot_cross(self) -> None:
        strided = fake_cuda.FakeArray(self.fake.alloc(64), (4, 2), "<f4", strides=(16, 4))
        empty = fake_cuda.FakeArray(self.fake.alloc(4), (0,), "<f4")
        for value, words in ((strided, "strided"), (empty, "empty")):
            with self.assertRaises(IpcError) as caught:
                self.a.send({"x": value})
            self.assertEqual(caught.exception.code, "ERR_NOT_TRANSFERABLE")
            self.assertIn(words, str(caught.exception))
        self.a._peer_features &= ~8  # a peer whose HELLO does not announce NCCL (an older cuda-ipc)
        with self.assertRaises(IpcError) as caught:
            self.a.send(share(self.array([1.0])))
        self.assertEqual(caught.exception.code, "ERR_NOT_TRANSFERABLE")
        self.assertIn("does not take device memory over NCCL", str(caught.exception))
        self.assertEqual(self.a.leases.count, 0)
        self.a.send({"plain": True})
        self.assertEqual(self.b.receive(timeout=10), {"plain": True})
        self.assertEqual(self.lines("init"), [])

    def test_no_nccl_on_the_sender_fails_that_send_only(self) -> None:
        os.environ[NCCL_LIBRARY_ENV] = "/nonexistent/libnccl.so.2"
        library_mod._forget_discoveries()
        with self.assertRaises(IpcError) as caught:
            self.a.send({"x": self.array([1.0])})
        self.assertEqual(caught.exception.code, "ERR_NCCL_UNAVAILABLE")
        self.assertEqual(self.a.leases.count, 0)
        self.a.send({"still": "open"})
        self.assertEqual(self.b.receive(timeout=10), {"still": "open"})

    def test_no_nccl_on_the_receiver_fails_that_message_and_the_sender_learns_it(self) -> None:
        aborts = []
        on_nccl_abort(self.a, lambda _link, abort: aborts.append(abort))
        self.a.send({"x": self.array([1.0, 2.0])})  # the sender found NCCL
        self.a.send({"next": 1})
        os.environ[NCCL_LIBRARY_ENV] = "/nonexistent/libnccl.so.2"  # the receiver does not
        library_mod._forget_discoveries()
        with self.assertRaises(IpcError) as caught:
            self.b.receive(timeout=10)
        self.assertEqual(caught.exception.code, "ERR_NCCL_UNAVAILABLE")
        self.assertEqual(self.b.receive(timeout=10), {"next": 1}, "the link goes on")
        self.assertEqual(self.b.received_leases, 0)
        self.wait_for(lambda: aborts, "the sender to get NCCL_ABORT", poll=self.a.poll)
        self.assertEqual(aborts[0].reason, 1)
        self.assertIn("no usable NCCL library", aborts[0].text)
        self.wait_for(lambda: self.a.leases.count == 0, "the lease to end", poll=self.a.poll)
        # A later transfer makes a new communicator (and works once the receiver has NCCL).
        os.environ[NCCL_LIBRARY_ENV] = self.saved_nccl
        library_mod._forget_discoveries()
        self.a.send({"x": self.array([5.0])})
        self.assertEqual(read_f32(self.b.receive(timeout=10)["x"].ptr, 1), [5.0])
        self.assertEqual(len(self.lines("getUniqueId")), 2)

    def setUp(self) -> None:
        super().setUp()
        self.saved_nccl = os.environ[NCCL_LIBRARY_ENV]

    def fake_device(self):  # type: ignore[no-untyped-def]
        from cuda_ipc.cuda.device import Device
        return Device.get(0)


class HostileRecordTests(NcclCase):
    def setUp(self) -> None:
        super().setUp()
        register_transfer_handler(Crafted())
        self.addCleanup(unregister_transfer_handler, Crafted.kind)
        self.aborts: list[object] = []
        on_nccl_abort(self.a, lambda _link, abort: self.aborts.append(abort))

    def fails(self, record: tuple[str, bytes], words: str, code: str = "ERR_FRAME_INVALID") -> None:
        self.a.send({"r": Record(*record)})
        self.a.send({"next": True})
        with self.assertRaises(IpcError) as caught:
            self.b.receive(timeout=10)
        self.assertEqual(caught.exception.code, code)
        self.assertIn(words, str(caught.exception))
        self.assertEqual(self.b.receive(timeout=10), {"next": True}, "the message failed alone")
        self.assertEqual(self.b.received_leases, 0)

    def test_malformed_records_fail_their_message(self) -> None:
        uid = os.urandom(128)
        good = encode_nccl_buffer(ref(os.urandom(16), uid), 0, 16, UUID, ("float32", (4,)))
        self.fails(("nccl-buffer", good[:100]), "shorter than its 168-byte head")
        self.fails(("nccl-buffer", encode_nccl_buffer(ref(os.urandom(16), uid, rank=0), 0, 16, UUID)), "rank 0 of 2")
        self.fails(("nccl-buffer", encode_nccl_buffer(ref(os.urandom(16), uid), 0, 12, UUID, ("float32", (4,)))), "not the 12 announced")
        self.fails(("nccl-buffer", encode_nccl_buffer(ref(os.urandom(16), None), 0, 16, UUID)), "does not know, without its unique id")
        table = encode_packed_table(["a", "b"], ["float32", "float32"], [(4,), (4,)], [0, 8])  # b starts inside a
        self.fails(("nccl-tensor-set", encode_nccl_tensor_set(ref(os.urandom(16), uid), 0, table, 2, 24, 1 << 20)), "inside the tensor before it")
        self.assertEqual(self.lines("init"), [], "nothing was joined")

    def test_a_skipped_sequence_aborts_the_communicator_and_tells_the_sender(self) -> None:
        comm_id = os.urandom(16)
        self.fails(("nccl-buffer", encode_nccl_buffer(ref(comm_id, os.urandom(128)), 1, 16, UUID)), "number 1 on its communicator, 0 was next")
        self.wait_for(lambda: self.aborts, "NCCL_ABORT", poll=self.a.poll)
        abort = self.aborts[0]
        self.assertEqual((abort.communicator, abort.reason), (comm_id, 1))  # type: ignore[attr-defined]
        # Forgotten here: a record naming it again (without its unique id) is unknown.
        self.fails(("nccl-buffer", encode_nccl_buffer(ref(comm_id, None), 2, 16, UUID)), "does not know")

    def test_a_record_contradicting_an_earlier_one_fails_both_and_the_link_goes_on(self) -> None:
        os.environ["FAKE_NCCL_MOVE_TIMEOUT_MS"] = "300"  # the first transfer's bytes never come
        comm_id, uid = os.urandom(16), os.urandom(128)
        self.a.send({"first": Record("nccl-buffer", encode_nccl_buffer(ref(comm_id, uid), 0, 16, UUID))})
        self.a.send({"second": Record("nccl-buffer", encode_nccl_buffer(ref(comm_id, uid), 1, 16, UUID))})  # the unique id again
        self.a.send({"next": True})
        for _ in range(2):
            with self.assertRaises(IpcError) as caught:
                self.b.receive(timeout=10)
            self.assertEqual(caught.exception.code, "ERR_FRAME_INVALID")
            self.assertIn("contradicts an earlier one", str(caught.exception))
        self.assertEqual(self.b.receive(timeout=10), {"next": True})
        self.assertEqual(self.b.received_leases, 0)
        self.wait_for(lambda: self.aborts, "NCCL_ABORT", poll=self.a.poll)
        self.assertEqual(len(self.lines("abort")), 1, "the receiver aborted the communicator it had joined")

    def test_the_link_closing_fails_a_message_whose_bytes_wait(self) -> None:
        os.environ["FAKE_NCCL_MOVE_TIMEOUT_MS"] = "300"
        self.a.send({"x": Record("nccl-buffer", encode_nccl_buffer(ref(os.urandom(16), os.urandom(128)), 0, 16, UUID))})
        out: dict[str, BaseException] = {}

        def receive() -> None:
            try:
                self.b.receive(timeout=10)
            except BaseException as e:  # noqa: BLE001 - checked below
                out["error"] = e
        t = threading.Thread(target=receive)
        t.start()
        # The receiver's NCCL receive was posted (it waits in the fake for bytes that never come).
        self.wait_for(lambda: len(self.lines("recv ")) == 1, "the receiver's NCCL receive")
        self.assertTrue(t.is_alive(), "the message waits for its bytes")
        self.a.close()
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertIsInstance(out.get("error"), IpcError)
        self.assertEqual(out["error"].code, "ERR_LINK_CLOSED")  # type: ignore[attr-defined]
        self.assertIn("closed before its NCCL transfers finished", str(out["error"]))

    def test_a_receive_timeout_leaves_the_arriving_message_next(self) -> None:
        os.environ["FAKE_NCCL_MOVE_TIMEOUT_MS"] = "300"
        self.a.send({"x": Record("nccl-buffer", encode_nccl_buffer(ref(os.urandom(16), os.urandom(128)), 0, 16, UUID))})
        with self.assertRaises(IpcError) as caught:
            self.b.receive(timeout=0.05)
        self.assertEqual(caught.exception.code, "ERR_TIMEOUT")
        self.assertEqual(self.b.poll(), 0, "nothing receive() can take at once")
        self.assertEqual(self.b.pending_receives, 1)
        with self.assertRaises(IpcError) as caught:
            self.b.receive(timeout=10)  # its bytes never come: NCCL fails it
        self.assertEqual(caught.exception.code, "ERR_NCCL")


class PeerDeathTests(NcclCase):
    def test_a_receiver_killed_mid_transfer_leaves_nothing_held_by_the_sender(self) -> None:
        """The sender never reads its link: its watchdog notices the peer hung up while the send is in flight."""
        url = self.server.url
        self.a.close()
        self.b.close()
        child = subprocess.Popen([sys.executable, "-c", _CHILD, url, TOKEN], cwd=PYTHON_DIR, stdout=subprocess.PIPE,
                                 env={**os.environ, "PYTHONPATH": PYTHON_DIR})
        try:
            link = self.server.accept(timeout=10)
            self.pairs.append((link, link))
            os.environ["FAKE_NCCL_OP_POLLS"] = "100000000"  # this side's send stays in flight
            src = self.array([float(i) for i in range(64)])
            gone = weakref.ref(src)
            link.send({"x": share_tensors({"w": src})})
            del src
            assert child.stdout is not None
            self.assertEqual(child.stdout.readline().strip(), b"received")
            child.kill()
            child.wait(10)
            self.wait_for(lambda: link.closed, "the sender's link to close", seconds=10)
            self.assertEqual(link._reason.code if link._reason else None, "ERR_PEER_GONE")
            self.wait_for(lambda: (gc.collect(), gone() is None)[1] and link.leases.count == 0, "the memory to be let go", seconds=10)
            self.assertGreaterEqual(len(self.lines("abort")), 1, "the communicator was aborted")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()


_CHILD = """
import os, sys
from tests import fake_cuda
fake_cuda.install()
import cuda_ipc
link = cuda_ipc.connect(sys.argv[1], token=sys.argv[2], timeout=10)
m = link.receive(timeout=10)
assert m["x"].pending
print("received", flush=True)
import time
time.sleep(60)
"""


def _raised(fn: object) -> BaseException | None:
    """What ``fn()`` raised, or None."""
    try:
        fn()  # type: ignore[operator]
    except BaseException as e:  # noqa: BLE001 - handed to the test thread
        return e
    return None
