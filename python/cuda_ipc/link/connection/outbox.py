"""The sending half of a link (src/link/connection/outbox.ts): each frame goes out in one sendmsg with its fds,
under the send lock, so that frames never interleave. The releases of what this process received
go out in RELEASE frames after the frame in flight, never blocking on that lock: whoever holds it
flushes after letting it go; a thread that closes what it just received has its releases deferred
until its next link call (its reply first, as on the Node side), at the latest RELEASE_DEFER_LIMIT
later (ReleaseFlusher). Where the native helper is loaded, a frame and the RELEASE waiting behind it
go in one system call (its ``cip_send_pair``: two records, one sendmmsg); without it, in two.
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
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ...errors import IpcError
from ...native.addon import helper_function
from ..transport import frame as fr

if TYPE_CHECKING:
    from ..lifetimes.lease import IncomingLeases

# Plain ints: the socket module's IntFlag members cost microseconds per operation.
_SOL_SOCKET = int(socket.SOL_SOCKET)
_SCM_RIGHTS = int(socket.SCM_RIGHTS)
_NOSIGNAL = int(socket.MSG_NOSIGNAL)
_NOW = int(socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)

class DeferredReleases(Protocol):
    """What the flusher calls on a link (the Link, link.py: it imports this module, so this one names
    only what it uses)."""

    def flush_deferred(self) -> None: ...


#: The longest a release waits for the receiving thread's next link call.
RELEASE_DEFER_LIMIT = 0.02


class Outbox:
    """Sends frames on ``sock`` for the link to ``peer_name``; ``leases``: the link's IncomingLeases,
    whose ended ids go out as RELEASE frames."""

    __slots__ = ("_sock", "_lock", "_peer_name", "_leases", "_send_pair", "open")

    def __init__(self, sock: socket.socket, peer_name: str, leases: IncomingLeases):
        self._sock = sock
        self._lock = threading.Lock()
        self._peer_name = peer_name
        self._leases = leases
        #: The native helper's cip_send_pair (native/py/link_send.c), or None: two sendmsg instead.
        self._send_pair = helper_function("cip_send_pair")
        #: True while the link is open (set by the link): release frames go out only then.
        self.open = False

    def send(self, data: fr.Buffer, fds: Sequence[int] = (), timeout: float | None = None) -> None:
        """Sends one frame with ``fds`` (borrowed), then any releases that waited for the lock.

        Backpressure: while the peer is not reading, the socket is full and this waits (the sending
        thread blocks; nothing queues up in this process). ``timeout`` (seconds) bounds the wait:
        ERR_TIMEOUT, and the frame was not sent."""
        anc = [(_SOL_SOCKET, _SCM_RIGHTS, array.array("i", fds))] if fds else []
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            try:
                # Releases waiting (a reply after closing what came): the frame and their RELEASE in one call.
                paired = self._send_pair is not None and self._leases.has_pending and self.open and self._sent_with_release(data, fds)
                while not paired:
                    try:
                        if deadline is None:
                            self._sock.sendmsg([data], anc, _NOSIGNAL)
                        else:
                            self._sock.sendmsg([data], anc, _NOW)
                        break
                    except InterruptedError:
                        continue
                    except BlockingIOError:
                        assert deadline is not None
                        left = deadline - time.monotonic()
                        p = select.poll()
                        p.register(self._sock.fileno(), select.POLLOUT)
                        if left <= 0 or not p.poll(left * 1000):
                            raise IpcError("ERR_TIMEOUT", f"link.send: the {self._peer_name} did not read for {timeout} s and its "
                                           "socket is full; the message was not sent (it is behind or stopped)") from None
            except OSError as e:
                raise self._send_failed(e) from None
        if self._leases.has_pending:
            self.flush_releases()

    def _sent_with_release(self, data: fr.Buffer, fds: Sequence[int]) -> bool:
        """With the send lock held: sends ``data`` and the RELEASE of the ids waiting in one sendmmsg.
        True when ``data`` went (its RELEASE too, or written after it here); False when the socket
        was full (nothing went, the ids wait again: send()'s own path takes over)."""
        assert self._send_pair is not None
        ids = self._leases.take_pending()
        if not ids or len(ids) > fr.MAX_RELEASE_IDS:
            self._leases.put_back(ids)
            return False
        release = fr.release_frame(ids)
        raw = data if type(data) is bytes else bytes(data)
        n: int = self._send_pair(self._sock.fileno(), raw, len(raw), struct.pack(f"{len(fds)}i", *fds) if fds else None, len(fds),
                                 release, len(release))
        if n <= 0:
            self._leases.put_back(ids)
            if n == 0:
                return False
            raise self._send_failed(OSError(-n, os.strerror(-n)))
        if n == 1:  # (the kernel took the frame, not the RELEASE: it goes as flush_releases would send it)
            try:
                self._write_release(release)
            except OSError:
                pass  # the link is going away: its close ends every lease on the sender's side
        return True

    def send_now(self, data: bytes) -> None:
        """A last frame (GOODBYE, REFUSE) without waiting for socket space; lost quietly if there is none."""
        try:
            with self._lock:
                self._sock.sendmsg([data], [], _NOW)
        except OSError:
            pass  # the peer is gone already

    def _send_failed(self, e: OSError) -> IpcError:
        if e.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ECONNREFUSED, errno.EBADF):
            return IpcError("ERR_LINK_CLOSED", f"cannot send: the {self._peer_name} has closed the link (or exited)")
        if e.errno == errno.EMSGSIZE:
            return IpcError("ERR_MESSAGE_TOO_LARGE", "cannot send: the frame is larger than the socket buffer allows")
        return IpcError("ERR_LINK_CLOSED", f"cannot send on the link: {e}")

    def flush_releases(self) -> None:
        """Sends ended lease ids. Called from lease ends (maybe in a GC finalizer on any thread): never
        blocks on the send lock; whoever holds it flushes after letting it go."""
        leases = self._leases
        while leases.has_pending and self.open:
            if not self._lock.acquire(blocking=False):
                return
            try:
                for frame in fr.release_frames(leases.take_pending()):
                    try:
                        self._write_release(frame)
                    except OSError:
                        return  # the link is going away: its close ends every lease on the sender's side
            finally:
                self._lock.release()

    def _write_release(self, frame: bytes) -> None:
        """Writes one RELEASE frame, the send lock held (a stream link writes it its own way)."""
        self._sock.sendmsg([frame], [], _NOSIGNAL)


class ReleaseFlusher:
    """Sends the deferred releases of links whose receiving thread did not use the link again within
    RELEASE_DEFER_LIMIT (a thread that closes a buffer, then works for a long time without the link).
    One daemon thread, started on first use; it wakes at most once per limit while releases wait."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._links: weakref.WeakSet[DeferredReleases] = weakref.WeakSet()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def kick(self, link: DeferredReleases) -> None:
        """``link`` has releases waiting: ``link.flush_deferred()`` runs within RELEASE_DEFER_LIMIT."""
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
                try:
                    link.flush_deferred()
                except Exception:  # noqa: BLE001 - the link reports its failures to its user
                    pass


flusher = ReleaseFlusher()
