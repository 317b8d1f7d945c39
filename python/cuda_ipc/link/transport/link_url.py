"""The addresses of links between machines (docs/PROTOCOL.md 2.3): ``tcp://HOST:PORT``, or ``tls://`` for
the same protocol inside TLS. HOST is an IPv4 address, a bracketed IPv6 address (``tcp://[::1]:5000``)
or, to connect, a host name. A listener binds exactly the address it is given.

The twin of src/link/transport/link-url.ts: the same rules step for step and the same error code
(ERR_INVALID_URL); test/fixtures/link-urls.json is the list both languages' tests read.
"""
from __future__ import annotations

import ipaddress
import re
import socket
from typing import NamedTuple

from ...errors import IpcError

#: The forms a link URL takes, for messages.
LINK_URL_FORMS = ("tcp://HOST:PORT or tls://HOST:PORT (HOST an IPv4 address, an IPv6 address in brackets or, to connect, "
                  "a host name), e.g. tcp://127.0.0.1:5000 or tcp://[::1]:5000")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_REST = re.compile(r"^(?:\[([0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?)\]|([A-Za-z0-9.-]+))(?::([0-9]+))?\Z")
_HOST_NAME = re.compile(r"^(?=.{1,253}\.?\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?\Z")
_IPV4 = re.compile(r"^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\Z")
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class TcpAddress(NamedTuple):
    """A parsed tcp:// or tls:// URL."""

    scheme: str
    #: An IP address (without brackets) or a host name, as written.
    host: str
    #: 0 for "any free port" (listen only).
    port: int
    #: AF_INET / AF_INET6 for an address, 0 for a host name.
    family: int


def is_url(address: object) -> bool:
    """Whether ``address`` is written as a URL (``SCHEME://...``, any scheme): such a string is never a
    link name; parse_url says whether it is a link URL."""
    return isinstance(address, str) and _SCHEME.match(address) is not None


def _printable(s: str) -> str:
    t = s[:200] + "..." if len(s) > 200 else s
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):x}", t)


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
        return True
    except ValueError:
        return False


def parse_url(url: object, listening: bool) -> TcpAddress:
    """Checks a link URL for ``listen`` (``listening``: an IP address bound exactly, port 0 allowed) or
    ``connect`` (also a host name, port 1..65535). IpcError ERR_INVALID_URL says what is wrong and the
    forms a link URL takes."""
    what = "listen" if listening else "connect"
    shown = f"'{_printable(str(url))}'"

    def bad(why: str) -> IpcError:
        return IpcError("ERR_INVALID_URL", f"{what}: {shown} {why}; write {LINK_URL_FORMS}")

    if not isinstance(url, str):
        raise bad("is not a string")
    head = _SCHEME.match(url)
    if head is None:
        raise bad("is not a link URL")
    scheme = head.group(1)
    if scheme not in ("tcp", "tls"):
        raise bad(f"is not a link URL: its scheme is {_printable(scheme)}://, and a link's is tcp:// or tls://")
    rest = url[head.end():]
    m = _REST.match(rest)
    if m is None:
        if "[" not in rest and rest.count(":") > 1:
            raise bad("is not a link URL: an IPv6 address goes in brackets")
        raise bad("is not a link URL")
    bracketed, name, digits = m.groups()
    if digits is None:
        raise bad("has no port (a link URL always names one; 0 picks a free one to listen)")
    port = int(digits)
    if len(digits) > 5 or port > 65535 or (port == 0 and not listening):
        raise bad(f"has port {_printable(digits)}, which is not {'0..65535 (0: any free port)' if listening else '1..65535'}")
    if bracketed is not None:
        if not _is_ipv6(bracketed):
            raise bad(f"is not a link URL: brackets hold an IPv6 address, e.g. tcp://[::1]:5000, and {_printable(bracketed)} is not one")
        return TcpAddress(scheme, bracketed, port, socket.AF_INET6)
    if _IPV4.match(name):
        return TcpAddress(scheme, name, port, socket.AF_INET)
    if re.match(r"^[0-9.]+\Z", name):
        raise bad(f"is not a link URL: {name} is not an IPv4 address (four numbers 0..255 without leading zeros)")
    if listening:
        raise bad("names a host, and a listener binds an IP address exactly: give the address of the interface to listen on "
                  "(127.0.0.1 for this machine only, 0.0.0.0 for every interface)")
    if not _HOST_NAME.match(name):
        raise bad(f"is not a link URL: {_printable(name)} is not a host name or an IP address")
    return TcpAddress(scheme, name, port, 0)


def format_url(scheme: str, host: str, port: int) -> str:
    """The URL of ``host``:``port`` under ``scheme`` (IPv6 in brackets)."""
    return f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port}"
