"""The sync group's hub (docs/PROTOCOL.md 9.3; src/tensors/sharded/hub.ts): one rank listens, every
other rank connects and joins with its layout. Once ``size`` distinct ranks joined the hub plans the
whole group (refusing a join whose layout does not plan), sends every rank the plan (epoch 1, 2, ...
one more per change), waits until every rank said planned with one fingerprint and sends ready. A
member whose link drops is lost: every other member is told, and a replacement with its rank number
makes the hub plan again.

The hub's logic runs on one thread, fed by a queue: the accept loop and one reader per member link
put what they see there; the hub's own rank is a member without a link (``local``)."""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from ...errors import IpcError
from ...link.connection.link import Link
from ...link.connect.endpoints import listen
from .errors import LayoutError
from .group_wire import (
    AT_HUB, DEFAULT_SHARD_CHUNK_BYTES, Join, NcclReady, Planned, ShardError, close_values, failed_message, lost_message, parse_message,
    plan_message, ready_message, refused_message,
)
from .layout import RankLayout, validate_layout
from .layout_wire import decode_layout
from .plan import plan_sharded

#: Groups larger than this are not planned whole at the hub (each record is only checked).
PLAN_AT_HUB_MAX_RANKS = 64
#: How often the accept loop looks whether the hub closed (seconds).
_ACCEPT_TURN = 0.2

#: The hub's own rank receives hub messages through this callable.
Deliver = Callable[[dict[str, Any]], None]


class _Member:
    """A connection to the hub: a member's link, or the hub's own rank (link None)."""

    def __init__(self, link: Link | None, deliver: Deliver | None = None):
        self.link = link
        self.deliver = deliver
        self.rank: int | None = None
        self.layout: RankLayout | None = None
        self.record = b""
        self.serve: str | None = None
        self.closed = False

    def send(self, message: dict[str, Any]) -> None:
        if self.deliver is not None:
            self.deliver(message)
            return
        assert self.link is not None
        try:
            self.link.send(message, timeout=10.0)
        except IpcError:
            pass  # its reader sees the link close and reports it


class ShardHub:
    """The hub of a sync group of ``size`` ranks, listening on ``address`` (a link name, or
    ``tcp://HOST:PORT`` with ``token``). ``local(deliver)`` attaches the hub's own rank."""

    def __init__(self, address: str, *, size: int, token: str | bytes | None = None, chunk_bytes: int = DEFAULT_SHARD_CHUNK_BYTES,
                 listen_options: dict[str, Any] | None = None):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise IpcError("ERR_INVALID_ARG", f"ShardGroup.host: size must be the number of ranks (an integer >= 1), got {size!r}")
        if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise IpcError("ERR_INVALID_ARG", f"ShardGroup.host: chunk_bytes must be a positive integer, got {chunk_bytes!r}")
        self.size = size
        self.chunk_bytes = chunk_bytes
        options = dict(listen_options or {})
        if token is not None:
            options["token"] = token
        self._server = listen(address, **options)
        #: The address members connect to (a TCP listener's URL with its port).
        self.address: str = getattr(self._server, "url", None) or address
        self.epoch = 0
        self._members: list[_Member] = []
        self._by_rank: dict[int, _Member] = {}
        self._planned: dict[int, Planned] = {}
        self._fingerprint = ""
        self._events: queue.Queue[tuple[str, _Member | None, Any]] = queue.Queue()
        self._closed = False
        self._threads = [threading.Thread(target=self._accept_loop, name="shard-hub-accept", daemon=True),
                         threading.Thread(target=self._run, name="shard-hub", daemon=True)]
        for t in self._threads:
            t.start()

    # -- the public part -----------------------------------------------------------------------------

    def local(self, deliver: Deliver) -> Callable[[dict[str, Any]], None]:
        """Attaches the hub's own rank: hub messages go to ``deliver``; returns what it sends the hub with."""
        member = _Member(None, deliver)
        self._events.put(("open", member, None))
        return lambda message: self._events.put(("message", member, message))

    def close(self) -> None:
        """Ends the group: every member link closes (the members see the hub lost), the listener with them."""
        if self._closed:
            return
        self._closed = True
        self._events.put(("close", None, None))
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=10)

    # -- threads -------------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        server = self._server
        try:
            while not self._closed:
                try:
                    link = server.accept(timeout=_ACCEPT_TURN)
                except IpcError as e:
                    if e.code == "ERR_TIMEOUT":
                        continue
                    break
                member = _Member(link)
                self._events.put(("open", member, None))
                threading.Thread(target=self._read_loop, args=(member,), name="shard-hub-member", daemon=True).start()
        finally:
            server.close()

    def _read_loop(self, member: _Member) -> None:
        link = member.link
        assert link is not None
        while True:
            try:
                value = link.receive()
            except IpcError as e:
                self._events.put(("closed", member, e))
                return
            self._events.put(("message", member, value))

    def _run(self) -> None:
        while True:
            kind, member, value = self._events.get()
            if kind == "close":
                for m in self._members:
                    if m.link is not None:
                        m.link.close()
                self._members.clear()
                return
            assert member is not None
            try:
                if kind == "open":
                    self._members.append(member)
                elif kind == "message":
                    self._on_message(member, value)
                elif kind == "closed":
                    self._on_closed(member, value)
            except Exception as e:  # noqa: BLE001 - one member's failure must not stop the hub
                self._drop(member, e if isinstance(e, IpcError) else IpcError("ERR_SHARD_PROTOCOL", f"the hub failed on a message: {e!r}"))

    # -- what the hub does ---------------------------------------------------------------------------

    def _on_message(self, member: _Member, value: Any) -> None:
        if member.closed:
            close_values(value)
            return
        try:
            msg = parse_message(value, AT_HUB)
        except ShardError as e:
            close_values(value)
            member.send(refused_message(e.code, str(e)))  # then its link closes
            self._drop(member, e)
            return
        if isinstance(msg, Join):
            self._on_join(member, msg)
        elif isinstance(msg, Planned):
            self._on_planned(member, msg)

    def _on_join(self, member: _Member, msg: Join) -> None:
        if member.rank is not None and member.rank != msg.rank:
            self._drop(member, ShardError("ERR_SHARD_PROTOCOL", f"a member that joined as rank {member.rank} sent a join as rank {msg.rank}; "
                                                                "one link is one rank"))
            return
        live = self._by_rank.get(msg.rank)
        if live is not None and live is not member:
            member.send(refused_message("ERR_SHARD_PROTOCOL", f"rank {msg.rank} is already live in this group on another link; "
                                                              "a replacement joins once the hub lost the old one"))
            self._drop(member, None)
            return
        if live is None and len(self._by_rank) >= self.size:
            member.send(refused_message("ERR_SHARD_PROTOCOL", f"the group already has its {self.size} ranks "
                                                              f"({', '.join(map(str, sorted(self._by_rank)))}); rank {msg.rank} cannot join"))
            self._drop(member, None)
            return
        try:
            layout = decode_layout(msg.layout)
            if layout.rank != msg.rank:
                raise ShardError("ERR_SHARD_PROTOCOL", f"a join as rank {msg.rank} carries the layout of rank {layout.rank}")
        except IpcError as e:
            member.send(refused_message(e.code, str(e)))
            return
        before = (member.rank, member.layout, member.record, member.serve)
        member.rank, member.layout, member.record, member.serve = msg.rank, layout, msg.layout, msg.serve
        self._by_rank[msg.rank] = member
        if len(self._by_rank) < self.size:
            return
        error = self._check_group()
        if error is not None:
            member.rank, member.layout, member.record, member.serve = before
            if before[0] is None:
                del self._by_rank[msg.rank]
            member.send(refused_message(error.code, str(error)))
            return
        self._plan()

    def _check_group(self) -> IpcError | None:
        """The whole group's plan (or, past PLAN_AT_HUB_MAX_RANKS, each layout on its own), before anything is sent."""
        layouts = [m.layout for m in self._by_rank.values() if m.layout is not None]
        try:
            if len(layouts) > PLAN_AT_HUB_MAX_RANKS:
                for layout in layouts:
                    validate_layout(layout)
                self._fingerprint = ""
            else:
                self._fingerprint = plan_sharded(layouts).fingerprint
        except LayoutError as e:
            return e
        return None

    def _plan(self) -> None:
        self.epoch += 1
        self._planned = {}
        ranks = sorted(self._by_rank)
        hub = next((m.rank for m in self._by_rank.values() if m.link is None), None)
        message = plan_message(self.epoch, [self._by_rank[r].record for r in ranks], [self._by_rank[r].serve for r in ranks], self.chunk_bytes, hub)
        for r in ranks:
            self._by_rank[r].send(message)

    def _on_planned(self, member: _Member, msg: Planned) -> None:
        if member.rank is None or msg.epoch != self.epoch:
            return  # a rank that has not joined, or an epoch already replaced: nothing waits for it
        self._planned[member.rank] = msg
        if len(self._planned) < self.size or len(self._by_rank) < self.size:
            return
        expected = self._fingerprint or max(p.fingerprint for p in self._planned.values())
        differ = sorted(r for r, p in self._planned.items() if p.fingerprint != expected)
        if differ:
            text = (f"ranks {', '.join(map(str, differ))} planned epoch {self.epoch} with another fingerprint than the hub's "
                    f"({expected[:16]}...): they run another planner version or decoded other layouts; the group cannot sync")
            for m in list(self._by_rank.values()):
                m.send(failed_message(self.epoch, "ERR_SHARD_PLAN", text, differ))
            return
        nccl_ranks = tuple(sorted(r for r, p in self._planned.items() if p.nccl))
        nccl: NcclReady | None = None
        if nccl_ranks:
            try:
                from ...nccl import load_nccl
                nccl = NcclReady(bytes(load_nccl().unique_id()), nccl_ranks)
            except Exception as e:  # noqa: BLE001 - no NCCL here: the ranks that need it are told
                for m in list(self._by_rank.values()):
                    m.send(failed_message(self.epoch, "ERR_SHARD_PLAN", f"the hub could not make the NCCL unique id for ranks "
                                                                        f"{', '.join(map(str, nccl_ranks))}: {e}", list(nccl_ranks)))
                return
        message = ready_message(self.epoch, nccl)
        for m in list(self._by_rank.values()):
            m.send(message)

    def _on_closed(self, member: _Member, reason: IpcError | None) -> None:
        if member.closed:
            return
        member.closed = True
        if member in self._members:
            self._members.remove(member)
        rank = member.rank
        if rank is None or self._by_rank.get(rank) is not member:
            return
        del self._by_rank[rank]
        self._planned.pop(rank, None)
        why = str(reason) if reason is not None else "it left the group"
        message = lost_message(self.epoch, rank, f"rank {rank}'s link to the hub closed: {why}")
        for m in list(self._by_rank.values()):
            m.send(message)

    def _drop(self, member: _Member, error: BaseException | None) -> None:
        """Closes a member's link (a bad message): it is lost to the group like one that died."""
        if member.link is not None:
            member.link.close()
        self._on_closed(member, error if isinstance(error, IpcError) else None)
