"""The link to the Node process that started this one (src/link/connect/spawn.ts, spawn-python.ts): Node's
``spawnPython``/``spawn`` passes the child its end of a socketpair, named by CUDA_IPC_LINK_FD.
"""
from __future__ import annotations

import os
import socket
import threading

from ...errors import IpcError
from ..connection.link import _CREATE, Link

LINK_FD_ENV = "CUDA_IPC_LINK_FD"

_parent: Link | None = None
_parent_lock = threading.Lock()


def parent_link(*, max_message_bytes: int | None = None) -> Link:
    """The link to the Node process that started this one (``spawnPython`` / ``spawn``). The same Link
    every call (``max_message_bytes``, default 1 GiB, counts at the first call). The parent is trusted as such (it chose how to start us): its uid is not checked."""
    global _parent
    with _parent_lock:
        if _parent is not None:
            return _parent
        value = os.environ.get(LINK_FD_ENV)
        if value is None:
            raise IpcError("ERR_NOT_SPAWNED", f"parent_link(): this process was not started by cuda-ipc's spawnPython() ({LINK_FD_ENV} is not set); start it from Node with spawnPython(module)")
        try:
            fd = int(value)
            sock = socket.socket(fileno=fd)
        except (ValueError, OSError):
            raise IpcError("ERR_NOT_SPAWNED", f"parent_link(): {LINK_FD_ENV}={value} does not name a link socket in this process") from None
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
            sock.detach()
            raise IpcError("ERR_NOT_SPAWNED", f"parent_link(): {LINK_FD_ENV}={value} does not name a link socket in this process")
        # Keep it away from our own children and from anyone reading the environment later.
        del os.environ[LINK_FD_ENV]
        sock.set_inheritable(False)
        sock.setblocking(True)
        _parent = Link(sock, peer_name="parent process", max_message_bytes=max_message_bytes, _token=_CREATE)
        return _parent
