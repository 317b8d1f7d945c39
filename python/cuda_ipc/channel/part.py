"""What the producer and consumer ends of a channel tell alike (src/channel/part.ts): ChannelEnd, the
channel's shape, this end's participant index, its wait statistics and the channel's stats.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..leak import Resource
from .endpoint import Endpoint, SlotViews

if TYPE_CHECKING:
    from ..cuda.device import Device



class ChannelEnd(Resource):
    """What both ends tell about their channel."""

    role = ""

    def __init__(self, end: Endpoint):
        self._end = end
        self._slots = SlotViews(end.block)

    @property
    def topology(self) -> str:
        return "broadcast" if self._end.layout.broadcast else "queue"

    @property
    def memory(self) -> str:
        return "device" if self._end.layout.device else "host"

    @property
    def slot_count(self) -> int:
        return self._end.layout.slot_count

    @property
    def slot_bytes(self) -> int:
        return self._end.layout.slot_bytes

    @property
    def meta_bytes(self) -> int:
        return self._end.layout.meta_bytes

    @property
    def index(self) -> int:
        """This end's participant index in the control block (the hub is 0)."""
        return self._end.index

    @property
    def device(self) -> Device | None:
        """The cuda_ipc Device the slots are used on (device slots), else None."""
        return self._end.block.device

    @property
    def closed(self) -> bool:
        return self._end.closed

    @property
    def hot_path(self) -> str:
        """'native' when this end's per-message operations run in the native helper (cuda_ipc.native_helper()
        says which file), 'python' when the standard library alone runs them."""
        return self._end.ring.hot_path

    @property
    def wait_stats(self) -> dict[str, int]:
        """How this end's waits ended: spin_hits, sleeps, rung, rescued (a lost wake-up: should stay 0)."""
        return dict(self._end.waiter.stats)

    def stats(self) -> dict[str, Any]:
        """Slot states and membership, read from the control block now."""
        e = self._end
        e.assert_open("stats")
        return e.stats_now()


    def __del__(self) -> None:
        # An end's flag is its Endpoint's (Resource's __del__ reads the object's own).
        e = getattr(self, "_end", None)
        if e is not None and not e.closed:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing to report to at collection time
                pass

    def __repr__(self) -> str:
        return f"<cuda_ipc.{type(self).__name__} {self.topology} {self.memory} #{self.index}{' closed' if self.closed else ''}>"
