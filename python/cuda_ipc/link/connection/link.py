"""Link: one connection between two processes over a Unix SOCK_SEQPACKET socket, carrying structured
messages with file descriptors, the same protocol as the Node side (docs/PROTOCOL.md; src/link/connection/link.ts).
Between machines a TcpLink (stream.py) carries the same frames over TCP, without fds.

``parent_link()`` in a process started by Node's ``spawnPython``/``spawn`` (spawn.py); ``connect(name)``
to a Node ``listen(name)`` (listener.py); ``connect('tcp://host:port', token=...)`` (tcp.py). The API is
synchronous: ``send`` writes one frame, ``receive`` blocks (with an optional timeout) and processes
control frames (RELEASE, GOODBYE, ...) as they come. A process that only sends can call ``poll()`` now
and then so that the peer's releases and departure are noticed.

The link holds the state and runs the handshake, the reading and the close; its parts do one job
each: sending (outbox.py), what each frame read does (frame_dispatch.py), messages read ahead of
receive() (inbox.py), encoding and decoding messages (message_encoder.py, message_decoder.py), leases
(lease.py), the frame format (frame.py).
"""
from __future__ import annotations

import array
import errno
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple

from ...errors import IpcError
from ..transport import frame as fr
from ..transport.fds import close_fds
from .inbox import Inbox
from ..lifetimes.lease import IncomingLeases, OutgoingLeases, release_hold
from ..transport import received_memory
from ..transport.large_message import DEFAULT_MAX_MESSAGE_BYTES, check_max_message_bytes, write_large_payload
from ..messages.message_encoder import encode_message
from . import arriving
from .frame_dispatch import dispatch_record, fds_lost_here
from ..messages.nccl_abort import NcclAbortHook
from .outbox import Outbox, flusher
from ..transport.socket_path import MY_UID as _MY_UID

if TYPE_CHECKING:
    from ..transport.tcp_transport import RemoteAddress

_ANC_BYTES = socket.CMSG_SPACE(4 * fr.MAX_FDS) + socket.CMSG_SPACE(struct.calcsize("3i"))
# Plain ints: the socket module's IntFlag members cost microseconds per operation.
_TRUNCATED = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)
_CTRUNC = int(socket.MSG_CTRUNC)
_CLOEXEC = int(socket.MSG_CMSG_CLOEXEC)
_SOL_SOCKET = int(socket.SOL_SOCKET)
_SCM_RIGHTS = int(socket.SCM_RIGHTS)
_SCM_CREDENTIALS = int(getattr(socket, "SCM_CREDENTIALS", -1))


#: Default bound of the messages poll() reads ahead of receive() (as the Node side's inbox).
INBOX_LIMIT = 1024
#: Default bound of their bytes (as the Node side's inbox.bytes), and so of max_message_bytes.
INBOX_BYTES = 256 * 2**20


class PeerCredentials(NamedTuple):
    """Who is on the other end, as the kernel reports it."""

    pid: int
    uid: int
    gid: int


#: Values sent on a link and not released yet, and the bytes they keep alive. (The functional form:
#: a class-syntax field named ``count`` would shadow tuple.count for type checkers.)
LeaseCounts = NamedTuple("LeaseCounts", [("count", int), ("bytes", int)])

#: What runs once when a link closes: hook(link, reason or None).
CloseHook = Callable[["Link", "IpcError | None"], None]
#: What end() runs before it says goodbye: hook(deadline), where deadline is a time.monotonic() value
#: or None. Returns once what the layer sent beside the socket arrived; raises ERR_TIMEOUT past deadline.
DrainHook = Callable[["float | None"], None]


class Link:
    """A connection to another process (see the module notes). Use ``parent_link()`` or ``connect()``.

    ``send(value)``: JSON data, big ints, bytes/array.array/memoryview (copied into the frame), and
    objects with a transfer handler: HostBuffer, received device buffers, CUDA tensors/arrays (shared
    zero-copy, leased to the peer until it releases them). ``receive(timeout=None)`` returns the next
    message; received buffers are leased from the peer until you close them (or they are collected).
    A buffer closed by the thread that received it, before that thread uses the link again, is
    released with that thread's next link call (``send``, ``receive``, ``poll``), after its frame: a
    reply goes out first, as on the Node side. ``close()`` says goodbye now (``with`` does the same);
    ``end(timeout=None)`` first waits for device memory sent over NCCL to arrive. A peer that died
    shows as ERR_PEER_GONE.
    """

    #: The HELLO feature bits this side sends (PROTOCOL.md 3).
    _features = fr.OUR_FEATURES

    def __init__(self, sock: socket.socket, *, peer_name: str, verify_peer: bool = False,
                 allow_uids: Iterable[int] = (), max_message_bytes: int | None = None, _token: object = None):
        if _token is not _CREATE:
            raise IpcError("ERR_INVALID_ARG", "Link cannot be constructed directly; use parent_link() or connect()")
        self._sock = sock
        self._fd: int = sock.fileno()
        self._peer_name: str = peer_name
        self._allow_uids = tuple(allow_uids)
        #: The largest message (payload bytes) this link sends or accepts; larger than a frame, it
        #: travels in a sealed memfd (PROTOCOL.md 3.1).
        self.max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES if max_message_bytes is None else check_max_message_bytes(max_message_bytes)
        #: The peer's HELLO features; until it arrives (a child may send first) large messages are assumed.
        self._peer_features: int = fr.FEATURE_LARGE_MESSAGES
        self._state: str = "handshaking"
        self._reason: IpcError | None = None
        self._closed_by: str | None = None
        self._hello_sent: bool = False
        self._goodbye_sent = False
        self._recv_lock: threading.Lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._state_lock = threading.RLock()
        self._inbox: Inbox = Inbox()
        #: poll() stops reading ahead at this many unreceived messages: the rest waits in the socket
        #: (and the peer's sends wait), so a peer that floods cannot grow this process without bound.
        self.inbox_limit: int = INBOX_LIMIT
        #: ... nor past this many bytes of them, nor while the process holds its bound across links
        #: (received_memory.set_max_received_bytes). One message may not be larger: a larger
        #: max_message_bytes raises it with it.
        self.inbox_bytes: int = max(INBOX_BYTES, self.max_message_bytes)
        self._leases_out: OutgoingLeases = OutgoingLeases()
        self._leases_in: IncomingLeases = IncomingLeases(self._lease_ended)
        # The thread that received the last message and has not used the link since: the releases
        # of what it closes meanwhile go out after its next link call (its reply first), as Node
        # sends them on a microtask after the handler's reply.
        self._defer_thread: int | None = None
        #: Per-link state of transfer handlers (pools sent/received), dropped at close.
        self.handler_state: dict[str, Any] = {}
        self._close_hooks: list[CloseHook] = []
        self._drain_hooks: list[DrainHook] = []
        #: What receives the peer's NCCL_ABORT frames (nccl_abort.py; TCP links only).
        self._nccl_abort_hooks: list[NcclAbortHook] = []
        #: What wakes a receive() waiting for a message's values to arrive (made on first use).
        self._wake: arriving.Wake | None = None
        self._start(sock, verify_peer)

    def _start(self, sock: socket.socket, verify_peer: bool) -> None:
        """The socket's own part of __init__: the peer's credentials, the uid check, HELLO (a TcpLink's differs)."""
        self._rbuf = bytearray(fr.MAX_FRAME_BYTES)
        self._rview = memoryview(self._rbuf)
        self._outbox: Outbox = Outbox(sock, self._peer_name, self._leases_in)
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        self._peer = PeerCredentials(*struct.unpack("3i", raw))
        if verify_peer and self._peer.uid != _MY_UID and self._peer.uid not in self._allow_uids:
            self._refuse()
            return
        self._send_hello()

    # -- properties -------------------------------------------------------------------------------

    @property
    def peer(self) -> PeerCredentials:
        """The peer's pid/uid/gid (SO_PEERCRED)."""
        return self._peer

    @property
    def remote(self) -> RemoteAddress | None:
        """A TCP link's peer: (address, port, family 'IPv4' or 'IPv6'); None on a Unix socket."""
        return None

    @property
    def transport(self) -> str:
        """'unix' (a Unix socket: fds pass, memory is shared) or 'tcp' (TLS included: no fds, bytes are copied)."""
        return "unix"

    @property
    def tls(self) -> bool:
        """True for a TCP link inside TLS (a tls:// address)."""
        return False

    @property
    def state(self) -> str:
        """'handshaking', 'open' or 'closed'."""
        return self._state

    @property
    def closed(self) -> bool:
        return self._state == "closed"

    @property
    def leases(self) -> LeaseCounts:
        """Values sent on this link that the peer has not released yet, and the bytes they keep alive.
        Releases are read from the socket by receive()/poll()."""
        return LeaseCounts(self._leases_out.count, self._leases_out.bytes)

    @property
    def received_leases(self) -> int:
        """Values received on this link that are not released (closed or collected) yet."""
        return self._leases_in.count

    @property
    def pending_receives(self) -> int:
        return len(self._inbox)

    def fileno(self) -> int:
        """The socket, for select()/selectors: readable means receive()/poll() has something to do."""
        return self._fd

    def on_close(self, hook: CloseHook) -> None:
        """Runs ``hook(link, reason)`` once when the link closes (transfer handlers drop per-link state)."""
        if self._state == "closed":
            hook(self, self._reason)
        else:
            self._close_hooks.append(hook)

    def on_drain(self, hook: DrainHook) -> None:
        """Registers ``hook``, which end() runs before it says goodbye: a layer that sends bytes beside
        the socket (NCCL transfers of device memory) returns once they all arrived."""
        self._drain_hooks.append(hook)

    # -- sending ----------------------------------------------------------------------------------

    def send(self, value: Any, timeout: float | None = None) -> None:
        """Sends ``value`` in one frame with all its fds. Raises ERR_NOT_TRANSFERABLE /
        ERR_MESSAGE_TOO_LARGE without sending, ERR_LINK_CLOSED / ERR_PEER_GONE once closed.

        Backpressure: while the peer does not read, the socket fills and send() waits (nothing queues
        up in this process); ``timeout`` seconds bounds that wait (ERR_TIMEOUT, nothing sent)."""
        self._defer_thread = None
        if self._state == "closed":
            raise self._closed_error("send")
        # One message at a time from encode to commit: records that number what they carry per link
        # (NCCL transfers' sequence numbers, a communicator's first record) go out in that order.
        with self._send_lock:
            msg = encode_message(value, self)
            try:
                if len(msg.frame) - fr.HEADER_BYTES > fr.MAX_PAYLOAD_BYTES:
                    self._send_large(msg.frame, msg.fds, timeout)
                else:
                    self._outbox.send(msg.frame, msg.fds, timeout)
            except BaseException:
                for _, hold in msg.holds:
                    release_hold(hold)  # nothing was leased: the peer never sees these ids
                raise
            finally:
                close_fds(msg.owned_fds)
            for lease_id, hold in msg.holds:
                self._leases_out.add(lease_id, hold)
            for commit in msg.commits:
                commit()

    def _send_large(self, frame: bytearray, fds: list[int], timeout: float | None) -> None:
        """Sends an encoded frame too large for the socket: its payload in a sealed memfd."""
        if not self._peer_features & fr.FEATURE_LARGE_MESSAGES:
            raise IpcError("ERR_MESSAGE_TOO_LARGE",
                           f"link.send: the message needs {len(frame) - fr.HEADER_BYTES} bytes, more than a frame holds, and the "
                           f"{self._peer_name} does not take larger messages (an older cuda-ipc); send bulk data in a HostBuffer",
                           limit="max_message_bytes")
        if len(fds) + 1 > fr.MAX_FDS:
            raise IpcError("ERR_MESSAGE_TOO_LARGE", f"link.send: a large message carries its memfd besides its records' fds, so at most "
                           f"{fr.MAX_FDS - 1} of them; split it into several messages")
        flags = struct.unpack_from("<H", frame, 6)[0] | fr.LARGE_PAYLOAD
        length = len(frame) - fr.HEADER_BYTES
        memfd = write_large_payload(memoryview(frame)[fr.HEADER_BYTES:])
        try:
            head = fr.header(fr.MESSAGE, flags, fr.LARGE_INLINE_BYTES, len(fds) + 1) + struct.pack("<Q", length)
            self._outbox.send(head, [memfd, *fds], timeout)
        finally:
            os.close(memfd)

    def _lease_ended(self) -> None:
        if self._defer_thread == threading.get_ident():
            flusher.kick(self)  # after this thread's next send/receive/poll, or within RELEASE_DEFER_LIMIT
            return
        self._outbox.flush_releases()

    def flush_deferred(self) -> None:
        """The release flusher's call: sends the releases deferred for the receiving thread."""
        if self._leases_in.has_pending:
            self._defer_thread = None
            self._outbox.flush_releases()

    def _send_hello(self) -> None:
        self._hello_sent = True
        try:
            self._outbox.send(fr.hello_frame(self._features))
        except IpcError:
            pass  # the peer is gone already; the receive side reports it

    def _refuse(self) -> None:
        p = self._peer
        text = f"uid {p.uid} is not allowed by the process at the other end (pid {os.getpid()}, uid {_MY_UID})"
        self._outbox.send_now(fr.refuse_frame(fr.REFUSE_UID, text))
        self._shutdown(IpcError(
            "ERR_PEER_REFUSED",
            f"refused a link with the {self._peer_name} (pid {p.pid}): it runs as uid {p.uid}, this process as uid {_MY_UID}; "
            f"pass allow_uids=[{p.uid}] to accept links from that user"), "local")

    # -- receiving --------------------------------------------------------------------------------

    def receive(self, timeout: float | None = None) -> Any:
        """The next message. Raises IpcError ERR_TIMEOUT after ``timeout`` seconds, ERR_LINK_CLOSED once
        the peer closed the link cleanly, ERR_PEER_GONE if it died; a message that could not be
        decoded raises its own error and the link stays open."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._defer_thread = None
        if self._leases_in.has_pending:
            self._outbox.flush_releases()
        with self._recv_lock:
            try:
                while True:
                    if self._inbox:
                        waiting = self._inbox.waiting()  # its values still arriving (deferred.py): reads meanwhile
                        if waiting is not None:
                            if not arriving.wait_settled(self, waiting, deadline):
                                raise IpcError("ERR_TIMEOUT", f"link.receive: the {self._peer_name}'s message is still arriving "
                                               "(device memory over NCCL) at the timeout; it stays next")
                            continue
                        value = self._inbox.take()
                        self._defer_thread = threading.get_ident()
                        return value
                    if self._state == "closed":
                        raise self._closed_error("receive")
                    self._read_one(deadline, want_message=True)
            finally:
                self._close_socket_if_closed()

    def _has_buffered(self) -> bool:
        """Whether a whole frame was read ahead already (a stream link's buffer)."""
        return False

    def poll(self) -> int:
        """Processes whatever the peer sent without blocking (releases, goodbye, messages go to the
        inbox for receive()). Returns the number of messages receive() can take at once (a message
        whose device memory is still arriving over NCCL, and those behind it, are not counted yet).
        Does nothing while another thread is in receive() (which processes them anyway)."""
        self._defer_thread = None
        if self._leases_in.has_pending:
            self._outbox.flush_releases()
        if not self._recv_lock.acquire(blocking=False):
            return self._inbox.ready_count()
        try:
            while self._state != "closed" and self._may_read_ahead():
                if not self._read_one(0.0, want_message=False):
                    break
        finally:
            self._close_socket_if_closed()
            self._recv_lock.release()
        return self._inbox.ready_count()

    def _may_read_ahead(self) -> bool:
        """Whether reading more ahead of receive() stays within the link's and the process's bounds."""
        inbox = self._inbox
        return len(inbox) < self.inbox_limit and inbox.bytes < self.inbox_bytes and not received_memory.bound_reached()

    def __iter__(self) -> Iterator[Any]:
        """Yields messages until the link closes cleanly; raises if it closed with an error."""
        while True:
            try:
                yield self.receive()
            except IpcError as e:
                if e.code == "ERR_LINK_CLOSED":
                    return
                raise

    def _read_one(self, deadline: float | None, want_message: bool) -> bool:
        """Reads and handles one record. Returns False when nothing arrived before the deadline
        (raises ERR_TIMEOUT instead when a message is wanted)."""
        if deadline is not None:
            remaining = max(0.0, deadline - time.monotonic())
            p = select.poll()
            p.register(self._fd, select.POLLIN)
            if not p.poll(remaining * 1000):
                if want_message:
                    raise IpcError("ERR_TIMEOUT", f"link.receive: no message from the {self._peer_name} within the timeout")
                return False
        try:
            try:
                nbytes, anc, flags, _ = self._sock.recvmsg_into([self._rbuf], _ANC_BYTES, _CLOEXEC)
            except ConnectionResetError:
                # The peer closed with records of ours unread: the kernel says so before the records
                # the peer sent us (a GOODBYE or REFUSE among them); reading on returns them, then
                # EOF (as the Node side's reader does).
                nbytes, anc, flags, _ = self._sock.recvmsg_into([self._rbuf], _ANC_BYTES, _CLOEXEC)
        except InterruptedError:
            return True
        except OSError as e:
            if self._state == "closed":
                return False
            if e.errno in (errno.ECONNRESET, errno.ENOTCONN, errno.EBADF):
                self._peer_gone(f" (socket error {e.errno})")
                return True
            raise
        fds: list[int] = []
        cred = None
        for level, ctype, data in anc:
            if level == _SOL_SOCKET and ctype == _SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(data[: len(data) - len(data) % a.itemsize])
                fds.extend(a)
            elif level == _SOL_SOCKET and ctype == _SCM_CREDENTIALS:
                cred = data
        if self._state == "closed":
            close_fds(fds)
            return False
        if nbytes == 0 and not fds:
            self._peer_gone("")
            return True
        if flags & _TRUNCATED:
            close_fds(fds)
            if (flags & _TRUNCATED) == _CTRUNC and self._fds_lost_here(nbytes):
                return True
            self._shutdown(
                IpcError("ERR_FDS_TRUNCATED", f"the {self._peer_name} sent a message with more fds than a link accepts; they were closed")
                if flags & _CTRUNC else
                IpcError("ERR_FRAME_INVALID", f"the {self._peer_name} sent a record larger than {fr.MAX_FRAME_BYTES} bytes"), "local")
            return True
        self._on_record(self._rview, nbytes, fds)
        return True

    def _fds_lost_here(self, length: int) -> bool:
        return fds_lost_here(self, length)

    def _on_record(self, buf: memoryview, length: int, fds: list[int]) -> None:
        """Handles one frame of ``length`` bytes in ``buf`` that came with ``fds`` (owned from here): frame_dispatch.py."""
        dispatch_record(self, buf, length, fds)

    def _peer_gone(self, detail: str) -> None:
        self._shutdown(IpcError(
            "ERR_PEER_GONE",
            f"the {self._peer_name} ({self._peer_label()}) went away without closing the link{detail}: it exited, crashed or was killed"),
            "peer")

    def _peer_label(self) -> str:
        return f"pid {self._peer.pid}"

    def _handshake_step(self) -> None:
        """Reads what has arrived of the handshake, without waiting (a listener's accept() runs many side by side)."""
        with self._recv_lock:
            try:
                while self._state == "handshaking":
                    if not self._read_one(time.monotonic(), want_message=False):
                        break
            finally:
                self._close_socket_if_closed()

    def _wait_open(self, timeout: float) -> None:
        """Reads until the peer's HELLO (connect)."""
        deadline = time.monotonic() + timeout
        with self._recv_lock:
            try:
                while self._state == "handshaking":
                    if not self._read_one(deadline, want_message=False):
                        self._shutdown(IpcError("ERR_TIMEOUT", f"the {self._peer_name} did not complete the link handshake within {timeout} s"), "local")
            finally:
                self._close_socket_if_closed()
        if self._state == "closed":
            raise self._closed_error("complete the handshake")

    # -- closing ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Says goodbye and closes now; messages never received are dropped (their buffers closed), and
        device memory still on its way over NCCL (a TCP link) is cut short: end() waits for it.
        Idempotent."""
        if self._state != "closed" and self._hello_sent and not self._goodbye_sent:
            self._goodbye_sent = True
            self._outbox.send_now(fr.goodbye_frame())
        self._shutdown(None, "local")
        self._inbox.drain()

    def end(self, timeout: float | None = None) -> None:
        """Waits until the device memory this side sent over NCCL (a TCP link) arrived, then close(): a
        sender that ends right after ``send()`` does not cut its own transfer short. A peer that does not
        receive keeps it waiting; past ``timeout`` seconds it raises ERR_TIMEOUT and the link is closed at
        once, the transfer cut short. A transfer that failed does not make it raise. On a Unix link
        nothing moves beside the socket: end() is close(). Idempotent."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0):
            raise IpcError("ERR_INVALID_ARG", f"link.end: timeout must be None or a number of seconds >= 0, got {timeout!r}")
        if self._state != "closed":
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                for hook in list(self._drain_hooks):
                    hook(deadline)
            except BaseException:
                self.close()
                raise
        self.close()

    def __enter__(self) -> "Link":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _closed_error(self, what: str) -> IpcError:
        r = self._reason
        if r is not None:
            return IpcError(r.code, str(r))
        if self._closed_by == "peer":
            return IpcError("ERR_LINK_CLOSED", f"cannot {what}: the {self._peer_name} closed the link")
        return IpcError("ERR_LINK_CLOSED", f"cannot {what}: the link is closed; open a new one to talk again")

    def _shutdown(self, reason: IpcError | None, by: str) -> None:
        with self._state_lock:
            if self._state == "closed":
                return
            self._state = "closed"
            self._outbox.open = False
            self._reason = reason
            self._closed_by = by
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        # A thread in receive() wakes from the shutdown and closes the fd as it leaves (closing it
        # under a blocked recvmsg could hand the number to another file meanwhile).
        if self._recv_lock.acquire(blocking=False):
            try:
                self._sock.close()
            finally:
                self._recv_lock.release()
        # The peer can no longer use or release anything: every lease on this link ends, both ways.
        self._leases_in.close()
        self._leases_out.close()
        if by == "local":
            self._inbox.drain()
        hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            try:
                hook(self, reason)
            except Exception:  # noqa: BLE001 - the other hooks must still run
                pass

    def _close_socket_if_closed(self) -> None:
        """With the receive lock held: the socket goes once the link is closed (and the wake-up fd)."""
        if self._state == "closed":
            self._sock.close()
            wake, self._wake = self._wake, None
            if wake is not None:
                wake.close()

    def __repr__(self) -> str:
        return f"<cuda_ipc.Link {self._state} with the {self._peer_name} ({self._peer_label()})>"


_CREATE = object()
