"""Links: one connection between two processes over a Unix SOCK_SEQPACKET socket, carrying structured
messages with file descriptors, the same protocol as the Node side (docs/PROTOCOL.md).

``parent_link()`` in a process started by Node's ``spawnPython``/``spawn``; ``connect(name)`` to a
Node ``listen(name)``. The API is synchronous: ``send`` writes one frame, ``receive`` blocks (with an
optional timeout) and processes control frames (RELEASE, GOODBYE, ...) as they come. A process that
only sends can call ``poll()`` now and then so that the peer's releases and departure are noticed.
"""
from __future__ import annotations

import array
import errno
import os
import re
import select
import socket
import struct
import threading
import time
import weakref
from collections import deque
from typing import Any, Iterator, NamedTuple

from . import frame as fr
from .codec import Malformed, decode_message, dispose_values, encode_message
from .errors import IpcError
from .lease import IncomingLeases, OutgoingLeases, release_hold

LINK_FD_ENV = "CUDA_IPC_LINK_FD"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_MAX_PATH_BYTES = 107
_ANC_BYTES = socket.CMSG_SPACE(4 * fr.MAX_FDS) + socket.CMSG_SPACE(struct.calcsize("3i"))
_MY_UID = os.getuid()
# Plain ints: the socket module's IntFlag members cost microseconds per operation.
_TRUNCATED = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)
_CTRUNC = int(socket.MSG_CTRUNC)
_CLOEXEC = int(socket.MSG_CMSG_CLOEXEC)
_SOL_SOCKET = int(socket.SOL_SOCKET)
_SCM_RIGHTS = int(socket.SCM_RIGHTS)
_SCM_CREDENTIALS = int(getattr(socket, "SCM_CREDENTIALS", -1))
_NOSIGNAL = int(socket.MSG_NOSIGNAL)


class PeerCredentials(NamedTuple):
    """Who is on the other end, as the kernel reports it."""

    pid: int
    uid: int
    gid: int


class LeaseCounts(NamedTuple):
    count: int
    bytes: int


def default_socket_directory() -> str:
    """Where listen()/connect() put sockets by default, as the Node side computes it:
    ``${XDG_RUNTIME_DIR or the temp dir}/cuda-ipc-<uid>``."""
    base = os.environ.get("XDG_RUNTIME_DIR") or ""
    if not base:
        # Node's os.tmpdir() on POSIX.
        base = os.environ.get("TMPDIR") or os.environ.get("TMP") or os.environ.get("TEMP") or "/tmp"
        if len(base) > 1 and base.endswith("/"):
            base = base[:-1]
    return os.path.join(base, f"cuda-ipc-{_MY_UID}")


def socket_path(name: str, directory: str | None = None) -> str:
    """Validates ``name`` and returns its socket's path: ``<dir>/<name>.sock``."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise IpcError(
            "ERR_INVALID_ARG",
            f"link name {name!r} is not valid: use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit (no slashes)",
        )
    path = os.path.join(directory if directory is not None else default_socket_directory(), f"{name}.sock")
    if len(path.encode()) > _MAX_PATH_BYTES:
        raise IpcError("ERR_INVALID_ARG", f"the socket path {path} is longer than {_MAX_PATH_BYTES} bytes, the limit of a Unix socket address; use a shorter name or directory")
    return path


def _close_fds(fds) -> None:
    for fd in fds or ():
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


class Link:
    """A connection to another process (see the module notes). Use ``parent_link()`` or ``connect()``.

    ``send(value)``: JSON data, big ints, bytes/array.array/memoryview (copied into the frame), and
    objects with a transfer handler: HostBuffer, received device buffers, CUDA tensors/arrays (shared
    zero-copy, leased to the peer until it releases them). ``receive(timeout=None)`` returns the next
    message; received buffers are leased from the peer until you close them (or they are collected).
    A buffer closed by the thread that received it, before that thread uses the link again, is
    released with that thread's next link call (``send``, ``receive``, ``poll``), after its frame: a
    reply goes out first, as on the Node side. ``close()`` says goodbye; a peer that died shows as
    ERR_PEER_GONE.
    """

    def __init__(self, sock: socket.socket, *, peer_name: str, verify_peer: bool = False,
                 allow_uids=(), _token=None):
        if _token is not _CREATE:
            raise IpcError("ERR_INVALID_ARG", "Link cannot be constructed directly; use parent_link() or connect()")
        self._sock = sock
        self._fd = sock.fileno()
        self._peer_name = peer_name
        self._allow_uids = tuple(allow_uids)
        self._state = "handshaking"
        self._reason: IpcError | None = None
        self._closed_by: str | None = None
        self._hello_sent = False
        self._goodbye_sent = False
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._state_lock = threading.RLock()
        self._inbox: deque = deque()
        self._rbuf = bytearray(fr.MAX_FRAME_BYTES)
        self._rview = memoryview(self._rbuf)
        self._leases_out = OutgoingLeases()
        self._leases_in = IncomingLeases(self._lease_ended)
        # The thread that received the last message and has not used the link since: the releases
        # of what it closes meanwhile go out after its next link call (its reply first), as Node
        # sends them on a microtask after the handler's reply.
        self._defer_thread: int | None = None
        #: Per-link state of transfer handlers (pools sent/received), dropped at close.
        self.handler_state: dict[str, Any] = {}
        self._close_hooks: list = []
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

    def on_close(self, hook) -> None:
        """Runs ``hook(link, reason)`` once when the link closes (transfer handlers drop per-link state)."""
        if self._state == "closed":
            hook(self, self._reason)
        else:
            self._close_hooks.append(hook)

    # -- sending ----------------------------------------------------------------------------------

    def send(self, value: Any) -> None:
        """Sends ``value`` in one frame with all its fds. Raises ERR_NOT_TRANSFERABLE /
        ERR_MESSAGE_TOO_LARGE without sending, ERR_LINK_CLOSED / ERR_PEER_GONE once closed."""
        self._defer_thread = None
        if self._state == "closed":
            raise self._closed_error("send")
        msg = encode_message(value, self)
        try:
            self._send_frame(msg.frame, msg.fds)
        except BaseException:
            for _, hold in msg.holds:
                release_hold(hold)  # nothing was leased: the peer never sees these ids
            raise
        finally:
            _close_fds(msg.owned_fds)
        for lease_id, hold in msg.holds:
            self._leases_out.add(lease_id, hold)
        for commit in msg.commits:
            commit()

    def _send_frame(self, data, fds=()) -> None:
        anc = [(_SOL_SOCKET, _SCM_RIGHTS, array.array("i", fds))] if fds else []
        with self._send_lock:
            try:
                while True:
                    try:
                        self._sock.sendmsg([data], anc, _NOSIGNAL)
                        break
                    except InterruptedError:
                        continue
            except OSError as e:
                raise self._send_failed(e) from None
        if self._leases_in.has_pending:
            self._flush_releases()

    def _send_failed(self, e: OSError) -> IpcError:
        if e.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ECONNREFUSED, errno.EBADF):
            return IpcError("ERR_LINK_CLOSED", f"cannot send: the {self._peer_name} has closed the link (or exited)")
        if e.errno == errno.EMSGSIZE:
            return IpcError("ERR_MESSAGE_TOO_LARGE", "cannot send: the frame is larger than the socket buffer allows")
        return IpcError("ERR_LINK_CLOSED", f"cannot send on the link: {e}")

    def _lease_ended(self) -> None:
        if self._defer_thread == threading.get_ident():
            _flusher.kick(self)  # after this thread's next send/receive/poll, or within RELEASE_DEFER_LIMIT
            return
        self._flush_releases()

    def _flush_releases(self) -> None:
        """Sends ended lease ids. Called from lease ends (maybe in a GC finalizer on any thread): never
        blocks on the send lock; whoever holds it flushes after letting it go."""
        while self._leases_in.has_pending and self._state == "open":
            if not self._send_lock.acquire(blocking=False):
                return
            try:
                ids = self._leases_in.take_pending()
                for i in range(0, len(ids), fr.MAX_RELEASE_IDS):
                    try:
                        self._sock.sendmsg([fr.release_frame(ids[i:i + fr.MAX_RELEASE_IDS])], [], _NOSIGNAL)
                    except OSError:
                        return  # the link is going away: its close ends every lease on the sender's side
            finally:
                self._send_lock.release()

    def _send_control(self, data: bytes) -> None:
        self._send_frame(data)

    def _send_hello(self) -> None:
        self._hello_sent = True
        try:
            self._send_control(fr.hello_frame())
        except IpcError:
            pass  # the peer is gone already; the receive side reports it

    def _refuse(self) -> None:
        p = self._peer
        text = f"uid {p.uid} is not allowed by the process at the other end (pid {os.getpid()}, uid {_MY_UID})"
        try:
            self._sock.sendmsg([fr.refuse_frame(fr.REFUSE_UID, text)], [], socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
        except OSError:
            pass
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
            self._flush_releases()
        with self._recv_lock:
            try:
                while True:
                    if self._inbox:
                        value = self._take(self._inbox.popleft())
                        self._defer_thread = threading.get_ident()
                        return value
                    if self._state == "closed":
                        raise self._closed_error("receive")
                    self._read_one(deadline, want_message=True)
            finally:
                self._close_socket_if_closed()

    def poll(self) -> int:
        """Processes whatever the peer sent without blocking (releases, goodbye, messages go to the
        inbox for receive()). Returns the number of messages waiting. Does nothing while another
        thread is in receive() (which processes them anyway)."""
        self._defer_thread = None
        if self._leases_in.has_pending:
            self._flush_releases()
        if not self._recv_lock.acquire(blocking=False):
            return len(self._inbox)
        try:
            while self._state != "closed":
                if not self._read_one(0.0, want_message=False):
                    break
        finally:
            self._close_socket_if_closed()
            self._recv_lock.release()
        return len(self._inbox)

    def __iter__(self) -> Iterator[Any]:
        """Yields messages until the link closes cleanly; raises if it closed with an error."""
        while True:
            try:
                yield self.receive()
            except IpcError as e:
                if e.code == "ERR_LINK_CLOSED":
                    return
                raise

    @staticmethod
    def _take(entry):
        ok, value = entry
        if ok:
            return value
        raise value

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
            _close_fds(fds)
            return False
        if nbytes == 0 and not fds:
            self._peer_gone("")
            return True
        if flags & _TRUNCATED:
            _close_fds(fds)
            self._shutdown(
                IpcError("ERR_FDS_TRUNCATED", f"the {self._peer_name} sent a message with more fds than a link accepts; they were closed")
                if flags & _CTRUNC else
                IpcError("ERR_FRAME_INVALID", f"the {self._peer_name} sent a record larger than {fr.MAX_FRAME_BYTES} bytes"), "local")
            return True
        self._on_record(nbytes, fds)
        return True

    def _on_record(self, length: int, fds: list[int]) -> None:
        buf = self._rview
        try:
            ftype, flags, payload_length = fr.parse_header(buf, length, len(fds))
        except IpcError as e:
            _close_fds(fds)
            self._shutdown(e, "local")
            return
        if ftype in (fr.MESSAGE, fr.RELEASE) and self._state != "open":
            _close_fds(fds)
            what = "message" if ftype == fr.MESSAGE else "RELEASE"
            self._shutdown(IpcError("ERR_FRAME_INVALID", f"the {self._peer_name} sent a {what} before the link handshake"), "local")
            return
        if ftype == fr.MESSAGE:
            try:
                value, owned = decode_message(flags, buf[fr.HEADER_BYTES:length], fds, self, self._leases_in)
            except Malformed as e:
                self._shutdown(e, "local")
                return
            except IpcError as e:
                self._inbox.append((False, e))
                return
            self._inbox.append((True, value))
            return
        if ftype == fr.RELEASE:
            try:
                ids = fr.read_release_ids(buf, payload_length)
            except IpcError as e:
                self._shutdown(e, "local")
                return
            unknown = self._leases_out.release(ids)
            if unknown is not None:
                self._shutdown(IpcError(
                    "ERR_FRAME_INVALID",
                    f"the {self._peer_name} released lease {unknown}, which this link never granted or had already ended"), "local")
            return
        if ftype == fr.HELLO:
            if self._state != "handshaking":
                self._shutdown(IpcError("ERR_FRAME_INVALID", f"the {self._peer_name} sent a second HELLO"), "local")
                return
            if not self._hello_sent:
                self._send_hello()
            if self._state != "closed":
                self._state = "open"
            return
        if ftype == fr.GOODBYE:
            self._shutdown(None, "peer")
            return
        if ftype == fr.REFUSE:
            text = bytes(buf[fr.HEADER_BYTES + 2:min(length, fr.HEADER_BYTES + 2 + 1024)]).decode("utf-8", "replace")
            self._shutdown(IpcError("ERR_PEER_REFUSED", f"the {self._peer_name} refused the link: {text}"), "peer")

    def _peer_gone(self, detail: str) -> None:
        self._shutdown(IpcError(
            "ERR_PEER_GONE",
            f"the {self._peer_name} (pid {self._peer.pid}) went away without closing the link{detail}: it exited, crashed or was killed"),
            "peer")

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
        """Says goodbye and closes now; messages never received are dropped (their buffers closed).
        Idempotent."""
        if self._state != "closed" and self._hello_sent and not self._goodbye_sent:
            self._goodbye_sent = True
            try:
                with self._send_lock:
                    self._sock.sendmsg([fr.goodbye_frame()], [], socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
            except OSError:
                pass  # the peer is gone already
        self._shutdown(None, "local")
        self._drain_inbox()

    end = close

    def __enter__(self) -> "Link":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _drain_inbox(self) -> None:
        while self._inbox:
            ok, value = self._inbox.popleft()
            if ok:
                dispose_values(_owned_of(value))

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
            self._drain_inbox()
        hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            try:
                hook(self, reason)
            except Exception:  # noqa: BLE001 - the other hooks must still run
                pass

    def _close_socket_if_closed(self) -> None:
        """With the receive lock held: the socket goes once the link is closed."""
        if self._state == "closed":
            self._sock.close()

    def __repr__(self) -> str:
        return f"<cuda_ipc.Link {self._state} with the {self._peer_name} (pid {self._peer.pid})>"


#: The longest a release waits for the receiving thread's next link call.
RELEASE_DEFER_LIMIT = 0.02


class _ReleaseFlusher:
    """Sends the deferred releases of links whose receiving thread did not use the link again within
    RELEASE_DEFER_LIMIT (a thread that closes a buffer, then works for a long time without the link).
    One daemon thread, started on first use; it wakes at most once per limit while releases wait."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._links: "weakref.WeakSet[Link]" = weakref.WeakSet()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def kick(self, link: "Link") -> None:
        self._links.add(link)
        if not self._event.is_set():
            self._event.set()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    t = threading.Thread(target=self._run, name="cuda_ipc-release-flusher", daemon=True)
                    t.start()
                    self._thread = t

    def _run(self) -> None:
        while True:
            self._event.wait()
            time.sleep(RELEASE_DEFER_LIMIT)
            self._event.clear()
            links = list(self._links)
            self._links.clear()
            for link in links:
                if link._leases_in.has_pending:
                    link._defer_thread = None
                    try:
                        link._flush_releases()
                    except Exception:  # noqa: BLE001 - the link reports its failures to its user
                        pass


_flusher = _ReleaseFlusher()


def _owned_of(value) -> list:
    """Objects with close() inside a received message (to dispose of unread messages)."""
    out = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif v is not None and not isinstance(v, (str, int, float, bytes)) and callable(getattr(v, "close", None)):
            out.append(v)
    return out


_CREATE = object()
_parent: Link | None = None
_parent_lock = threading.Lock()


def parent_link() -> Link:
    """The link to the Node process that started this one (``spawnPython`` / ``spawn``). The same Link
    every call. The parent is trusted as such (it chose how to start us): its uid is not checked."""
    global _parent
    with _parent_lock:
        if _parent is not None:
            return _parent
        value = os.environ.get(LINK_FD_ENV)
        if value is None:
            raise IpcError("ERR_NOT_SPAWNED", f"parent_link(): this process was not started by cuda-ipc's spawnPython() ({LINK_FD_ENV} is not set); start it from Node with spawnPython(module)")
        try:
            fd = int(value)
            sock = socket.socket(fileno=fd)
        except (ValueError, OSError):
            raise IpcError("ERR_NOT_SPAWNED", f"parent_link(): {LINK_FD_ENV}={value} does not name a link socket in this process") from None
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
            sock.detach()
            raise IpcError("ERR_NOT_SPAWNED", f"parent_link(): {LINK_FD_ENV}={value} does not name a link socket in this process")
        # Keep it away from our own children and from anyone reading the environment later.
        del os.environ[LINK_FD_ENV]
        sock.set_inheritable(False)
        sock.setblocking(True)
        _parent = Link(sock, peer_name="parent process", _token=_CREATE)
        return _parent


def connect(name: str, *, directory: str | None = None, allow_uids=(), timeout: float = 10.0) -> Link:
    """Connects to the Node ``listen(name)`` (a socket in the same per-user directory, or ``directory``)
    and returns the link once its handshake succeeded."""
    path = socket_path(name, directory)
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(path)
            break
        except OSError as e:
            sock.close()
            if e.errno == errno.ENOENT:
                raise IpcError("ERR_NO_LISTENER", f"no listener named '{name}': {path} does not exist; start the listening process first") from None
            if e.errno == errno.ECONNREFUSED:
                raise IpcError("ERR_NO_LISTENER", f"no listener named '{name}': {path} is a stale socket left by a process that is gone") from None
            if e.errno in (errno.EACCES, errno.EPERM):
                raise IpcError("ERR_PEER_REFUSED", f"permission denied connecting to '{name}' ({path}): it belongs to another user") from None
            if e.errno != errno.EAGAIN or time.monotonic() >= deadline:
                if e.errno == errno.EAGAIN:
                    raise IpcError("ERR_TIMEOUT", f"the listener '{name}' stayed too busy to accept a connection for {timeout} s") from None
                raise
            time.sleep(0.005)  # backlog full: the listener is alive but behind
    link = Link(sock, peer_name=f"listener '{name}'", verify_peer=True, allow_uids=allow_uids, _token=_CREATE)
    if link.closed:
        raise link._closed_error("connect")
    link._wait_open(max(0.001, deadline - time.monotonic()))
    return link
