"""Links between machines: ``listen('tcp://HOST:PORT', token=...)`` and ``connect('tcp://HOST:PORT',
token=...)`` (docs/PROTOCOL.md 1.1 and 2.3; Node: the same calls). ``tls://`` runs the same inside TLS.

A listener binds exactly the address it is given (port 0 picks a free one, ``listener.url`` says
which); there is no default, so listening beyond the loopback interface is always written out. Every
connection authenticates with the shared token (tcp_auth.py) and then says HELLO; the listener runs
those handshakes side by side in accept() (non-blocking), so a connection that stays silent holds up
no other. Bounds, as Node's: ``max_pending`` connections in their handshake or not yet returned by
accept(), of them ``max_pending_per_address`` from one address (an IPv6 one: its /64) that have not
proved the token; more are closed at once. A connection must send its challenge within
``challenge_timeout`` and finish within ``handshake_timeout``. Refusals are counted (``refused``) and
reported coalesced to ``on_refused(error, report)`` (refusal_report.py).
"""
from __future__ import annotations

import errno
import ipaddress
import os
import select
import socket
import ssl
import threading
import time
from collections import deque
from typing import Iterator, Union

from ...errors import IpcError
from ..transport.large_message import check_max_message_bytes
from ..connection.link import _CREATE, Link
from ..transport.link_url import TcpAddress, format_url, parse_url
from ..connection.stream import TcpLink
from ..transport.tcp_transport import POLLIN, POLLOUT, StreamSocket
from .refusal_report import REFUSED_INTERVAL, RefusalReporter, RefusedCallback
from ..transport.tcp_auth import ROLE_CONNECTOR, ROLE_LISTENER, Authenticator, resolve_token

#: A file given to ssl: a path.
PathLike = Union[str, "os.PathLike[str]"]

#: Keepalive (PROTOCOL.md 1.1): a peer whose machine vanished is noticed within about 25 s.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 5, 3
#: Connections a listener accepts per wake-up before it looks at the others again.
_ACCEPT_BATCH = 64


def source_of(address: str) -> str:
    """What a connection from ``address`` counts against (max_pending_per_address): an IPv4 address
    (also written IPv4-mapped), or an IPv6 address's /64, as Node's sourceOf()."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False).network_address) + "/64"
    return str(ip)


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

    def __init__(self, sock: socket.socket, role: int, secret: bytes, peer_name: str, max_message_bytes: int | None, deadline: float,
                 source: str | None = None, full_deadline: float | None = None):
        self.conn = StreamSocket(sock)
        self.deadline = deadline
        #: A listener's: the deadline once the peer's challenge arrived (``deadline`` is the challenge's until then).
        self.full_deadline = deadline if full_deadline is None else full_deadline
        #: A listener's: what max_pending_per_address counts it against, until it proved the token.
        self.source = source
        self.want = POLLOUT
        self.link: TcpLink | None = None
        self._auth = Authenticator(self.conn, secret, role, peer_name)
        self._peer_name = peer_name
        self._max_message_bytes = max_message_bytes
        self._tls_done = not self.conn.tls

    @property
    def tls_done(self) -> bool:
        return self._tls_done

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
            try:
                self.want = self._auth.advance()
            finally:
                if self._auth.challenged:
                    self.deadline = self.full_deadline
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
                 max_pending: int, max_message_bytes: int | None, _token: object = None, *, challenge_timeout: float = 2.0,
                 max_pending_per_address: int = 8, on_refused: RefusedCallback | None = None, refused_interval: float = REFUSED_INTERVAL):
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
        self._max_pending_per_address = max_pending_per_address
        self._challenge_timeout = min(challenge_timeout, handshake_timeout)
        self._max_message_bytes = max_message_bytes
        self._pending: dict[int, _Opening] = {}
        #: Connections not yet authenticated, by source (what max_pending_per_address bounds).
        self._by_source: dict[str, int] = {}
        self._reporter = RefusalReporter(refused_interval, on_refused)
        self._ready: deque[TcpLink] = deque()
        self._closed = False
        self._cleared = False
        #: Why the last connection dropped was (``refused`` counts them).
        self.last_refusal: IpcError | None = None
        # One thread runs the handshakes at a time (the one in accept()); close() from another wakes it.
        self._accept_lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def refused(self) -> int:
        """Connections dropped so far: authentication or handshake failed or timed out, over a bound."""
        return self._reporter.total

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
                        link = self._ready.popleft()
                        link.allow_nccl_in_clear = getattr(self, "allow_nccl_in_clear", False)  # endpoints.listen()
                        return link
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
            self._drop(o, IpcError("ERR_TIMEOUT", f"a connection to {self.url} from {o.source} did not send its challenge within "
                                   f"{self._challenge_timeout} s (challenge_timeout)" if o.deadline != o.full_deadline else
                                   f"a connection to {self.url} did not complete authentication and the link "
                                   f"handshake within {self._handshake_timeout} s (handshake_timeout)"))
        due = self._reporter.due()
        if due is not None and due <= now:
            self._reporter.flush()
            due = None
        until = deadline if due is None or (deadline is not None and deadline < due) else due
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
                sock, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if self._closed or e.errno == errno.ECONNABORTED:
                    return
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    raise IpcError("ERR_FD_LIMIT", f"the listener at {self.url} cannot accept a connection: this process has no "
                                   "descriptor left (see `ulimit -n`); close links or buffers you no longer need") from None
                raise
            source = source_of(addr[0])
            # Over a bound: closed at once and counted, so that silent peers cannot use up our fds or the others' places.
            if len(self._pending) + len(self._ready) >= self._max_pending:
                sock.close()
                self._note_refusal(IpcError("ERR_LIMIT_REACHED", f"a connection to {self.url} from {source} was closed at once: "
                                            f"{self._max_pending} were in their handshake or waiting for accept() already (max_pending)",
                                            limit="max_pending"), source)
                continue
            if self._by_source.get(source, 0) >= self._max_pending_per_address:
                sock.close()
                self._note_refusal(IpcError("ERR_LIMIT_REACHED", f"a connection to {self.url} from {source} was closed at once: "
                                            f"{self._max_pending_per_address} from that address were authenticating already "
                                            "(max_pending_per_address)", limit="max_pending_per_address"), source)
                continue
            try:
                _tune(sock)
                if self._tls is not None:
                    sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                now = time.monotonic()
                o = _Opening(sock, ROLE_LISTENER, self._secret, "peer connected to " + self.url, self._max_message_bytes,
                             now + self._challenge_timeout, source, now + self._handshake_timeout)
            except OSError:
                sock.close()  # it hung up already
                continue
            self._pending[o.conn.fd] = o
            self._by_source[source] = self._by_source.get(source, 0) + 1
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
        if o.link is not None:
            self._unsource(o)  # it proved the token
        if link is not None:
            del self._pending[o.conn.fd]
            self._ready.append(link)

    def _unsource(self, o: _Opening) -> None:
        if o.source is None:
            return
        n = self._by_source.get(o.source, 1) - 1
        if n > 0:
            self._by_source[o.source] = n
        else:
            self._by_source.pop(o.source, None)
        o.source = None

    def _drop(self, o: _Opening, why: IpcError) -> None:
        self._pending.pop(o.conn.fd, None)
        source = o.source or "?"
        self._unsource(o)
        o.close()
        self._note_refusal(why, source)

    def _note_refusal(self, why: IpcError, source: str) -> None:
        self.last_refusal = why
        self._reporter.note(why, source)

    def close(self) -> None:
        """Stops listening: pending connections are dropped, links accepted but not yet returned closed.
        Wakes an accept() in another thread (ERR_LINK_CLOSED). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() == self._pid:  # (a forked child's copy must not stop its parent's socket)
            try:
                self._reporter.flush()  # what was gathered is still told
            except Exception:
                pass
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
        if os.getpid() == self._pid:
            try:
                self._reporter.flush()  # refusals an accept() in another thread noted after close()'s flush
            except Exception:
                pass
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
               key: PathLike | None = None, ca: PathLike | None = None, challenge_timeout: float = 2.0,
               max_pending_per_address: int = 8, on_refused: RefusedCallback | None = None,
               refused_interval: float = REFUSED_INTERVAL) -> TcpListener:
    """Listens for TCP links on ``url`` (see the module notes). ``on_refused(error, report)`` is called
    from accept() with the refused connections, at most once per ``refused_interval`` seconds (the
    first after a quiet interval at once): ``error`` the first of them, ``report`` a RefusedReport."""
    where = parse_url(url, listening=True)
    secret = resolve_token(token, "listen")
    if isinstance(handshake_timeout, bool) or not isinstance(handshake_timeout, (int, float)) or not handshake_timeout > 0:
        raise ValueError(f"listen: handshake_timeout must be a positive number of seconds, got {handshake_timeout!r}")
    for value, what in ((max_pending, "max_pending"), (max_pending_per_address, "max_pending_per_address")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"listen: {what} must be a positive int, got {value!r}")
    for number, what in ((challenge_timeout, "challenge_timeout"), (refused_interval, "refused_interval")):
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number < 0 or (what == "challenge_timeout" and number == 0):
            raise ValueError(f"listen: {what} must be a {'positive' if what == 'challenge_timeout' else 'non-negative'} number of seconds, got {number!r}")
    if on_refused is not None and not callable(on_refused):
        raise TypeError("listen: on_refused must be callable (error, report)")
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
        return TcpListener(sock, where, secret, tls, float(handshake_timeout), max_pending, max_message_bytes, _token=_CREATE,
                           challenge_timeout=float(challenge_timeout), max_pending_per_address=max_pending_per_address,
                           on_refused=on_refused, refused_interval=float(refused_interval))
    except BaseException:
        sock.close()
        raise


def connect_tcp(url: str, *, token: str | bytes | None = None, timeout: float = 10.0, max_message_bytes: int | None = None,
                cert: PathLike | None = None, key: PathLike | None = None, ca: PathLike | None = None) -> Link:
    """Connects to the listener at ``url`` and returns the link once authentication and handshake
    succeeded. A missing or short token fails at once (ERR_AUTH_FAILED) with nothing sent. While the
    connection is refused (nobody listens yet) it tries again up to ``timeout`` seconds, then
    ERR_NO_LISTENER (0: at once), as connect(name) does; a connection the listener closes before this
    side could prove the token (no room: its bounds of pending connections) is tried again alike, then
    ERR_LISTENER_BUSY. The whole call takes at most ``timeout``."""
    where = parse_url(url, listening=False)
    secret = resolve_token(token, "connect")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"connect: timeout must be a number of seconds >= 0, got {timeout!r}")
    if max_message_bytes is not None:
        check_max_message_bytes(max_message_bytes)
    tls = _tls_context(where, False, cert, key, ca)
    deadline = time.monotonic() + timeout
    pause = 0.005
    busy: IpcError | None = None
    tries = 0
    while True:
        try:
            return _connect_once(url, where, tls, secret, max_message_bytes, deadline, timeout)
        except IpcError as e:
            # Closed before this side could prove the token: the listener had no room (or was flooded); try
            # again until the deadline. A last try that the deadline cut short is still that listener being busy.
            still_busy = busy is not None and e.code == "ERR_TIMEOUT"
            if (e.code != "ERR_LISTENER_BUSY" and not still_busy) or timeout == 0:
                raise
            if not still_busy:
                busy, tries = e, tries + 1
            left = deadline - time.monotonic()
            if left <= 0 or still_busy:
                raise IpcError("ERR_LISTENER_BUSY", f"connect: the listener at {url} closed {tries} connection{'s' if tries != 1 else ''} "
                               f"before this side could prove the token and stayed so for {timeout} s (the timeout): it is at its "
                               "bound of connections still authenticating (max_pending, max_pending_per_address; a flood from this "
                               "address?), or it is not a cuda-ipc listener") from None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.25)


def _connect_once(url: str, where: TcpAddress, tls: ssl.SSLContext | None, secret: bytes, max_message_bytes: int | None,
                  deadline: float, timeout: float) -> Link:
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
            try:
                link = opening.advance()
            except IpcError as e:
                # The TCP connection closed during TLS, before anything was proved: as a listener with no room does.
                if e.code == "ERR_AUTH_FAILED" and not opening.tls_done and ("closed the connection" in str(e) or "EOF" in str(e)):
                    raise IpcError("ERR_LISTENER_BUSY", f"the listener at {url} closed the connection during TLS, before this side "
                                   "could prove the token") from None
                if e.code == "ERR_LISTENER_BUSY" and tls is not None:
                    # A listener with no room closes before TLS; one that closes right after it, before its challenge,
                    # refused this side's certificate (a Node listener does so without a TLS alert).
                    raise IpcError("ERR_AUTH_FAILED", f"connect: the listener at {url} closed the connection right after TLS, before "
                                   "its challenge: it requires a client certificate its CA signed (cert= and key=)") from None
                raise
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
                raise IpcError("ERR_NO_LISTENER", f"connect: nothing listens at {url} (connection refused), and no listener appeared "
                               f"within {timeout} s (the timeout); start the listening process first") from None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.25)
        except socket.gaierror as e:
            raise IpcError("ERR_NO_LISTENER", f"connect: cannot resolve the host of {url}: {e.strerror}") from None
        except TimeoutError:
            raise IpcError("ERR_TIMEOUT", f"connect: no answer from {url} within {timeout} s (the timeout)") from None
        except OSError as e:
            raise IpcError("ERR_NO_LISTENER", f"connect: cannot reach {url}: {e.strerror or e}") from None
