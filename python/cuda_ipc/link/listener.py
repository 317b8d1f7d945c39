"""listen() and connect(): links between unrelated processes through a named Unix socket
(docs/PROTOCOL.md section 2.2; src/link/listener.ts). ``listen(name)`` is the twin of Node's
``listen``: with it two Python processes (a trainer and an inference worker) link directly; Node and
Python processes connect to it as to a Node listener. ``connect(name)`` joins a Node or Python listener.

``with listen("weights") as server: link = server.accept(timeout=30)``. The socket lives in the same
private per-user directory as Node's (created 0700; refused when it is not a private directory of
this user), or in ``directory``. A stale socket file of a dead listener is replaced; a live listener
on the name is ERR_ADDRESS_IN_USE.
"""
from __future__ import annotations

import errno
import os
import socket
import stat
import time
from collections.abc import Iterable

from ..errors import IpcError
from .link import _CREATE, Link
from .socket_path import default_socket_directory, socket_path


def _private_directory(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise IpcError("ERR_SOCKET_DIR_UNSAFE", f"the socket directory {path} is not a private directory of this user (it must be a real directory, owned by uid {os.getuid()}, "
                       f"mode 0700; it has mode 0{stat.S_IMODE(st.st_mode):o} and owner {st.st_uid}); remove it, or pass directory= to use another")


def _someone_listens(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    probe.setblocking(False)
    try:
        probe.connect(path)
        return True
    except BlockingIOError:
        return True  # backlog full: alive
    except OSError:
        return False
    finally:
        probe.close()


class Listener:
    """A named socket accepting links: ``accept(timeout=None)`` returns the next link whose handshake
    succeeded; ``close()`` stops listening and removes the socket file."""

    def __init__(self, name: str, path: str, sock: socket.socket, allow_uids: Iterable[int], handshake_timeout: float,
                 _token: object = None):
        if _token is not _CREATE:
            raise IpcError("ERR_INVALID_ARG", "use listen() to create a Listener")
        self.name = name
        self.path = path
        self._sock: socket.socket | None = sock
        self._ino = os.stat(path).st_ino
        self._allow_uids = tuple(allow_uids)
        self._handshake_timeout = handshake_timeout

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
        A connection that fails its handshake (hangs up, refused uid) is dropped and the next awaited."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            sock = self._sock
            if sock is None:
                raise IpcError("ERR_LINK_CLOSED", f"the listener '{self.name}' is closed")
            sock.settimeout(None if deadline is None else max(0.0, deadline - time.monotonic()))
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                raise IpcError("ERR_TIMEOUT", f"no connection to '{self.name}' within {timeout} s") from None
            conn.setblocking(True)
            link = Link(conn, peer_name=f"process connected to '{self.name}'", verify_peer=True, allow_uids=self._allow_uids, _token=_CREATE)
            if link.closed:
                continue  # refused (uid): the peer was told
            try:
                wait = self._handshake_timeout if deadline is None else min(self._handshake_timeout, max(0.001, deadline - time.monotonic()))
                link._wait_open(wait)
            except IpcError:
                link.close()
                if deadline is not None and time.monotonic() >= deadline:
                    raise IpcError("ERR_TIMEOUT", f"no connection to '{self.name}' completed its handshake within {timeout} s") from None
                continue
            return link

    def close(self) -> None:
        """Stops listening and removes the socket file (if it is still ours). Idempotent."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        sock.close()
        try:
            if os.stat(self.path).st_ino == self._ino:
                os.unlink(self.path)
        except OSError:
            pass

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_sock", None) is not None:
            self.close()


def listen(name: str, *, directory: str | None = None, allow_uids: Iterable[int] = (), backlog: int = 128,
           handshake_timeout: float = 10.0) -> Listener:
    """Listens for links on ``name``; see the module notes."""
    path = socket_path(name, directory)
    if directory is None:
        _private_directory(default_socket_directory())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        try:
            sock.bind(path)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            if _someone_listens(path):
                raise IpcError("ERR_ADDRESS_IN_USE", f"another process is already listening on '{name}' ({path}); pick another name or close that listener") from None
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            try:
                sock.bind(path)
            except OSError as e2:
                if e2.errno == errno.EADDRINUSE:
                    raise IpcError("ERR_ADDRESS_IN_USE", f"another process took '{name}' ({path}) at the same time") from None
                raise
        os.chmod(path, 0o666 if allow_uids else 0o600)
        sock.listen(backlog)
        return Listener(name, path, sock, allow_uids, handshake_timeout, _token=_CREATE)
    except BaseException:
        sock.close()
        raise


def connect(name: str, *, directory: str | None = None, allow_uids: Iterable[int] = (), timeout: float = 10.0) -> Link:
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
