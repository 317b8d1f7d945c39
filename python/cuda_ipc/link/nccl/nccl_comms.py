"""The NCCL communicators of TCP links (docs/PROTOCOL.md 8.1, 8.4), as src/link/nccl/nccl-comms.ts. A sender
makes one per link and device (rank 0 of 2; its unique id rides in the first record that names it),
or one for a broadcast over several links (rank 0 of 1 + N, fanout.py); a receiver joins each with
the rank the record gives it, on its working device. Transfers on a communicator run in sequence
order on both sides (nccl_order.py).

Python is synchronous, so each communicator has two threads of its own: a worker that makes the
NCCL communicator (non-blocking init, polled) and then queues each transfer's NCCL work in turn on
the communicator's stream, and a waiter that tells each transfer once its work finished (an event
after it). ``link.send()`` returns once the record went out; the bytes follow. A watchdog thread
asks NCCL for asynchronous errors while a communicator has work in flight, and notices a peer whose
connection ended (the link is read then, so its close aborts the communicator even when nobody
calls receive()).

Ending: the link closing for any reason aborts its communicators (a broadcast's for every link of
it); so does an error NCCL reports, or a transfer this side cannot take, which also tells the peer
(NCCL_ABORT); the peer's NCCL_ABORT aborts ours. Transfers still queued fail with the reason; what
they hold is let go by their owners' settle callbacks.
"""
from __future__ import annotations

import os
import queue
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...cuda.device import Device, working_device
from ...errors import IpcError
from ...nccl import NcclCommunicator, load_nccl
from ..messages.nccl_records import CommReference
from ...cuda.stream import Event, Stream
from ..messages.deferred import Completion
from ..messages.nccl_abort import ABORT_CANNOT_TAKE, ABORT_NCCL_FAILED, ABORT_NO_COMMUNICATOR, NcclAbort, on_nccl_abort, peer_takes_nccl, send_nccl_abort
from .nccl_order import TransferOrder

if TYPE_CHECKING:
    from ..connection.link import Link

#: How often a communicator with work in flight is asked for asynchronous errors (seconds).
ERROR_POLL_S = 0.1
_STATE_KEY = "cuda_ipc.nccl.comms"
#: Queues one transfer's NCCL work on the communicator's stream (on its worker thread).
StartWork = Callable[["LinkComm", NcclCommunicator], None]
#: Told once per transfer: None when its work finished, else why it failed.
Settle = Callable[[IpcError | None], object]


def as_ipc_error(e: BaseException, what: str) -> IpcError:
    return e if isinstance(e, IpcError) else IpcError("ERR_NCCL", f"{what} failed: {e}")


class LinkComm:
    """One communicator of one or more TCP links, as this side sees it."""

    def __init__(self, comm_id: bytes, device: Device, nranks: int, rank: int, broadcast: bool, unique_id: bytes | None):
        #: The 16 random bytes every record names it by.
        self.id = comm_id
        self.device = device
        self.nranks = nranks
        #: This side's rank (0: the sender).
        self.rank = rank
        #: Chunks are broadcasts (else sends from rank 0 to rank 1).
        self.broadcast = broadcast
        #: The unique id, on the side that made it (rank 0).
        self.unique_id = unique_id
        #: Per-communicator state of the layers above (the tensors' chunk mover), closed with it on its worker.
        self.extras: dict[str, Any] = {}
        #: Sender: the next sequence number to hand out. Receiver: the one the next record must carry.
        self.sequence = 0
        self.order = TransferOrder()
        self.links: list[Link] = []
        self._lock = threading.Lock()
        self._ended: IpcError | None = None
        self._cancel = threading.Event()
        self._comm: NcclCommunicator | None = None
        self._stream: Stream | None = None
        self._started = False
        self._done: queue.SimpleQueue[tuple[Event, Settle] | None] = queue.SimpleQueue()
        #: Transfers whose work was queued and has not finished (the watchdog watches while > 0).
        self.in_flight = 0
        self._making = False

    @property
    def ended(self) -> IpcError | None:
        """Why the communicator ended here (None while it lives)."""
        return self._ended

    @property
    def busy(self) -> bool:
        """Being made, or with work in flight: what the watchdog watches."""
        return self._making or self.in_flight > 0

    @property
    def stream(self) -> Stream:
        """The stream every NCCL operation of this communicator runs on (one stream: NCCL's operations
        on a communicator must not overtake each other). The worker thread's."""
        s = self._stream
        if s is None:
            s = self._stream = Stream(self.device)
        return s

    def add_link(self, link: Link) -> None:
        """The links it spans (a broadcast spans several)."""
        if link not in self.links:
            self.links.append(link)

    def start(self, unique_id: bytes) -> None:
        """Starts making the NCCL communicator (once) and queueing its transfers, on its own threads."""
        with self._lock:
            if self._started or self._ended is not None:
                return
            self._started = True
            self._making = True
        threading.Thread(target=self._work, args=(unique_id,), name=f"cuda-ipc nccl {self.id.hex()[:8]}", daemon=True).start()
        threading.Thread(target=self._wait_done, name=f"cuda-ipc nccl wait {self.id.hex()[:8]}", daemon=True).start()
        watchdog.watch(self)

    def submit(self, sequence: int, start: StartWork, settle: Settle) -> None:
        """Queues ``start``'s work in ``sequence``'s turn; ``settle`` is told once: when the work finished
        (None), or why it failed (it never ran, could not be queued, or the communicator ended)."""
        def run() -> None:
            self._run_one(start, settle)
        self.order.submit(sequence, run, settle)

    def defer(self, sequence: int, force: Callable[[], None], fail: Callable[[IpcError], object]) -> None:
        """A transfer that starts when its consumer submits it, or when ``force()`` is called because a
        later one needs the way (TransferOrder.defer)."""
        self.order.defer(sequence, force, fail)

    # -- the worker ------------------------------------------------------------------------------

    def _work(self, unique_id: bytes) -> None:
        try:
            try:
                library = load_nccl()
                if self._ended is None:
                    comm = NcclCommunicator.init(unique_id, self.nranks, self.rank, self.device, library=library, cancel=self._cancel)
                    with self._lock:
                        self._comm = comm
                    if self._ended is not None:
                        comm.abort()
            except BaseException as e:  # noqa: BLE001 - reported to the transfers and the peers
                self.abort(as_ipc_error(e, "making the NCCL communicator"), ABORT_NO_COMMUNICATOR)
            finally:
                self._making = False
            while self._ended is None:
                run = self.order.take(block=True)
                if run is None:
                    break
                run()
        finally:
            self._close_resources()
            self._done.put(None)  # after the last transfer it queued: the waiter ends there

    def _run_one(self, start: StartWork, settle: Settle) -> None:
        comm = self._comm
        ended = self._ended
        if ended is not None or comm is None:
            settle(ended or IpcError("ERR_NCCL", "the NCCL communicator was not made"))
            return
        self._count(1)
        watchdog.watch(self)
        try:
            start(self, comm)
            done = Event(self.device, blocking=True)
            try:
                done.record(self.stream.handle)
            except BaseException:
                done.close()
                raise
        except BaseException as e:  # noqa: BLE001 - a transfer half queued leaves the sides out of step
            error = as_ipc_error(e, "queueing an NCCL transfer")
            self.abort(error, ABORT_NCCL_FAILED)
            # What it queued before it failed may still touch its memory: let the (aborted) work end first.
            try:
                self.stream.synchronize()
            except Exception:  # noqa: BLE001 - the context may be lost; nothing more to wait for
                pass
            self._count(-1)
            settle(self._ended or error)
            return
        self._done.put((done, settle))

    def _count(self, n: int) -> None:
        with self._lock:
            self.in_flight += n

    def _wait_done(self) -> None:
        """The waiter: tells each queued transfer, in order, once the work before its event finished."""
        while True:
            item = self._done.get()
            if item is None:
                return
            done, settle = item
            error: IpcError | None = None
            try:
                done.synchronize()
            except BaseException as e:  # noqa: BLE001 - reported to the transfer
                error = as_ipc_error(e, "an NCCL transfer")
            done.close()
            comm = self._comm
            if error is None and (comm is None or comm.closed):
                error = self._ended or IpcError("ERR_NCCL", "the NCCL transfer was cut short: its communicator was aborted")
            self._count(-1)
            try:
                settle(error)
            except Exception as e:  # noqa: BLE001 - the next transfers must still be told
                print(f"cuda_ipc: an NCCL transfer's settle callback failed: {e!r}", file=sys.stderr)

    def _close_resources(self) -> None:
        """On the worker, once it queues nothing more: the layers' state, then the stream."""
        for x in list(self.extras.values()):
            try:
                x.close()
            except Exception as e:  # noqa: BLE001 - the others must still close
                print(f"cuda_ipc: closing an NCCL communicator's state failed: {e!r}", file=sys.stderr)
        self.extras.clear()
        s, self._stream = self._stream, None
        if s is not None:
            try:
                s.synchronize()  # ends once the aborted NCCL kernels did
            except Exception:  # noqa: BLE001 - the context may be lost (a peer that died mid-kernel)
                pass
            s.close()

    # -- ending ----------------------------------------------------------------------------------

    def abort(self, reason: IpcError, tell: int | None = None) -> None:
        """Ends the communicator here: NCCL's work is cut short (ncclCommAbort), waiting transfers fail
        with ``reason``, and with ``tell`` (an NCCL_ABORT reason) the peers learn why."""
        with self._lock:
            if self._ended is not None:
                return
            self._ended = reason
            comm = self._comm
        self._cancel.set()
        self.order.fail(reason)
        for link in list(self.links):
            _forget(link, self)
            if tell is not None and peer_takes_nccl(link):
                try:
                    send_nccl_abort(link, self.id, tell, str(reason))
                except IpcError:
                    pass  # the link is going: the peer learns from its close
        if comm is not None:
            try:
                comm.abort()  # ends NCCL's kernels, so that the streams the worker waits for drain
            except Exception as e:  # noqa: BLE001 - nothing more to do with it
                print(f"cuda_ipc: ncclCommAbort failed: {e!r}", file=sys.stderr)
        watchdog.forget(self)

    def check(self) -> None:
        """The watchdog's look: NCCL's asynchronous error, and links whose peer hung up (read, so that they close)."""
        for link in list(self.links):
            if _hung_up(link):
                link.poll()  # reads to the end: the link closes, and its close aborts this
        comm = self._comm
        if comm is not None and not comm.closed and self._ended is None:
            try:
                state = comm.poll_async_error()  # None: the worker is in a call, which reports NCCL's errors itself
            except IpcError:
                state = None  # aborted meanwhile
            if state is not None and state not in ("ncclSuccess", "ncclInProgress"):
                self.abort(IpcError("ERR_NCCL", f"NCCL reported {state} on the communicator of this link's transfers ({self._peers()}); "
                                    "the transfers in flight failed, a later transfer makes a new communicator"), ABORT_NCCL_FAILED)

    def _peers(self) -> str:
        out = []
        for link in self.links:
            r = link.remote
            out.append(f"{r.address}:{r.port}" if r is not None else repr(link))
        return ", ".join(out)

    def __repr__(self) -> str:
        return f"<LinkComm {self.id.hex()[:8]} rank {self.rank} of {self.nranks}{' ended' if self._ended else ''}>"


def _hung_up(link: Link) -> bool:
    """Whether the peer's side of the connection ended (nothing is read: the fd is only looked at)."""
    if link.closed:
        return False
    try:
        p = select.poll()
        p.register(link.fileno(), select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return False


class _Watchdog:
    """One thread for the process: every ERROR_POLL_S, each communicator being made or with work in
    flight is checked (LinkComm.check); idle ones are dropped until their next transfer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._comms: set[LinkComm] = set()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, comm: LinkComm) -> None:
        with self._lock:
            self._comms.add(comm)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cuda-ipc nccl watchdog", daemon=True)
                self._thread.start()

    def forget(self, comm: LinkComm) -> None:
        with self._lock:
            self._comms.discard(comm)

    def _run(self) -> None:
        while True:
            self._wake.wait(ERROR_POLL_S)
            with self._lock:
                comms = list(self._comms)
            for comm in comms:
                if comm.ended is not None or not comm.busy:
                    self.forget(comm)
                    continue
                try:
                    comm.check()
                except Exception as e:  # noqa: BLE001 - the watchdog must go on
                    print(f"cuda_ipc: checking an NCCL communicator failed: {e!r}", file=sys.stderr)


watchdog = _Watchdog()


# ------------------------------------------------------------------------------------------------
# Per link: the communicators by id, the one it sends on per device, and which unique ids went out.


class _LinkState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_id: dict[bytes, LinkComm] = {}
        self.outgoing: dict[str, LinkComm] = {}  # by device UUID
        #: Communicators whose unique id went out on the link.
        self.announced: set[bytes] = set()
        #: ... or goes in the message being sent (its later records for the same communicator need not carry it).
        self.announcing: set[bytes] = set()
        #: Transfers this link sent that have not both settled here and been released by the peer
        #: (what end() waits for).
        self.sending = 0
        self.settled = threading.Condition(self.lock)

    def track(self, sent: Completion, released: Completion) -> None:
        """Counts a transfer in ``sending`` until ``sent`` (its NCCL work here) and ``released`` (the
        peer's RELEASE: the bytes arrived there; or the link's close) both settled."""
        with self.lock:
            self.sending += 1
        left = [2]

        def one(_c: Completion) -> None:
            with self.lock:
                left[0] -= 1
                if left[0] == 0:
                    self.sending -= 1
                    self.settled.notify_all()
        sent.add_callback(one)
        released.add_callback(one)

    def wait_sent(self, link: Link, deadline: float | None) -> None:
        """end()'s drain hook: returns once nothing this link sent over NCCL is on its way; ERR_TIMEOUT
        past ``deadline``. Reads the link meanwhile (poll): the peer's RELEASE says the bytes arrived."""
        while True:
            with self.lock:
                if self.sending == 0:
                    return
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise IpcError("ERR_TIMEOUT", f"link.end: {self.sending} transfer(s) of device memory over NCCL had not "
                                                  "arrived at the timeout (the peer has not received them); the link was closed, "
                                                  "cutting them short")
                self.settled.wait(_DRAIN_POLL_S if left is None else min(left, _DRAIN_POLL_S))
            link.poll()


#: How often end() reads the link for the peer's RELEASE while it waits.
_DRAIN_POLL_S = 0.005


_states_lock = threading.Lock()
_ABORT_WHY = {ABORT_CANNOT_TAKE: "could not take a transfer", ABORT_NCCL_FAILED: "saw NCCL fail",
              ABORT_NO_COMMUNICATOR: "could not make the communicator"}


def state_of(link: Link) -> _LinkState:
    s = link.handler_state.get(_STATE_KEY)
    if isinstance(s, _LinkState):
        return s
    if link.transport != "tcp":
        raise IpcError("ERR_UNSUPPORTED", "NCCL transfers run on TCP links only (a Unix link shares the memory itself)")
    with _states_lock:
        s = link.handler_state.get(_STATE_KEY)
        if isinstance(s, _LinkState):
            return s
        state = _LinkState()
        link.handler_state[_STATE_KEY] = state

    def on_abort(_link: Link, a: NcclAbort) -> None:
        comm = state.by_id.get(a.communicator)
        if comm is None:
            return  # ended here already (or never known): nothing to do
        why = _ABORT_WHY.get(a.reason, "aborted it")
        comm.abort(IpcError("ERR_NCCL", f"the peer {why} and aborted this link's NCCL communicator: {a.text}"))

    def on_close(_link: Link, reason: IpcError | None) -> None:
        why = reason or IpcError("ERR_LINK_CLOSED", "the link closed before its NCCL transfers finished")
        with state.lock:
            comms = list(state.by_id.values())
        for comm in comms:
            comm.abort(why)
    on_nccl_abort(link, on_abort)
    link.on_close(on_close)
    link.on_drain(lambda deadline: state.wait_sent(link, deadline))
    return state


def _forget(link: Link, comm: LinkComm) -> None:
    s: _LinkState | None = link.handler_state.get(_STATE_KEY)
    if s is None:
        return
    with s.lock:
        if s.by_id.get(comm.id) is comm:
            del s.by_id[comm.id]
        if s.outgoing.get(comm.device.uuid) is comm:
            del s.outgoing[comm.device.uuid]


def check_peer(link: Link, what: str) -> None:
    """ERR_NOT_TRANSFERABLE unless ``link`` is an open TCP link whose peer takes device memory over NCCL."""
    if link.transport != "tcp":
        raise IpcError("ERR_NOT_TRANSFERABLE", f"link.send: {what} travels over NCCL on TCP links only")
    if not peer_takes_nccl(link):
        if link.closed:
            raise link._closed_error("send")
        raise IpcError("ERR_NOT_TRANSFERABLE", f"link.send: the {link._peer_name} does not take device memory over NCCL (its HELLO "
                       "did not say so: an older cuda-ipc); copy it to host memory first (bytes, or a HostBuffer, which a TCP link copies)")


def new_root_comm(device: Device, nranks: int, broadcast: bool) -> LinkComm:
    """A communicator this side makes as rank 0 of ``nranks`` on ``device`` (a link's own, or a Fanout's
    broadcast): a fresh id, and a unique id for the records to carry. Loads NCCL if needed."""
    library = load_nccl()
    with device.activate():  # as Node: NCCL may touch CUDA making the id; let it find this device's context
        uid = library.unique_id()
    return LinkComm(os.urandom(16), device, nranks, 0, broadcast, uid)


def outgoing_comm(link: Link, device: Device) -> LinkComm:
    """The communicator ``link`` sends device memory of ``device`` on: rank 0 of 2, made on first use
    (ERR_NCCL_UNAVAILABLE when there is no NCCL). Its NCCL side starts once a record naming it went out."""
    s = state_of(link)
    with s.lock:
        comm = s.outgoing.get(device.uuid)
        if comm is not None and comm.ended is None:
            return comm
    comm = new_root_comm(device, 2, False)
    comm.add_link(link)
    with s.lock:
        s.outgoing[device.uuid] = comm
        s.by_id[comm.id] = comm
    return comm


def add_broadcast_comm(link: Link, comm: LinkComm) -> None:
    """Registers a communicator this side made for a broadcast over several links (fanout.py)."""
    s = state_of(link)
    with s.lock:
        s.by_id[comm.id] = comm
    comm.add_link(link)


def comm_reference(link: Link, comm: LinkComm, rank: int) -> CommReference:
    """How a record names ``comm`` on ``link`` for the receiver of ``rank``: the first one carries its
    unique id (the first of the message being encoded, when none went out yet; Link.send encodes one
    message at a time)."""
    s = state_of(link)
    if comm.id in s.announced or comm.id in s.announcing:
        return CommReference(comm.id, comm.nranks, rank, comm.broadcast, None)
    s.announcing.add(comm.id)
    return CommReference(comm.id, comm.nranks, rank, comm.broadcast, comm.unique_id)


def committed_on(link: Link, comm: LinkComm) -> None:
    """A record naming ``comm`` went out on ``link``: later ones there need not carry its unique id, and its NCCL side starts."""
    s = state_of(link)
    s.announced.add(comm.id)
    s.announcing.discard(comm.id)
    assert comm.unique_id is not None, "the side that made a communicator has its unique id"
    comm.start(comm.unique_id)


def not_sent(link: Link, comm: LinkComm) -> None:
    """The message naming ``comm`` did not go out: the next one carries its unique id again, if it had to."""
    state_of(link).announcing.discard(comm.id)


def receiving_device() -> Device:
    """The device received bytes land on: the working device (set_working_device, CUDA_IPC_DEVICE),
    else PyTorch's current device when this process uses PyTorch's CUDA, else device 0."""
    d = working_device()
    if d is not None:
        return d
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return Device.get(int(torch.cuda.current_device()))
    return Device.get(0)


def check_nccl_in_clear(link: Link, what: str) -> None:
    """Device memory over NCCL on a tls:// link crosses NCCL's network in clear, outside TLS: refused
    (ERR_NCCL_UNENCRYPTED) unless the link allows it (``allow_nccl_in_clear``). ``what``: 'send' or 'receive'."""
    if not link.tls or getattr(link, "allow_nccl_in_clear", False):
        return
    how = "NCCL does not encrypt: device memory would cross its network (sockets, InfiniBand, RoCE) in clear, outside TLS"
    if what == "send":
        raise IpcError("ERR_NCCL_UNENCRYPTED", f"link.send: this tls:// link moves device memory over NCCL, and {how}. Pass "
                       "allow_nccl_in_clear=True to connect()/listen() ({ allowNcclInClear: true } in Node) where that network is "
                       "trusted, or send a HostBuffer copy of the bytes (it travels inside TLS)")
    raise IpcError("ERR_NCCL_UNENCRYPTED", f"the peer sent device memory on this tls:// link, which moves over NCCL, and {how}; "
                   "this side does not allow it, so the message was dropped and the sender told (NCCL_ABORT). Pass "
                   "allow_nccl_in_clear=True to connect()/listen() ({ allowNcclInClear: true } in Node) where that network is trusted")


def incoming_comm(link: Link, ref: CommReference, sequence: int) -> LinkComm:
    """The communicator a received record names (joining it when the record carries its unique id), on
    the receiving device, and the transfer's place in its order. ERR_NCCL_UNAVAILABLE without NCCL;
    ERR_FRAME_INVALID (the message fails) for a record that names an unknown communicator,
    contradicts an earlier one, or skips a sequence number. The communicator is then aborted and the
    peer told (NCCL_ABORT). ERR_NCCL_UNENCRYPTED on a tls:// link that does not allow NCCL in clear."""
    try:
        check_nccl_in_clear(link, "receive")
    except IpcError as e:
        _refuse(link, ref.id, e)
        raise
    s = state_of(link)
    with s.lock:
        comm = s.by_id.get(ref.id)
    if comm is None:
        if ref.unique_id is None:
            raise IpcError("ERR_FRAME_INVALID", "a received NCCL record names a communicator this link does not know, without its unique id")
        try:
            load_nccl()  # no NCCL: this message fails with ERR_NCCL_UNAVAILABLE, and the sender learns it
            device = receiving_device()
        except IpcError as e:
            _refuse(link, ref.id, e)
            raise
        comm = LinkComm(bytes(ref.id), device, ref.nranks, ref.rank, ref.broadcast, None)
        comm.add_link(link)
        with s.lock:
            s.by_id[ref.id] = comm
        comm.start(ref.unique_id)
    elif (ref.unique_id is not None or comm.nranks != ref.nranks or comm.rank != ref.rank or comm.broadcast != ref.broadcast
          or comm.unique_id is not None):
        error = IpcError("ERR_FRAME_INVALID", "a received NCCL record contradicts an earlier one about its communicator (its rank, "
                         "size, mode or unique id)")
        comm.abort(error, ABORT_CANNOT_TAKE)
        raise error
    if sequence != comm.sequence:
        error = IpcError("ERR_FRAME_INVALID", f"a received NCCL transfer is number {sequence} on its communicator, {comm.sequence} was next")
        comm.abort(error, ABORT_CANNOT_TAKE)
        raise error
    comm.sequence += 1
    return comm


def _refuse(link: Link, comm_id: bytes, error: IpcError) -> None:
    if peer_takes_nccl(link):
        try:
            send_nccl_abort(link, comm_id, ABORT_CANNOT_TAKE, str(error))
        except IpcError:
            pass
