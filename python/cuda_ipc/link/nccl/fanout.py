"""One message to several TCP links at once, its device memory moved once (src/link/nccl/fanout.ts): an NCCL
broadcast from this process (rank 0) to every receiver (ranks 1..N) over one communicator, instead
of one send per link. How checkpoint-engine and vLLM sync many engines: the trainer's bytes leave
once, NCCL's broadcast pipelines them down a chain or tree. Receivers need nothing special: they
receive as from a single sender (the record says it is a broadcast and gives their rank).

    fan = Fanout([link_a, link_b, link_c])
    fan.send({"step": 7, "weights": share_tensors(model.state_dict())})
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from ...cuda.device import Device
from ...errors import IpcError
from ..messages.deferred import Completion
from ..connection.link import Link
from ..messages.nccl_abort import ABORT_CANNOT_TAKE
from .nccl_comms import LinkComm, StartWork, add_broadcast_comm, new_root_comm
from .nccl_outgoing import FanoutContext, with_fanout


class _Shared:
    __slots__ = ("comm", "sequence", "start", "done")

    def __init__(self, comm: LinkComm, sequence: int, start: StartWork):
        self.comm = comm
        self.sequence = sequence
        self.start = start
        self.done = Completion()


class Fanout:
    """Sends each message to every link of the fanout; device memory in it (tensors, arrays, buffers,
    ``share_tensors`` sets) is broadcast over one NCCL communicator spanning all of them (made at the
    first send, its unique id in the first record on each link). Every link must be a TCP link to a
    different process on its own GPU. A link that closes ends the broadcast communicator for all:
    later sends of device memory through this fanout fail; make a new Fanout over the links still open."""

    def __init__(self, links: Iterable[Link]):
        items = list(links)
        if not items:
            raise ValueError("a Fanout needs at least one link")
        seen: set[int] = set()
        for link in items:
            if not isinstance(link, Link):
                raise TypeError(f"a Fanout takes Links (from connect() or listen()), got {type(link).__qualname__}")
            if id(link) in seen:
                raise ValueError(f"{link!r} is in the Fanout twice")
            seen.add(id(link))
            if link.transport != "tcp":
                raise ValueError(f"{link!r} is a {link.transport} link; a Fanout broadcasts over NCCL to TCP links (on one machine, "
                                 "send to each link: memory is shared there)")
        self.links: tuple[Link, ...] = tuple(items)
        self._comms: dict[str, LinkComm] = {}  # by device UUID
        self._pending: dict[tuple[bytes, int], _Shared] = {}
        self._closed = False
        self._lock = threading.Lock()

    def send(self, value: Any, timeout: float | None = None) -> None:
        """Sends ``value`` on every link (``timeout`` per link, as Link.send); its device memory is
        broadcast once. All or nothing: when a link refuses the message (closed, too large, its peer
        stopped reading), the broadcast communicator is aborted (the receivers that got the message
        fail it with ERR_NCCL) and the error is raised."""
        with self._lock:
            if self._closed:
                raise IpcError("ERR_CLOSED", "this Fanout is closed")
            before = {comm: comm.sequence for comm in self._comms.values()}
            context = _Context(self)
            try:
                for link in self.links:
                    # Every link numbers the same transfers the same: each send starts from the same place.
                    for comm in self._comms.values():
                        comm.sequence = before.get(comm, 0)
                    with with_fanout(context):
                        link.send(value, timeout)
            except BaseException as e:
                error = IpcError("ERR_NCCL", f"a Fanout send failed on one of its links ({e}); its broadcast was abandoned")
                for p in self._pending.values():
                    p.done.settle(error)
                self._pending.clear()
                for comm in self._comms.values():
                    comm.abort(error, ABORT_CANNOT_TAKE)
                self._comms.clear()
                raise
            # Every link took it: queue each transfer once.
            for p in self._pending.values():
                p.comm.submit(p.sequence, p.start, p.done.settle)
            self._pending.clear()

    def _comm_for(self, device: Device) -> LinkComm:
        comm = self._comms.get(device.uuid)
        if comm is not None and comm.ended is None:
            return comm
        comm = new_root_comm(device, len(self.links) + 1, True)
        for link in self.links:
            add_broadcast_comm(link, comm)
        self._comms[device.uuid] = comm
        return comm

    def _share(self, comm: LinkComm, sequence: int, start: StartWork) -> Completion:
        key = (comm.id, sequence)
        p = self._pending.get(key)
        if p is None:
            p = self._pending[key] = _Shared(comm, sequence, start)
        return p.done

    def close(self) -> None:
        """Ends the fanout: its broadcast communicators are aborted (the links stay open). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            comms, self._comms = list(self._comms.values()), {}
        for comm in comms:
            comm.abort(IpcError("ERR_CLOSED", "the Fanout was closed"))

    def __enter__(self) -> "Fanout":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<cuda_ipc.Fanout over {len(self.links)} links{' closed' if self._closed else ''}>"


class _Context(FanoutContext):
    def __init__(self, fanout: Fanout):
        self._fanout = fanout

    def comm_for(self, device: Device) -> LinkComm:
        return self._fanout._comm_for(device)

    def rank_of(self, link: Link) -> int:
        return self._fanout.links.index(link) + 1

    def shared(self, comm: LinkComm, sequence: int, start: StartWork) -> Completion:
        return self._fanout._share(comm, sequence, start)
