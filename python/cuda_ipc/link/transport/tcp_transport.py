"""Frames over a byte stream: TCP, optionally inside TLS (docs/PROTOCOL.md 1.1), as
src/link/transport/tcp-transport.ts cuts them: the socket used without blocking (StreamSocket) and
the frames read out of the stream (FrameReader). The Link over them is connection/stream.py's TcpLink.

The same frames as on a Unix socket, back to back: a frame is its 16-byte header and then exactly
``payload length`` bytes. The receiver checks each header as soon as its 16 bytes arrived, before it
buffers the payload (no fds, no memfd flag, no frame rings; a MESSAGE up to ``max_message_bytes``
travels inline, every other frame at most 128 KiB), so a lying length costs nothing.

The socket is non-blocking and waits happen in poll(), so that one thread can read while others
write; under TLS every call into the SSL object holds a short lock (OpenSSL does not allow two
threads in one connection) and never waits while holding it.
"""
from __future__ import annotations

import errno
import mmap
import select
import socket
import ssl
import struct
import threading
import time
from typing import NamedTuple, cast

from ...errors import IpcError, frame_invalid
from . import frame as fr
from .large_message import check_message_length

POLLIN = select.POLLIN
POLLOUT = select.POLLOUT
_NOSIGNAL = int(socket.MSG_NOSIGNAL)
#: Bytes read ahead of the frame being handled. At least a frame (128 KiB) plus a TLS record
#: (16 KiB) stays free after compaction, so a TLS read always takes a whole record (nothing stays
#: buffered inside the SSL object where poll() cannot see it).
_BUFFER_BYTES = 256 * 1024
#: The most bytes handed to one send call (the TLS lock is held for one call at a time).
_WRITE_CHUNK = 256 * 1024
_HEADER = struct.Struct("<IBBHIHH")
_KNOWN_TYPES = frozenset({fr.HELLO, fr.MESSAGE, fr.GOODBYE, fr.REFUSE, fr.RELEASE, fr.GONE, fr.NCCL_ABORT})
_GONE_ERRNOS = (errno.ECONNRESET, errno.ENOTCONN, errno.EBADF, errno.EPIPE, errno.ETIMEDOUT, errno.EHOSTUNREACH)


class RemoteAddress(NamedTuple):
    """Where a TCP link's peer is: ``link.remote``."""

    address: str
    port: int
    #: 'IPv4' or 'IPv6'.
    family: str


class StreamEnded(Exception):
    """The byte stream ended (end of file, or a reset): the peer is gone."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class StreamSocket:
    """A connected TCP socket (``ssl.SSLSocket`` for TLS) used without blocking. ``recv_into``/``send``
    return None when they would block; ``want`` then says what to poll for."""

    __slots__ = ("sock", "fd", "tls", "remote", "want", "_lock")

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        self.tls = isinstance(sock, ssl.SSLSocket)
        address = sock.getpeername()
        self.remote = RemoteAddress(str(address[0]), int(address[1]), "IPv6" if sock.family == socket.AF_INET6 else "IPv4")
        self.want = POLLIN
        self._lock = threading.Lock()

    def recv_into(self, view: memoryview) -> int | None:
        """Reads into ``view``: the byte count, 0 at the end of the stream, None when nothing came yet."""
        if not self.tls:
            try:
                return self.sock.recv_into(view)
            except (BlockingIOError, InterruptedError):
                self.want = POLLIN
                return None
        sock = self.sock
        assert isinstance(sock, ssl.SSLSocket)
        with self._lock:
            try:
                # Into the buffer, so the count is an int (typeshed names only bytearray for the buffer).
                return cast(int, sock.read(len(view), cast(bytearray, view)))
            except ssl.SSLWantReadError:
                self.want = POLLIN
            except ssl.SSLWantWriteError:
                self.want = POLLOUT
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return 0  # the TLS stream ended (with or without close_notify)
            except ValueError:  # the link closed the socket meanwhile (SSLSocket.shutdown drops the TLS state)
                return 0
            return None

    def send(self, view: memoryview) -> int | None:
        """Writes from ``view``: the byte count, None when there is no room yet. Under TLS a write that
        returned None must be repeated with the same bytes."""
        if not self.tls:
            try:
                return self.sock.send(view, _NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                self.want = POLLOUT
                return None
        sock = self.sock
        assert isinstance(sock, ssl.SSLSocket)
        with self._lock:
            try:
                return sock.write(view)
            except ssl.SSLWantWriteError:
                self.want = POLLOUT
            except ssl.SSLWantReadError:
                self.want = POLLIN
            except ValueError:
                raise BrokenPipeError(errno.EPIPE, "the TLS connection is closed") from None
            return None

    def handshake(self) -> int:
        """A step of the TLS handshake: 0 once done, else the poll events to wait for."""
        sock = self.sock
        if not isinstance(sock, ssl.SSLSocket):
            return 0
        with self._lock:
            try:
                sock.do_handshake()
                return 0
            except ssl.SSLWantReadError:
                return POLLIN
            except ssl.SSLWantWriteError:
                return POLLOUT

    def pending(self) -> int:
        """Bytes the TLS layer decrypted and holds (poll() cannot see them)."""
        sock = self.sock
        if not isinstance(sock, ssl.SSLSocket):
            return 0
        with self._lock:
            try:
                return sock.pending()
            except ValueError:
                return 0

    def wait(self, events: int, deadline: float | None) -> bool:
        """Waits until the socket is ready for ``events`` (or closed); False at the deadline."""
        p = select.poll()
        p.register(self.fd, events)
        while True:
            ms = -1 if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
            try:
                return bool(p.poll(ms))
            except InterruptedError:
                continue


def check_header(buf: fr.Buffer, at: int, max_message_bytes: int) -> int:
    """Checks a frame header of the stream as soon as its 16 bytes arrived; returns its payload length.
    ERR_FRAME_INVALID for anything a TCP link does not carry, ERR_MESSAGE_TOO_LARGE for a message over
    ``max_message_bytes`` (the caller says so with REFUSE reason 3). The rest of the frame's checks
    (fr.parse_header) run once its payload is in."""
    magic, version, ftype, flags, payload_length, fd_count, reserved = _HEADER.unpack_from(buf, at)
    if magic != fr.FRAME_MAGIC:
        raise frame_invalid(f"bad magic 0x{magic:x}")
    if version != fr.FRAME_VERSION:
        raise frame_invalid(f"protocol version {version}, this build speaks {fr.FRAME_VERSION}")
    if reserved != 0:
        raise frame_invalid("reserved header bytes are not zero")
    if fd_count != 0:
        raise frame_invalid(f"a header announces {fd_count} fds, and a TCP link carries none")
    if ftype == fr.MESSAGE:
        if flags & fr.LARGE_PAYLOAD:
            raise frame_invalid("a message flagged as carried in a memfd, and a TCP link carries messages inline")
        check_message_length(payload_length, max_message_bytes)
    elif ftype in (fr.RING, fr.RING_START):
        raise frame_invalid("a frame-ring frame, and frame rings (shared memory) are never used on a TCP link")
    elif ftype not in _KNOWN_TYPES:
        raise frame_invalid(f"unknown frame type {ftype}")
    elif payload_length > fr.MAX_PAYLOAD_BYTES:
        raise frame_invalid(f"a control frame of {payload_length} payload bytes, more than a frame's {fr.MAX_PAYLOAD_BYTES}")
    return int(payload_length)


class FrameReader:
    """Frames out of a stream socket, one at a time; a frame handed out stays valid until the next call.
    Frames that fit the read-ahead buffer are read with as few calls as the kernel allows; a larger
    message gets memory of its own, mapped lazily (pages are only committed as its bytes arrive)."""

    def __init__(self, conn: StreamSocket):
        self._conn = conn
        self._buf = bytearray(_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        # A frame larger than the buffer: its memory, view, bytes so far; handed out once whole.
        self._big: mmap.mmap | None = None
        self._big_view: memoryview | None = None
        self._big_have = 0
        self._big_out = False

    def buffered(self) -> bool:
        """Whether a whole frame (or TLS data poll() cannot see) is here already."""
        if self._big is None and self._end - self._start >= fr.HEADER_BYTES:
            payload_length = _HEADER.unpack_from(self._view, self._start)[4]
            if self._end - self._start >= fr.HEADER_BYTES + payload_length:
                return True
        return self._conn.tls and self._conn.pending() > 0

    def next_frame(self, deadline: float | None, max_message_bytes: int) -> memoryview | None:
        """The next whole frame, header included (None when it did not arrive before ``deadline``, an
        absolute time.monotonic(); None waits as long as it takes). Raises StreamEnded when the
        stream ends, IpcError for a header out of spec."""
        if self._big_out:
            self._drop_big()
        while True:
            if self._big_view is not None:
                if not self._fill_big(deadline):
                    return None
                self._big_out = True
                return self._big_view
            avail = self._end - self._start
            if avail >= fr.HEADER_BYTES:
                total = fr.HEADER_BYTES + check_header(self._view, self._start, max_message_bytes)
                if avail >= total:
                    at = self._start
                    self._start += total
                    if self._start == self._end:
                        self._start = self._end = 0
                    return self._view[at:at + total]
                if total > len(self._buf):
                    self._begin_big(total)
                    continue
            if not self._fill(deadline):
                return None

    def _fill(self, deadline: float | None) -> bool:
        """Reads more into the buffer (moving the partial frame to its start first); False at the deadline."""
        if self._start:
            n = self._end - self._start
            # Through a copy: the two ranges may overlap, and bytearray copies with memcpy.
            self._buf[:n] = bytes(self._view[self._start:self._end])
            self._start, self._end = 0, n
        while True:
            got = self._recv(self._view[self._end:], deadline)
            if got is None:
                return False
            if got:
                self._end += got
                return True

    def _begin_big(self, total: int) -> None:
        big = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = memoryview(big)
        have = self._end - self._start
        view[:have] = self._view[self._start:self._end]
        self._start = self._end = 0
        self._big, self._big_view, self._big_have = big, view, have

    def _fill_big(self, deadline: float | None) -> bool:
        view = self._big_view
        assert view is not None
        while self._big_have < len(view):
            got = self._recv(view[self._big_have:], deadline)
            if got is None:
                return False
            self._big_have += got
        return True

    def _drop_big(self) -> None:
        big, view = self._big, self._big_view
        self._big, self._big_view, self._big_have, self._big_out = None, None, 0, False
        if view is not None:
            view.release()
        if big is not None:
            try:
                big.close()
            except BufferError:
                pass  # a view of it is still alive somewhere: the mapping goes with it

    def _recv(self, view: memoryview, deadline: float | None) -> int | None:
        """One read: its byte count (0 when the TLS layer had nothing whole yet), None at the deadline."""
        conn = self._conn
        try:
            n = conn.recv_into(view)
        except ssl.SSLError as e:
            raise IpcError("ERR_FRAME_INVALID", f"the TLS stream from the peer broke: {e.reason or e}") from None
        except OSError as e:
            if e.errno in _GONE_ERRNOS:
                raise StreamEnded(f" (socket error {errno.errorcode.get(e.errno or 0, e.errno)})") from None
            raise
        if n is None:
            return 0 if conn.wait(conn.want, deadline) else None
        if n == 0:
            partial = self._big is not None or self._end > self._start
            raise StreamEnded(" in the middle of a frame" if partial else "")
        return n

    def close(self) -> None:
        self._drop_big()
