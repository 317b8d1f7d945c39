"""What one end maps of a channel (src/channel/block.ts): the control block (and its atomics), the
slots, the doorbells and, for device slots, the control block's registration with the GPU (fences).
Owned by one end, closed with it.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from ..host.host_buffer import HostBuffer
from ..arrays.device_array import DeviceBuffer
from .doorbells import Doorbells
from .fences import Fences
from .layout import Layout
from .shared_words import SharedWords

if TYPE_CHECKING:
    from ..cuda.device import Device


class Block:
    """The control block (and its atomics), the slots, the doorbells and, for device slots, the
    fences; owned by one end, closed with it."""

    def __init__(self, layout: Layout, control: HostBuffer, slots: HostBuffer | DeviceBuffer, bells: Doorbells, device: Device | None = None):
        self.layout = layout
        self.control = control
        self.slots = slots
        self.bells = bells
        self.words = SharedWords(control._mapping.mmap, layout.total_bytes)
        self.fences: Fences | None = None
        try:
            if layout.device:
                assert device is not None, "device slots come with their device"
                self.fences = Fences(device, self.words)
        except BaseException:
            self.words.close()
            raise
        self.device = device
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.fences is not None:
                self.fences.close()  # before the mapping it registered goes away
        except Exception as e:  # noqa: BLE001 - the rest must still be released
            warnings.warn(f"cuda_ipc channel: unregistering the control block from the GPU failed: {e}", RuntimeWarning, stacklevel=2)
        for c in (self.slots,):
            try:
                if isinstance(c, DeviceBuffer):
                    c.close(sync=self.fences is None or not self.fences.queued)
                else:
                    c.close()
            except Exception:  # noqa: BLE001
                pass
        self.words.close()
        self.control.close()
        self.bells.close()
