"""``listen(address)`` and ``connect(address)`` by address, as on the Node side: a name is a Unix socket
on this machine (listener.py: peers proved by the kernel, fds and memory shared), a ``tcp://`` or
``tls://`` URL a TCP link to another machine (tcp.py: peers proved by a shared token, bytes copied).
"""
from __future__ import annotations

from typing import Any

from . import listener
from ..connection.link import Link
from .tcp import PathLike, TcpListener, connect_tcp, is_tcp_url, listen_tcp


def _no_tcp_options(what: str, token: object, cert: object, key: object, ca: object) -> None:
    if token is not None or cert is not None or key is not None or ca is not None:
        raise TypeError(f"{what}: token, cert, key and ca apply to tcp:// and tls:// addresses, not to a link name")


def listen(address: str, *, token: str | bytes | None = None, cert: PathLike | None = None, key: PathLike | None = None,
           ca: PathLike | None = None, **options: Any) -> listener.Listener | TcpListener:
    """Listens for links on ``address``.

    - A name (``listen('weights')``): a Unix socket in this user's private directory; options
      ``directory``, ``allow_uids``, ``backlog``, ``handshake_timeout``, ``max_message_bytes`` (listener.py).
    - ``tcp://HOST:PORT`` (``listen('tcp://127.0.0.1:0', token=...)``): TCP on exactly that address
      (port 0 picks one: ``listener.url``); ``token`` (else CUDA_IPC_TOKEN, at least 16 bytes) is
      required; options ``backlog``, ``handshake_timeout`` (10 s), ``max_pending`` (128),
      ``max_message_bytes``. ``tls://`` adds TLS with ``cert``, ``key`` and optionally ``ca`` (then
      clients need certificates it signed).
    """
    if is_tcp_url(address):
        return listen_tcp(address, token=token, cert=cert, key=key, ca=ca, **options)
    _no_tcp_options("listen", token, cert, key, ca)
    return listener.listen(address, **options)


def connect(address: str, *, token: str | bytes | None = None, cert: PathLike | None = None, key: PathLike | None = None,
            ca: PathLike | None = None, **options: Any) -> Link:
    """Connects to the listener at ``address`` and returns the link once its handshake succeeded.

    - A name: the Unix socket of a Node or Python ``listen(name)``; options ``directory``, ``allow_uids``,
      ``timeout`` (10 s), ``max_message_bytes`` (listener.py).
    - ``tcp://HOST:PORT`` / ``tls://HOST:PORT``: a Node or Python TCP listener; ``token`` (else
      CUDA_IPC_TOKEN) is required; options ``timeout`` (10 s), ``max_message_bytes``; for TLS ``ca``
      (the listener's CA, else the system's) and ``cert``/``key`` when the listener asks for one.
    """
    if is_tcp_url(address):
        return connect_tcp(address, token=token, cert=cert, key=key, ca=ca, **options)
    _no_tcp_options("connect", token, cert, key, ca)
    return listener.connect(address, **options)
