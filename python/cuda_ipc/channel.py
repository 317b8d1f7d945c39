"""Channels from Python: this process as a producer or consumer of a channel a Node process created
(``ChannelHub.attach(link, { role })`` or ``createChannel(link, ...)`` there; ``accept_channel(link)``
here). The same control block, ordering, wake-up and crash rules as Node's ends
(docs/channel-protocol.md); the API is synchronous::

    consumer = accept_channel(parent_link(), role="consumer")
    for msg in consumer:                 # blocks; ends when every producer ended
        with msg:                        # release() on exit: the slot goes back to the producers
            data = msg.memory            # host slots: a memoryview of the message's bytes (no copy)

    producer = accept_channel(link, role="producer")
    slot = producer.acquire()            # blocks while every slot is in flight (backpressure)
    slot.memory[:5] = b"hello"
    producer.publish(slot, length=5, meta={"id": 1})
    producer.end()                       # waits until the consumers released everything

Device slots: ``msg.buffer`` / ``slot.buffer`` is the slot's device memory (``__cuda_array_interface__``
and DLPack, ``view(dtype, shape)``), mapped once per channel. GPU work is ordered through the
channel's fences on the caller's stream (a PyTorch/CuPy/cuda.core stream, or an int CUstream; None
is the legacy default stream): ``msg.wait_on(stream)`` before reading a message on the GPU,
``msg.release(stream=stream)`` after; ``producer.acquire(stream=stream)`` orders your writes after
the consumers' work on the slot's previous message, and ``publish(slot, stream=stream)`` makes the
consumers' work wait for yours. Without a stream, acquire and ``msg.synchronize()`` wait on the CPU.

Waiting: an end spins briefly, then sleeps on its doorbell (an eventfd) and on its link to the hub,
so that it notices the hub's death: then it repairs the control block in the hub's place (the hub's
own ends leave as dead; a consumer then ends with ERR_PEER_GONE after the messages already
published, a producer's acquire raises ERR_PEER_GONE). An end is used by one thread at a time;
``close()`` may come from another thread and wakes a blocked call.
"""
from __future__ import annotations

import json
import os
import select
import struct
import threading
import time
import warnings
from typing import Any, Iterator

from .channel_fences import Fences
from .channel_layout import (
    FLAG_REDELIVERED, H_CONSUMERS_ATTACHED, H_CONSUMERS_DIED, H_CONSUMERS_LIVE, H_DATA_SEQ, H_DATA_SLEEPERS,
    H_PRODUCERS_ATTACHED, H_PRODUCERS_DIED, H_PRODUCERS_LIVE, H_SPACE_SEQ, H_SPACE_SLEEPERS, H_TAIL, KIND_PUBLISHED,
    KIND_TAKEN, META_BYTES, META_JSON, META_NONE, P_CURSOR, P_FLAGS, P_GENERATION, P_STATE, PFLAG_HUB_LOCAL,
    ROLE_CONSUMER, ROLE_PRODUCER, S_LENGTH, S_META, S_META_KIND, S_META_LENGTH, S_POSITION, S_PUBLISHER,
    S_RELEASE_TICKET, S_RELEASED_BY, S_STATE, S_TICKET, ST_ALIVE, ST_EMPTY, ST_RECOVERING, Layout, read_header,
)
from .channel_ring import Doorbells, Ring, corrupt
from .codec import TransferEncoding, TransferHandler, register_transfer_handler
from .descriptor import DTYPES, dtype_name
from .errors import IpcError
from .host import HostBuffer
from .memory import DeviceBuffer
from .shared_words import SharedWords

PROTOCOL = "@cuda-ipc/channel"
ATTACH_VERSION = 3
DOORBELLS_KIND = "channel-doorbells"

DEFAULT_ADAPTIVE_SPIN_US = 10
DEFAULT_SPIN_US = 50
MAX_SPIN_US = 100_000
#: A sleep re-checks after this long even without a ring (a wake-up lost with a dying waker).
WAIT_BACKSTOP = 1.0
RETRY = 0.002
RECOVERY_GIVE_UP = 5.0
FENCE_REPAIR_GIVE_UP = 60.0
_PROBE_EVERY = 16
_MIN_HIT_RATE = 0.3
_HIT_RATE_AFTER_HIT = 0.55


def _closed_error(what: str) -> IpcError:
    return IpcError("ERR_CHANNEL_CLOSED", f"{what}: the channel is closed")


def _next_ticket(t: int) -> int:
    """Per-slot publish tickets: the previous one + 1, wrapping, never 0 (0: never published)."""
    return ((t + 1) & 0xFFFFFFFF) or 1


# ------------------------------------------------------------------------------------------------
# Doorbells over links


class _DoorbellsTransfer(TransferHandler):
    """'channel-doorbells': data is u32 count; the record carries that many eventfds, entry 0 first."""

    kind = DOORBELLS_KIND

    def can_transfer(self, value) -> bool:
        return isinstance(value, Doorbells)

    def encode(self, value: Doorbells, link) -> TransferEncoding:
        if value.closed:
            raise IpcError("ERR_CLOSED", "link.send: the channel's doorbells are closed")
        return TransferEncoding(data=struct.pack("<I", len(value.fds)), fds=list(value.fds))

    def decode(self, data, fds, link, lease):
        if len(data) != 4 or struct.unpack("<I", data)[0] != len(fds) or not fds:
            raise IpcError("ERR_DESCRIPTOR_INVALID", f"received malformed channel doorbells ({len(data)} bytes, {len(fds)} fds)")
        for fd in fds:
            try:
                ok = os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
            except OSError:
                ok = False
            if not ok:
                raise IpcError("ERR_DESCRIPTOR_INVALID", "received channel doorbells that are not eventfds")
        bells = Doorbells(fds)
        for i in range(len(fds)):
            fds[i] = -1  # owned by bells now
        if lease is not None:
            lease.end()  # nothing on the sender's side depends on our copies
        return bells


register_transfer_handler(_DoorbellsTransfer())


# ------------------------------------------------------------------------------------------------
# What one end maps


class _Block:
    """The control block (and its atomics), the slots, the doorbells and, for device slots, the
    fences; owned by one end, closed with it."""

    def __init__(self, layout: Layout, control: HostBuffer, slots, bells: Doorbells, device=None):
        self.layout = layout
        self.control = control
        self.slots = slots
        self.bells = bells
        self.words = SharedWords(control._mapping.mmap, layout.total_bytes)
        self.fences = None
        try:
            if layout.device:
                self.fences = Fences(device, self.words)
        except BaseException:
            self.words.close()
            raise
        self.device = device
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.fences is not None:
                self.fences.close()  # before the mapping it registered goes away
        except Exception as e:  # noqa: BLE001 - the rest must still be released
            warnings.warn(f"cuda_ipc channel: unregistering the control block from the GPU failed: {e}", RuntimeWarning, stacklevel=2)
        for c in (self.slots,):
            try:
                if isinstance(c, DeviceBuffer):
                    c.close(sync=self.fences is None or not self.fences.queued)
                else:
                    c.close()
            except Exception:  # noqa: BLE001
                pass
        self.words.close()
        self.control.close()
        self.bells.close()


class _Policy:
    __slots__ = ("mode", "spin")

    def __init__(self, wait: str, spin_us):
        if wait not in ("adaptive", "sleep", "spin"):
            raise IpcError("ERR_INVALID_ARG", f"wait must be 'adaptive', 'sleep' or 'spin'; got {wait!r}")
        if spin_us is None:
            spin_us = DEFAULT_SPIN_US if wait == "spin" else DEFAULT_ADAPTIVE_SPIN_US
        if not isinstance(spin_us, (int, float)) or not 0 <= spin_us <= MAX_SPIN_US:
            raise IpcError("ERR_INVALID_ARG", f"spin_us must be in 0..{MAX_SPIN_US}; got {spin_us!r}")
        self.mode = wait
        self.spin = spin_us / 1e6


def _process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts). Unknown (0) counts as gone."""
    if not pid:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state in (b"Z", b"X")


class _End:
    """What a producer and a consumer both hold: their participant entry, the memory, how they wait,
    the link to the hub (whose closing means the hub is gone), leaving, and repairs."""

    def __init__(self, block: _Block, index: int, role: str, link, policy: _Policy):
        self.block = block
        self.layout = block.layout
        self.index = index
        self.role = role
        self.ring = Ring(block.words, block.layout, block.bells, index)
        self.w = block.words
        self.policy = policy
        self.closed = False
        self.hub_lost = False
        self.lock = threading.RLock()
        self.seq_off = H_DATA_SEQ if role == "consumer" else H_SPACE_SEQ
        self.sleepers_off = H_DATA_SLEEPERS if role == "consumer" else H_SPACE_SLEEPERS
        self._bell = block.bells.fds[index]
        self._link = link
        self._link_fd = -1
        # Sleeps poll the doorbell and the link (select.poll objects, made once).
        self._poll_bell = select.poll()
        self._poll_bell.register(self._bell, select.POLLIN)
        self._poller = self._poll_bell
        self._link_quiet_until = 0.0
        self._hits = 1.0
        self._waits = 0
        #: Participants whose leave waits for the publish lock: k -> (since, died).
        self._pending: dict[int, tuple[float, bool]] = {}
        #: Dead participants whose fences are raised once their process is gone: (k, pid, generation, since).
        self._fence_repairs: list = []
        #: Counts of how waits ended (tests, benchmarks).
        self.stats = {"spin_hits": 0, "sleeps": 0, "rung": 0, "rescued": 0}
        self._watch_stop = threading.Event()
        if link is not None and block.fences is not None:
            # GPU work queued here may wait for fences only we can raise once the hub died, while
            # this thread is blocked in that very work (a torch sync): a watcher thread raises them.
            threading.Thread(target=self._watch_hub, name="cuda_ipc-channel-fence-watch", daemon=True).start()
        if link is not None:
            # Our own copy of the socket's fd: the link may close its own at any time.
            self._link_fd = os.dup(link.fileno())
            self._poller = select.poll()
            self._poller.register(self._bell, select.POLLIN)
            self._poller.register(self._link_fd, select.POLLIN)
            link.on_close(self._on_link_closed)

    # -- state --

    def alive(self) -> bool:
        return self.ring.participant_state(self.index) == ST_ALIVE

    def detached_error(self, what: str) -> IpcError:
        return IpcError("ERR_CHANNEL_CLOSED", f"{what}: this end was removed from the channel (its link to the hub closed, so its messages were handed to others); attach again over a new link")

    def assert_open(self, what: str) -> None:
        if self.closed:
            raise _closed_error(what)

    def counter(self, off: int) -> int:
        return self.w.load32(off)

    def stats_now(self) -> dict:
        c = self.counter
        return {
            "slots": self.ring.slot_counts(),
            "producers": {"attached": c(H_PRODUCERS_ATTACHED), "live": c(H_PRODUCERS_LIVE), "died": c(H_PRODUCERS_DIED)},
            "consumers": {"attached": c(H_CONSUMERS_ATTACHED), "live": c(H_CONSUMERS_LIVE), "died": c(H_CONSUMERS_DIED)},
            "published": self.w.load64(H_TAIL),
        }

    # -- housekeeping: the hub's death, repairs that wait for the lock, fences of dead processes --

    def _on_link_closed(self, _link, _reason) -> None:
        self.hub_lost = True

    def service(self) -> None:
        """Runs what is due: the hub's repair once its link closed, retries of repairs that found the
        publish lock busy, and fence raises for dead processes. Cheap when nothing is due."""
        if self.closed:
            return
        if self.hub_lost and self._link is not None:
            self._link = None
            self._unwatch_link()
            self._recover_hub()
        if self._pending:
            for k, (since, died) in list(self._pending.items()):
                if time.monotonic() - since > RECOVERY_GIVE_UP:
                    del self._pending[k]
                    warnings.warn(f"cuda_ipc channel: gave up repairing participant {k}: the publish lock stayed held for {RECOVERY_GIVE_UP} s", RuntimeWarning, stacklevel=2)
                    continue
                self._recover(k, died)
        if self._fence_repairs:
            self._repair_fences()

    def _unwatch_link(self) -> None:
        if self._link_fd >= 0:
            self._poller = self._poll_bell
            os.close(self._link_fd)
            self._link_fd = -1

    def _recover(self, k: int, died: bool) -> None:
        try:
            r = self.ring.leave(k, died, k in self._pending)
        except IpcError as e:
            self._pending.pop(k, None)
            warnings.warn(f"cuda_ipc channel: could not recover participant {k}: {e}", RuntimeWarning, stacklevel=2)
            return
        if r == "busy":
            self._pending.setdefault(k, (time.monotonic(), died))
        else:
            self._pending.pop(k, None)

    def _recover_hub(self) -> None:
        """The hub went away: take its place for its own entry and its in-process ends. GPU writes
        they queued die with their process: their fences are raised once it is gone."""
        ring = self.ring
        for k in range(self.layout.max_participants):
            if k == self.index:
                continue
            po = ring.part_off(k)
            if k != 0 and not self.w.load32(po + P_FLAGS) & PFLAG_HUB_LOCAL:
                continue
            st = ring.participant_state(k)
            if st == ST_EMPTY:
                continue
            if self.block.fences is not None:
                # [k, pid, generation, since, next check, pause]: polled 1 ms doubling to 100 ms, as Node does.
                t = time.monotonic()
                self._fence_repairs.append([k, ring.participant_pid(k), self.w.plain32(po + P_GENERATION), t, t, 0.001])
            if st == ST_ALIVE:
                self._recover(k, True)

    def _repair_fences(self) -> None:
        now = time.monotonic()
        keep = []
        for r in self._fence_repairs:
            k, pid, generation, since, due, pause = r
            if now < due:
                keep.append(r)
                continue
            if self.w.plain32(self.ring.part_off(k) + P_GENERATION) != generation:
                continue  # the entry was handed out again
            if _process_gone(pid):
                self._raise_fences_of(k)
            elif now - since < FENCE_REPAIR_GIVE_UP:
                r[4], r[5] = now + pause, min(pause * 2, 0.1)
                keep.append(r)
        self._fence_repairs = keep

    def _watch_hub(self) -> None:
        """Once the hub's process is gone, raises the fences of the hub and its in-process ends."""
        pid = self.ring.participant_pid(0)
        while not self._watch_stop.wait(0.1):
            if not _process_gone(pid):
                continue
            with self.lock:
                if self.closed:
                    return
                for k in range(self.layout.max_participants):
                    po = self.ring.part_off(k)
                    if k == self.index or self.ring.participant_state(k) == ST_EMPTY:
                        continue
                    if k == 0 or self.w.load32(po + P_FLAGS) & PFLAG_HUB_LOCAL:
                        self._raise_fences_of(k)
            return

    def _raise_fences_of(self, k: int) -> None:
        ring, w, f, l = self.ring, self.w, self.block.fences, self.layout
        for s in range(l.slot_count):
            so = ring.slot_off(s)
            before = w.load32(so + S_STATE)
            ticket = w.plain32(so + S_TICKET)
            if ticket == 0:
                continue
            f.raise_(l.release_fence(s, k), ticket)
            kind = before & 0xFF
            if kind in (KIND_PUBLISHED, KIND_TAKEN) and w.plain32(so + S_PUBLISHER) == k and \
                    w.load32(so + S_STATE) == before and w.plain32(so + S_TICKET) == ticket:
                f.raise_(l.publish_fence(s), ticket)

    def leave_self(self) -> None:
        """Leaves cleanly; the lock is held for microseconds at a time, so this retries for a while."""
        deadline = time.monotonic() + RECOVERY_GIVE_UP
        resuming = False
        while True:
            r = self.ring.leave(self.index, False, resuming)
            if r != "busy":
                return
            resuming = True
            if time.monotonic() > deadline:
                raise IpcError("ERR_TIMEOUT", f"leaving the channel: the publish lock stayed held for {RECOVERY_GIVE_UP} s (a process died inside it and was not repaired)")
            time.sleep(RETRY)

    # -- waiting --

    def park(self, ready, deadline: float | None) -> None:
        """Returns once ``ready()`` may have become true (spin, then sleep on the doorbell and the hub
        link), or the deadline passed, or close() was called. Called with self.lock held; releases
        it while sleeping."""
        w = self.w
        seq_off = self.seq_off
        seq = w.load32(seq_off)
        if ready():
            return
        budget = self._budget()
        t0 = time.perf_counter() if self.policy.mode == "adaptive" else 0.0
        if budget > 0:
            end = t0 + budget if t0 else time.perf_counter() + budget
            while time.perf_counter() < end:
                if w.load32(seq_off) != seq:
                    self.stats["spin_hits"] += 1
                    self._learn(True)
                    return
        self.ring.enter_sleep(self.sleepers_off)
        try:
            if ready() or self.closed:
                return
            self.stats["sleeps"] += 1
            timeout = WAIT_BACKSTOP
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - time.monotonic()))
            if self._pending:
                timeout = min(timeout, RETRY)  # a repair waits for the publish lock
            if self._fence_repairs:
                timeout = min(timeout, max(0.0, min(r[4] for r in self._fence_repairs) - time.monotonic()))
            poller = self._poller
            if self._link_fd >= 0 and time.monotonic() < self._link_quiet_until:
                poller = self._poll_bell  # another thread reads the link: look at it again soon
                timeout = min(timeout, 0.01)
            self.lock.release()
            try:
                events = poller.poll(timeout * 1000)
            finally:
                self.lock.acquire()
            if self.closed:
                return
            rung = False
            for fd, _ev in events:
                if fd == self._bell:
                    rung = True
                    try:
                        os.eventfd_read(self._bell)
                    except (BlockingIOError, OSError):
                        pass
                elif fd == self._link_fd:
                    self._poll_link()
            if rung:
                self.stats["rung"] += 1
            elif not events and ready():
                self.stats["rescued"] += 1
        finally:
            if not self.closed:
                self.ring.leave_sleep(self.sleepers_off)
                if t0:
                    self._learn(time.perf_counter() - t0 <= self.policy.spin)
        self.service()

    def _poll_link(self) -> None:
        link = self._link
        if link is None:
            return
        try:
            link.poll()
        except Exception:  # noqa: BLE001 - the link reports its own failures to its user
            pass
        if not link.closed:
            # Readable, yet nothing was read: another thread is in link.receive() and reads it.
            self._link_quiet_until = time.monotonic() + 0.01

    def _budget(self) -> float:
        p = self.policy
        if p.mode == "spin":
            return p.spin
        if p.mode == "sleep" or p.spin == 0:
            return 0.0
        if self._hits >= _MIN_HIT_RATE:
            return p.spin
        self._waits += 1
        return p.spin if self._waits % _PROBE_EVERY == 0 else 0.0

    def _learn(self, hit: bool) -> None:
        if hit:
            self._hits = max(self._hits + (1 - self._hits) / 8, _HIT_RATE_AFTER_HIT)
        else:
            self._hits -= self._hits / 8

    def wake(self) -> None:
        """Ends a sleep of this end now (close() from another thread)."""
        try:
            os.eventfd_write(self._bell, 1)
        except OSError:
            pass

    def close(self, before_release=None) -> None:
        """Leaves the control block and releases the memory. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._watch_stop.set()
        self.wake()
        with self.lock:
            try:
                if before_release is not None:
                    before_release()
                if self.alive():
                    self.leave_self()
            except Exception as e:  # noqa: BLE001 - the memory must still be released
                warnings.warn(f"cuda_ipc channel: leaving the control block failed: {e}", RuntimeWarning, stacklevel=2)
            finally:
                self._unwatch_link()
                self._link = None
                self.block.close()


# ------------------------------------------------------------------------------------------------
# Accepting a channel


def _dispose(values) -> None:
    for v in values:
        close = getattr(v, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001
                pass


def accept_channel(link, role: str | None = None, memory: str | None = None, *, timeout: float | None = 60.0,
                   wait: str = "adaptive", spin_us: float | None = None):
    """The peer's side of a Node ``hub.attach(link, { role })`` / ``createChannel(link, ...)``: receives
    the channel over ``link`` (the next message on it must be the channel), checks it, and returns
    this process's end: a ``ChannelProducer`` or ``ChannelConsumer`` in the role the hub gave it
    (refused unless it is ``role``, when given; ``memory`` 'host' or 'device' likewise).

    ``wait``: 'adaptive' (default: spin up to ``spin_us``, default 10, while recent waits ended that
    fast, then sleep), 'sleep' (never spin) or 'spin' (always spin ``spin_us``, default 50, first).
    Keep the link open while using the channel: its closing is how each side learns the other died.
    """
    policy = _Policy(wait, spin_us)
    if role not in (None, "producer", "consumer"):
        raise IpcError("ERR_INVALID_ARG", f"accept_channel: role must be 'producer' or 'consumer'; got {role!r}")
    if memory not in (None, "host", "device"):
        raise IpcError("ERR_INVALID_ARG", f"accept_channel: memory must be 'host' or 'device'; got {memory!r}")
    msg = link.receive(timeout=timeout)
    if not isinstance(msg, dict) or msg.get(PROTOCOL) != "attach":
        _dispose(_values_of(msg))
        raise IpcError("ERR_FRAME_INVALID", "accept_channel: the first message on the link was not a channel (the other side must call attach or createChannel)")
    owned = [msg.get("control"), msg.get("slots"), msg.get("doorbells")]

    def refuse(error: IpcError):
        try:
            link.send({PROTOCOL: "refused", "message": str(error)})
        except IpcError:
            pass
        _dispose(owned)
        raise error

    def bad(what: str) -> IpcError:
        return IpcError("ERR_DESCRIPTOR_INVALID", f"accept_channel: {what}")

    if msg.get("version") != ATTACH_VERSION:
        refuse(IpcError("ERR_DESCRIPTOR_VERSION", f"accept_channel: channel protocol version {msg.get('version')!r}; this side speaks {ATTACH_VERSION}: use the same cuda-ipc version on both sides"))
    control = msg.get("control")
    if not isinstance(control, HostBuffer) or control.offset != 0:
        refuse(bad("the control block is not shared memory (a whole memfd)"))
    try:
        layout = read_header(control.memory, control.nbytes)
    except IpcError as e:
        refuse(e)
    their_role = msg.get("role")
    k = msg.get("index")
    if their_role not in ("producer", "consumer") or type(k) is not int or not 1 <= k < layout.max_participants:
        refuse(bad(f"bad role or index ({their_role!r}, {k!r})"))
    if role is not None and role != their_role:
        refuse(IpcError("ERR_INVALID_ARG", f"accept_channel: the hub attached this process as a {their_role}, not a {role} as asked"))
    kind = "device" if layout.device else "host"
    if memory is not None and memory != kind:
        refuse(IpcError("ERR_INVALID_ARG", f"accept_channel: the channel's slots are {kind} memory, not {memory} as asked"))
    slots = msg.get("slots")
    if not isinstance(slots, DeviceBuffer if layout.device else HostBuffer):
        refuse(bad(f"{kind} slots expected"))
    total = layout.slot_count * layout.slot_bytes
    if slots.nbytes < total:
        refuse(bad(f"the slots hold {slots.nbytes} bytes, fewer than {layout.slot_count} x {layout.slot_bytes}"))
    bells = msg.get("doorbells")
    if not isinstance(bells, Doorbells) or len(bells.fds) != layout.max_participants:
        refuse(bad(f"expected {layout.max_participants} doorbells"))
    po = layout.participants_offset + k * 64
    state, prole = struct.unpack_from("<II", control.memory, po)
    if state != ST_RECOVERING or prole != (ROLE_PRODUCER if their_role == "producer" else ROLE_CONSUMER):
        refuse(bad("the participant entry the hub named is not waiting for this peer"))
    device = None
    if layout.device:
        try:
            slots.ptr  # map the slots now: a failure is a refusal, not a surprise later
            device = slots.device
        except (IpcError, Exception) as e:  # noqa: BLE001 - CudaError included
            refuse(IpcError(getattr(e, "code", "ERR_DESCRIPTOR_INVALID") if isinstance(e, IpcError) else "ERR_DESCRIPTOR_INVALID",
                            f"accept_channel: the device slots could not be mapped: {e}"))
    try:
        block = _Block(layout, control, slots, bells, device)
    except Exception as e:  # noqa: BLE001
        refuse(IpcError(getattr(e, "code", "ERR_UNSUPPORTED") if isinstance(e, IpcError) else "ERR_UNSUPPORTED",
                        f"accept_channel: could not map the channel: {e}"))
    try:
        link.send({PROTOCOL: "ready", "index": k})
        active = link.receive(timeout=timeout)
        if not isinstance(active, dict) or active.get(PROTOCOL) != "active":
            _dispose(_values_of(active))
            raise IpcError("ERR_FRAME_INVALID", "accept_channel: the hub did not confirm the attach")
        cls = ChannelProducer if their_role == "producer" else ChannelConsumer
        return cls(_End(block, k, their_role, link, policy))
    except BaseException:
        block.close()  # the hub repairs the entry once the link closes
        raise


def _values_of(msg) -> list:
    if isinstance(msg, dict):
        return list(msg.values())
    return [msg] if msg is not None else []


# ------------------------------------------------------------------------------------------------
# Slot memory


class _SlotMemory:
    """Per-slot views of the slots, made once."""

    def __init__(self, block: _Block):
        self.block = block
        self.bytes = block.layout.slot_bytes
        self.host = not block.layout.device
        self._base = block.slots.memory if self.host else None
        self._buffers: list = [None] * block.layout.slot_count

    def memory(self, s: int, length: int) -> memoryview:
        if not self.host:
            raise IpcError("ERR_UNSUPPORTED", "this channel's slots are device memory: use .buffer (with wait_on/release(stream)), or .view(dtype, shape)")
        start = s * self.bytes
        return self._base[start:start + length]

    def buffer(self, s: int):
        b = self._buffers[s]
        if b is None or b.closed:
            b = self.block.slots.view(s * self.bytes, self.bytes) if self.host else self.block.slots.slice(s * self.bytes, self.bytes)
            self._buffers[s] = b
        return b

    def close(self) -> None:
        for b in self._buffers:
            if b is not None:
                try:
                    b.close(sync=False) if isinstance(b, DeviceBuffer) else b.close()
                except Exception:  # noqa: BLE001
                    pass
        self._buffers = []
        if self._base is not None:
            try:
                self._base.release()
            except BufferError:
                pass  # a view the user kept: the mapping stays until it goes
            self._base = None


class _Shape:
    """What both ends tell about their channel."""

    _end: _End

    @property
    def topology(self) -> str:
        return "broadcast" if self._end.layout.broadcast else "queue"

    @property
    def memory(self) -> str:
        return "device" if self._end.layout.device else "host"

    @property
    def slot_count(self) -> int:
        return self._end.layout.slot_count

    @property
    def slot_bytes(self) -> int:
        return self._end.layout.slot_bytes

    @property
    def meta_bytes(self) -> int:
        return self._end.layout.meta_bytes

    @property
    def index(self) -> int:
        """This end's participant index in the control block (the hub is 0)."""
        return self._end.index

    @property
    def device(self):
        """The cuda_ipc Device the slots are used on (device slots), else None."""
        return self._end.block.device

    @property
    def closed(self) -> bool:
        return self._end.closed

    @property
    def wait_stats(self) -> dict:
        """How this end's waits ended: spin_hits, sleeps, rung, rescued (a lost wake-up: should stay 0)."""
        return dict(self._end.stats)

    def stats(self) -> dict:
        """Slot states and membership, read from the control block now."""
        e = self._end
        e.assert_open("stats")
        return e.stats_now()

    def __enter__(self):
        return self

    def __del__(self) -> None:
        e = getattr(self, "_end", None)
        if e is not None and not e.closed:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing to report to at collection time
                pass


# ------------------------------------------------------------------------------------------------
# Consumers


class ChannelConsumer(_Shape):
    """This process's consumer end (from accept_channel). ``receive(timeout)`` or iterate; release each
    message once done with its slot (``msg.release()`` or ``with msg:``)."""

    role = "consumer"

    def __init__(self, end: _End):
        self._end = end
        self._slots = _SlotMemory(end.block)
        self._held: dict[int, Message] = {}
        self._ended = False
        self._end_error: IpcError | None = None
        self._cursor = end.w.load64(end.ring.part_off(end.index) + P_CURSOR) if end.layout.broadcast else 0

    @property
    def ended(self) -> bool:
        """True once every producer left and every message was taken (receive() returns None)."""
        return self._ended

    def _producers_gone(self) -> bool:
        e = self._end
        return e.counter(H_PRODUCERS_LIVE) == 0 and e.counter(H_PRODUCERS_ATTACHED) >= e.layout.expect_producers

    def _can_receive(self) -> bool:
        e = self._end
        return e.closed or e.hub_lost or not e.ring.is_empty(self._cursor) or self._producers_gone() or not e.alive()

    def receive(self, timeout: float | None = None) -> "Message | None":
        """The next message; None once the channel ended cleanly (every producer ended and all their
        messages were taken) or this end was closed. Raises ERR_PEER_GONE, after the messages already
        published, when a producer died; ERR_TIMEOUT after ``timeout`` seconds."""
        e = self._end
        e.assert_open("receive")
        deadline = None if timeout is None else time.monotonic() + timeout
        with e.lock:
            while True:
                m = self._poll()
                if m is not None or self._ended or e.closed:
                    return m
                if deadline is not None and time.monotonic() >= deadline:
                    # A wake-up meant for this end must not be lost with its timeout: pass it on.
                    if not e.closed and not e.ring.is_empty(self._cursor):
                        e.ring.signal_data()
                    raise IpcError("ERR_TIMEOUT", "channel receive: no message within the timeout")
                e.park(self._can_receive, deadline)

    def poll(self) -> "Message | None":
        """A message now, or None when there is none (or the channel ended: see ``ended``)."""
        e = self._end
        e.assert_open("poll")
        with e.lock:
            return self._poll()

    def __iter__(self) -> Iterator["Message"]:
        while True:
            m = self.receive()
            if m is None:
                return
            yield m

    def _poll(self):
        if self._end_error is not None:
            raise self._end_error
        e = self._end
        if self._ended or e.closed:
            return None
        e.service()
        m = self._take_one()
        if m is not None:
            return m
        if not self._producers_gone():
            return None
        m = self._take_one()  # every producer left: drain what they published, then end
        if m is not None:
            return m
        self._ended = True
        died = e.counter(H_PRODUCERS_DIED)
        if died > 0:
            self._end_error = IpcError("ERR_PEER_GONE", f"the channel's producer{'s' if died > 1 else ''} died ({died}); every message published before was delivered")
            raise self._end_error
        return None

    def _take_one(self):
        e = self._end
        ring = e.ring
        if not e.layout.broadcast:
            s = ring.take()
            if s < 0:
                if not e.alive():
                    raise e.detached_error("receive")
                return None
            if not e.alive():
                # Detached while taking (a recovery already ran for us): hand it back, then stop.
                if not ring.return_taken(s):
                    warnings.warn(f"cuda_ipc channel: a message taken after this end was detached could not be handed back (slot {s})", RuntimeWarning, stacklevel=3)
                raise e.detached_error("receive")
            return self._message(s)
        while True:
            s = ring.peek_at(self._cursor)
            if s == -1:
                if not e.alive():
                    raise e.detached_error("receive")
                return None
            self._cursor += 1
            if s == -2:
                continue  # not ours (published before we attached, or we were removed)
            return self._message(s)

    def _message(self, s: int) -> "Message":
        e = self._end
        w = e.w
        so = e.ring.slot_off(s)
        length = w.plain32(so + S_LENGTH) | w.plain32(so + S_LENGTH + 4) << 32
        meta_length = w.plain32(so + S_META_LENGTH)
        meta_kind = w.plain32(so + S_META_KIND)
        l = e.layout
        if length > l.slot_bytes or meta_length > l.meta_bytes or meta_kind > META_BYTES:
            self._abandon(s)
            raise corrupt(f"message in slot {s}: length {length}, meta {meta_length} bytes of kind {meta_kind}")
        meta = None
        if meta_kind != META_NONE:
            raw = bytes(e.block.control._mapping.base[so + S_META:so + S_META + meta_length])
            if meta_kind == META_BYTES:
                meta = raw
            else:
                try:
                    meta = json.loads(raw)
                except ValueError:
                    self._abandon(s)
                    raise corrupt(f"message in slot {s}: its meta is not JSON") from None
        word = e.ring.taken_words[s] if not l.broadcast else 0
        m = Message(self, s, w.load64(so + S_POSITION), length, meta, w.plain32(so + S_PUBLISHER),
                    bool(word & FLAG_REDELIVERED), w.plain32(so + S_TICKET))
        self._held[s] = m
        return m

    def _abandon(self, s: int) -> None:
        if self._end.layout.broadcast:
            self._end.ring.release_held(s)
        else:
            self._end.ring.release_taken(s)

    def _release(self, m: "Message", stream, streamed: bool) -> None:
        e = self._end
        with e.lock:
            if self._held.get(m.index) is not m:
                return
            del self._held[m.index]
            if e.closed:
                return
            ring = e.ring
            f = e.block.fences
            if f is not None:
                l = e.layout
                if not l.broadcast:
                    so = ring.slot_off(m.index)
                    e.w.set_plain32(so + S_RELEASED_BY, e.index)
                    e.w.set_plain32(so + S_RELEASE_TICKET, m.ticket)
                publish = l.publish_fence(m.index)
                # A release must never land before its publish (a fence would go backwards).
                if m._waited is not True and (not streamed or m._waited != stream) and not f.reached(publish, m.ticket):
                    f.wait_on(stream, publish, m.ticket)
                f.signal(stream, l.release_fence(m.index, e.index), m.ticket)
            if e.layout.broadcast:
                ring.release_held(m.index)
            else:
                ring.release_taken(m.index)

    def close(self) -> None:
        """Closes this end now. Unreleased messages go to other consumers (work sharing: flagged
        redelivered) or are dropped (broadcast). Idempotent."""
        e = self._end

        def settle():
            f = e.block.fences
            if f is not None and e.layout.broadcast:
                for m in self._held.values():
                    f.raise_(e.layout.release_fence(m.index, e.index), m.ticket)
            for m in self._held.values():
                m._released = True
            self._held.clear()
            self._slots.close()
        e.close(settle)

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<cuda_ipc.ChannelConsumer {self.topology} {self.memory} #{self.index}{' closed' if self.closed else ''}>"


class Message:
    """A message a consumer received: ``memory`` (host slots: a memoryview of its ``length`` bytes),
    ``buffer`` (the whole slot: HostBuffer or DeviceBuffer), ``view(dtype, shape)``, ``meta``. Valid
    until ``release()``."""

    __slots__ = ("_consumer", "index", "position", "length", "meta", "producer", "redelivered", "ticket", "_released", "_waited")

    def __init__(self, consumer: ChannelConsumer, index: int, position: int, length: int, meta, producer: int,
                 redelivered: bool, ticket: int):
        self._consumer = consumer
        self.index = index
        self.position = position
        self.length = length
        self.meta = meta
        self.producer = producer
        self.redelivered = redelivered
        self.ticket = ticket
        self._released = False
        self._waited = None  # the stream its publish fence was waited on, or True once synchronized

    @property
    def released(self) -> bool:
        return self._released

    def _check(self, what: str) -> None:
        if self._released:
            raise IpcError("ERR_CLOSED", f"msg.{what}: the message was released")

    @property
    def memory(self) -> memoryview:
        """Host slots: the message's bytes (zero-copy; valid until release())."""
        self._check("memory")
        return self._consumer._slots.memory(self.index, self.length)

    @property
    def buffer(self):
        """The slot's memory: a HostBuffer (host slots) or DeviceBuffer (device slots), the whole slot."""
        self._check("buffer")
        return self._consumer._slots.buffer(self.index)

    def view(self, dtype="uint8", shape=None, strides=None, offset: int = 0):
        """A typed view of the slot: device slots an ArrayView (``__cuda_array_interface__`` and
        DLPack); host slots a memoryview cast to the dtype's format. Default shape: as many elements
        as ``length`` holds."""
        return _typed_view(self.buffer, self.length, dtype, shape, strides, offset)

    @property
    def __cuda_array_interface__(self) -> dict:
        cai = dict(self.buffer.__cuda_array_interface__)
        cai["shape"] = (self.length,)
        if not self.length:
            cai["data"] = (0, False)
        return cai

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("Message.__dlpack__: copy=True is not supported; it shares memory")
        buf = self.buffer
        if isinstance(buf, DeviceBuffer):
            from .dlpack import DL_CUDA, make_capsule
            return make_capsule(buf.ptr, (DL_CUDA, buf.device.ordinal), "|u1", (self.length,), None, owner=self)
        return buf.view(0, self.length).__dlpack__() if self.length else buf.__dlpack__()

    def __dlpack_device__(self):
        return self.buffer.__dlpack_device__()

    def wait_on(self, stream=None) -> None:
        """Device slots: GPU work queued on ``stream`` after this waits for the producer's work on the
        message (its publish fence). No-op for host slots."""
        self._check("wait_on")
        f = self._consumer._end.block.fences
        if f is None:
            return
        f.wait_on(stream, self._consumer._end.layout.publish_fence(self.index), self.ticket)
        if self._waited is not True:
            self._waited = stream

    def synchronize(self, timeout: float | None = None) -> None:
        """Waits on this thread until the producer's GPU work on the message is done (host reads of
        device slots). No-op for host slots."""
        self._check("synchronize")
        e = self._consumer._end
        f = e.block.fences
        if f is None:
            return
        f.synchronize([(e.layout.publish_fence(self.index), self.ticket)], timeout)
        self._waited = True

    def release(self, stream=None) -> None:
        """Returns the slot to the producers. Device slots: pass the stream your GPU work on the
        message ran on; the producer's next use of the slot waits for it. Idempotent."""
        if self._released:
            return
        self._released = True
        self._consumer._release(self, stream, stream is not None)

    def __enter__(self) -> "Message":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<cuda_ipc.Message #{self.position} slot {self.index} {self.length} bytes{' released' if self._released else ''}>"


def _typed_view(buf, length: int, dtype, shape, strides, offset: int):
    if isinstance(buf, DeviceBuffer):
        if shape is None:
            shape = ((length - offset) // DTYPES[dtype_name(dtype)][0],)
        return buf.view(dtype, shape, strides, offset)
    name = dtype_name(dtype)
    fmt = {"float32": "f", "float64": "d", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i",
           "uint32": "I", "int64": "q", "uint64": "Q"}.get(name)
    if fmt is None or strides is not None:
        raise IpcError("ERR_UNSUPPORTED", f"host slots view as C-contiguous memoryviews of standard formats; {name} with strides {strides} is not one (use numpy/torch.frombuffer on .memory)")
    size = DTYPES[name][0]
    if shape is None:
        shape = ((length - offset) // size,)
    elif isinstance(shape, int):
        shape = (shape,)
    n = 1
    for d in shape:
        n *= d
    if offset < 0 or offset % size or offset + n * size > buf.nbytes:
        raise IpcError("ERR_OUT_OF_RANGE", f"a {name} view of shape {tuple(shape)} at {offset} does not fit the {buf.nbytes}-byte slot")
    return buf.memory[offset:offset + n * size].cast(fmt, shape)


# ------------------------------------------------------------------------------------------------
# Producers


class ChannelProducer(_Shape):
    """This process's producer end (from accept_channel): ``slot = acquire()``, write into the slot,
    ``publish(slot, length=..., meta=...)``; ``end()`` when done."""

    role = "producer"

    def __init__(self, end: _End):
        self._end = end
        self._slots = _SlotMemory(end.block)
        self._writing: dict[int, Slot] = {}
        self._ending = False

    def _consumers_gone(self) -> bool:
        e = self._end
        return e.counter(H_CONSUMERS_LIVE) == 0 and e.counter(H_CONSUMERS_ATTACHED) >= e.layout.expect_consumers

    def _gone_error(self, what: str) -> IpcError:
        died = self._end.counter(H_CONSUMERS_DIED)
        if died > 0:
            return IpcError("ERR_PEER_GONE", f"{what}: every consumer of the channel is gone ({died} died)")
        return IpcError("ERR_CHANNEL_CLOSED", f"{what}: every consumer has closed the channel")

    def _try_acquire(self):
        e = self._end
        if self._ending:
            raise _closed_error("acquire (end() was called)")
        e.service()
        if not e.alive():
            raise e.detached_error("acquire")
        if self._consumers_gone():
            raise self._gone_error("acquire")
        if e.layout.broadcast and e.counter(H_CONSUMERS_ATTACHED) < e.layout.expect_consumers:
            return None
        s = e.ring.claim_slot()
        if s < 0:
            return None
        slot = Slot(self, s)
        self._writing[s] = slot
        return slot

    def _can_acquire(self) -> bool:
        e = self._end
        if e.closed or e.hub_lost or self._consumers_gone() or not e.alive():
            return True
        if e.layout.broadcast and e.counter(H_CONSUMERS_ATTACHED) < e.layout.expect_consumers:
            return False
        return e.ring.has_free()

    def acquire(self, timeout: float | None = None, stream=None) -> "Slot":
        """A free slot to write into; blocks while every slot is in flight (ERR_TIMEOUT after
        ``timeout`` seconds). Raises ERR_PEER_GONE once every consumer died (ERR_CHANNEL_CLOSED once
        they all left). Device slots: with ``stream``, GPU work queued there after this waits for the
        consumers' work on the slot's previous message; without, this waits on the CPU."""
        e = self._end
        e.assert_open("acquire")
        deadline = None if timeout is None else time.monotonic() + timeout
        with e.lock:
            while True:
                slot = self._try_acquire()
                if slot is not None:
                    break
                e.assert_open("acquire")
                if deadline is not None and time.monotonic() >= deadline:
                    raise IpcError("ERR_TIMEOUT", "channel acquire: no free slot within the timeout")
                e.park(self._can_acquire, deadline)
        if e.block.fences is not None:
            try:
                if stream is not None:
                    slot.wait_on(stream)
                else:
                    slot.ready(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except BaseException:
                self.discard(slot)
                raise
        return slot

    def try_acquire(self) -> "Slot | None":
        """A free slot now, or None when every slot is in flight. Device slots: order your writes
        after the consumers' work yourself (``slot.wait_on(stream)`` or ``slot.ready()``)."""
        e = self._end
        e.assert_open("try_acquire")
        with e.lock:
            return self._try_acquire()

    def publish(self, slot: "Slot", length: int | None = None, meta: Any = None, stream=None) -> None:
        """Publishes ``slot``: the consumers can take it at once. ``length``: bytes of the slot the
        message uses (default: all); ``meta``: JSON-serialisable data or bytes (at most meta_bytes
        once encoded). Device slots: the consumers' GPU work waits for the work queued on ``stream``
        (default: the legacy default stream) so far."""
        e = self._end
        e.assert_open("publish")
        with e.lock:
            s = getattr(slot, "index", -1)
            if not isinstance(slot, Slot) or self._writing.get(s) is not slot:
                raise IpcError("ERR_INVALID_ARG", "publish: that slot is not one this producer acquired and has not yet published")
            l = e.layout
            if length is None:
                length = l.slot_bytes
            if type(length) is not int or not 0 <= length <= l.slot_bytes:
                raise IpcError("ERR_OUT_OF_RANGE", f"publish: length must be an int in 0..{l.slot_bytes}; got {length!r}")
            w = e.w
            so = e.ring.slot_off(s)
            kind = META_NONE
            raw = b""
            if meta is not None:
                if isinstance(meta, (bytes, bytearray, memoryview)):
                    raw = bytes(meta)
                    kind = META_BYTES
                else:
                    try:
                        raw = json.dumps(meta, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
                    except (TypeError, ValueError) as err:
                        raise IpcError("ERR_NOT_TRANSFERABLE", f"publish: meta must be JSON-serialisable or bytes ({err})") from None
                    kind = META_JSON
                if len(raw) > l.meta_bytes:
                    raise IpcError("ERR_MESSAGE_TOO_LARGE", f"publish: meta takes {len(raw)} bytes; this channel holds {l.meta_bytes} per message (metaBytes)")
                e.block.control._mapping.base[so + S_META:so + S_META + len(raw)] = raw
            w.set_plain32(so + S_LENGTH, length & 0xFFFFFFFF)
            w.set_plain32(so + S_LENGTH + 4, length >> 32)
            w.set_plain32(so + S_META_LENGTH, len(raw))
            w.set_plain32(so + S_META_KIND, kind)
            f = e.block.fences
            if f is not None:
                # The slot is ours (writing) until the commit below: nobody else touches its ticket.
                ticket = _next_ticket(w.plain32(so + S_TICKET))
                w.set_plain32(so + S_TICKET, ticket)
                f.signal(stream, l.publish_fence(s), ticket)
            del self._writing[s]
            slot._done = True
            self._commit(s)

    def _commit(self, s: int) -> None:
        e = self._end
        started = time.monotonic()
        while True:
            r = e.ring.publish(s)
            if r == "ok" or r == "dropped":
                return
            if r == "detached":
                raise e.detached_error("publish")
            # The lock stays taken: a live publisher holds it for microseconds, a dead one is
            # repaired by the hub (or by us, once the hub is gone).
            if time.monotonic() - started > RECOVERY_GIVE_UP:
                raise IpcError("ERR_TIMEOUT", f"publish: the channel's publish lock stayed held for {RECOVERY_GIVE_UP} s (a process died inside it and was not repaired)")
            time.sleep(RETRY)
            e.service()

    def discard(self, slot: "Slot") -> None:
        """Gives back a slot acquired and not published."""
        e = self._end
        e.assert_open("discard")
        with e.lock:
            if self._writing.get(slot.index) is not slot:
                return
            del self._writing[slot.index]
            slot._done = True
            e.ring.discard(slot.index)

    def end(self, timeout: float | None = None) -> None:
        """No more messages from this end. Consumers finish once they took what was published. Returns
        once every message this end published was released (raises ERR_PEER_GONE if the consumers
        died first, ERR_TIMEOUT after ``timeout`` seconds), then closes this end."""
        e = self._end
        if e.closed:
            return
        self._ending = True
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            with e.lock:
                for slot in list(self._writing.values()):
                    self.discard(slot)
                e.leave_self()  # first: consumers see the end even while they hold our last messages

                def done() -> bool:
                    return e.closed or e.hub_lost or e.ring.in_flight_from(e.index) == 0 or self._consumers_gone()
                while not done():
                    if deadline is not None and time.monotonic() >= deadline:
                        raise IpcError("ERR_TIMEOUT", f"end: {e.ring.in_flight_from(e.index)} message(s) still unreleased after the timeout")
                    e.park(done, deadline)
                if not e.closed and not e.hub_lost and e.ring.in_flight_from(e.index) > 0 and e.counter(H_CONSUMERS_DIED) > 0:
                    raise IpcError("ERR_PEER_GONE", f"end: the consumers died with {e.ring.in_flight_from(e.index)} message(s) unreleased")
        finally:
            self.close()

    def close(self) -> None:
        """Closes this end now: acquired slots are given back; what was published stays published.
        Idempotent."""
        def settle():
            for slot in self._writing.values():
                slot._done = True
            self._writing.clear()
            self._slots.close()
        self._end.close(settle)

    def __exit__(self, *exc) -> None:
        self.close()

    def _slot_waits(self, s: int) -> list:
        """The release fences slot s's previous message must reach (read while we hold the slot)."""
        e = self._end
        if e.block.fences is None:
            return []
        w = e.w
        l = e.layout
        so = e.ring.slot_off(s)
        if not l.broadcast:
            ticket = w.plain32(so + S_RELEASE_TICKET)
            if ticket == 0:
                return []
            k = w.plain32(so + S_RELEASED_BY)
            if k >= l.max_participants:
                raise corrupt(f"slot {s} was released by participant {k}")
            return [(l.release_fence(s, k), ticket)]
        ticket = w.plain32(so + S_TICKET)
        if ticket == 0:
            return []
        holders = e.ring.last_holders(s)
        return [(l.release_fence(s, k), ticket) for k in range(l.max_participants) if holders & (1 << k)]

    def __repr__(self) -> str:
        return f"<cuda_ipc.ChannelProducer {self.topology} {self.memory} #{self.index}{' closed' if self.closed else ''}>"


class Slot:
    """A slot a producer acquired: write into ``memory`` (host slots) or ``buffer`` / ``view()``
    (device slots), then publish it."""

    __slots__ = ("_producer", "index", "_done")

    def __init__(self, producer: ChannelProducer, index: int):
        self._producer = producer
        self.index = index
        self._done = False

    @property
    def pending(self) -> bool:
        """False once published or discarded."""
        return not self._done

    @property
    def memory(self) -> memoryview:
        """Host slots: the slot's bytes (zero-copy)."""
        if self._done:
            raise IpcError("ERR_CLOSED", "slot.memory: the slot was published or discarded")
        return self._producer._slots.memory(self.index, self._producer._end.layout.slot_bytes)

    @property
    def buffer(self):
        """The slot's memory: a HostBuffer (host slots) or DeviceBuffer (device slots)."""
        if self._done:
            raise IpcError("ERR_CLOSED", "slot.buffer: the slot was published or discarded")
        return self._producer._slots.buffer(self.index)

    @property
    def nbytes(self) -> int:
        return self._producer._end.layout.slot_bytes

    def view(self, dtype="uint8", shape=None, strides=None, offset: int = 0):
        """A typed view of the slot (see Message.view)."""
        return _typed_view(self.buffer, self.nbytes, dtype, shape, strides, offset)

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.buffer.__cuda_array_interface__

    def __dlpack__(self, **kw):
        return self.buffer.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.buffer.__dlpack_device__()

    def wait_on(self, stream=None) -> None:
        """Device slots: GPU work queued on ``stream`` after this waits until the consumers' work on
        the slot's previous message is done. acquire(stream=...) does this for you."""
        p = self._producer
        f = p._end.block.fences
        if f is None:
            return
        for off, v in p._slot_waits(self.index):
            f.wait_on(stream, off, v)

    def ready(self, timeout: float | None = None) -> None:
        """Device slots: waits on this thread until the consumers' GPU work on the previous message in
        this slot is done."""
        p = self._producer
        f = p._end.block.fences
        if f is not None:
            f.synchronize(p._slot_waits(self.index), timeout)

    def __repr__(self) -> str:
        return f"<cuda_ipc.Slot {self.index}{' done' if self._done else ''}>"

