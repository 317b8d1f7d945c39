"""Links over a byte stream: TCP, optionally inside TLS (docs/PROTOCOL.md 1.1; tcp.py opens them).

The same frames as on a Unix socket, back to back: a frame is its 16-byte header and then exactly
``payload length`` bytes. What differs from a SOCK_SEQPACKET record:

- the receiver checks each header as soon as its 16 bytes arrived, before it buffers the payload
  (no fds, no memfd flag, no frame rings; a MESSAGE up to ``max_message_bytes`` travels inline,
  every other frame at most 128 KiB), so a lying length costs nothing;
- a frame is written whole or the link breaks: a stream cannot skip half a frame.

The socket is non-blocking and waits happen in poll(), so that one thread can read while others
write; under TLS every call into the SSL object holds a short lock (OpenSSL does not allow two
threads in one connection) and never waits while holding it.

TcpLink is a Link whose socket part is transport/tcp_transport.py's StreamSocket (the socket) and
FrameReader (frames out of the stream), and StreamOutbox here (frames into it).
"""
from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ...errors import IpcError
from ..transport import frame as fr
from ..transport.tcp_transport import _WRITE_CHUNK, POLLIN, POLLOUT, FrameReader, RemoteAddress, StreamEnded, StreamSocket  # noqa: F401  (POLLIN: re-exported)
from .link import Link, PeerCredentials
from .outbox import Outbox

if TYPE_CHECKING:
    from ..lifetimes.lease import IncomingLeases


#: A frame this short takes the RELEASE of the ids waiting behind it in the same write (a copy of it
#: costs less than a second system call, and the peer gets both in one segment).
PAIR_LIMIT = 16 * 1024


class StreamOutbox(Outbox):
    """The sending half of a stream link (Outbox's rules): each frame written whole under the send lock.
    ``broken(error)`` closes the link when a frame could only be written in part."""

    __slots__ = ("_conn", "_broken")

    def __init__(self, conn: StreamSocket, peer_name: str, leases: IncomingLeases, broken: Callable[[IpcError], None]):
        super().__init__(conn.sock, peer_name, leases)
        self._conn = conn
        self._broken = broken

    def send(self, data: fr.Buffer, fds: Sequence[int] = (), timeout: float | None = None) -> None:
        """Sends one frame (no fds on a stream). With ``timeout``: ERR_TIMEOUT and nothing sent when the
        socket had no room for that long; a frame already begun that cannot finish in time closes the
        link with ERR_TIMEOUT (the stream cannot skip the rest)."""
        if fds:
            raise IpcError("ERR_NOT_TRANSFERABLE", "link.send: a TCP link carries no file descriptors")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if deadline is not None and not self._conn.wait(POLLOUT, deadline):
                raise IpcError("ERR_TIMEOUT", f"link.send: the {self._peer_name} did not read for {timeout} s and its "
                               "socket is full; the message was not sent (it is behind or stopped)")
            if self._leases.has_pending and self.open and len(data) <= PAIR_LIMIT:
                # A reply after closing what came: its RELEASE behind it, one write (PROTOCOL.md 5).
                # Ids taken here end with the link if the write fails: its close ends them all.
                data = b"".join([data, *fr.release_frames(self._leases.take_pending())])
            try:
                self._write_all(data, deadline)
            except TimeoutError:
                error = IpcError("ERR_TIMEOUT", f"link.send: the {self._peer_name} stopped reading in the middle of a frame for "
                                 f"{timeout} s; a TCP link cannot drop half a frame, so the link was closed")
                self._broken(error)
                raise error from None
            except OSError as e:
                raise self._send_failed(e) from None
        if self._leases.has_pending:
            self.flush_releases()

    def send_now(self, data: bytes) -> None:
        """A last frame (GOODBYE, REFUSE), written as far as the socket takes it without waiting."""
        try:
            with self._lock:
                view = memoryview(data)
                while view:
                    n = self._conn.send(view)
                    if n is None:
                        return
                    view = view[n:]
        except OSError:
            pass

    def _write_release(self, frame: bytes) -> None:
        self._write_all(frame, None)

    def _write_all(self, data: fr.Buffer, deadline: float | None) -> None:
        """Writes every byte of ``data`` (the send lock held); TimeoutError at the deadline."""
        conn = self._conn
        view = memoryview(data).cast("B")
        sent, size = 0, len(view)
        while sent < size:
            n = conn.send(view[sent:sent + _WRITE_CHUNK])
            if n is None:
                if not conn.wait(conn.want, deadline):
                    raise TimeoutError
                continue
            sent += n


class TcpLink(Link):
    """A Link over TCP (or TLS): the same messages, leases and close rules, without fds (PROTOCOL.md
    1.1). What crosses is copied: a HostBuffer arrives as a new one holding its bytes (host_bytes_transfer.py).
    ``remote`` says where the peer is; ``peer`` (process credentials) does not exist here."""

    _features = fr.OUR_FEATURES | fr.FEATURE_NCCL

    def __init__(self, conn: StreamSocket, *, peer_name: str, max_message_bytes: int | None = None, _token: object = None):
        self._conn = conn
        #: Whether the peer's HELLO came (it may say GOODBYE in the same read, before accept() returns the link).
        self.opened = False
        #: Device memory on a tls:// link moves over NCCL, which does not encrypt: refused both ways
        #: (ERR_NCCL_UNENCRYPTED) unless this is True (``allow_nccl_in_clear=True`` of connect()/listen()).
        self.allow_nccl_in_clear = False
        super().__init__(conn.sock, peer_name=peer_name, max_message_bytes=max_message_bytes, _token=_token)

    def _start(self, sock: socket.socket, verify_peer: bool) -> None:
        self._reader = FrameReader(self._conn)
        self._outbox = StreamOutbox(self._conn, self._peer_name, self._leases_in, lambda e: self._shutdown(e, "local"))
        self._send_hello()  # after authentication (tcp.py): nothing of the peer to check here

    @property
    def peer(self) -> PeerCredentials:
        """Raises ERR_UNSUPPORTED: no pid or uid crosses machines (see ``remote``)."""
        raise IpcError("ERR_UNSUPPORTED", "link.peer: a TCP link knows no pid or uid of its peer (nothing the kernel vouches "
                       "for crosses machines); link.remote has its address and port")

    @property
    def remote(self) -> RemoteAddress:
        return self._conn.remote

    @property
    def transport(self) -> str:
        return "tcp"

    @property
    def tls(self) -> bool:
        return self._conn.tls

    def _peer_label(self) -> str:
        r = self._conn.remote
        return f"at {'[' + r.address + ']' if r.family == 'IPv6' else r.address}:{r.port}"

    def _peer_gone(self, detail: str) -> None:
        self._shutdown(IpcError(
            "ERR_PEER_GONE",
            f"the {self._peer_name} ({self._peer_label()}) went away without closing the link{detail}: it exited, crashed or "
            "was killed, or its machine or the network went down"), "peer")

    def _has_buffered(self) -> bool:
        return self._reader.buffered()

    def _send_large(self, frame: bytearray, fds: list[int], timeout: float | None) -> None:
        """A message over a frame travels inline on a TCP link, to a peer that takes large messages."""
        if not self._peer_features & fr.FEATURE_LARGE_MESSAGES:
            raise IpcError("ERR_MESSAGE_TOO_LARGE", f"link.send: the message needs {len(frame) - fr.HEADER_BYTES} bytes, more than a "
                           f"frame holds, and the {self._peer_name} does not take larger messages", limit="max_message_bytes")
        self._outbox.send(frame, fds, timeout)

    def _read_one(self, deadline: float | None, want_message: bool) -> bool:
        """The next frame of the stream, then every whole frame that is here already (so that fileno()
        turning readable stays the sign of more to read)."""
        reader = self._reader
        handled = False
        while True:
            try:
                frame = reader.next_frame(deadline, self.max_message_bytes)
            except StreamEnded as e:
                if self._state == "closed":
                    return False
                self._peer_gone(e.detail)
                return True
            except IpcError as e:
                if self._state == "closed":
                    return False
                if e.code == "ERR_MESSAGE_TOO_LARGE":
                    self._outbox.send_now(fr.refuse_frame(fr.REFUSE_TOO_LARGE, str(e)))
                self._shutdown(e, "local")
                return True
            if frame is None:
                break
            if self._state == "closed":
                return False
            self._on_record(frame, len(frame), [])
            handled = True
            self.opened = self.opened or self._state == "open"
            if self._state == "closed" or not self._may_read_ahead() or not reader.buffered():
                return True
            deadline = 0.0
        if not handled and want_message:
            raise IpcError("ERR_TIMEOUT", f"link.receive: no message from the {self._peer_name} within the timeout")
        return handled
