"""Sending over the NCCL communicators of TCP links (nccl_comms.py): one transfer's place on a
communicator, alone or as part of a Fanout (fanout.py), and what link.end() waits for: each transfer
counted from its commit until its NCCL work settled here and the peer released it. As the sending
half of src/link/nccl/nccl-comms.ts."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...cuda.device import Device
from ..messages.nccl_records import CommReference
from ..messages.deferred import Completion
from ..messages.handlers import TransferEncoding
from ..lifetimes.lease import Hold
from .nccl_comms import LinkComm, StartWork, check_nccl_in_clear, comm_reference, committed_on, not_sent, outgoing_comm, state_of

if TYPE_CHECKING:
    from ...cuda.stream import Event
    from ..connection.link import Link

_GONE = object()



class OutgoingTransfer:
    """What a handler's encode gets for one NCCL transfer it sends (begin_outgoing)."""

    def __init__(self, link: Link, comm: LinkComm, sequence: int, reference: CommReference, queue: Callable[[StartWork], Completion],
                 abandoned: Callable[[], None]):
        self.comm = comm
        self.sequence = sequence
        #: How the record names the communicator on this link.
        self.reference = reference
        #: The message did not go out: the sequence number goes back for the next one.
        self.abandoned = abandoned
        self._link = link
        self._queue = queue
        self._released = Completion()

    def committed(self, start: StartWork) -> Completion:
        """The message went out: queue the NCCL work in its turn; the Completion settles once it is done
        or failed. Until then and until released(), link.end() waits for it."""
        committed_on(self._link, self.comm)
        sent = self._queue(start)
        state_of(self._link).track(sent, self._released)
        return sent

    def encoding(self, data: bytes, nbytes: int, kind: str, start: StartWork, events: list[Event], keep: Any,
                 let_go: Callable[[], None]) -> TransferEncoding:
        """The message's encoding: once it went out, ``start`` queues the NCCL work in its turn (waiting
        for ``events``, the producers' work, and closing them). Its hold keeps ``keep`` and calls
        ``let_go`` once the peer released it and NCCL is done reading the memory (sent, or aborted with
        the link); a message that never went out gives its sequence number back and closes ``events``."""
        state: dict[str, Any] = {"committed": False, "sent": None, "keep": keep}

        def gone(_c: object = None) -> None:
            if state.pop("keep", _GONE) is not _GONE:  # once: the memory may go
                let_go()

        def release() -> None:
            self.released()
            if not state["committed"]:
                self.abandoned()
                for ev in events:
                    ev.close()
            sent: Completion | None = state["sent"]
            if sent is None:
                gone()
            else:
                sent.add_callback(gone)

        def on_commit() -> None:
            state["committed"] = True
            state["sent"] = self.committed(start)
        return TransferEncoding(data=data, hold=Hold(release, nbytes), on_commit=on_commit, kind=kind)

    def released(self) -> None:
        """The peer released the value (its bytes arrived there, or it gave up on them), or the link
        closed. A send that finished here may still be on its way (NCCL buffers the last bytes): only
        the peer's RELEASE says it arrived, so link.end() waits for both before it says goodbye."""
        self._released.settle()


class FanoutContext:
    """A Fanout sending one message to several links (fanout.py): the communicator and rank per link."""

    def comm_for(self, device: Device) -> LinkComm:
        raise NotImplementedError

    def rank_of(self, link: Link) -> int:
        raise NotImplementedError

    def shared(self, comm: LinkComm, sequence: int, start: StartWork) -> Completion:
        """Queues ``sequence``'s work on ``comm`` once, after the message went to every link; the same Completion for each."""
        raise NotImplementedError


_active = threading.local()


class with_fanout:
    """``with with_fanout(context): link.send(value)``: the send is part of a Fanout (this thread only)."""

    def __init__(self, context: FanoutContext):
        self._context = context
        self._outer: FanoutContext | None = None

    def __enter__(self) -> None:
        self._outer = getattr(_active, "fanout", None)
        _active.fanout = self._context

    def __exit__(self, *exc: object) -> None:
        _active.fanout = self._outer


def queue_in_turn(comm: LinkComm, sequence: int, start: StartWork) -> Completion:
    """Queues ``start`` in ``sequence``'s turn on ``comm``; the Completion settles once its work is done or failed."""
    done = Completion()
    comm.submit(sequence, start, done.settle)
    return done


def begin_outgoing(link: Link, device: Device) -> OutgoingTransfer:
    """The next transfer ``link`` sends of ``device``'s memory: on the link's own communicator, or a fanout's."""
    check_nccl_in_clear(link, "send")
    active: FanoutContext | None = getattr(_active, "fanout", None)
    if active is not None:
        fan = active
        comm = fan.comm_for(device)
        sequence = comm.sequence
        comm.sequence += 1
        # Abandoned: the fanout gives up as a whole (fanout.py), and its communicator with it.
        return OutgoingTransfer(link, comm, sequence, comm_reference(link, comm, fan.rank_of(link)),
                                lambda start: fan.shared(comm, sequence, start), lambda: not_sent(link, comm))
    comm = outgoing_comm(link, device)
    sequence = comm.sequence
    comm.sequence += 1

    def abandoned() -> None:
        comm.sequence = min(comm.sequence, sequence)
        not_sent(link, comm)
    return OutgoingTransfer(link, comm, sequence, comm_reference(link, comm, 1), lambda start: queue_in_turn(comm, sequence, start), abandoned)
