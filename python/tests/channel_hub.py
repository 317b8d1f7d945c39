"""A minimal channel hub in Python, for tests only: it makes a control block the way Node's
ChannelHub does (src/channel/hub.ts), hands it to Python ends over link pairs (the attach protocol
of src/channel/attach.ts) and repairs ends as Node's hub would when their link closes. Lets the
Python ends be tested without Node; the real hub is Node's (test/cpu/python-channel.test.ts)."""
import contextlib
import gc
import os
import struct
import threading
import unittest
from collections.abc import Iterator
from typing import Any

from cuda_ipc import HostBuffer
from cuda_ipc.native import addon as native_mod
from cuda_ipc import channel as ch
from cuda_ipc import link as link_mod
from cuda_ipc.channel.layout import (
    FLAG_BROADCAST, FLAG_DEVICE, H_CONSUMER_MASK, H_CONSUMERS_ATTACHED, H_CONSUMERS_LIVE, H_FENCES_OFFSET, H_LOCK,
    H_PRODUCERS_ATTACHED, H_PRODUCERS_LIVE, H_TAIL, HEADER_BYTES, MAGIC, P_CURSOR, P_FLAGS, P_GENERATION, P_PID, P_ROLE,
    P_STATE, ROLE_CONSUMER, ROLE_HUB, ROLE_PRODUCER, ST_ALIVE, ST_EMPTY, ST_RECOVERING, VERSION, compute_layout,
)
from cuda_ipc.channel.doorbells import Doorbells
from cuda_ipc.channel import ring_recovery
from cuda_ipc.channel.slot_ring import Ring
from cuda_ipc.channel.shared_words import SharedWords


def link_pair():
    import socket
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    la = link_mod.Link(a, peer_name="hub", _token=link_mod._CREATE)
    lb = link_mod.Link(b, peer_name="peer", _token=link_mod._CREATE)
    la.poll()
    lb.poll()
    return la, lb


class TestHub:
    """``TestHub(slots=..., slot_bytes=...)``; ``attach(role)`` returns the Python end (accepted over a
    fresh link pair in a thread, as a peer process would) and keeps the hub's side of the link."""

    def __init__(self, slots=8, slot_bytes=64, meta_bytes=256, max_participants=8, producers=1, consumers=1,
                 broadcast=False, device_slots=None):
        device = device_slots is not None
        self.layout = compute_layout(slots, slot_bytes, meta_bytes, max_participants, device, broadcast, producers, consumers)
        l = self.layout
        self.control = HostBuffer.allocate(l.total_bytes)
        m = self.control.memory
        struct.pack_into("<IHHIIQIIIIIIQII", m, 0, MAGIC, VERSION, HEADER_BYTES,
                         (FLAG_DEVICE if device else 0) | (FLAG_BROADCAST if broadcast else 0), l.slot_count, l.slot_bytes,
                         l.meta_bytes, l.max_participants, l.participants_offset, l.ring_offset, l.slot_records_offset,
                         l.slot_record_bytes, l.total_bytes, producers, consumers)
        struct.pack_into("<I", m, H_FENCES_OFFSET, l.fences_offset)
        p0 = l.participants_offset
        struct.pack_into("<I", m, p0 + P_ROLE, ROLE_HUB)
        struct.pack_into("<I", m, p0 + P_PID, os.getpid())
        struct.pack_into("<I", m, p0 + P_GENERATION, 1)
        struct.pack_into("<I", m, p0 + P_STATE, ST_ALIVE)
        del m
        self.bells = Doorbells([os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(max_participants)])
        self.slots = device_slots if device else HostBuffer.allocate(slots * slot_bytes)
        self.words = SharedWords(self.control._mapping.mmap, l.total_bytes)
        self.ring = Ring(self.words, l, self.bells, 0)
        self.links = {}  # participant -> (hub side, peer side) of its link
        self._spent = []  # link pairs of attaches that were refused

    def attach(self, as_, **accept_options):
        """Attaches a new end as ``as_`` ('producer' or 'consumer'); ``accept_options`` go to accept_channel."""
        role = as_
        k = self.allocate(role)
        hub_side, peer_side = link_pair()
        result = {}

        def peer():
            try:
                result["end"] = ch.accept_channel(peer_side, **accept_options)
            except BaseException as e:  # noqa: BLE001 - reported below
                result["error"] = e
        t = threading.Thread(target=peer)
        t.start()
        hub_side.send({ch.PROTOCOL: "attach", "version": ch.ATTACH_VERSION, "index": k, "role": role, "control": self.control,
                       "slots": self.slots, "doorbells": self.bells})
        reply = hub_side.receive(timeout=10)
        if reply.get(ch.PROTOCOL) == "ready":
            self.activate(k, role)
            hub_side.send({ch.PROTOCOL: "active", "index": k})
        else:
            self.words.store32(self.ring.part_off(k) + P_STATE, ST_EMPTY)
        t.join(10)
        if "error" in result:
            self._spent.append((hub_side, peer_side))
            raise result["error"]
        self.links[k] = (hub_side, peer_side)
        return result["end"]

    def allocate(self, role, flags=0):
        w, ring = self.words, self.ring
        for k in range(1, self.layout.max_participants):
            po = ring.part_off(k)
            if w.cas32(po + P_STATE, ST_EMPTY, ST_RECOVERING) != ST_EMPTY:
                continue
            w.set_plain32(po + P_ROLE, ROLE_PRODUCER if role == "producer" else ROLE_CONSUMER)
            w.set_plain32(po + P_PID, os.getpid())
            w.store32(po + P_FLAGS, flags)
            w.store64(po + P_CURSOR, 0)
            w.set_plain32(po + P_GENERATION, w.plain32(po + P_GENERATION) + 1)
            return k
        raise RuntimeError("no free participant entry")

    def activate(self, k, role):
        w = self.words
        po = self.ring.part_off(k)
        if role == "consumer":
            if self.layout.broadcast:
                assert self.ring.spin_lock()
                w.store64(po + P_CURSOR, w.load64(H_TAIL))
                w.or32(H_CONSUMER_MASK, 1 << k)
                w.store32(H_LOCK, 0)
            else:
                w.or32(H_CONSUMER_MASK, 1 << k)
            w.add32(H_CONSUMERS_LIVE, 1)
            w.add32(H_CONSUMERS_ATTACHED, 1)
        else:
            w.add32(H_PRODUCERS_LIVE, 1)
            w.add32(H_PRODUCERS_ATTACHED, 1)
        w.store32(po + P_STATE, ST_ALIVE)
        self.ring.wake_everyone()

    def kill(self, k):
        """What Node's hub does when participant k's link closes (its process died). The link itself
        stays open here: the end is still in this process and must not take the hub for dead."""
        assert ring_recovery.leave(self.ring, k, True) in ("done", "not-alive")

    def close(self):
        for hub_side, peer_side in list(self.links.values()) + self._spent:
            hub_side.close()
            peer_side.close()
        self.links.clear()
        self._spent.clear()
        self.words.close()
        self.control.close()
        if isinstance(self.slots, HostBuffer):
            self.slots.close()
        self.bells.close()


@contextlib.contextmanager
def native_setting(value: str) -> Iterator[None]:
    """CUDA_IPC_PY_NATIVE set to ``value`` (the hot path chosen again), put back after."""
    saved = os.environ.get("CUDA_IPC_PY_NATIVE")
    os.environ["CUDA_IPC_PY_NATIVE"] = value
    native_mod._reset_for_tests()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_IPC_PY_NATIVE", None)
        else:
            os.environ["CUDA_IPC_PY_NATIVE"] = saved
        native_mod._reset_for_tests()


class HubCase(unittest.TestCase):
    """A test case whose hubs (self.hub(...)) are closed after each test, which then checks that no fd leaked."""

    def setUp(self) -> None:
        from .test_link import open_fds
        self._open_fds = open_fds
        self.fds = open_fds()
        self.hubs: list[TestHub] = []

    def tearDown(self) -> None:
        for h in self.hubs:
            h.close()
        gc.collect()
        self.assertEqual(self._open_fds() - self.fds, set(), "fds leaked by the test")

    def hub(self, **kw: Any) -> "TestHub":
        h = TestHub(**kw)
        self.hubs.append(h)
        return h
