"""How device memory, pools and events travel over links (src/link/transfers/device-transfers.ts). Each is leased
to the peer: the sender's memory, pool or event stays alive until the peer releases it or dies.
 - Pool buffers: the pool's fd goes once per link (in the first message that needs it); after that
   each buffer is 64 bytes of export data plus its size and range.
 - Other device memory: the legacy-handle descriptor (binary form) of its allocation and range.
 - IPC pools: the fd once per link, then the pool's id.
 - Interprocess events: their event-handle descriptor.
Devices travel as UUIDs, never ordinals (CUDA_VISIBLE_DEVICES renumbers). Received memory is mapped
on first use, for the working device (arrays/device_array.py).
"""
from __future__ import annotations

import ctypes
import os
import stat
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...cuda import driver as drv
from ...ipc.descriptor import LegacyHandleDescriptor, decode_descriptor, encode_descriptor
from ...cuda.device import Device, format_uuid, uuid_bytes
from ...errors import IpcError
from ...ipc import cache
from ...arrays.device_array import _CREATE, DeviceArray, DeviceBuffer, _Origin
from ...ipc.event import IpcEvent
from ...arrays.exports import Shared, _describe_array, _Exported, _is_device_array, legacy_handle_of, pool_export_of
from ...ipc.pool import ImportedPool, PoolImport
from ..messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler
from ..lifetimes.lease import Hold

if TYPE_CHECKING:
    from ..lifetimes.lease import ReceivedLease
    from ..connection.link import Link

# Pool reference, shared by pool and pool-buffer records (src/link/transfers/device-transfers.ts):
#   0 16 pool id | 16 16 device UUID | 32 8 pool maxSize | 40 4 flags (bit 0: fd attached) | 44 4 reserved
POOL_REF_BYTES = 48
# Pool buffer: a pool reference, then 48 64 export data | 112 8 allocation size | 120 8 offset | 128 8 length
POOL_BUFFER_BYTES = 136
FD_ATTACHED = 1
_NVIDIA_CHAR_MAJOR = 195


def _frame_error(what: str) -> IpcError:
    return IpcError("ERR_FRAME_INVALID", f"a received {what} is malformed")


def _check_pool_fd(fd: int) -> None:
    st = os.fstat(fd)
    if not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) != _NVIDIA_CHAR_MAJOR:
        raise IpcError("ERR_DESCRIPTOR_INVALID", "a received pool fd is not a CUDA memory pool handle (not the NVIDIA control device)")


def _read_pool_ref(data: memoryview, fds: list[int], link: Link) -> PoolImport:
    if len(data) < POOL_REF_BYTES:
        raise _frame_error("pool reference")
    pool_id = bytes(data[0:16])
    device_uuid = format_uuid(bytes(data[16:32]))
    max_size, flags, reserved = struct.unpack_from("<QII", data, 32)
    if flags & ~FD_ATTACHED or reserved:
        raise _frame_error("pool reference")
    received: dict[bytes, PoolImport] | None = link.handler_state.get(cache._POOLS_RECEIVED)
    if received is None:
        table: dict[bytes, PoolImport] = {}
        received = link.handler_state[cache._POOLS_RECEIVED] = table

        def drop(_link: Link, _reason: IpcError | None, pools: dict[bytes, PoolImport] = table) -> None:
            # The link going away ends only its own hold: imported buffers stay mapped.
            for p in list(pools.values()):
                p.release()
            pools.clear()
        link.on_close(drop)
    known = received.get(pool_id)
    if flags & FD_ATTACHED:
        if len(fds) != 1:
            raise _frame_error("pool reference (fd count)")
        fd = fds[0]
        if known is not None:
            fds[0] = -1
            os.close(fd)  # sent again (a peer re-sending what it received): keep the first
            return known
        _check_pool_fd(fd)
        fds[0] = -1
        ref = PoolImport(pool_id, device_uuid, max_size, fd)
        received[pool_id] = ref
        return ref
    if fds:
        raise _frame_error("pool reference (unexpected fd)")
    if known is None:
        raise IpcError("ERR_FRAME_INVALID", "a pool buffer names a pool this link never received; messages arrived out of order or from another link")
    return known


def read_pool_buffer(data: memoryview, fds: list[int], link: Link) -> tuple[PoolImport, bytes, int, int, int]:
    """(pool, export data, allocation size, offset, length) of a 'pool-buffer' record's data; the pool's
    fd, when attached, is taken from ``fds`` (its slot set to -1)."""
    if len(data) != POOL_BUFFER_BYTES:
        raise _frame_error("pool buffer")
    pool = _read_pool_ref(data, fds, link)
    size, offset, length = struct.unpack_from("<QQQ", data, 112)
    if size == 0 or offset + length > size:
        raise IpcError("ERR_OUT_OF_RANGE", f"a range of {length} bytes at {offset} does not fit a pool buffer of {size} bytes")
    return pool, bytes(data[48:112]), size, offset, length


def pool_buffer_bytes(pool_id: bytes, device_uuid: str, max_size: int, attach: bool, export_data: bytes, size: int, offset: int,
                      length: int) -> bytes:
    """A 'pool-buffer' record's data: the pool reference, then the allocation's export data and size,
    and the range of it that travels."""
    b = bytearray(POOL_BUFFER_BYTES)
    b[0:16] = pool_id
    b[16:32] = uuid_bytes(device_uuid)
    struct.pack_into("<QII", b, 32, max_size, FD_ATTACHED if attach else 0, 0)
    b[48:112] = export_data
    struct.pack_into("<QQQ", b, 112, size, offset, length)
    return bytes(b)


def pool_fd_for_link(link: Link, pool_id: bytes, fd: int) -> tuple[bool, list[int], Callable[[], None] | None]:
    """(attach, fds, on_commit): the pool's fd goes once per link, in the first message that needs it."""
    sent: set[bytes] = link.handler_state.setdefault(cache._POOLS_SENT, set())
    if pool_id in sent:
        return False, [], None
    return True, [os.dup(fd)], (lambda: sent.add(pool_id))


class _DeviceMemoryTransfer(TransferHandler[Any]):
    """Sends device memory: received buffers onward, and tensors/arrays of this process."""

    kind = "cuda-ipc.device-memory"  # local name only: records go out as 'pool-buffer' or 'legacy-buffer'

    def instead(self, transport: str) -> str:
        return ("device memory crosses machines over NCCL (PROTOCOL.md 8), which needs a transfer handler for TCP links "
                "that this process does not have; copy it to host memory first (bytes, or a HostBuffer, which a TCP link copies)")

    def can_transfer(self, value: object) -> bool:
        return _is_device_array(value)

    def encode(self, value: Any, link: Link) -> TransferEncoding:
        if isinstance(value, (DeviceArray, DeviceBuffer)):
            buf = value.buffer if isinstance(value, DeviceArray) else value
            if buf.kind == "owned":  # memory of this process's own (received over NCCL): shared as such
                return self._send_owned(value, buf, link)
            if isinstance(value, DeviceArray):
                return self._resend(value.buffer, link, value.offset, value.meta.extent)
            return self._resend(value, link, 0, value.nbytes)
        sync = True
        if isinstance(value, Shared):
            sync, value = value.sync, value.obj
            if isinstance(value, (DeviceBuffer, DeviceArray)):
                return self.encode(value, link)
        return self._send_own(value, sync, link)

    def _send_owned(self, value: DeviceBuffer | DeviceArray, buf: DeviceBuffer, link: Link) -> TransferEncoding:
        """An owned DeviceBuffer (or a view of one): this process's memory, kept until the peer released it."""
        if buf.closed:
            raise IpcError("ERR_CLOSED", "link.send: the DeviceBuffer is closed; send it before closing it")
        o = buf._origin
        o.retain()
        try:
            enc = self._send_own(value, True, link)
        except BaseException:
            o.release(False)
            raise
        inner = enc.hold

        def release() -> None:
            try:
                if inner is not None:
                    inner.release()
            finally:
                o.release(False)
        enc.hold = Hold(release, inner.bytes if inner is not None else 0)
        return enc

    def _send_own(self, value: Any, sync: bool, link: Link) -> TransferEncoding:
        e = _describe_array(value, sync)
        if not e.ptr:
            raise IpcError("ERR_NOT_EXPORTABLE", "an empty tensor/array (no memory) cannot be shared; send its shape as data instead")
        ordinal = e.ordinal
        if ordinal is None:
            # Pointer queries need some context current; unified addressing answers for every device.
            with Device.get(0).activate():
                ordinal = drv.ptr_attribute_int(drv.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, e.ptr)
        dev = Device.get(ordinal)
        with dev.activate():
            if e.sync is not None:
                if callable(e.sync):
                    e.sync()
                elif e.sync[0] == "stream":
                    s = e.sync[1]
                    drv.driver().call("cuStreamSynchronize", ctypes.c_void_p(s))
                else:
                    drv.driver().call("cuCtxSynchronize")
            # One driver call for everything about the pointer (pool, kind, allocation, its unique id).
            facts = drv.pointer_facts(e.ptr)
            if facts.pool:
                return self._send_pool_memory(e, facts, dev, link)
            return self._send_legacy_memory(e, facts, dev)

    def _send_legacy_memory(self, e: _Exported, facts: drv.PointerFacts, dev: Device) -> TransferEncoding:
        if facts.managed:
            raise IpcError("ERR_NOT_EXPORTABLE", "managed memory cannot be shared through CUDA IPC handles; allocate with cudaMalloc (PyTorch's default allocator) or from an IPC pool")
        if facts.memory_type != drv.CU_MEMORYTYPE_DEVICE:
            what = "pinned host memory" if facts.memory_type == drv.CU_MEMORYTYPE_HOST else "memory the CUDA driver does not know"
            raise IpcError("ERR_NOT_EXPORTABLE", f"{what} cannot be shared through CUDA IPC handles; send a HostBuffer instead")
        base, size = facts.base, facts.size
        offset = e.ptr - base
        if offset + e.extent > size:
            raise IpcError("ERR_OUT_OF_RANGE", f"{e.extent} bytes at 0x{e.ptr:x} run past the end of its allocation ({size - offset} bytes left)")
        handle, _asked = legacy_handle_of(base, facts.buffer_id, "this memory")
        meta = e.meta if e.meta is not None and e.meta.extent <= e.extent else None
        desc = LegacyHandleDescriptor(handle, offset, e.extent, dev.uuid, os.getpid(), meta)
        keep = e.keep
        return TransferEncoding(data=encode_descriptor(desc), hold=Hold(lambda: _drop(keep), e.extent), kind="legacy-buffer")

    def _send_pool_memory(self, e: _Exported, facts: drv.PointerFacts, dev: Device, link: Link) -> TransferEncoding:
        base, size = (e.ptr, e.extent) if e.whole else (facts.base, facts.size)
        pool_id, fd, export = pool_export_of(facts.pool, base, facts.buffer_id, "this memory")
        attach, fds, commit = pool_fd_for_link(link, pool_id, fd)
        data = pool_buffer_bytes(pool_id, dev.uuid, 0, attach, export, size, e.ptr - base, e.extent)
        keep = e.keep
        return TransferEncoding(data=data, fds=fds, close_fds_after_send=True, on_commit=commit,
                                hold=Hold(lambda: _drop(keep), e.extent), kind="pool-buffer")

    def _resend(self, buf: DeviceBuffer, link: Link, offset: int, length: int) -> TransferEncoding:
        """A received buffer sent on: the same pool reference / handle, leased from our handle on it."""
        o = buf._origin
        if buf.closed:
            raise IpcError("ERR_CLOSED", "link.send: the DeviceBuffer is closed; send it before closing it")
        o.retain()
        hold = Hold(lambda: o.release(False), length)
        try:
            d, pool = o.descriptor, o.pool
            if o.kind == "legacy" and d is not None:
                desc = LegacyHandleDescriptor(d.handle, buf.offset + offset, length, d.device_uuid, d.pid)
                return TransferEncoding(data=encode_descriptor(desc), hold=hold, kind="legacy-buffer")
            assert pool is not None, "a pool origin has its pool"
            attach, fds, commit = pool_fd_for_link(link, pool.id, pool.fd)
            data = pool_buffer_bytes(pool.id, pool.device_uuid, pool.max_size, attach, o.export_data, o.allocation_size, buf.offset + offset, length)
            return TransferEncoding(data=data, fds=fds, close_fds_after_send=True, on_commit=commit, hold=hold, kind="pool-buffer")
        except BaseException:
            hold.release()
            raise

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> Any:
        raise IpcError("ERR_FRAME_INVALID", f"'{self.kind}' is not a wire kind")


def _drop(_obj: object) -> None:
    """The hold's release: the last reference we kept goes with the closure."""


class _ReceivedKind(TransferHandler[object]):
    """A record kind this process only decodes: device memory of this process goes out through
    _DeviceMemoryTransfer; pools and events are sent by Node only."""

    def can_transfer(self, value: object) -> bool:
        return False


class _PoolBufferTransfer(_ReceivedKind):
    kind = "pool-buffer"

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> DeviceBuffer:
        pool, export, size, offset, length = read_pool_buffer(data, fds, link)
        origin = _Origin("pool", lease, pool.device_uuid, size, pool=pool, export_data=export)
        return DeviceBuffer(origin, offset, length, _CREATE)


class _LegacyBufferTransfer(_ReceivedKind):
    kind = "legacy-buffer"

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> DeviceBuffer:
        desc = decode_descriptor(data, "cuda-legacy-handle")
        origin = _Origin("legacy", lease, desc.device_uuid, 0, descriptor=desc)
        buf = DeviceBuffer(origin, desc.offset, desc.byte_length, _CREATE)
        if desc.array is not None:
            buf.array = desc.array  # what the sender said the bytes hold
        return buf


class _IpcPoolTransfer(_ReceivedKind):
    kind = "ipc-pool"

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> ImportedPool:
        if len(data) != POOL_REF_BYTES:
            raise _frame_error("pool")
        ref = _read_pool_ref(data, fds, link)
        pool = ImportedPool(ref)
        if lease is not None:
            ref.after_destroy.append(lease.end)
        return pool


class _IpcEventTransfer(_ReceivedKind):
    kind = "ipc-event"

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> IpcEvent:
        desc = decode_descriptor(data, "cuda-ipc-event")
        return IpcEvent(desc.handle, desc.device_uuid, lease)


register_transfer_handler(_DeviceMemoryTransfer())
register_transfer_handler(_PoolBufferTransfer())
register_transfer_handler(_LegacyBufferTransfer())
register_transfer_handler(_IpcPoolTransfer())
register_transfer_handler(_IpcEventTransfer())
