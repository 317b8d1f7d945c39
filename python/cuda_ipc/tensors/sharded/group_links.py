"""The links of a sync group's rank besides its hub link (src/tensors/sharded/group-links.ts): the
serve listener where this rank's destinations on its node connect for its source tensors, the
links it serves on, and the links it holds to the sources it takes runs from. Each link has a
reader thread that hands what it reads to the rank's control thread (``post``)."""
from __future__ import annotations

import os
import secrets
import threading
from collections import deque
from typing import Any, Callable

from ...errors import IpcError
from ...link.connection.link import Link
from ...link.connect.endpoints import connect, listen
from ...link.connect.listener import Listener
from .group_wire import hello_message
from .host_copy import RunMemory

#: What a reader hands the control thread: (event kind, the object it is about, a value).
Post = Callable[[str, Any, Any], None]
#: How often the accept loop looks whether the rank closed (seconds).
_ACCEPT_TURN = 0.2


def serve_name(rank: int) -> str:
    """A serve address of this process's own: unique per process and rank, a valid link name."""
    return f"shard-{os.getpid()}-{rank}-{secrets.token_hex(4)}"


class Served:
    """A link a destination opened to this rank's serve address. Its first message, hello, says which
    rank and epoch; the source answers with its tensor set once it reached that epoch (``attached``).
    Then go and done pass, matched by their order: ``gos`` sent, ``dones`` received."""

    def __init__(self, link: Link):
        self.link = link
        self.rank: int | None = None
        self.epoch = 0
        self.attached = False
        self.gos = 0
        self.dones = 0
        self.closed = False


class SourceLink:
    """A destination's link to one source rank for one epoch: that rank's tensor set as mapped here
    and the gos it sent (versions, oldest first)."""

    def __init__(self, rank: int, epoch: int):
        self.rank = rank
        self.epoch = epoch
        self.link: Link | None = None
        self.tensors: Any = None
        self.views: list[Any] = []
        self.memories: list[RunMemory] = []
        self.gos: deque[int] = deque()
        self.closed = False

    def close(self) -> None:
        """Drops the mapping (views, the set) and the link."""
        self.closed = True
        for v in self.views:
            try:
                v.close()
            except Exception:  # noqa: BLE001 - best effort: the set's close below lets go of all of it
                pass
        self.views = []
        self.memories = []
        if self.tensors is not None:
            try:
                self.tensors.close(sync=False)
            except Exception:  # noqa: BLE001
                pass
            self.tensors = None
        if self.link is not None:
            self.link.close()


def read_loop(link: Link, kind: str, subject: Any, post: Post) -> None:
    """Posts every message of ``link`` as (kind, subject, value), then (kind + '-closed', subject, error)."""
    while True:
        try:
            value = link.receive()
        except IpcError as e:
            post(kind + "-closed", subject, e)
            return
        except Exception as e:  # noqa: BLE001 - a message this side could not decode: the link is unusable
            link.close()
            post(kind + "-closed", subject, IpcError("ERR_SHARD_PROTOCOL", f"a message could not be read: {e}"))
            return
        post(kind, subject, value)


class ServeListener:
    """Listens on ``name`` and posts ('served-open', Served, None) per link, then its messages."""

    def __init__(self, name: str, post: Post):
        self.name = name
        self._post = post
        server = listen(name)
        assert isinstance(server, Listener)
        self._server = server
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="shard-serve", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._closed:
                try:
                    link = self._server.accept(timeout=_ACCEPT_TURN)
                except IpcError as e:
                    if e.code == "ERR_TIMEOUT":
                        continue
                    return
                served = Served(link)
                self._post("served-open", served, None)
                threading.Thread(target=read_loop, args=(link, "served", served, self._post), name="shard-served", daemon=True).start()
        finally:
            self._server.close()

    def close(self) -> None:
        self._closed = True
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)


def open_source(source: SourceLink, address: str, me: int, post: Post, timeout: float) -> None:
    """Connects to a source rank's serve address on a thread of its own, says hello (this rank, the
    epoch), then reads it."""
    def run() -> None:
        try:
            link = connect(address, timeout=timeout)
            link.send(hello_message(source.epoch, me), timeout=timeout)
        except IpcError as e:
            post("source-closed", source, e)
            return
        source.link = link
        if source.closed:
            link.close()
            return
        read_loop(link, "source", source, post)
    threading.Thread(target=run, name="shard-source", daemon=True).start()
