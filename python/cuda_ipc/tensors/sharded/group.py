"""A sharded sync group (docs/PROTOCOL.md 9.3; src/tensors/sharded/group.ts): ranks that hold
sources and need destinations, joined through a hub, each sync moving every byte once, from the
rank that holds it to the rank that needs it.

    group = ShardGroup.host(listen="tcp://0.0.0.0:7000", token=token, size=4, layout=layout,
                            sources=[...], destinations=[...])          # or ShardGroup.join(connect=...)
    r = group.sync(timeout=30)            # SyncResult: version, sent, received, paths, timings
    group.relayout(layout, sources, destinations)
    group.close()

A rank's tensors are HostArrays (host memory: the CPU tests run whole groups this way) or CUDA
tensors on its layout's GPU. Same-node runs ('local', 'ipc') are copied by the destination from
the source's memory as mapped here (its tensor set, received on the source's serve link), in one
batch per sync once every source said ``go``; the destination answers ``done``. The NCCL path
(ranks on different nodes) is not in the Python group yet: a rank that has an 'nccl' pair leaves
the group saying so (ERR_UNSUPPORTED).

State changes run on one control thread per rank, fed by a queue from the link readers; sync() runs
on the caller's thread and waits on the rank's condition."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, NamedTuple, Sequence

from ...errors import IpcError
from ...link.connect.endpoints import connect
from ...link.connection.link import Link
from .device_copy import DeviceRunCopier, synchronize_sources
from .group_links import Post, Served, ServeListener, SourceLink, open_source, read_loop, serve_name
from .group_memory import local_memories, memory_kind, received_memories
from .group_wire import (
    AT_DESTINATION, AT_MEMBER, AT_SOURCE, DEFAULT_SHARD_CHUNK_BYTES, Done, Go, Lost, Plan, Ready, Refused, ShardError, Sources,
    close_values, done_message, go_message, join_message, parse_message, planned_message, sources_message,
)
from .host_copy import CopyPair, HostRunCopier, RunMemory
from .hub import ShardHub
from .layout import RankLayout
from .layout_wire import decode_layout, encode_layout
from .plan import ShardPlan, plan_sharded

#: Seconds host()/join()/relayout() wait for the group to be ready by default.
DEFAULT_READY_TIMEOUT = 60.0


class SyncResult(NamedTuple):
    #: this rank's version after the sync
    version: int
    #: bytes this rank's sources gave (to its destinations and others'), bytes its destinations received
    sent: int
    received: int
    #: bytes by path: 'local', 'ipc', 'nccl'
    paths: dict[str, int]
    #: NCCL staging bytes used (0: no NCCL path)
    staging: int
    #: seconds: 'wait' (until every go came), 'copy', 'done' (until every destination said done)
    timings: dict[str, float]


class _Sync:
    def __init__(self, version: int, epoch: int, need_go: list[int], expect_done: int):
        self.version = version
        self.epoch = epoch
        self.need_go = need_go  # source ranks whose go has not come yet
        self.gos: dict[int, int] = {}  # source rank -> the version its go said
        self.expect_done = expect_done
        self.done = 0
        self.copying = False
        self.error: ShardError | None = None


class ShardGroup:
    """One rank of a sync group; ``ShardGroup.host(...)`` or ``ShardGroup.join(...)`` (module notes)."""

    def __init__(self, layout: RankLayout, sources: Sequence[Any], destinations: Sequence[Any], serve: str | None, _token: object = None):
        if _token is not _CREATE:
            raise IpcError("ERR_INVALID_ARG", "use ShardGroup.host(...) or ShardGroup.join(...)")
        self._set_tensors(layout, sources, destinations)
        self.rank = layout.rank
        self._cond = threading.Condition(threading.RLock())
        self._events: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
        self._epoch = 0
        self._status = "joining"  # planning, ready, failed, closed
        self._failure: ShardError | None = None
        self._refused: ShardError | None = None
        self._version = 0
        self._plan: ShardPlan | None = None
        self._planned_epoch = 0
        self._pending: tuple[RankLayout, bytes, list[RunMemory], list[RunMemory], Any] | None = None
        self._layouts: list[RankLayout] = []
        self._sources_in: dict[int, SourceLink] = {}
        self._served: list[Served] = []
        self._sync: _Sync | None = None
        self._copy_running = False
        self._lost_sources: list[SourceLink] = []
        self._copier: HostRunCopier | DeviceRunCopier | None = None
        self._hub: ShardHub | None = None
        self._to_hub: Callable[[dict[str, Any]], None] = lambda m: None
        self._hub_link: Link | None = None
        self._serve: ServeListener | None = None
        self._serve_address = serve
        if self._src_mem:
            self._serve_address = serve or serve_name(self.rank)
            self._serve = ServeListener(self._serve_address, self._post)
        self._control = threading.Thread(target=self._run, name=f"shard-rank-{self.rank}", daemon=True)
        self._control.start()

    # -- creating ------------------------------------------------------------------------------------

    @classmethod
    def host(cls, *, listen: str, size: int, layout: RankLayout, sources: Sequence[Any] = (), destinations: Sequence[Any] = (),
             token: str | bytes | None = None, serve: str | None = None, chunk_bytes: int = DEFAULT_SHARD_CHUNK_BYTES,
             timeout: float | None = DEFAULT_READY_TIMEOUT, listen_options: dict[str, Any] | None = None) -> "ShardGroup":
        """The hub's rank: listens on ``listen`` for the other ``size - 1`` ranks and returns once the group
        is ready for its first sync (``timeout`` seconds; None: wait, 0: return at once, sync() waits)."""
        group = cls(layout, sources, destinations, serve, _CREATE)
        try:
            group._hub = ShardHub(listen, size=size, token=token, chunk_bytes=chunk_bytes, listen_options=listen_options)
            group._to_hub = group._hub.local(lambda m: group._post("hub", None, m))
            group._to_hub(join_message(group.rank, group._record, group._serve_address))
            group.wait_ready(timeout)
        except BaseException:
            group.close()
            raise
        return group

    @classmethod
    def join(cls, *, connect: str, layout: RankLayout, sources: Sequence[Any] = (), destinations: Sequence[Any] = (),
             token: str | bytes | None = None, serve: str | None = None, timeout: float | None = DEFAULT_READY_TIMEOUT,
             connect_options: dict[str, Any] | None = None) -> "ShardGroup":
        """A member: connects to the hub at ``connect``, joins, returns once the group is ready (see host)."""
        group = cls(layout, sources, destinations, serve, _CREATE)
        try:
            options = dict(connect_options or {})
            if token is not None:
                options["token"] = token
            link = _connect(connect, options)
            group._hub_link = link
            group._to_hub = lambda m: link.send(m, timeout=10.0)
            threading.Thread(target=read_loop, args=(link, "hub", None, group._post), name="shard-hub-link", daemon=True).start()
            group._to_hub(join_message(group.rank, group._record, group._serve_address))
            group.wait_ready(timeout)
        except BaseException:
            group.close()
            raise
        return group

    def _set_tensors(self, layout: RankLayout, sources: Sequence[Any], destinations: Sequence[Any]) -> None:
        record = encode_layout(layout)
        self._layout = layout
        self._record = record
        self._src_mem = local_memories(layout.sources, list(sources), "sources", layout.gpu)
        self._dst_mem = local_memories(layout.destinations, list(destinations), "destinations", layout.gpu)
        self._shared = _share(layout, sources) if self._src_mem else None
        kinds = {memory_kind(self._src_mem), memory_kind(self._dst_mem)} - {None}
        if len(kinds) > 1:
            raise IpcError("ERR_INVALID_ARG", "a rank's sources and destinations are all HostArrays or all on its GPU, not both")
        self._kind = kinds.pop() if kinds else "host"

    # -- the public part -----------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Syncs this rank completed (a failed one does not count)."""
        return self._version

    @property
    def epoch(self) -> int:
        """The plan this rank follows (1, 2, ...; 0 before the first)."""
        return self._epoch

    @property
    def plan(self) -> ShardPlan | None:
        """This rank's pairs of the current epoch."""
        return self._plan

    @property
    def layout(self) -> RankLayout:
        return self._layout

    @property
    def address(self) -> str | None:
        """The hub's: the address members connect to (a TCP URL with its port); None for a member."""
        return self._hub.address if self._hub is not None else None

    @property
    def waiting_for(self) -> list[int]:
        """The ranks the pending sync still waits for (sources whose go, destinations whose done did not come)."""
        with self._cond:
            return self._waiting_for(self._sync) if self._sync is not None else []

    @property
    def copied(self) -> bool:
        """Whether the pending sync copied this rank's runs already (waiting for its destinations only)."""
        with self._cond:
            return self._sync is not None and self._sync.copying and not self._sync.need_go

    def sync(self, timeout: float | None = None) -> SyncResult:
        """Moves this rank's share of the weights: returns once its destinations hold the sync's version
        and its destinations said done. ERR_SHARD_PEER_LOST (detail ranks, half_written, version) when
        a rank or link of the group went away, ERR_TIMEOUT (detail waiting_for) past ``timeout`` seconds;
        both leave the group failed until it plans again (a replacement joins, or relayout())."""
        deadline = None if timeout is None else time.monotonic() + timeout
        t0 = time.monotonic()
        with self._cond:
            while self._status in ("joining", "planning") and self._failure is None:
                if not self._wait(deadline):
                    raise self._timeout(None, timeout)
            if self._status == "closed":
                raise IpcError("ERR_CLOSED", "sync: the group is closed")
            if self._failure is not None:
                raise self._failure.again(version=self._version, half_written=[])
            if self._sync is not None:
                raise IpcError("ERR_INVALID_STATE", "sync: another sync of this rank is pending; one at a time")
            plan = self._plan
            assert plan is not None
            s = _Sync(self._version + 1, self._epoch, sorted(self._sources_in), sum(1 for p in plan.pairs if p.src == self.rank and p.path == "ipc"))
            self._sync = s
            self._take_gos()
            served = [x for x in self._served if not x.closed]
            copier = self._copier
        try:
            if s.expect_done and self._kind == "device":
                synchronize_sources(self._layout.gpu)
            for x in served:
                x.go = s.version
                try:
                    x.link.send(go_message(s.epoch, s.version), timeout=10.0)
                except IpcError:
                    pass  # its reader sees the link close
            with self._cond:
                while s.need_go and s.error is None:
                    if not self._wait(deadline):
                        raise self._timeout(s, timeout)
                if s.error is not None:
                    raise s.error
                s.copying = True
                self._copy_running = True
                links = [(r, self._sources_in[r]) for r in sorted(s.gos)]
            t1 = time.monotonic()
            assert copier is not None
            try:
                copier.copy()
            finally:
                with self._cond:
                    self._copy_running = False
                    self._release_lost()
            t2 = time.monotonic()
            for r, src in links:
                if src.link is not None:
                    try:
                        src.link.send(done_message(s.epoch, s.gos[r]), timeout=10.0)
                    except IpcError:
                        pass
            with self._cond:
                while s.done < s.expect_done and s.error is None:
                    if not self._wait(deadline):
                        raise self._timeout(s, timeout)
                if s.error is not None:
                    raise s.error
                self._version = s.version
                self._sync = None
            t3 = time.monotonic()
        except BaseException:
            with self._cond:
                if self._sync is s:
                    self._sync = None
            raise
        sent, received, paths = _bytes(plan, self.rank)
        return SyncResult(s.version, sent, received, paths, 0, {"wait": t1 - t0, "copy": t2 - t1, "done": t3 - t2})

    def relayout(self, layout: RankLayout, sources: Sequence[Any] = (), destinations: Sequence[Any] = (),
                 timeout: float | None = DEFAULT_READY_TIMEOUT) -> None:
        """A new layout and tensors (the same rank): the hub plans the group again; returns once it is
        ready. A layout the group cannot plan is refused (LayoutError's code) and the old one stays."""
        if layout.rank != self.rank:
            raise IpcError("ERR_INVALID_ARG", f"relayout: the layout is rank {layout.rank}'s; this is rank {self.rank}")
        record = encode_layout(layout)
        src = local_memories(layout.sources, list(sources), "sources", layout.gpu)
        dst = local_memories(layout.destinations, list(destinations), "destinations", layout.gpu)
        if src and self._serve is None:
            self._serve_address = self._serve_address or serve_name(self.rank)
            self._serve = ServeListener(self._serve_address, self._post)
        with self._cond:
            if self._sync is not None:
                raise IpcError("ERR_INVALID_STATE", "relayout: a sync is pending; wait for it first")
            self._pending = (layout, record, src, dst, (list(sources), list(destinations)))
            self._refused = None
            target = self._epoch
        self._to_hub(join_message(self.rank, record, self._serve_address if src else None))
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not (self._record == record and self._epoch > target and self._status == "ready"):
                if self._refused is not None:
                    self._pending = None
                    raise self._refused
                if self._status == "closed" or (self._failure is not None and self._failure.code == "ERR_SHARD_PEER_LOST" and self._hub_lost):
                    raise self._failure or IpcError("ERR_CLOSED", "relayout: the group is closed")
                if not self._wait(deadline):
                    raise ShardError("ERR_TIMEOUT", f"relayout: the group did not plan rank {self.rank}'s new layout within {timeout} s",
                                     {"waiting_for": []})

    def close(self) -> None:
        """Leaves the group (the hub tells the others this rank is lost); the hub's close ends the group."""
        with self._cond:
            if self._status == "closed":
                return
            self._status = "closed"
            if self._sync is not None and self._sync.error is None:
                self._sync.error = ShardError("ERR_CLOSED", "the group was closed while this sync was pending", {"ranks": []})
            self._cond.notify_all()
        if self._hub_link is not None:
            self._hub_link.close()
        if self._hub is not None:
            self._hub.close()
        if self._serve is not None:
            self._serve.close()
        self._events.put(("stop", None, None))
        if self._control is not threading.current_thread():
            self._control.join(timeout=10)

    def __enter__(self) -> "ShardGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<cuda_ipc ShardGroup rank {self.rank} epoch {self._epoch} version {self._version} {self._status}>"

    # -- waiting -------------------------------------------------------------------------------------

    _hub_lost = False

    def _wait(self, deadline: float | None) -> bool:
        """Waits on the condition until notified or the deadline; False once the deadline passed."""
        if deadline is None:
            self._cond.wait()
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self._cond.wait(left)
        return True

    def wait_ready(self, timeout: float | None = DEFAULT_READY_TIMEOUT) -> None:
        """Returns once the group is ready to sync (host(timeout=0) returns at once: a TCP hub's ``address``
        is known then). Raises the hub's refusal, the group's failure, or ERR_TIMEOUT."""
        if timeout == 0:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._status != "ready":
                if self._refused is not None:
                    raise self._refused
                if self._failure is not None:
                    raise self._failure.again(version=self._version, half_written=[])
                if not self._wait(deadline):
                    raise ShardError("ERR_TIMEOUT", f"rank {self.rank}: the group was not ready within {timeout} s (epoch {self._epoch}, "
                                     f"{'waiting for ranks to join' if self._epoch == 0 else 'waiting for every rank to plan'})", {"waiting_for": []})

    def _waiting_for(self, s: _Sync) -> list[int]:
        ranks = set(s.need_go)
        if s.done < s.expect_done and self._plan is not None:
            ranks.update(p.dst for p in self._plan.pairs if p.src == self.rank and p.path == "ipc")  # serve links do not say who they are
        return sorted(ranks)

    def _timeout(self, s: _Sync | None, timeout: float | None) -> ShardError:
        """ERR_TIMEOUT naming what the sync waited for; the group is failed (as lost) until it plans again."""
        waiting = self._waiting_for(s) if s is not None else []
        e = ShardError("ERR_TIMEOUT", f"sync: rank {self.rank} waited {timeout} s for "
                       + (f"ranks {', '.join(map(str, waiting))}" if waiting else "the group to be ready")
                       + "; the group needs a new plan (a replacement rank, or relayout()) before it syncs again",
                       {"waiting_for": waiting, "ranks": waiting, "version": self._version,
                        "half_written": self._half_written(s) if s is not None else []})
        if s is not None:
            self._fail(e.again(half_written=[]))
        return e

    def _half_written(self, s: _Sync) -> list[str]:
        if not s.copying or self._plan is None:
            return []
        touched = {r.dst_tensor for p in self._plan.pairs if p.dst == self.rank and p.path in ("local", "ipc") for r in p.runs}
        return [self._layout.destinations[i].name for i in sorted(touched)]

    def _fail(self, error: ShardError) -> None:
        """With the condition held: the group failed; the pending sync fails with ``error`` (this rank's detail)."""
        if self._status == "closed":
            return
        self._failure = error
        self._status = "failed"
        s = self._sync
        if s is not None and s.error is None:
            s.error = error.again(version=self._version, half_written=self._half_written(s))
        self._cond.notify_all()

    # -- the control thread --------------------------------------------------------------------------

    def _post(self, kind: str, subject: Any, value: Any) -> None:
        self._events.put((kind, subject, value))

    def _run(self) -> None:
        while True:
            kind, subject, value = self._events.get()
            if kind == "stop":
                self._teardown()
                return
            try:
                with self._cond:
                    self._on_event(kind, subject, value)
            except Exception as e:  # noqa: BLE001 - the rank fails; it must not stop reading its links
                with self._cond:
                    self._fail(e if isinstance(e, ShardError) else ShardError(getattr(e, "code", "ERR_SHARD_PROTOCOL"), str(e), {"ranks": []}))

    def _on_event(self, kind: str, subject: Any, value: Any) -> None:
        if self._status == "closed":
            close_values(value)
            return
        if kind == "hub":
            self._on_hub(value)
        elif kind == "hub-closed":
            self._hub_lost = True
            self._fail(ShardError("ERR_SHARD_PEER_LOST", f"rank {self.rank}'s link to the group's hub closed ({value}); the group is over "
                                  "for this rank: join a new one", {"ranks": []}))
        elif kind == "served-open":
            self._served.append(subject)
            if self._epoch and self._shared is not None:
                self._send_sources(subject)
        elif kind == "served":
            self._on_served(subject, value)
        elif kind == "served-closed":
            subject.closed = True
            if subject in self._served:
                self._served.remove(subject)
            s = self._sync
            if s is not None and s.done + sum(1 for x in self._served if x.go == s.version and x.done < s.version) < s.expect_done:
                ranks = sorted({p.dst for p in self._plan.pairs if p.src == self.rank and p.path == "ipc"}) if self._plan else []
                self._fail(ShardError("ERR_SHARD_PEER_LOST", f"a destination's serve link to rank {self.rank} closed mid-sync ({value}); "
                                      f"it was one of ranks {', '.join(map(str, ranks))}", {"ranks": ranks}))
        elif kind == "source":
            self._on_source(subject, value)
        elif kind == "source-closed":
            if subject.closed or subject.epoch != self._epoch or self._sources_in.get(subject.rank) is not subject:
                return  # a link of an epoch that ended, closed by this side
            subject.closed = True
            self._fail(ShardError("ERR_SHARD_PEER_LOST", f"rank {self.rank}'s link to source rank {subject.rank} closed ({value})",
                                  {"ranks": [subject.rank]}))
            subject.close()

    def _on_hub(self, value: Any) -> None:
        try:
            msg = parse_message(value, AT_MEMBER)
        except ShardError as e:
            if self._hub_link is not None:
                self._hub_link.close()
            self._hub_lost = True
            self._fail(e.again(ranks=[]))
            return
        if isinstance(msg, Plan):
            self._on_plan(msg)
        elif isinstance(msg, Ready):
            if msg.epoch == self._epoch and self._status == "planning" and self._planned_epoch == msg.epoch:
                self._status = "ready"
                self._cond.notify_all()
        elif isinstance(msg, Lost):
            if msg.epoch >= self._epoch:
                source = self._sources_in.pop(msg.rank, None)
                self._fail(ShardError("ERR_SHARD_PEER_LOST", f"rank {msg.rank} left the group: {msg.reason}", {"ranks": [msg.rank]}))
                if source is not None:
                    source.closed = True
                    self._lost_sources.append(source)
                    self._release_lost()
        elif isinstance(msg, Refused):
            e = ShardError(msg.code, f"the hub refused: {msg.message}", {"ranks": []})
            if self._pending is not None or self._status == "joining":
                self._refused = e
                self._cond.notify_all()
            else:
                self._fail(e)

    def _on_plan(self, msg: Plan) -> None:
        if msg.epoch <= self._epoch:
            return
        layouts = [decode_layout(b) for b in msg.layouts]
        mine = next((i for i, x in enumerate(layouts) if x.rank == self.rank), None)
        if mine is None:
            raise ShardError("ERR_SHARD_PROTOCOL", f"the hub's plan of epoch {msg.epoch} has no layout for rank {self.rank}", {"ranks": []})
        if self._pending is not None and msg.layouts[mine] == self._pending[1]:
            layout, record, src, dst, given = self._pending
            self._pending = None
            self._layout, self._record, self._src_mem, self._dst_mem = layout, record, src, dst
            self._shared = _share(layout, given[0]) if src else None
            kinds = {memory_kind(src), memory_kind(dst)} - {None}
            self._kind = kinds.pop() if kinds else "host"
        elif msg.layouts[mine] != self._record:
            raise ShardError("ERR_SHARD_PROTOCOL", f"the hub's plan of epoch {msg.epoch} gives rank {self.rank} a layout it did not send", {"ranks": []})
        # The old epoch ends: its mappings, its table; a pending sync fails.
        if self._sync is not None and self._sync.error is None:
            self._sync.error = ShardError("ERR_SHARD_PLAN", f"the group planned again (epoch {msg.epoch}) while this sync was pending",
                                          {"ranks": [], "version": self._version, "half_written": self._half_written(self._sync)})
        self._end_epoch()
        self._epoch = msg.epoch
        self._failure = None
        self._status = "planning"
        self._layouts = layouts
        plan = plan_sharded(layouts, rank=self.rank)
        self._plan = plan
        nccl = [p for p in plan.pairs if p.path == "nccl"]
        if nccl:
            p = nccl[0]
            self._fail(ShardError("ERR_UNSUPPORTED", f"rank {p.src} -> rank {p.dst} crosses nodes ('nccl' path); the Python group moves "
                                  "runs within a node only (host memory never crosses nodes); give ranks of one machine one node id", {"ranks": []}))
            if self._hub_link is not None:
                self._hub_link.close()  # the others see this rank lost instead of waiting for it
            return
        for x in self._served:
            if not x.closed and self._shared is not None:
                self._send_sources(x)
        by_rank = {x.rank: i for i, x in enumerate(layouts)}
        for p in plan.pairs:
            if p.dst == self.rank and p.path == "ipc":
                address = msg.serve[by_rank[p.src]]
                if address is None:
                    raise ShardError("ERR_SHARD_PROTOCOL", f"rank {p.src} has sources for rank {self.rank} but no serve address", {"ranks": [p.src]})
                source = SourceLink(p.src, msg.epoch)
                self._sources_in[p.src] = source
                open_source(source, address, self._post, 30.0)
        self._maybe_planned()

    def _send_sources(self, served: Served) -> None:
        try:
            served.link.send(sources_message(self._epoch, self.rank, self._shared), timeout=10.0)
            served.sent_epoch = self._epoch
        except IpcError:
            pass  # its reader sees the link close

    def _on_source(self, source: SourceLink, value: Any) -> None:
        try:
            msg = parse_message(value, AT_DESTINATION)
        except ShardError as e:
            close_values(value)
            if source.link is not None:
                source.link.close()
            if source.epoch == self._epoch and self._sources_in.get(source.rank) is source:
                self._fail(e.again(ranks=[source.rank]))
            return
        if source.closed or source.epoch != self._epoch:
            close_values(value)
            return
        if isinstance(msg, Sources):
            if msg.epoch != source.epoch or msg.rank != source.rank or source.tensors is not None:
                msg.tensors.close(sync=False)  # an older epoch's (sent before the source planned this one), or a repeat
                return
            layout = next(x for x in self._layouts if x.rank == source.rank)
            source.tensors = msg.tensors
            source.memories, source.views = received_memories(layout.sources, msg.tensors, source.rank)
            self._maybe_planned()
        elif isinstance(msg, Go):
            if msg.epoch == source.epoch:
                source.gos.append(msg.version)
                self._take_gos()

    def _on_served(self, served: Served, value: Any) -> None:
        try:
            msg = parse_message(value, AT_SOURCE)
        except ShardError:
            close_values(value)
            served.link.close()  # its close event decides whether a sync fails
            return
        assert isinstance(msg, Done)
        s = self._sync
        if s is not None and msg.epoch == s.epoch and msg.version == s.version and served.go == s.version and served.done < s.version:
            served.done = s.version
            s.done += 1
            self._cond.notify_all()

    def _take_gos(self) -> None:
        s = self._sync
        if s is None or s.error is not None:
            return
        for r in list(s.need_go):
            src = self._sources_in.get(r)
            if src is not None and src.gos:
                s.gos[r] = src.gos.popleft()
                s.need_go.remove(r)
        self._cond.notify_all()

    def _maybe_planned(self) -> None:
        """Once every source's set arrived: the epoch's copy table, then planned to the hub."""
        if self._status != "planning" or self._planned_epoch == self._epoch or any(x.tensors is None for x in self._sources_in.values()):
            return
        plan = self._plan
        assert plan is not None
        pairs = []
        for p in plan.pairs:
            if p.dst != self.rank:
                continue
            pairs.append(CopyPair(p, self._src_mem if p.path == "local" else self._sources_in[p.src].memories))
        copier: HostRunCopier | DeviceRunCopier = HostRunCopier() if self._kind == "host" else DeviceRunCopier(self._layout.gpu)
        copier.compile(pairs, self._dst_mem)
        self._copier = copier
        self._planned_epoch = self._epoch
        self._to_hub(planned_message(self._epoch, plan.fingerprint, False))

    def _release_lost(self) -> None:
        """Drops the mappings of lost sources (and the table that reads them) once no copy reads them."""
        if self._copy_running or not self._lost_sources:
            return
        if self._copier is not None:
            self._copier.close()
            self._copier = None
        for source in self._lost_sources:
            source.close()
        self._lost_sources = []

    def _end_epoch(self) -> None:
        if self._copier is not None:
            self._copier.close()  # its slices of the sources' memory first
            self._copier = None
        self._lost_sources.extend(self._sources_in.values())
        self._sources_in = {}
        self._release_lost()

    def _teardown(self) -> None:
        with self._cond:
            self._end_epoch()
            for x in self._served:
                x.link.close()
            self._served = []
        while True:  # what the readers posted after the stop: their tensor sets closed
            try:
                _, _, value = self._events.get_nowait()
            except queue.Empty:
                return
            close_values(value)


def _share(layout: RankLayout, sources: Sequence[Any]) -> Any:
    from ..tensor_set_transfer import share_tensors
    return share_tensors([(local.name, obj) for local, obj in zip(layout.sources, sources)])


def _connect(address: str, options: dict[str, Any]) -> Link:
    return connect(address, **options)


def _bytes(plan: ShardPlan, rank: int) -> tuple[int, int, dict[str, int]]:
    sent = received = 0
    paths = {"local": 0, "ipc": 0, "nccl": 0}
    for p in plan.pairs:
        if p.src == rank:
            sent += p.bytes
        if p.dst == rank:
            received += p.bytes
            paths[p.path] += p.bytes
    return sent, received, paths


_CREATE = object()
