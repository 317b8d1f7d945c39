"""What a producer end and a consumer end both hold (src/channel/endpoint.ts): their participant entry
in the control block, the memory (Block), how they wait (Waiter), their views of the slots, leaving,
and repairs (Recoveries). A Python end also watches its link to the hub: when it closes, the end
repairs the hub's entries (and those of the ends the hub had in its own process) in the hub's place.
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..ipc.descriptor import DTYPES, dtype_name
from ..errors import IpcError
from ..host.host_buffer import HostBuffer
from ..arrays.device_array import DeviceArray, DeviceBuffer
from .block import Block
from .layout import ST_ALIVE
from .native_slot_ring import make_ring
from .recovery import Recoveries
from .waiter import Waiter, WaitPolicy

if TYPE_CHECKING:
    from ..link.connection.link import Link


def closed_error(what: str) -> IpcError:
    return IpcError("ERR_CHANNEL_CLOSED", f"{what}: the channel is closed")


class Endpoint:
    """One end's participant ``index`` in the channel of ``block``, as ``role``; ``link``: the link to
    the hub (None in tests that play the hub)."""

    def __init__(self, block: Block, index: int, role: str, link: Link | None, policy: WaitPolicy):
        self.block = block
        self.layout = block.layout
        self.index = index
        self.role = role
        # slot_ring.py's Ring, or NativeRing (the per-message operations in C) where the native helper loaded.
        self.ring = make_ring(block.words, block.layout, block.bells, index)
        self.w = block.words
        self.closed = False
        self.hub_lost = False
        self.lock = threading.RLock()
        self.waiter = Waiter(self.ring, block.words, block.bells.fds[index], policy, role, self.lock)
        self.recoveries = Recoveries(self.ring, block, self.lock)
        # The recoveries' own containers, so that service() (on every message) checks them without a call.
        self._pending = self.recoveries.pending
        self._fence_repairs = self.recoveries.fence_repairs
        self._link = link
        if link is not None and block.fences is not None:
            self.recoveries.watch_hub()
        if link is not None:
            self.waiter.watch_link(link)
            link.on_close(self._on_link_closed)

    # -- state --

    def alive(self) -> bool:
        return self.ring.participant_state(self.index) == ST_ALIVE

    def detached_error(self, what: str) -> IpcError:
        return IpcError("ERR_CHANNEL_CLOSED", f"{what}: this end was removed from the channel (its link to the hub closed, so its messages were handed to others); attach again over a new link")

    def assert_open(self, what: str) -> None:
        if self.closed:
            raise closed_error(what)

    def stats_now(self) -> dict[str, Any]:
        return self.ring.stats()

    # -- housekeeping: the hub's death, repairs that wait for the lock, fences of dead processes --

    def _on_link_closed(self, _link: Link, _reason: IpcError | None) -> None:
        self.hub_lost = True

    def service(self) -> None:
        """Runs what is due: the hub's repair once its link closed, retries of repairs that found the
        publish lock busy, and fence raises for dead processes. Cheap when nothing is due."""
        if self.closed:
            return
        if self.hub_lost and self._link is not None:
            self._link = None
            self.waiter.unwatch_link()
            self.recoveries.recover_hub()
        if self._pending or self._fence_repairs:
            self.recoveries.run()

    # -- waiting --

    def park(self, ready: Callable[[], bool], deadline: float | None) -> None:
        """Returns once ``ready()`` may have become true, or the deadline passed, or close() was
        called (waiter.py). Called with self.lock held; releases it while sleeping."""
        if self.waiter.park(ready, deadline, self.recoveries.sleep_limit):
            self.service()

    def close(self, before_release: Callable[[], None] | None = None) -> None:
        """Leaves the control block and releases the memory. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.recoveries.stop()
        self.waiter.cancel()
        with self.lock:
            try:
                if before_release is not None:
                    before_release()
                if self.alive():
                    self.recoveries.leave_self()
            except Exception as e:  # noqa: BLE001 - the memory must still be released
                warnings.warn(f"cuda_ipc channel: leaving the control block failed: {e}", RuntimeWarning, stacklevel=2)
            finally:
                self.waiter.unwatch_link()
                self._link = None
                self.ring.close()  # (NativeRing: before the block and the doorbells it uses go)
                self.block.close()


# ------------------------------------------------------------------------------------------------
# Slot memory


class SlotViews:
    """Per-slot views of the slots, made once."""

    def __init__(self, block: Block):
        self.block = block
        self.bytes = block.layout.slot_bytes
        self.host = not block.layout.device
        slots = block.slots
        self._base = slots.memory if isinstance(slots, HostBuffer) else None
        self._buffers: list[HostBuffer | DeviceBuffer | None] = [None] * block.layout.slot_count

    def memory(self, s: int, length: int) -> memoryview:
        base = self._base
        if base is None:  # (host slots have their memoryview until close())
            raise IpcError("ERR_UNSUPPORTED", "this channel's slots are device memory: use .buffer (with wait_on/release(stream)), or .view(dtype, shape)")
        start = s * self.bytes
        return base[start:start + length]

    def buffer(self, s: int) -> HostBuffer | DeviceBuffer:
        b = self._buffers[s]
        if b is None or b.closed:
            slots = self.block.slots
            b = slots.view(s * self.bytes, self.bytes) if isinstance(slots, HostBuffer) else slots.slice(s * self.bytes, self.bytes)
            self._buffers[s] = b
        return b

    def close(self) -> None:
        for b in self._buffers:
            if b is not None:
                try:
                    b.close(sync=False) if isinstance(b, DeviceBuffer) else b.close()
                except Exception:  # noqa: BLE001
                    pass
        self._buffers = []
        if self._base is not None:
            try:
                self._base.release()
            except BufferError:
                pass  # a view the user kept: the mapping stays until it goes
            self._base = None


def typed_view(buf: HostBuffer | DeviceBuffer, length: int, dtype: object, shape: int | Sequence[int] | None,
               strides: Sequence[int] | None, offset: int) -> DeviceArray | memoryview:
    """A typed view of a slot's buffer: device slots a DeviceArray; host slots a memoryview cast to the
    dtype's format. Default shape: as many elements as ``length`` holds."""
    if isinstance(buf, DeviceBuffer):
        if shape is None:
            shape = ((length - offset) // DTYPES[dtype_name(dtype)][0],)
        return buf.view(dtype, shape, strides, offset)
    name = dtype_name(dtype)
    fmt = {"float32": "f", "float64": "d", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i",
           "uint32": "I", "int64": "q", "uint64": "Q"}.get(name)
    if fmt is None or strides is not None:
        raise IpcError("ERR_UNSUPPORTED", f"host slots view as C-contiguous memoryviews of standard formats; {name} with strides {strides} is not one (use numpy/torch.frombuffer on .memory)")
    size = DTYPES[name][0]
    if shape is None:
        shape = ((length - offset) // size,)
    elif isinstance(shape, int):
        shape = (shape,)
    n = 1
    for d in shape:
        n *= d
    if offset < 0 or offset % size or offset + n * size > buf.nbytes:
        raise IpcError("ERR_OUT_OF_RANGE", f"a {name} view of shape {tuple(shape)} at {offset} does not fit the {buf.nbytes}-byte slot")
    return buf.memory[offset:offset + n * size].cast(fmt, tuple(shape))


def cuda_array_interface(buf: HostBuffer | DeviceBuffer) -> dict[str, Any]:
    """A slot's ``__cuda_array_interface__``: device slots have one; for host slots it is an attribute
    that is not there (AttributeError, so that hasattr() says no)."""
    if not isinstance(buf, DeviceBuffer):
        raise AttributeError("__cuda_array_interface__: host slots are not device memory")
    return buf.__cuda_array_interface__
