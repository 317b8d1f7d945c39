"""Links between machines: ``listen('tcp://HOST:PORT', token=...)`` and ``connect('tcp://HOST:PORT',
token=...)`` (docs/PROTOCOL.md 1.1 and 2.3; Node: the same calls). ``tls://`` runs the same inside TLS.

A listener binds exactly the address it is given (port 0 picks a free one, ``listener.url`` says
which); there is no default, so listening beyond the loopback interface is always written out. Every
connection authenticates with the shared token (tcp_auth.py) and then says HELLO; the listener runs
those handshakes side by side in accept() (non-blocking, at most ``max_pending`` at once, each within
``handshake_timeout``), so a connection that stays silent holds up no other. Connections beyond
``max_pending`` are closed at once.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import re
import select
import socket
import ssl
import threading
import time
from collections import deque
from typing import Iterator, NamedTuple, Union

from ...errors import IpcError
from ..transport.large_message import check_max_message_bytes
from ..connection.link import _CREATE, Link
from ..connection.stream import POLLIN, POLLOUT, StreamSocket, TcpLink
from ..transport.tcp_auth import ROLE_CONNECTOR, ROLE_LISTENER, Authenticator, resolve_token

#: A file given to ssl: a path.
PathLike = Union[str, "os.PathLike[str]"]

_URL = re.compile(r"^(tcp|tls)://(?:\[([0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?)\]|([A-Za-z0-9.-]+)):([0-9]{1,5})$")
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
#: Keepalive (PROTOCOL.md 1.1): a peer whose machine vanished is noticed within about 25 s.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 5, 3
#: Connections a listener accepts per wake-up before it looks at the others again.
_ACCEPT_BATCH = 64


class TcpAddress(NamedTuple):
    """A parsed tcp:// or tls:// URL."""

    scheme: str
    host: str
    port: int
    #: AF_INET / AF_INET6 for an address, 0 for a host name.
    family: int


def is_tcp_url(address: object) -> bool:
    """Whether ``address`` is meant as a URL (parse_url says whether it is a good one), not a link name."""
    return isinstance(address, str) and "://" in address


def parse_url(url: str, listening: bool) -> TcpAddress:
    """Checks a link URL: ``tcp://HOST:PORT`` or ``tls://HOST:PORT``, HOST an IPv4 address, a bracketed
    IPv6 address or (to connect) a host name. ERR_INVALID_ARG otherwise."""
    what = "listen" if listening else "connect"
    m = _URL.match(url) if isinstance(url, str) else None
    if m is None:
        raise IpcError("ERR_INVALID_ARG", f"{what}: {url!r} is not a link address; use tcp://HOST:PORT or tls://HOST:PORT, HOST an "
                       "IPv4 address, an IPv6 address in brackets ([::1]) or, to connect, a host name")
    scheme, v6, name, digits = m.groups()
    port = int(digits)
    if port > 65535 or (port == 0 and not listening):
        raise IpcError("ERR_INVALID_ARG", f"{what}: port {port} of {url!r} is out of range (1..65535{'; 0 picks a free one to listen' if listening else ''})")
    if v6 is not None:
        try:
            return TcpAddress(scheme, str(ipaddress.IPv6Address(v6)), port, socket.AF_INET6)
        except ValueError:
            raise IpcError("ERR_INVALID_ARG", f"{what}: [{v6}] in {url!r} is not an IPv6 address") from None
    try:
        return TcpAddress(scheme, str(ipaddress.IPv4Address(name)), port, socket.AF_INET)
    except ValueError:
        pass
    if listening:
        raise IpcError("ERR_INVALID_ARG", f"listen: {url!r} names a host; a listener binds an address, written out: 127.0.0.1 or "
                       "[::1] for this machine only, the address of one interface, or 0.0.0.0 / [::] for every interface")
    if not _HOST_NAME.match(name):
        raise IpcError("ERR_INVALID_ARG", f"connect: {name!r} in {url!r} is not a host name")
    return TcpAddress(scheme, name, port, 0)


def format_url(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port}"


def _tune(sock: socket.socket) -> None:
    """TCP_NODELAY and keepalive on a link's socket (PROTOCOL.md 1.1)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)


def _tls_context(where: TcpAddress, server: bool, cert: PathLike | None, key: PathLike | None, ca: PathLike | None) -> ssl.SSLContext | None:
    """The TLS context of a tls:// address (None for tcp://). A listener needs ``cert`` (and ``key``
    unless the cert file holds it); with ``ca`` it also requires client certificates signed by it. A
    connector checks the listener's certificate against ``ca`` (else the system's CAs) and its name,
    and shows ``cert`` when given."""
    if where.scheme == "tcp":
        if cert is not None or key is not None or ca is not None:
            raise TypeError("cert, key and ca apply to tls:// addresses; this one is tcp://")
        return None
    if server:
        if cert is None:
            raise TypeError("listen: a tls:// address needs cert= (the certificate file) and key= (unless the cert file holds it)")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        if ca is not None:
            ctx.load_verify_locations(ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx = ssl.create_default_context(cafile=ca)
        if cert is not None:
            ctx.load_cert_chain(cert, key)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    return ctx


class _Opening:
    """A connection on its way to a link: TLS handshake, authentication, then the HELLOs. ``advance()``
    does what it can without waiting: the open link, or None with ``want`` the events to wait for."""

    def __init__(self, sock: socket.socket, role: int, secret: bytes, peer_name: str, max_message_bytes: int | None, deadline: float):
        self.conn = StreamSocket(sock)
        self.deadline = deadline
        self.want = POLLOUT
        self.link: TcpLink | None = None
        self._auth = Authenticator(self.conn, secret, role, peer_name)
        self._peer_name = peer_name
        self._max_message_bytes = max_message_bytes
        self._tls_done = not self.conn.tls

    def advance(self) -> TcpLink | None:
        if not self._tls_done:
            try:
                self.want = self.conn.handshake()
            except ssl.SSLError as e:
                raise IpcError("ERR_AUTH_FAILED", f"the TLS handshake with the {self._peer_name} failed: {e.reason or e}") from None
            except OSError as e:
                raise IpcError("ERR_AUTH_FAILED", f"the {self._peer_name} closed the connection during the TLS handshake ({e.strerror or e})") from None
            if self.want:
                return None
            self._tls_done = True
        if self.link is None:
            self.want = self._auth.advance()
            if self.want:
                return None
            self.link = TcpLink(self.conn, peer_name=self._peer_name, max_message_bytes=self._max_message_bytes, _token=_CREATE)
        link = self.link
        while link.state == "handshaking":
            if not link._read_one(0.0, want_message=False):
                self.want = POLLIN
                return None
        if not link.opened:
            raise link._closed_error("complete the link handshake")
        return link  # open, or closed by the peer after its HELLO (its messages wait in the inbox)

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
        else:
            self.conn.sock.close()


class TcpListener:
    """Accepts TCP links (see the module notes): ``accept(timeout=None)`` returns the next link whose
    authentication and handshake succeeded; iterating yields links until the listener is closed;
    ``close()`` stops listening. ``url`` is the bound address (tcp://127.0.0.1:40123)."""

    def __init__(self, sock: socket.socket, where: TcpAddress, secret: bytes, tls: ssl.SSLContext | None, handshake_timeout: float,
                 max_pending: int, max_message_bytes: int | None, _token: object = None):
        if _token is not _CREATE:
            raise IpcError("ERR_INVALID_ARG", "use listen('tcp://...') to create a TcpListener")
        host, port = sock.getsockname()[:2]
        #: The address it listens on, with the port it got.
        self.url = format_url(where.scheme, host, port)
        self._sock = sock
        self._fd = sock.fileno()
        self._secret = secret
        self._tls = tls
        self._handshake_timeout = handshake_timeout
        self._max_pending = max_pending
        self._max_message_bytes = max_message_bytes
        self._pending: dict[int, _Opening] = {}
        self._ready: deque[TcpLink] = deque()
        self._closed = False
        self._cleared = False
        #: Connections dropped so far (authentication or handshake failed or timed out, more than
        #: max_pending at once), and why the last one was.
        self.refused = 0
        self.last_refusal: IpcError | None = None
        # One thread runs the handshakes at a time (the one in accept()); close() from another wakes it.
        self._accept_lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        """Connections in their authentication or handshake now."""
        return len(self._pending)

    def accept(self, timeout: float | None = None) -> Link:
        """The next link, once its authentication and handshake succeeded (ERR_TIMEOUT after ``timeout``
        seconds; 0 does what can be done without waiting). Connections that fail them are dropped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._accept_lock:
            try:
                while True:
                    if self._closed:
                        raise IpcError("ERR_LINK_CLOSED", f"the listener at {self.url} is closed")
                    if self._ready:
                        return self._ready.popleft()
                    if deadline is not None and time.monotonic() >= deadline and timeout != 0:
                        raise IpcError("ERR_TIMEOUT", f"no link to {self.url} completed its handshake within {timeout} s")
                    self._turn(deadline)
                    if timeout == 0 and not self._ready and not self._closed:
                        raise IpcError("ERR_TIMEOUT", f"no link to {self.url} is ready")
            finally:
                if self._closed:
                    self._clear()

    def _turn(self, deadline: float | None) -> None:
        """Waits until something happens (a connection, a pending one's bytes, a handshake deadline, the
        caller's deadline) and does what that allows."""
        now = time.monotonic()
        for o in [o for o in self._pending.values() if o.deadline <= now]:
            self._drop(o, IpcError("ERR_TIMEOUT", f"a connection to {self.url} did not complete authentication and the link "
                                   f"handshake within {self._handshake_timeout} s (handshake_timeout)"))
        until = deadline
        p = select.poll()
        p.register(self._fd, POLLIN)
        for fd, o in self._pending.items():
            p.register(fd, o.want)
            until = o.deadline if until is None else min(until, o.deadline)
        try:
            events = p.poll(-1 if until is None else max(0.0, until - now) * 1000)
        except InterruptedError:
            return
        for fd, _ in events:
            if fd == self._fd:
                self._take_new()
            else:
                opening = self._pending.get(fd)
                if opening is not None:
                    self._advance(opening)

    def _take_new(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            if self._closed:
                return
            try:
                sock, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if self._closed or e.errno == errno.ECONNABORTED:
                    return
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    raise IpcError("ERR_FD_LIMIT", f"the listener at {self.url} cannot accept a connection: this process has no "
                                   "descriptor left (see `ulimit -n`); close links or buffers you no longer need") from None
                raise
            if len(self._pending) >= self._max_pending:
                sock.close()  # more than max_pending at once: refused, so that silent peers cannot use up our fds
                self._note_refusal(IpcError("ERR_LIMIT_REACHED", f"a connection to {self.url} was closed at once: {self._max_pending} "
                                            "were in their handshake already (max_pending)", limit="max_pending"))
                continue
            try:
                _tune(sock)
                if self._tls is not None:
                    sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                o = _Opening(sock, ROLE_LISTENER, self._secret, "peer connected to " + self.url, self._max_message_bytes,
                             time.monotonic() + self._handshake_timeout)
            except OSError:
                sock.close()  # it hung up already
                continue
            self._pending[o.conn.fd] = o
            self._advance(o)

    def _advance(self, o: _Opening) -> None:
        try:
            link = o.advance()
        except IpcError as e:
            self._drop(o, e)
            return
        except OSError as e:
            self._drop(o, IpcError("ERR_PEER_GONE", f"a connection to {self.url} failed during its handshake: {e.strerror or e}"))
            return
        if link is not None:
            del self._pending[o.conn.fd]
            self._ready.append(link)

    def _drop(self, o: _Opening, why: IpcError) -> None:
        self._pending.pop(o.conn.fd, None)
        o.close()
        self._note_refusal(why)

    def _note_refusal(self, why: IpcError) -> None:
        self.refused += 1
        self.last_refusal = why

    def close(self) -> None:
        """Stops listening: pending connections are dropped, links accepted but not yet returned closed.
        Wakes an accept() in another thread (ERR_LINK_CLOSED). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() == self._pid:  # (a forked child's copy must not stop its parent's socket)
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes a poll() in accept()
            except OSError:
                pass
        if self._accept_lock.acquire(blocking=False):
            try:
                self._clear()
            finally:
                self._accept_lock.release()

    def _clear(self) -> None:
        if self._cleared:
            return
        self._cleared = True
        self._sock.close()
        for o in list(self._pending.values()):
            o.close()
        self._pending.clear()
        while self._ready:
            self._ready.popleft().close()

    def __iter__(self) -> Iterator[Link]:
        """Links as they come, until the listener is closed."""
        while True:
            try:
                yield self.accept()
            except IpcError as e:
                if e.code == "ERR_LINK_CLOSED" and self._closed:
                    return
                raise

    def __enter__(self) -> "TcpListener":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def __repr__(self) -> str:
        return f"<cuda_ipc.TcpListener {self.url}{' closed' if self._closed else ''}>"


def listen_tcp(url: str, *, token: str | bytes | None = None, backlog: int = 128, handshake_timeout: float = 10.0,
               max_pending: int = 128, max_message_bytes: int | None = None, cert: PathLike | None = None,
               key: PathLike | None = None, ca: PathLike | None = None) -> TcpListener:
    """Listens for TCP links on ``url`` (see the module notes)."""
    where = parse_url(url, listening=True)
    secret = resolve_token(token, "listen")
    if isinstance(handshake_timeout, bool) or not isinstance(handshake_timeout, (int, float)) or not handshake_timeout > 0:
        raise ValueError(f"listen: handshake_timeout must be a positive number of seconds, got {handshake_timeout!r}")
    if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
        raise ValueError(f"listen: max_pending must be a positive int, got {max_pending!r}")
    if max_message_bytes is not None:
        check_max_message_bytes(max_message_bytes)
    tls = _tls_context(where, True, cert, key, ca)
    family, kind, proto, _, address = socket.getaddrinfo(where.host, where.port, where.family, socket.SOCK_STREAM, 0,
                                                         socket.AI_NUMERICHOST | socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # exactly the address given
        try:
            sock.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise IpcError("ERR_ADDRESS_IN_USE", f"listen: {url} is in use by another socket; pick another port, or 0 for a free one") from None
            if e.errno == errno.EADDRNOTAVAIL:
                raise IpcError("ERR_INVALID_ARG", f"listen: no interface of this machine has the address of {url}") from None
            raise
        sock.listen(backlog)
        sock.setblocking(False)
        return TcpListener(sock, where, secret, tls, float(handshake_timeout), max_pending, max_message_bytes, _token=_CREATE)
    except BaseException:
        sock.close()
        raise


def connect_tcp(url: str, *, token: str | bytes | None = None, timeout: float = 10.0, max_message_bytes: int | None = None,
                cert: PathLike | None = None, key: PathLike | None = None, ca: PathLike | None = None) -> Link:
    """Connects to the listener at ``url`` and returns the link once authentication and handshake
    succeeded. A missing or short token fails at once (ERR_AUTH_FAILED) with nothing sent. While the
    connection is refused (nobody listens yet) it tries again up to ``timeout`` seconds (0: fail at
    once with ERR_NO_LISTENER), as connect(name) does; the whole call takes at most ``timeout``."""
    where = parse_url(url, listening=False)
    secret = resolve_token(token, "connect")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"connect: timeout must be a number of seconds >= 0, got {timeout!r}")
    if max_message_bytes is not None:
        check_max_message_bytes(max_message_bytes)
    tls = _tls_context(where, False, cert, key, ca)
    deadline = time.monotonic() + timeout
    sock = _dial(url, where, deadline, timeout)
    try:
        _tune(sock)
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname=where.host, do_handshake_on_connect=False)
        opening = _Opening(sock, ROLE_CONNECTOR, secret, f"listener at {url}", max_message_bytes, deadline)
    except BaseException:
        sock.close()
        raise
    try:
        while True:
            link = opening.advance()
            if link is not None:
                return link
            if not opening.conn.wait(opening.want, deadline):
                raise IpcError("ERR_TIMEOUT", f"connect: the listener at {url} did not complete authentication and the link handshake "
                               f"within {timeout} s")
    except BaseException:
        opening.close()
        raise


def _dial(url: str, where: TcpAddress, deadline: float, timeout: float) -> socket.socket:
    pause = 0.005
    while True:
        left = deadline - time.monotonic()
        try:
            return socket.create_connection((where.host, where.port), timeout=max(0.001, left))
        except ConnectionRefusedError:
            left = deadline - time.monotonic()
            if timeout == 0:
                raise IpcError("ERR_NO_LISTENER", f"connect: nothing listens at {url} (connection refused); start the listening process first") from None
            if left <= 0:
                raise IpcError("ERR_TIMEOUT", f"connect: nothing listens at {url} (connection refused), and no listener appeared "
                               f"within {timeout} s (the timeout)") from None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.25)
        except socket.gaierror as e:
            raise IpcError("ERR_NO_LISTENER", f"connect: cannot resolve the host of {url}: {e.strerror}") from None
        except TimeoutError:
            raise IpcError("ERR_TIMEOUT", f"connect: no answer from {url} within {timeout} s (the timeout)") from None
        except OSError as e:
            raise IpcError("ERR_NO_LISTENER", f"connect: cannot reach {url}: {e.strerror or e}") from None
