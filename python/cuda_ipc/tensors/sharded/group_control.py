"""The control thread of a sync group's rank (src/tensors/sharded/group-control.ts): every state change
of the rank runs here, in the order the links' readers posted what they read: the hub's messages
(plan, ready, lost, refused), the serve links' (a destination opened one; its done), the links to
sources (their tensor set; their go). sync() (group.py) waits on the condition this thread notifies."""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Sequence

from ...errors import IpcError
from ...link.connection.link import Link
from .device_copy import DeviceRunCopier
from .group_links import Served, SourceLink, open_source
from .group_memory import rank_kind, received_memories
from .group_wire import (
    AT_DESTINATION, AT_MEMBER, AT_SOURCE, Done, Failed, Go, Hello, Lost, Plan, Ready, Refused, ShardError, Sources, close_values,
    parse_message, planned_message, sources_message,
)
from .host_copy import CopyPair, HostRunCopier, RunMemory
from .hub import ShardHub
from .layout import RankLayout
from .layout_wire import decode_layout
from .plan import ShardPlan, plan_sharded


class _Sync:
    def __init__(self, version: int, epoch: int, need_go: list[int], serves: list[int]):
        self.version = version
        self.epoch = epoch
        self.need_go = need_go  # source ranks whose go has not come yet
        self.gos: dict[int, int] = {}  # source rank -> the version its go said
        self.serves = serves  # destination ranks this rank serves over 'ipc'
        self.served: list[Served] = []  # their links, each sent one go more than it answered
        self.copying = False
        self.error: ShardError | None = None

    def waiting_done(self) -> list[int]:
        """Destinations whose done for this sync has not come (or whose link was not there)."""
        answered = {x.rank for x in self.served if x.dones >= x.gos}
        return sorted(r for r in self.serves if r not in answered)


class RankControl:
    """The rank's state and its control thread; ShardGroup (group.py) is the public half."""

    rank: int
    _cond: threading.Condition
    _events: "queue.Queue[tuple[str, Any, Any]]"
    _epoch: int
    _status: str
    _failure: ShardError | None
    _refused: ShardError | None
    _version: int
    _plan: ShardPlan | None
    _planned_epoch: int
    _pending: tuple[RankLayout, bytes, list[RunMemory], list[RunMemory], Any] | None
    _layouts: list[RankLayout]
    _layout: RankLayout
    _record: bytes
    _src_mem: list[RunMemory]
    _dst_mem: list[RunMemory]
    _shared: Any
    _kind: str
    _sources_in: dict[int, SourceLink]
    _served: list[Served]
    _sync: _Sync | None
    _copy_running: bool
    _retired: list[Any]
    _lost_sources: list[SourceLink]
    _copier: HostRunCopier | DeviceRunCopier | None
    _to_hub: Callable[[dict[str, Any]], None]
    _hub_link: Link | None
    _hub: "ShardHub | None"
    _hub_lost = False
    _chunk_bytes = 64 << 20
    _comm: Any = None
    _mover: Any = None
    _nccl_running = False
    _nccl_peers: list[int] = []
    _nccl_stop = threading.Event()
    _hub_rank: int | None = None

    def _waiting_for(self, s: _Sync) -> list[int]:
        return sorted({*s.need_go, *s.waiting_done()})

    def _half_written(self, s: _Sync) -> list[str]:
        """This rank's destination tensors that the pending sync's copy is writing now (a failure after
        the copy finished leaves them whole, at the new values, and the version unchanged)."""
        if not (self._copy_running or self._nccl_running) or self._sync is not s or self._plan is None:
            return []
        paths = ("nccl",) if self._nccl_running else ("local", "ipc")
        touched = {r.dst_tensor for p in self._plan.pairs if p.dst == self.rank and p.path in paths for r in p.runs}
        return [self._layout.destinations[i].name for i in sorted(touched)]

    def _fail(self, error: ShardError) -> None:
        """With the condition held: the group failed; the pending sync fails with ``error`` (this rank's detail).
        The first failure stays the group's until it plans again (what followed from it adds nothing)."""
        if self._status == "closed":
            return
        if self._failure is None:
            self._failure = error
        self._status = "failed"
        if self._comm is not None:
            self._end_nccl()  # the epoch's communicator is aborted: a move in flight ends
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
                    self._fail(e if isinstance(e, ShardError) else
                               ShardError(getattr(e, "code", "ERR_SHARD_PROTOCOL"), f"rank {self.rank} failed: {type(e).__name__}: {e}", {"ranks": []}))

    def _on_event(self, kind: str, subject: Any, value: Any) -> None:
        if self._status == "closed":
            close_values(value)
            return
        if kind == "hub":
            self._on_hub(value)
        elif kind == "hub-closed":
            self._hub_lost = True
            self._fail(ShardError("ERR_SHARD_PEER_LOST", f"rank {self.rank}'s link to the group's hub closed ({value}); the group is over "
                                  "for this rank: join a new one", {"ranks": [] if self._hub_rank is None else [self._hub_rank]}))
        elif kind == "served-open":
            self._served.append(subject)  # sources go out once its hello says for which epoch
        elif kind == "served":
            self._on_served(subject, value)
        elif kind == "served-closed":
            subject.closed = True
            if subject in self._served:
                self._served.remove(subject)
            if subject.attached and subject.epoch == self._epoch:
                self._fail(ShardError("ERR_SHARD_PEER_LOST", f"rank {subject.rank}'s serve link from rank {self.rank} closed "
                                      f"(epoch {self._epoch}): {value}", {"ranks": [subject.rank]}))
        elif kind == "source":
            self._on_source(subject, value)
        elif kind == "nccl-ready":
            self._on_nccl(subject, value)
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
                mine = self._plan is not None and any(p.path == "nccl" for p in self._plan.pairs)
                if mine != (msg.nccl is not None and self.rank in msg.nccl.ranks):
                    raise ShardError("ERR_SHARD_PROTOCOL", f"the hub's ready of epoch {msg.epoch} {'leaves out' if mine else 'names'} "
                                     f"rank {self.rank} in the NCCL communicator, which it {'needs' if mine else 'does not need'}", {"ranks": []})
                if msg.nccl is None or not mine:
                    self._status = "ready"
                    self._cond.notify_all()
                else:
                    start_nccl(self._epoch, msg.nccl.id, list(msg.nccl.ranks), self.rank, self._layout.gpu, self._post)
        elif isinstance(msg, Lost):
            if msg.epoch >= self._epoch:
                source = self._sources_in.pop(msg.rank, None)
                self._fail(ShardError("ERR_SHARD_PEER_LOST", f"rank {msg.rank} left the group: {msg.reason}", {"ranks": [msg.rank]}))
                if source is not None:
                    source.closed = True
                    self._retire_copier()
                    self._lost_sources.append(source)
                    self._release_lost()
        elif isinstance(msg, Failed):
            if msg.epoch == self._epoch:
                self._fail(ShardError(msg.code, f"the hub failed epoch {msg.epoch}: {msg.message}", {"ranks": list(msg.ranks)}))
        elif isinstance(msg, Refused):
            refusal = ShardError(msg.code, f"the hub refused: {msg.message}", {"ranks": []})
            if self._pending is not None or self._status == "joining":
                self._refused = refusal
                self._cond.notify_all()
            else:
                self._fail(refusal)

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
            self._kind = rank_kind(src, dst)
        elif msg.layouts[mine] != self._record:
            raise ShardError("ERR_SHARD_PROTOCOL", f"the hub's plan of epoch {msg.epoch} gives rank {self.rank} a layout it did not send", {"ranks": []})
        # The old epoch ends: its mappings, its table; a pending sync fails.
        if self._sync is not None and self._sync.error is None:
            self._sync.error = ShardError("ERR_SHARD_PLAN", f"the group planned again (epoch {msg.epoch}) while this sync was pending",
                                          {"ranks": [], "version": self._version, "half_written": self._half_written(self._sync)})
        self._end_epoch()
        self._epoch = msg.epoch
        self._hub_rank = msg.hub if msg.hub is not None else self._hub_rank
        self._failure = None
        self._status = "planning"
        self._layouts = layouts
        plan = plan_sharded(layouts, rank=self.rank)
        self._plan = plan
        self._chunk_bytes = msg.chunk_bytes
        nccl = [p for p in plan.pairs if p.path == "nccl"]
        if nccl and self._kind == "host":
            p = nccl[0]
            self._fail(ShardError("ERR_UNSUPPORTED", f"rank {p.src} -> rank {p.dst} crosses nodes ('nccl' path) and rank {self.rank}'s "
                                  "memory is host memory, which moves within a node only; give ranks of one machine one node id", {"ranks": []}))
            if self._hub_link is not None:
                self._hub_link.close()  # the others see this rank lost instead of waiting for it
            elif self._hub is not None:
                self._hub.close()  # the hub's own rank: the group ends (its members see the hub lost)
            return
        for x in list(self._served):
            if x.rank is not None and x.epoch < msg.epoch:
                x.link.close()  # a link of an epoch that ended: its destination connects again
            elif x.rank is not None and x.epoch == msg.epoch:
                self._attach(x)  # it said hello before this rank had the plan
        by_rank = {x.rank: i for i, x in enumerate(layouts)}
        for p in plan.pairs:
            if p.dst == self.rank and p.path == "ipc":
                address = msg.serve[by_rank[p.src]]
                if address is None:
                    raise ShardError("ERR_SHARD_PROTOCOL", f"rank {p.src} has sources for rank {self.rank} but no serve address", {"ranks": [p.src]})
                source = SourceLink(p.src, msg.epoch)
                self._sources_in[p.src] = source
                open_source(source, address, self.rank, self._post, 30.0)
        self._maybe_planned()
        self._cond.notify_all()

    def _attach(self, served: Served) -> None:
        """Sends a destination that said hello for this epoch the tensor set (once per rank and epoch)."""
        plan = self._plan
        serves = {p.dst for p in plan.pairs if p.src == self.rank and p.path == "ipc"} if plan is not None else set()
        if served.rank not in serves or self._shared is None or \
                any(x.attached and x.rank == served.rank and x.epoch == served.epoch for x in self._served):
            served.link.close()
            return
        served.attached = True
        try:
            served.link.send(sources_message(self._epoch, self.rank, self._shared), timeout=10.0)
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
        assert isinstance(msg, (Sources, Go))
        if msg.epoch != source.epoch or (isinstance(msg, Sources) and msg.rank != source.rank):
            close_values(value)
            source.closed = True
            self._fail(ShardError("ERR_SHARD_PROTOCOL", f"source rank {source.rank} sent {value.get('shard')!r} of epoch {msg.epoch} "
                                  f"(rank {getattr(msg, 'rank', source.rank)}) on its link of epoch {source.epoch}", {"ranks": [source.rank]}))
            source.close()
            return
        if isinstance(msg, Sources):
            if source.tensors is not None:
                msg.tensors.close(sync=False)  # a repeat: the first one stays
                return
            layout = next(x for x in self._layouts if x.rank == source.rank)
            source.tensors = msg.tensors
            source.memories, source.views = received_memories(layout.sources, msg.tensors, source.rank)
            self._maybe_planned()
        elif isinstance(msg, Go):
            source.gos.append(msg.version)
            self._take_gos()

    def _on_served(self, served: Served, value: Any) -> None:
        try:
            msg = parse_message(value, AT_SOURCE)
            if served.rank is None and not isinstance(msg, Hello):
                raise ShardError("ERR_SHARD_PROTOCOL", f"a serve link began with '{value.get('shard')}', not 'hello'")
            if served.rank is not None and not (isinstance(msg, Done) and msg.epoch == served.epoch and served.dones < served.gos):
                raise ShardError("ERR_SHARD_PROTOCOL", f"rank {served.rank} sent {value.get('shard')!r} (epoch {value.get('epoch')}) on its "
                                 f"serve link of epoch {served.epoch}, where only one 'done' per 'go' belongs")
        except ShardError as e:
            close_values(value)
            served.link.close()
            if served.attached and served.epoch == self._epoch:
                self._fail(e.again(ranks=[served.rank]))
            return
        if isinstance(msg, Hello):
            served.rank, served.epoch = msg.rank, msg.epoch
            if msg.epoch < self._epoch:
                served.link.close()  # an epoch that ended here: the destination will have the new plan
            elif msg.epoch == self._epoch:
                self._attach(served)
            return  # a later epoch: attached once this rank has its plan
        served.dones += 1
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
            if p.dst != self.rank or p.path == "nccl":
                continue
            pairs.append(CopyPair(p, self._src_mem if p.path == "local" else self._sources_in[p.src].memories))
        copier: HostRunCopier | DeviceRunCopier = HostRunCopier() if self._kind == "host" else DeviceRunCopier(self._layout.gpu)
        copier.compile(pairs, self._dst_mem)
        self._copier = copier
        self._planned_epoch = self._epoch
        self._to_hub(planned_message(self._epoch, plan.fingerprint, any(p.path == "nccl" for p in plan.pairs)))

    def _on_nccl(self, epoch: int, made: Any) -> None:
        """The epoch's communicator made (or its error): the mover, then ready."""
        comm, ranks = made if isinstance(made, tuple) else (None, [])
        if epoch != self._epoch or self._status != "planning" or comm is None:
            if comm is not None:
                comm.abort()
            if epoch == self._epoch and comm is None:
                self._fail(ShardError("ERR_SHARD_PEER_LOST", f"rank {self.rank} could not join the epoch's NCCL communicator: {made}", {"ranks": []}))
            return
        plan = self._plan
        assert plan is not None
        from .host_copy import DeviceMemory
        from .nccl_runs import NcclRunMover, nccl_chunk_bytes
        sends = [p for p in plan.pairs if p.path == "nccl" and p.src == self.rank]
        recvs = [p for p in plan.pairs if p.path == "nccl" and p.dst == self.rank]
        try:
            self._mover = NcclRunMover(self._layout.gpu, sends, recvs, [m for m in self._src_mem if isinstance(m, DeviceMemory)],
                                       [m for m in self._dst_mem if isinstance(m, DeviceMemory)], nccl_chunk_bytes(plan.pairs, self._chunk_bytes), ranks.index)
        except BaseException:
            comm.abort()
            raise
        self._comm = comm
        self._nccl_peers = sorted({p.dst for p in sends} | {p.src for p in recvs})
        self._status = "ready"
        self._cond.notify_all()

    def _end_nccl(self) -> None:
        """Aborts the epoch's communicator (local: never waits for a peer) and lets the mover go."""
        self._nccl_stop.set()
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.abort()
        if self._mover is not None and not self._nccl_running:
            self._mover.close()
            self._mover = None

    def _release_lost(self) -> None:
        """Closes retired copiers and drops the mappings of lost sources, once no copy reads them."""
        if self._copy_running:
            return
        retired, self._retired = self._retired, []
        for c in retired:
            c.close()
        lost, self._lost_sources = self._lost_sources, []
        for source in lost:
            source.close()

    def _retire_copier(self) -> None:
        """The copier's table reads mappings about to go: closed once no copy runs (a new one comes with the next plan)."""
        if self._copier is not None:
            self._retired.append(self._copier)
            self._copier = None

    def _end_epoch(self) -> None:
        self._end_nccl()
        self._nccl_stop = threading.Event()
        self._retire_copier()
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


def start_nccl(epoch: int, uid: bytes, ranks: list[int], rank: int, gpu: int, post: Callable[[str, Any, Any], None]) -> None:
    """Makes this rank's communicator of the epoch on a thread of its own (it returns once every rank
    joined), then posts ('nccl-ready', epoch, (comm, ranks)) or the error."""
    def run() -> None:
        try:
            from ...nccl import NcclCommunicator
            comm = NcclCommunicator.init(uid, len(ranks), ranks.index(rank), device=gpu, timeout=120.0)
        except Exception as e:  # noqa: BLE001 - the rank fails with it
            post("nccl-ready", epoch, e)
            return
        post("nccl-ready", epoch, (comm, ranks))
    threading.Thread(target=run, name="shard-nccl-init", daemon=True).start()


def _share(layout: RankLayout, sources: Sequence[Any]) -> Any:
    from ..tensor_set_transfer import share_tensors
    return share_tensors([(local.name, obj) for local, obj in zip(layout.sources, sources)])
