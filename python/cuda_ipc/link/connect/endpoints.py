"""``listen(address)`` and ``connect(address)`` by address, as on the Node side: a name is a Unix socket
on this machine (listener.py: peers proved by the kernel, fds and memory shared), a ``tcp://`` or
``tls://`` URL a TCP link to another machine (tcp.py: peers proved by a shared token, bytes copied).
"""
from __future__ import annotations

from typing import Any

from . import listener
from ..connection.link import Link
from ..transport.link_url import is_url
from .tcp import PathLike, TcpListener, connect_tcp, listen_tcp


def _no_tcp_options(what: str, token: object, cert: object, key: object, ca: object) -> None:
    if token is not None or cert is not None or key is not None or ca is not None:
        raise TypeError(f"{what}: token, cert, key and ca apply to tcp:// and tls:// addresses, not to a link name")


def _allow_nccl_in_clear(options: dict[str, Any]) -> bool:
    """The ``allow_nccl_in_clear`` option (taken out of ``options``): device memory on a tls:// link
    moves over NCCL, which does not encrypt; without it that is refused (ERR_NCCL_UNENCRYPTED)."""
    allow = options.pop("allow_nccl_in_clear", False)
    if not isinstance(allow, bool):
        raise TypeError(f"allow_nccl_in_clear must be a bool, got {type(allow).__name__}")
    return allow


def listen(address: str, *, token: str | bytes | None = None, cert: PathLike | None = None, key: PathLike | None = None,
           ca: PathLike | None = None, **options: Any) -> listener.Listener | TcpListener:
    """Listens for links on ``address``.

    - A name (``listen('weights')``): a Unix socket in this user's private directory; options
      ``directory``, ``allow_uids``, ``backlog``, ``handshake_timeout``, ``max_message_bytes`` (listener.py).
    - ``tcp://HOST:PORT`` (``listen('tcp://127.0.0.1:0', token=...)``): TCP on exactly that address
      (port 0 picks one: ``listener.url``); ``token`` (else CUDA_IPC_TOKEN, at least 16 bytes) is
      required; options ``backlog``, ``handshake_timeout`` (10 s), ``challenge_timeout`` (2 s),
      ``max_pending`` (128), ``max_pending_per_address`` (8), ``on_refused`` (a callable(error,
      report) told of refused connections, coalesced), ``refused_interval`` (1 s), ``max_message_bytes``. ``tls://`` adds TLS with ``cert``, ``key`` and optionally ``ca`` (then
      clients need certificates it signed); device memory on its links moves over NCCL, which does not
      encrypt, so it is refused (ERR_NCCL_UNENCRYPTED) unless ``allow_nccl_in_clear=True``.
    """
    # Any SCHEME:// is a URL, never a link name: parse_url says what is wrong with one that is not a link's.
    if is_url(address):
        allow = _allow_nccl_in_clear(options)
        server = listen_tcp(address, token=token, cert=cert, key=key, ca=ca, **options)
        setattr(server, "allow_nccl_in_clear", allow)  # handed to each link it accepts (tcp.py)
        return server
    _no_tcp_options("listen", token, cert, key, ca)
    return listener.listen(address, **options)


def connect(address: str, *, token: str | bytes | None = None, cert: PathLike | None = None, key: PathLike | None = None,
            ca: PathLike | None = None, **options: Any) -> Link:
    """Connects to the listener at ``address`` and returns the link once its handshake succeeded.

    - A name: the Unix socket of a Node or Python ``listen(name)``; options ``directory``, ``allow_uids``,
      ``timeout`` (10 s), ``max_message_bytes`` (listener.py).
    - ``tcp://HOST:PORT`` / ``tls://HOST:PORT``: a Node or Python TCP listener; ``token`` (else
      CUDA_IPC_TOKEN) is required; options ``timeout`` (10 s: connections refused, or closed by a busy
      listener before the token exchange, are tried again until then; then ERR_NO_LISTENER or
      ERR_LISTENER_BUSY), ``max_message_bytes``; for TLS ``ca``
      (the listener's CA, else the system's), ``cert``/``key`` when the listener asks for one, and
      ``allow_nccl_in_clear=True`` to let device memory cross NCCL's network in clear (else refused:
      ERR_NCCL_UNENCRYPTED).
    """
    if is_url(address):
        allow = _allow_nccl_in_clear(options)
        link = connect_tcp(address, token=token, cert=cert, key=key, ca=ca, **options)
        link.allow_nccl_in_clear = allow  # type: ignore[attr-defined]  # a TcpLink's (stream.py)
        return link
    _no_tcp_options("connect", token, cert, key, ca)
    return listener.connect(address, **options)
