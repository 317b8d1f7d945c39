"""listen() and connect(): links between unrelated processes through a named Unix socket
(docs/PROTOCOL.md section 2.2; src/link/connect/listener.ts). ``listen(name)`` is the twin of Node's
``listen``: with it two Python processes (a trainer and an inference worker) link directly; Node and
Python processes connect to it as to a Node listener. ``connect(name)`` joins a Node or Python listener.

``with listen("weights") as server: link = server.accept(timeout=30)``. The socket lives in the same
private per-user directory as Node's (created 0700; refused when it is not a private directory of
this user), or in ``directory``. A stale socket file of a dead listener is replaced; a live listener
on the name is ERR_ADDRESS_IN_USE.
"""
from __future__ import annotations

import errno
import json
import os
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterable

from ...errors import IpcError
from ..transport import frame as fr
from ..connection.link import _CREATE, Link
from ..transport.socket_file import FileIdentity, bind_socket_file, remove_if_same
from ..transport.socket_path import MY_UID, default_socket_directory, socket_path


def _private_directory(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise IpcError("ERR_SOCKET_DIR_UNSAFE", f"the socket directory {path} is not a private directory of this user (it must be a real directory, owned by uid {os.getuid()}, "
                       f"mode 0700; it has mode 0{stat.S_IMODE(st.st_mode):o} and owner {st.st_uid}); remove it, or pass directory= to use another")


#: Defaults, as the Node side's ListenOptions.
MAX_PENDING = 128
MAX_PENDING_PER_UID = 16
HANDSHAKE_TIMEOUT = 3.0
#: Most connections taken from the backlog in one round of accept(), so that a flood cannot keep it
#: from looking at the handshakes under way.
_ACCEPT_BATCH = 64


class Listener:
    """A named socket accepting links: ``accept(timeout=None)`` returns the next link whose handshake
    succeeded; ``close()`` stops listening and removes the socket file.

    Handshakes run side by side: accept() takes every waiting connection and returns the first that
    completes, so a peer that connects and stays silent delays nobody. Connections held at once in
    their handshake, or done and not yet returned, are bounded: ``max_pending`` in all and
    ``max_pending_per_uid`` for each uid other than this process's own; one more is refused with a
    REFUSE the peer's connect() reports as ERR_LISTENER_BUSY (and tries again until its timeout).
    A handshake not done within ``handshake_timeout`` seconds is dropped."""

    def __init__(self, name: str, path: str, sock: socket.socket, file: FileIdentity, allow_uids: Iterable[int], handshake_timeout: float,
                 max_message_bytes: int | None = None, max_pending: int = MAX_PENDING, max_pending_per_uid: int = MAX_PENDING_PER_UID,
                 _token: object = None):
        if _token is not _CREATE:
            raise IpcError("ERR_INVALID_ARG", "use listen() to create a Listener")
        self.name = name
        self.path = path
        self._sock: socket.socket | None = sock
        self._file = file
        self._allow_uids = tuple(allow_uids)
        self._handshake_timeout = handshake_timeout
        self._max_message_bytes = max_message_bytes
        self._max_pending = max_pending
        self._max_pending_per_uid = max_pending_per_uid
        #: Links in their handshake or done and not returned yet: link -> (peer uid, handshake deadline).
        self._pending: dict[Link, tuple[int, float]] = {}
        self._accept_lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return self._sock is None

    def fileno(self) -> int:
        """For select(): readable means a connection is waiting."""
        if self._sock is None:
            raise IpcError("ERR_LINK_CLOSED", f"the listener '{self.name}' is closed")
        return self._sock.fileno()

    def accept(self, timeout: float | None = None) -> Link:
        """The next connection, once its handshake succeeded (ERR_TIMEOUT after ``timeout`` seconds).
        A connection that fails its handshake (hangs up, refused uid, too slow) is dropped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._accept_lock:
            while True:
                sock = self._sock
                if sock is None:
                    raise IpcError("ERR_LINK_CLOSED", f"the listener '{self.name}' is closed")
                done = self._settle(time.monotonic())
                if done is not None:
                    return done
                now = time.monotonic()
                waits = [d for _, d in self._pending.values()]
                if deadline is not None:
                    waits.append(deadline)
                if deadline is not None and now >= deadline:
                    raise IpcError("ERR_TIMEOUT", f"no connection to '{self.name}' completed its handshake within {timeout} s")
                poller = select.poll()
                poller.register(sock.fileno(), select.POLLIN)
                by_fd = {}
                for link in self._pending:
                    by_fd[link.fileno()] = link
                    poller.register(link.fileno(), select.POLLIN)
                wait_ms = None if not waits else max(0, int((min(waits) - now) * 1000) + 1)
                for fd, _ in poller.poll(wait_ms):
                    if self._sock is None:
                        break
                    if fd == sock.fileno():
                        self._take_new(sock)
                    elif fd in by_fd:
                        by_fd[fd]._handshake_step()

    def _settle(self, now: float) -> Link | None:
        """Drops failed and overdue handshakes; returns (and lets go of) one that completed."""
        for link, (_, due) in list(self._pending.items()):
            if link.state == "open":
                del self._pending[link]
                return link
            if link.closed:
                del self._pending[link]
            elif now >= due:
                del self._pending[link]
                link.close()
        return None

    def _take_new(self, sock: socket.socket) -> None:
        """Takes the connections waiting in the backlog: each starts its handshake, or is refused."""
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    raise IpcError("ERR_FD_LIMIT", f"listener '{self.name}' cannot accept a connection: no file descriptor left "
                                   "(EMFILE/ENFILE: see `ulimit -n`)") from None
                raise
            try:
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
            except OSError:
                conn.close()
                continue
            busy = self._busy(uid)
            if busy is not None:
                conn.setblocking(False)
                try:
                    conn.send(fr.refuse_frame(fr.REFUSE_BUSY, f"listener '{self.name}' (pid {os.getpid()}) has no room: {busy}; try again later"))
                except OSError:
                    pass
                conn.close()
                continue
            conn.setblocking(True)
            link = Link(conn, peer_name=f"process connected to '{self.name}'", verify_peer=True, allow_uids=self._allow_uids,
                        max_message_bytes=self._max_message_bytes, _token=_CREATE)
            if link.closed:
                continue  # refused (uid): the peer was told
            self._pending[link] = (uid, time.monotonic() + self._handshake_timeout)

    def _busy(self, uid: int) -> str | None:
        if len(self._pending) >= self._max_pending:
            waiting = "connection is" if self._max_pending == 1 else "connections are"
            return f"{self._max_pending} {waiting} already waiting for their handshake or for accept() (max_pending)"
        if uid != MY_UID and sum(1 for u, _ in self._pending.values() if u == uid) >= self._max_pending_per_uid:
            n = self._max_pending_per_uid
            return f"{n} {'connection' if n == 1 else 'connections'} of uid {uid} {'is' if n == 1 else 'are'} already waiting for their handshake or for accept() (max_pending_per_uid)"
        return None

    def close(self) -> None:
        """Stops listening and removes the socket file (if it is still ours); connections still in
        their handshake are closed. Idempotent."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        sock.close()
        remove_if_same(self.path, self._file)
        for link in list(self._pending):
            link.close()
        self._pending.clear()

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_sock", None) is not None:
            self.close()


def listen(name: str, *, directory: str | None = None, allow_uids: Iterable[int] = (), backlog: int = 128,
           handshake_timeout: float = HANDSHAKE_TIMEOUT, max_message_bytes: int | None = None,
           max_pending: int = MAX_PENDING, max_pending_per_uid: int = MAX_PENDING_PER_UID) -> Listener:
    """Listens for links on ``name``; see the module notes. ``max_message_bytes`` bounds each accepted
    link's messages (default 1 GiB); ``max_pending``, ``max_pending_per_uid`` and ``handshake_timeout``
    bound connections not yet returned by accept() (see Listener)."""
    path = socket_path(name, directory)
    for value, what in ((max_pending, "max_pending"), (max_pending_per_uid, "max_pending_per_uid")):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise IpcError("ERR_INVALID_ARG", f"{what} must be an integer of at least 1, not {value!r}")
    if directory is None:
        _private_directory(default_socket_directory())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        try:
            file = bind_socket_file(sock, path, name, 0o666 if allow_uids else 0o600)
        except NotADirectoryError as e:
            raise _not_a_directory("listen", path) from e
        try:
            sock.listen(backlog)
            sock.setblocking(False)
            return Listener(name, path, sock, file, allow_uids, handshake_timeout, max_message_bytes, max_pending, max_pending_per_uid,
                            _token=_CREATE)
        except BaseException:
            remove_if_same(path, file)
            raise
    except BaseException:
        sock.close()
        raise


def connect(name: str, *, directory: str | None = None, allow_uids: Iterable[int] = (), timeout: float = 10.0,
            max_message_bytes: int | None = None) -> Link:
    """Connects to the Node ``listen(name)`` (a socket in the same per-user directory, or ``directory``)
    and returns the link once its handshake succeeded. Waits for the listener to appear, up to
    ``timeout`` seconds (0: try once, and fail at once with ERR_NO_LISTENER when nobody listens; a
    listener that is there gets 10 s for the handshake), as the Node side's connect() does; a
    listener that refuses as busy (ERR_LISTENER_BUSY) is tried again until then too."""
    path = socket_path(name, directory)
    deadline = time.monotonic() + timeout
    pause = [0.005]
    busy: IpcError | None = None
    while True:
        sock = _reach(name, path, deadline, timeout, pause)
        link = Link(sock, peer_name=f"listener '{name}'", verify_peer=True, allow_uids=allow_uids,
                    max_message_bytes=max_message_bytes, _token=_CREATE)
        try:
            if link.closed:
                raise link._closed_error("connect")
            # Try once (0) reaches the listener once; its handshake still gets the default time.
            link._wait_open(10.0 if timeout == 0 else max(0.001, deadline - time.monotonic()))
            return link
        except IpcError as e:
            # A last try that the deadline cut short is still that listener being busy.
            still_busy = busy is not None and e.code == "ERR_TIMEOUT"
            if (e.code != "ERR_LISTENER_BUSY" and not still_busy) or timeout == 0:
                raise
            if not still_busy:
                busy = e
            left = deadline - time.monotonic()
            if left <= 0 or still_busy:
                raise IpcError("ERR_LISTENER_BUSY", f"connect: {busy}; it stayed so for {timeout} s (the timeout)") from None
            time.sleep(min(pause[0], left))
            pause[0] = min(pause[0] * 2, 0.25)


def _not_a_directory(what: str, path: str) -> NotADirectoryError:
    """ENOTDIR (``directory``, or a directory above it, is a file): says which path and what to pass
    (listener.ts notADirectory)."""
    d = os.path.dirname(path)
    return NotADirectoryError(errno.ENOTDIR, f"{what}: {json.dumps(d)} is not a directory (directory= must name the directory the socket file is in)", d)


def _reach(name: str, path: str, deadline: float, timeout: float, pause: list[float]) -> socket.socket:
    """A socket connected to ``path``, tried again while nobody listens there yet, until the deadline."""
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(path)
            return sock
        except OSError as e:
            sock.close()
            if e.errno in (errno.ENOENT, errno.ECONNREFUSED):
                why = "does not exist" if e.errno == errno.ENOENT else "is a stale socket left by a process that is gone"
                left = deadline - time.monotonic()
                if timeout == 0:
                    raise IpcError("ERR_NO_LISTENER", f"no listener named '{name}': {path} {why}; start the listening process first") from None
                if left <= 0:
                    raise IpcError("ERR_TIMEOUT", f"connect: no listener named '{name}' ({path} {why}), and none appeared within {timeout} s (the timeout)") from None
                time.sleep(min(pause[0], left))
                pause[0] = min(pause[0] * 2, 0.25)
                continue
            if e.errno in (errno.EACCES, errno.EPERM):
                raise IpcError("ERR_PEER_REFUSED", f"permission denied connecting to '{name}' ({path}): it belongs to another user") from None
            if e.errno == errno.ENOTDIR:
                raise _not_a_directory("connect", path) from e
            if e.errno != errno.EAGAIN or time.monotonic() >= deadline:
                if e.errno == errno.EAGAIN:
                    raise IpcError("ERR_TIMEOUT", f"the listener '{name}' stayed too busy to accept a connection for {timeout} s") from None
                raise
            time.sleep(0.005)  # backlog full: the listener is alive but behind
