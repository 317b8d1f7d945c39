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
batch per sync once every source said ``go``; the destination answers ``done``. Runs between
nodes (device memory) go over the epoch's NCCL communicator in rounds of chunks (nccl_runs.py); a
host rank with such a pair leaves the group saying so (ERR_UNSUPPORTED).

State changes run on one control thread per rank, fed by a queue from the link readers; sync() runs
on the caller's thread and waits on the rank's condition."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, NamedTuple, Sequence

from ...cuda.device import Device, set_working_device
from ...cuda.stream import stream_handle
from ...errors import IpcError
from ...link.connect.endpoints import connect
from ...link.connection.link import Link
from .device_copy import DeviceRunCopier, synchronize_sources
from .group_control import RankControl, _share, _Sync
from .group_links import Served, ServeListener, SourceLink, read_loop, serve_name
from .group_memory import local_memories, rank_kind
from .group_wire import DEFAULT_SHARD_CHUNK_BYTES, ShardError, done_message, go_message, join_message
from .host_copy import HostRunCopier, RunMemory
from .hub import ShardHub
from .layout import RankLayout
from .layout_wire import encode_layout
from .plan import ShardPlan


#: Seconds host()/join()/relayout() wait for the group to be ready by default.
DEFAULT_READY_TIMEOUT = 60.0
# How long a rank whose NCCL transfers failed waits for the hub's verdict (the lost rank) before it
# blames its NCCL peers: NCCL's error names no rank (Node: NCCL_VERDICT_MS).
NCCL_VERDICT_S = 2.0


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


class ShardGroup(RankControl):
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
        self._retired: list[Any] = []
        self._nccl_stop = threading.Event()
        self._nccl_peers: list[int] = []
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
        self._kind = rank_kind(self._src_mem, self._dst_mem)
        if self._kind == "device":
            # The sources' tensor sets are mapped by the links' reader threads: on this rank's GPU.
            set_working_device(Device.get(layout.gpu))

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

    def sync(self, timeout: float | None = None, stream: Any = None) -> SyncResult:
        """Moves this rank's share of the weights: returns once its destinations hold the sync's version
        and its destinations said done. ``stream``: where this rank's sources were last written (a
        torch.cuda.Stream, a CuPy or cuda.core stream, or an int CUstream); the sync
        waits for it instead of the whole GPU. ERR_SHARD_PEER_LOST (detail ranks, half_written, version)
        when a rank or link of the group went away, ERR_TIMEOUT (detail waiting_for) past ``timeout``
        seconds; both leave the group failed until it plans again (a replacement joins, or relayout()).
        ERR_INVALID_ARG for a ``stream`` that is not one, or on a rank without device memory."""
        handle = None
        if stream is not None:
            handle = stream_handle(stream)
            if self._kind != "device":
                raise IpcError("ERR_INVALID_ARG", f"sync: stream is for device memory; rank {self.rank} holds {self._kind} memory")
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
            s = _Sync(self._version + 1, self._epoch, sorted(self._sources_in), sorted({p.dst for p in plan.pairs if p.src == self.rank and p.path == "ipc"}))
            self._sync = s
            self._take_gos()
            s.served = [x for x in self._served if x.attached and not x.closed and x.epoch == s.epoch]
            for x in s.served:
                x.gos += 1
        try:
            if (s.serves or self._mover is not None) and self._kind == "device":
                synchronize_sources(self._layout.gpu, handle)
            for x in s.served:
                try:
                    x.link.send(go_message(s.epoch, s.version), timeout=10.0)
                except IpcError:
                    pass  # its reader sees the link close
            staging = self._move_nccl(s, deadline, timeout)
            with self._cond:
                while s.need_go and s.error is None:
                    if not self._wait(deadline):
                        raise self._timeout(s, timeout)
                if s.error is not None:
                    raise s.error
                copier = self._copier
                if copier is None:
                    raise ShardError("ERR_SHARD_PLAN", f"sync: rank {self.rank}'s epoch {s.epoch} ended before its copy", {"ranks": []})
                s.copying = True
                self._copy_running = True
                links = [(r, self._sources_in[r]) for r in sorted(s.gos)]
            t1 = time.monotonic()
            try:
                copier.copy()
            except Exception as err:
                with self._cond:
                    if s.error is None:
                        self._fail(ShardError("ERR_SHARD_COPY", f"sync: rank {self.rank}'s copy of version {s.version} failed: {err}",
                                              {"ranks": [], "version": self._version}))
                    failure = s.error
                # Its sources wait for its 'done': their serve links dropped, they fail now, not at their timeout.
                for _, src in links:
                    if src.link is not None:
                        src.link.close()
                assert failure is not None
                raise failure from err
            finally:
                with self._cond:
                    self._copy_running = False
                    self._release_lost()
            t2 = time.monotonic()
            for r, src in links:
                if src.link is not None:
                    try:
                        src.link.send(done_message(s.epoch, s.version), timeout=10.0)
                    except IpcError:
                        pass
            with self._cond:
                while s.waiting_done() and s.error is None:
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
        return SyncResult(s.version, sent, received, paths, staging, {"wait": t1 - t0, "copy": t2 - t1, "done": t3 - t2})

    def _move_nccl(self, s: _Sync, deadline: float | None, timeout: float | None) -> int:
        """This rank's NCCL rounds of the sync (before its own copy: its destinations elsewhere wait on
        them); the staging bytes used. A failure fails the group (the communicator aborted)."""
        with self._cond:
            if self._mover is None:
                return 0
            if s.error is not None:
                raise s.error
            mover, comm, stop = self._mover, self._comm, self._nccl_stop
            self._nccl_running = True
        try:
            staging: int = mover.move(comm, stop, deadline)
        except Exception as e:
            with self._cond:
                if s.error is None:
                    peers = list(self._nccl_peers)
                    if getattr(e, "code", None) == "ERR_TIMEOUT":
                        self._fail(ShardError("ERR_TIMEOUT", f"sync: rank {self.rank}'s NCCL rounds did not end within {timeout} s (peers "
                                              f"{', '.join(map(str, peers))}); the group needs a new plan", {"waiting_for": peers, "ranks": peers}))
                    else:
                        # NCCL's error names no rank; the hub names the lost one ('lost') once the
                        # dead rank's control link closes: wait a little for that verdict.
                        self._cond.wait_for(lambda: s.error is not None, NCCL_VERDICT_S)
                        if s.error is None:
                            self._fail(ShardError("ERR_SHARD_PEER_LOST", f"sync of version {s.version} at rank {self.rank}: its NCCL transfers failed ({e}); "
                                                  f"one of its NCCL peers (ranks {', '.join(map(str, sorted(peers)))}) or the network to it is gone, and the hub "
                                                  f"named none within {int(NCCL_VERDICT_S * 1000)} ms", {"ranks": sorted(peers)}))
                self._nccl_running = False
                if self._mover is not mover:
                    mover.close()  # the epoch ended meanwhile
                error = s.error
            assert error is not None
            raise error from e
        with self._cond:
            self._nccl_running = False
            if self._mover is not mover:
                mover.close()
        return staging

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
                if self._status == "closed" or self._hub_lost:  # no plan can come any more
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
