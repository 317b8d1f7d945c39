"""GPU memory over links: receiving Node's pool buffers and legacy buffers, and sending CUDA tensors and
arrays (PyTorch, CuPy, Numba, cuda.core, anything with ``__cuda_array_interface__``) zero-copy.

Received device memory is a ``DeviceBuffer``: ``__cuda_array_interface__`` (v3, bytes) and DLPack, so
``torch.as_tensor(buf, device='cuda')``, ``cupy.asarray(buf)``, ``numba.cuda.as_cuda_array(buf)`` and
``torch.from_dlpack(buf)`` view it without a copy; ``buf.view('float32', shape)`` gives a typed view.
The memory is mapped (in the device's primary context, which those libraries use) on first use, and
unmapped when the buffer is closed or collected; that ends the sender's lease.

Sending: a tensor or array in a message is shared, never copied: memory from an IPC-enabled memory
pool travels as a pool buffer (the pool's fd once per link, then 64 bytes of export data), any other
device memory as the legacy IPC handle of its allocation plus offset and length (the handle of an
interior pointer is the handle of its allocation's base, so PyTorch's caching-allocator
sub-allocations and views with storage offsets arrive at the right address). The object is kept
alive until the peer releases it. Before sending, the object's stream is synchronized so that the
peer sees finished data (``share(obj, sync=False)`` skips that when you ordered the work yourself).
"""
from __future__ import annotations

import ctypes
import os
import stat
import struct
import sys
import threading
from collections import OrderedDict
from typing import Any, NamedTuple

from . import driver as drv
from .link.handlers import TransferEncoding, TransferHandler, register_transfer_handler
from .descriptor import DTYPES, ArrayMeta, LegacyHandleDescriptor, decode_descriptor, dtype_name, encode_descriptor
from .device import Device, format_uuid, importing_device, uuid_bytes
from .dlpack import DL_CUDA, make_capsule
from .errors import CudaError, IpcError
from .link.lease import Hold

# Pool reference, shared by pool and pool-buffer records (src/link/device-transfers.ts):
#   0 16 pool id | 16 16 device UUID | 32 8 pool maxSize | 40 4 flags (bit 0: fd attached) | 44 4 reserved
POOL_REF_BYTES = 48
# Pool buffer: a pool reference, then 48 64 export data | 112 8 allocation size | 120 8 offset | 128 8 length
POOL_BUFFER_BYTES = 136
FD_ATTACHED = 1
_NVIDIA_CHAR_MAJOR = 195
_POOLS_RECEIVED = "cuda_ipc.pools_received"
_POOLS_SENT = "cuda_ipc.pools_sent"


def _frame_error(what: str) -> IpcError:
    return IpcError("ERR_FRAME_INVALID", f"a received {what} is malformed")


# ------------------------------------------------------------------------------------------------
# Pools received over a link


class _PoolRef:
    """A pool a peer sent (its fd): imported into the driver on first use, destroyed (and the fd
    closed) once the link and every buffer and pool object from it let go. Its buffers are mapped
    once per process, for the device that first used them; every device that uses them is granted
    access to the pool (cuMemPoolSetAccess)."""

    def __init__(self, pool_id: bytes, device_uuid: str, max_size: int, fd: int):
        self.id = pool_id
        self.device_uuid = device_uuid
        self.max_size = max_size
        self.fd = fd
        self.users = 1
        self._handle: int | None = None
        self._home: Device | None = None  # the device whose context imported the pool
        self._access: set[str] = set()  # UUIDs of devices granted access
        self._imports: dict[bytes, list] = {}  # export data -> [base pointer, users, device it was mapped with]
        self._local: set[bytes] = set()  # imports that are allocations of this process
        self._lock = threading.RLock()
        self.after_destroy: list = []
        self.handed_to_cuda_core = False

    @property
    def device(self) -> Device:
        """The device the pool lives on."""
        return Device.by_uuid(self.device_uuid)

    def handle(self, user: Device | None = None) -> int:
        """The imported pool (importing it, in ``user``'s context, on first use)."""
        with self._lock:
            if self.fd < 0:
                raise IpcError("ERR_CLOSED", "the pool this buffer came from was destroyed")
            if self.handed_to_cuda_core:
                raise IpcError("ERR_INVALID_ARG", "buffers of this pool were handed to cuda.core's own import (cuda_core_ipc()); "
                               "map them through cuda.core, not cuda_ipc: one pool imported twice in a process is unsafe")
            if self._handle is None:
                dev = user or self.device
                with dev.activate():
                    try:
                        h = drv.pool_import_from_fd(self.fd)
                    except CudaError as e:
                        raise IpcError("ERR_HANDLE_STALE", f"the driver refused the pool's fd ({e.code}): its pool was destroyed, or it belongs to another driver instance") from e
                    try:
                        drv.pool_set_access(h, dev.ordinal)
                    except BaseException:
                        drv.driver().call("cuMemPoolDestroy", ctypes.c_void_p(h))
                        raise
                self._handle = h
                self._home = dev
                self._access.add(dev.uuid)
            return self._handle

    def grant(self, user: Device) -> None:
        """Lets kernels and copies on ``user`` use the pool's memory (idempotent)."""
        with self._lock:
            h = self.handle(user)
            if user.uuid in self._access:
                return
            with self._home.activate():
                drv.pool_set_access(h, user.ordinal)
            self._access.add(user.uuid)

    def import_pointer(self, export_data: bytes, user: Device | None = None) -> int:
        """Maps one buffer for ``user`` (default: the pool's device); repeated imports of the same
        export data share one mapping (importing a pool pointer twice and freeing either would unmap
        both)."""
        user = user or self.device
        with self._lock:
            entry = self._imports.get(export_data)
            if entry is not None:
                if entry[2] is not user:
                    self.grant(user)
                entry[1] += 1
                return entry[0]
            local = _local_pool_exports.get(export_data)
            if local is not None and _still_exported(local, export_data, self.device):
                user.enable_peer_access(self.device)  # our own allocation, sent back to us
                self._imports[export_data] = [local, 1, user]
                self.users += 1
                self._local.add(export_data)
                return local
            h = self.handle(user)
            self.grant(user)
            with user.activate():
                try:
                    base = drv.pool_import_pointer(h, export_data)
                except CudaError as e:
                    if e.code == "CUDA_ERROR_INVALID_VALUE":
                        raise IpcError("ERR_HANDLE_STALE", "the pool buffer could not be imported: the export data is not from this pool, or the owner freed the buffer") from e
                    raise
            self._imports[export_data] = [base, 1, user]
            self.users += 1
            return base

    def unmap(self, export_data: bytes) -> None:
        with self._lock:
            entry = self._imports[export_data]
            entry[1] -= 1
            if entry[1] > 0:
                return
            del self._imports[export_data]
            if export_data in self._local:
                self._local.discard(export_data)
            else:
                with entry[2].activate():
                    drv.driver().call("cuMemFree", entry[0])
        self.release()

    def retain(self) -> None:
        with self._lock:
            self.users += 1

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users > 0 or self.fd < 0:
                return
            h, self._handle = self._handle, None
            fd, self.fd = self.fd, -1
            home, self._home = self._home, None
        try:
            if h is not None:
                with home.activate():
                    drv.driver().call("cuMemPoolDestroy", ctypes.c_void_p(h))
        finally:
            os.close(fd)
            for cb in self.after_destroy:
                try:
                    cb()
                except Exception:  # noqa: BLE001 - the others must still run
                    pass


def _still_exported(ptr: int, export_data: bytes, dev: Device) -> bool:
    try:
        with dev.activate():
            return drv.pool_export_pointer(ptr) == export_data
    except CudaError:
        return False


def _check_pool_fd(fd: int) -> None:
    st = os.fstat(fd)
    if not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) != _NVIDIA_CHAR_MAJOR:
        raise IpcError("ERR_DESCRIPTOR_INVALID", "a received pool fd is not a CUDA memory pool handle (not the NVIDIA control device)")


def _read_pool_ref(data, fds: list[int], link) -> _PoolRef:
    if len(data) < POOL_REF_BYTES:
        raise _frame_error("pool reference")
    pool_id = bytes(data[0:16])
    device_uuid = format_uuid(bytes(data[16:32]))
    max_size, flags, reserved = struct.unpack_from("<QII", data, 32)
    if flags & ~FD_ATTACHED or reserved:
        raise _frame_error("pool reference")
    received = link.handler_state.get(_POOLS_RECEIVED)
    if received is None:
        received = link.handler_state[_POOLS_RECEIVED] = {}

        def drop(_link, _reason, pools=received):
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
        ref = _PoolRef(pool_id, device_uuid, max_size, fd)
        received[pool_id] = ref
        return ref
    if fds:
        raise _frame_error("pool reference (unexpected fd)")
    if known is None:
        raise IpcError("ERR_FRAME_INVALID", "a pool buffer names a pool this link never received; messages arrived out of order or from another link")
    return known


# ------------------------------------------------------------------------------------------------
# Received memory


class _Origin:
    """One received allocation range: the sender's lease, how to map it, and who still uses it (open
    DeviceBuffer handles and leases granted onward). Mapped on first use, for the working device
    (working_device(), else the device the memory lives on); unmapped, then the lease ended, once
    nobody uses it."""

    __slots__ = ("kind", "lease", "device_uuid", "allocation_size", "pool", "export_data", "descriptor", "users",
                 "base", "user", "_unmap", "handed_to_cuda_core", "_lock")

    def __init__(self, kind: str, lease, device_uuid: str, allocation_size: int, *, pool: _PoolRef | None = None,
                 export_data: bytes = b"", descriptor: LegacyHandleDescriptor | None = None):
        self.kind = kind  # 'pool' or 'legacy'
        self.lease = lease
        self.device_uuid = device_uuid
        self.allocation_size = allocation_size
        self.pool = pool
        self.export_data = export_data
        self.descriptor = descriptor
        self.users = 1
        self.base: int | None = None
        #: The device the memory is mapped for (set by map()).
        self.user: Device | None = None
        self._unmap = None
        self.handed_to_cuda_core = False
        self._lock = threading.Lock()
        if pool is not None:
            pool.retain()

    def map(self) -> int:
        base = self.base
        if base is not None:
            return base
        with self._lock:
            if self.users <= 0:
                raise IpcError("ERR_CLOSED", "this buffer is closed")
            if self.base is None:
                if self.handed_to_cuda_core:
                    raise IpcError("ERR_INVALID_ARG", "this pool buffer was handed to cuda.core's own import (cuda_core_ipc()); use that Buffer, not this one: importing one pool pointer twice in a process is unsafe")
                user = importing_device(Device.by_uuid(self.device_uuid))
                if self.kind == "pool":
                    base = self.pool.import_pointer(self.export_data, user)
                    pool, export = self.pool, self.export_data
                    self._unmap = lambda: pool.unmap(export)
                else:
                    base, self._unmap = _open_legacy(self.descriptor, user)
                self.user = user
                self.base = base
            return self.base

    def retain(self) -> None:
        with self._lock:
            if self.users <= 0:
                raise IpcError("ERR_CLOSED", "this buffer is closed")
            self.users += 1

    def release(self, sync: bool = True) -> None:
        with self._lock:
            self.users -= 1
            if self.users > 0:
                return
            unmap, self._unmap = self._unmap, None
            self.base = None
        try:
            if unmap is not None:
                if sync:
                    # Work queued on the memory (a kernel on a view of it) must finish before the
                    # mapping goes and the sender may reuse the memory.
                    self.user.synchronize()
                unmap()
        finally:
            if self.pool is not None:
                self.pool.release()
            if self.lease is not None:
                self.lease.end()


# ------------------------------------------------------------------------------------------------
# Legacy mappings: opened once per process and device, kept open (idle) a while after their last
# user, as Node's import cache does: reopening a handle then costs nothing, and closing a mapping
# (cuIpcCloseMemHandle, which is slow while the exporter still holds the memory) happens later, for
# the least recently used idle one, usually after its exporter freed it.


class _LegacyMapping:
    __slots__ = ("base", "size", "refs", "last_use", "device")

    def __init__(self, base: int, size: int, device: Device):
        self.base = base
        self.size = size
        self.refs = 1
        self.last_use = 0
        self.device = device


_legacy_lock = threading.Lock()
_legacy_maps: dict[tuple, _LegacyMapping] = {}  # (handle, device uuid) -> mapping
_legacy_clock = 0
_legacy_idle_limit = 16
_legacy_opens = 0  # [tensors hook] cuIpcOpenMemHandle calls made (legacy_cache_stats()["opened"])


def _legacy_acquire(handle: bytes, user: Device) -> tuple[int, int]:
    """(base, allocation size) of the mapping of ``handle`` for ``user``, opened if need be."""
    global _legacy_clock, _legacy_opens
    key = (handle, user.uuid)
    with _legacy_lock:
        m = _legacy_maps.get(key)
        if m is not None:
            m.refs += 1
            _legacy_clock += 1
            m.last_use = _legacy_clock
            return m.base, m.size
        with user.activate():
            base = drv.ipc_open_mem_handle(handle)
            _legacy_opens += 1
            try:
                size = drv.address_range(base)[1]
            except BaseException:
                drv.driver().call("cuIpcCloseMemHandle", base)
                raise
        # An idle entry of this device at the same address belongs to an allocation the driver no
        # longer maps here (its handle differs, or the lookup above would have found it): stale.
        for k, old in list(_legacy_maps.items()):
            if old.base == base and old.device is user and old.refs == 0:
                del _legacy_maps[k]
        m = _LegacyMapping(base, size, user)
        _legacy_clock += 1
        m.last_use = _legacy_clock
        _legacy_maps[key] = m
        return base, size


def _legacy_release(handle: bytes, user: Device) -> None:
    with _legacy_lock:
        m = _legacy_maps.get((handle, user.uuid))
        if m is None or m.refs == 0:
            return
        m.refs -= 1
        if m.refs == 0:
            _trim_idle(_legacy_idle_limit)


def _trim_idle(keep: int) -> None:
    """With _legacy_lock held: closes idle mappings, least recently used first, until ``keep`` remain."""
    idle = [(m.last_use, k) for k, m in _legacy_maps.items() if m.refs == 0]
    if len(idle) <= keep:
        return
    idle.sort()
    first: BaseException | None = None
    for _, k in idle[:len(idle) - keep]:
        m = _legacy_maps.pop(k)
        try:
            with m.device.activate():
                drv.driver().call("cuIpcCloseMemHandle", m.base)
        except CudaError as e:
            first = first or e
    if first is not None:
        raise first


def _legacy_drop(handle: bytes, user: Device) -> bool:
    """[tensors hook] Closes the mapping of ``handle`` for ``user`` now if nothing uses it (instead of
    leaving it idle in the cache): tensor sets drop theirs, so that an idle mapping never keeps a
    sender's freed memory. True when one was closed."""
    with _legacy_lock:
        m = _legacy_maps.get((handle, user.uuid))
        if m is None or m.refs:
            return False
        del _legacy_maps[(handle, user.uuid)]
        with m.device.activate():
            drv.driver().call("cuIpcCloseMemHandle", m.base)
        return True


def configure_import_cache(idle_limit: int) -> None:
    """How many unused legacy mappings stay open (default 16; least recently used closed first). An
    idle mapping keeps its allocation's memory alive after the exporter frees it, so 0 trades
    reopening cost for memory."""
    global _legacy_idle_limit
    if type(idle_limit) is not int or idle_limit < 0:
        raise IpcError("ERR_INVALID_ARG", f"idle_limit must be a non-negative int, got {idle_limit!r}")
    with _legacy_lock:
        _legacy_idle_limit = idle_limit
        _trim_idle(idle_limit)


def legacy_cache_stats() -> dict:
    """This process's legacy mappings: ``mappings``, ``idle``, ``idle_limit``, ``references``, and ``opened``
    (handles opened so far: a mapping found in the cache opens none)."""
    with _legacy_lock:
        refs = sum(m.refs for m in _legacy_maps.values())
        idle = sum(1 for m in _legacy_maps.values() if m.refs == 0)
        return {"mappings": len(_legacy_maps), "idle": idle, "idle_limit": _legacy_idle_limit, "references": refs, "opened": _legacy_opens}


def _open_legacy(desc: LegacyHandleDescriptor, user: Device):
    """Maps the allocation behind ``desc.handle`` for ``user``; returns (base, unmap)."""
    resident = Device.by_uuid(desc.device_uuid)
    local = _local_exports.get(desc.handle)
    if local is not None:
        try:
            with resident.activate():
                same = drv.ipc_get_mem_handle(local) == desc.handle
                size = drv.address_range(local)[1] if same else 0
            if same:
                _check_range(desc, size)
                user.enable_peer_access(resident)  # our own allocation, sent back to us
                return local, (lambda: None)
        except CudaError:
            pass  # freed since: fall through to the driver's answer
    try:
        base, size = _legacy_acquire(desc.handle, user)
    except CudaError as e:
        if e.code in ("CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_INVALID_HANDLE"):
            why = "this process exported it but has since freed the memory" if desc.pid == os.getpid() else (
                f"the exporting process {desc.pid} has exited, or freed the memory, or the bytes are not a CUDA IPC handle")
            raise IpcError("ERR_HANDLE_STALE", f"cannot open the IPC handle: {why}. Ask the exporter for a fresh descriptor") from e
        raise
    handle = desc.handle

    def close():
        _legacy_release(handle, user)
    try:
        _check_range(desc, size)
    except BaseException:
        close()
        raise
    return base, close


def _check_range(desc: LegacyHandleDescriptor, allocation_size: int) -> None:
    if desc.offset + desc.byte_length > allocation_size:
        raise IpcError("ERR_OUT_OF_RANGE", f"the descriptor names {desc.byte_length} bytes at offset {desc.offset}, but the allocation holds only {allocation_size} bytes")


class CudaCoreImport(NamedTuple):
    """What cuda.core needs to import a received pool buffer with its own IPC API."""

    allocation_handle: int  # a dup of the pool's fd, owned by the caller
    descriptor: Any  # cuda.core IPCBufferDescriptor of the whole allocation
    offset: int  # where this buffer starts in the allocation
    length: int
    device_ordinal: int


class DeviceBuffer:
    """Device memory received over a link (a Node pool buffer or legacy buffer), or a view of it.

    ``ptr``, ``nbytes``, ``device``; ``__cuda_array_interface__`` and DLPack (uint8 bytes);
    ``view(dtype, shape, strides, offset)`` for a typed array; ``read``/``write`` copy to/from host;
    ``close(sync=True)`` releases it (first waiting for the device's queued work, unless
    ``sync=False``), which tells the sender; dropping the last reference does the same.
    """

    def __init__(self, origin: _Origin, offset: int, length: int, _token=None):
        if _token is not _CREATE:
            raise IpcError("ERR_INVALID_ARG", "DeviceBuffer objects come from links (receive)")
        self._origin = origin
        self._offset = offset
        self._length = length
        self._closed = False

    # -- facts --

    @property
    def kind(self) -> str:
        """'pool' (from an IPC pool) or 'legacy' (a legacy IPC handle)."""
        return self._origin.kind

    @property
    def nbytes(self) -> int:
        return self._length

    def __len__(self) -> int:
        return self._length

    @property
    def offset(self) -> int:
        """Where this buffer starts in its allocation."""
        return self._offset

    @property
    def allocation_size(self) -> int:
        return self._origin.allocation_size

    @property
    def device_uuid(self) -> str:
        return self._origin.device_uuid

    @property
    def device(self) -> Device:
        """The device the memory is used on: the one it is mapped for (the working device when one was
        chosen: working_device(), Node's spawn({ device })), else the one it lives on."""
        o = self._origin
        return o.user if o.user is not None else importing_device(Device.by_uuid(o.device_uuid))

    @property
    def resident_device(self) -> Device:
        """The device the memory lives on."""
        return Device.by_uuid(self._origin.device_uuid)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def is_mapped(self) -> bool:
        return self._origin.base is not None

    @property
    def ptr(self) -> int:
        """The device address (mapping the memory on first use)."""
        if self._closed:
            raise IpcError("ERR_CLOSED", "this DeviceBuffer is closed")
        return self._origin.map() + self._offset

    # -- interop --

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self._length,), "typestr": "|u1", "data": (self.ptr if self._length else 0, False),
                "version": 3, "strides": None, "stream": None}

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        # The memory has no pending work in this process: nothing to order on the consumer's stream.
        if copy:
            raise BufferError("DeviceBuffer.__dlpack__: copy=True is not supported; it shares memory")
        return make_capsule(self.ptr, (DL_CUDA, self.device.ordinal), "|u1", (self._length,), None, owner=self)

    def __dlpack_device__(self):
        return (DL_CUDA, self.device.ordinal)

    def view(self, dtype="uint8", shape=None, strides=None, offset: int = 0) -> "ArrayView":
        """A typed array over the bytes (strides in bytes; default C-contiguous, shape default: as many
        elements as fit), exposing ``__cuda_array_interface__`` and DLPack; it keeps this buffer alive."""
        name = dtype_name(dtype)
        itemsize = DTYPES[name][0]
        if offset < 0 or offset > self._length:
            raise IpcError("ERR_OUT_OF_RANGE", f"offset {offset} lies outside the {self._length}-byte buffer")
        if shape is None:
            shape = ((self._length - offset) // itemsize,)
        elif isinstance(shape, int):
            shape = (shape,)
        meta = ArrayMeta.make(name, shape, strides)
        if offset + meta.extent > self._length:
            raise IpcError("ERR_OUT_OF_RANGE", f"a {meta.dtype} array of shape {meta.shape} needs {meta.extent} bytes at offset {offset}; the buffer has {self._length}")
        if offset % itemsize:
            raise IpcError("ERR_INVALID_ARG", f"offset {offset} is not aligned to the {itemsize}-byte {meta.dtype} elements")
        return ArrayView(self, meta, offset)

    def to_cuda_core(self):
        """A cuda.core ``Buffer`` over this memory (no copy) that keeps this buffer alive."""
        Buffer = _cuda_core().Buffer
        try:
            return Buffer.from_handle(self.ptr, self._length, owner=self)
        except TypeError as e:
            raise IpcError("ERR_UNSUPPORTED", f"this cuda.core's Buffer.from_handle takes no owner ({e}); upgrade cuda.core") from None

    def cuda_core_ipc(self) -> CudaCoreImport:
        """For cuda.core's own IPC import of a received *pool* buffer:
        ``mr = DeviceMemoryResource.from_allocation_handle(dev, r.allocation_handle)``,
        ``Buffer.from_ipc_descriptor(mr, r.descriptor, stream=...)``; the data starts at ``r.offset``.
        Close that Buffer before this one. The pool is then cuda.core's in this process: cuda_ipc
        refuses to map its buffers itself (one pool imported twice in a process is unsafe)."""
        o = self._origin
        if o.kind != "pool":
            raise IpcError("ERR_NOT_EXPORTABLE", "only pool buffers have cuda.core IPC data; this one is a legacy-handle buffer")
        if o.base is not None or o.pool._handle is not None:
            raise IpcError("ERR_INVALID_ARG", "cuda_ipc already imported this buffer's pool in this process; importing it again through "
                           "cuda.core would map it twice: use to_cuda_core() (a cuda.core Buffer over cuda_ipc's mapping) instead")
        desc = ipc_buffer_descriptor(o.export_data, o.allocation_size)
        ordinal = self.device.ordinal
        o.handed_to_cuda_core = True
        o.pool.handed_to_cuda_core = True
        return CudaCoreImport(os.dup(o.pool.fd), desc, self._offset, self._length, ordinal)

    @property
    def export_data(self) -> bytes:
        """The 64 bytes of pool export data of the allocation (pool buffers only)."""
        if self._origin.kind != "pool":
            raise IpcError("ERR_NOT_EXPORTABLE", "only pool buffers have export data")
        return self._origin.export_data

    def descriptor(self) -> LegacyHandleDescriptor:
        """The legacy-handle descriptor of this range (legacy buffers only)."""
        o = self._origin
        if o.kind != "legacy":
            raise IpcError("ERR_NOT_EXPORTABLE", "a pool buffer has no legacy handle; send it over a link instead")
        d = o.descriptor
        return LegacyHandleDescriptor(d.handle, self._offset, self._length, d.device_uuid, d.pid)

    # -- copies --

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """A host copy of ``length`` bytes at ``offset`` (synchronous)."""
        n = self._length - offset if length is None else length
        if offset < 0 or n < 0 or offset + n > self._length:
            raise IpcError("ERR_OUT_OF_RANGE", f"{n} bytes at {offset} do not fit a {self._length}-byte buffer")
        out = bytearray(n)
        if n:
            with self.device.activate():
                drv.memcpy_dtoh(ctypes.addressof((ctypes.c_char * n).from_buffer(out)), self.ptr + offset, n)
        return bytes(out)

    def write(self, data, offset: int = 0) -> None:
        """Copies host bytes in (synchronous)."""
        src = bytes(memoryview(data).cast("B"))
        if offset < 0 or offset + len(src) > self._length:
            raise IpcError("ERR_OUT_OF_RANGE", f"{len(src)} bytes at {offset} do not fit a {self._length}-byte buffer")
        if src:
            with self.device.activate():
                drv.memcpy_htod(self.ptr + offset, ctypes.cast(ctypes.c_char_p(src), ctypes.c_void_p).value, len(src))

    # -- lifetime --

    def slice(self, offset: int, length: int) -> "DeviceBuffer":
        """Another handle on ``length`` bytes at ``offset`` of this buffer (close it too)."""
        if offset < 0 or length < 0 or offset + length > self._length:
            raise IpcError("ERR_OUT_OF_RANGE", f"{length} bytes at {offset} do not fit a {self._length}-byte buffer")
        self._origin.retain()
        return DeviceBuffer(self._origin, self._offset + offset, length, _CREATE)

    def close(self, sync: bool = True) -> None:
        """Releases this handle; with the last one the memory is unmapped (after waiting for the
        device's queued work, unless ``sync=False``) and the sender told. Views (tensors, arrays) of
        it must not be used afterwards. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._origin.release(sync)

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing to report to at collection time
                pass

    def __repr__(self) -> str:
        return f"<cuda_ipc.DeviceBuffer {self.kind} {self._length} bytes{' closed' if self._closed else ''}>"


class ArrayView:
    """A typed array over a DeviceBuffer (``buf.view(...)``): ``__cuda_array_interface__`` and DLPack."""

    __slots__ = ("buffer", "meta", "offset", "_cai", "__weakref__")

    def __init__(self, buffer: DeviceBuffer, meta: ArrayMeta, offset: int):
        self.buffer = buffer
        self.meta = meta
        self.offset = offset
        self._cai = None

    @property
    def shape(self) -> tuple:
        return self.meta.shape

    @property
    def dtype(self) -> str:
        return self.meta.dtype

    @property
    def ptr(self) -> int:
        return self.buffer.ptr + self.offset

    @property
    def __cuda_array_interface__(self) -> dict:
        cai = self._cai
        if cai is None or self.buffer.closed:
            m = self.meta
            cai = self._cai = {"shape": m.shape, "typestr": m.typestr, "data": (self.ptr if m.extent else 0, False), "version": 3,
                               "strides": None if m.c_contiguous else m.strides, "stream": None}
        return dict(cai)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("__dlpack__: copy=True is not supported; it shares memory")
        m = self.meta
        return make_capsule(self.ptr, (DL_CUDA, self.buffer.device.ordinal), m.typestr, m.shape,
                            None if m.c_contiguous else m.strides, owner=self)

    def __dlpack_device__(self):
        return (DL_CUDA, self.buffer.device.ordinal)

    def __repr__(self) -> str:
        return f"<cuda_ipc.ArrayView {self.meta.dtype}{list(self.meta.shape)} of {self.buffer!r}>"


class ImportedPool:
    """A pool a peer sent by itself (an ``IpcPool`` in a message). Its buffers arrive as DeviceBuffers;
    ``close()`` lets go of it (destroyed after its last buffer)."""

    def __init__(self, ref: _PoolRef):
        self._ref = ref
        self._closed = False
        ref.retain()

    @property
    def id(self) -> str:
        return self._ref.id.hex()

    @property
    def device_uuid(self) -> str:
        return self._ref.device_uuid

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._ref.release()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass


class IpcEvent:
    """An interprocess CUDA event a peer sent: ``wait(stream)`` makes a stream (an int handle, e.g.
    ``torch.cuda.current_stream().cuda_stream``) wait for it on the GPU; ``synchronize()`` waits on
    the CPU; ``close()`` releases it."""

    def __init__(self, handle_bytes: bytes, device_uuid: str, lease):
        self._bytes = handle_bytes
        self.device_uuid = device_uuid
        self._lease = lease
        self._event: int | None = None
        self._closed = False

    @property
    def handle(self) -> int:
        if self._closed:
            raise IpcError("ERR_CLOSED", "this event is closed")
        if self._event is None:
            h = drv.CUipcEventHandle()
            ctypes.memmove(ctypes.addressof(h), self._bytes, 64)
            ev = drv.CUevent()
            with Device.by_uuid(self.device_uuid).activate():
                drv.driver().call("cuIpcOpenEventHandle", ctypes.byref(ev), h)
            self._event = ev.value
        return self._event

    def wait(self, stream: int) -> None:
        with Device.by_uuid(self.device_uuid).activate():
            drv.driver().call("cuStreamWaitEvent", ctypes.c_void_p(stream), ctypes.c_void_p(self.handle), 0)

    def synchronize(self) -> None:
        with Device.by_uuid(self.device_uuid).activate():
            drv.driver().call("cuEventSynchronize", ctypes.c_void_p(self.handle))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ev, self._event = self._event, None
        try:
            if ev is not None:
                with Device.by_uuid(self.device_uuid).activate():
                    drv.driver().call("cuEventDestroy", ctypes.c_void_p(ev))
        finally:
            if self._lease is not None:
                self._lease.end()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass


_CREATE = object()


def _cuda_core():
    try:
        import cuda.core as cc  # cuda.core >= 0.4 / 1.x
        if hasattr(cc, "Buffer"):
            return cc
    except ImportError:
        pass
    try:
        import cuda.core.experimental as cce  # older releases
        return cce
    except ImportError:
        raise IpcError("ERR_UNSUPPORTED", "cuda.core is not installed in this Python") from None


def ipc_buffer_descriptor(export_data: bytes, size: int):
    """A cuda.core IPCBufferDescriptor for a pool allocation (its 64 bytes of export data and size)."""
    cls = None
    for modname in ("cuda.core._memory", "cuda.core._memory._ipc", "cuda.core", "cuda.core.experimental._memory"):
        try:
            mod = __import__(modname, fromlist=["IPCBufferDescriptor"])
        except ImportError:
            continue
        cls = getattr(mod, "IPCBufferDescriptor", None)
        if cls is not None:
            break
    if cls is None:
        raise IpcError("ERR_UNSUPPORTED", "this cuda.core has no IPCBufferDescriptor")
    # The same constructor cuda.core's own pickling uses (IPCBufferDescriptor.__reduce__).
    return cls._init(bytes(export_data), int(size))


# ------------------------------------------------------------------------------------------------
# Sending device memory


class Shared:
    """``share(obj, sync=...)``: a tensor/array to send, with options."""

    __slots__ = ("obj", "sync")

    def __init__(self, obj, sync: bool):
        self.obj = obj
        self.sync = sync


def share(obj, *, sync: bool = True) -> Shared:
    """Marks a CUDA tensor/array for sending. ``sync=False`` skips synchronizing its stream before the
    send (do it yourself, or make the peer wait on an event)."""
    return Shared(obj, sync)


class _Recent(OrderedDict):
    """A dict that forgets its oldest entries beyond ``limit`` (entries are re-checked on use)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


# handle -> allocation base of legacy exports from this process (so that a handle sent back to us
# opens as a view instead of failing: the driver refuses to open a process's own handle).
_local_exports: dict[bytes, int] = _Recent(4096)
# export data -> pointer of pool allocations exported from this process.
_local_pool_exports: dict[bytes, int] = _Recent(4096)
# allocation base -> (its buffer id, its legacy handle or pool export data), exported from this process.
_export_handles: dict[int, tuple[int, bytes]] = _Recent(4096)
# CUmemoryPool handle -> (16-byte id, fd) of pools whose memory this process exported.
_local_pools: dict[int, tuple[bytes, int]] = {}
_export_lock = threading.Lock()


class _Exported(NamedTuple):
    ptr: int
    extent: int
    meta: ArrayMeta | None
    keep: Any
    sync: Any  # callable, ("stream", handle), ("device", None) or None
    ordinal: int | None = None  # the device, when the object says (saves a driver query)
    whole: bool = False  # the object is a whole allocation (ptr is its base, extent its size)


def _stream_sync(stream: int, dev: Device):
    def run():
        with dev.activate():
            drv.driver().call("cuStreamSynchronize", ctypes.c_void_p(stream))
    return run


def _describe_array(obj, sync: bool) -> _Exported:
    """Pointer, extent, array metadata and how to wait for the producer, of a tensor/array."""
    mod = type(obj).__module__ or ""
    if mod.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda"):
        if not obj.is_cuda:
            raise IpcError("ERR_NOT_EXPORTABLE", "a CPU tensor cannot be shared as device memory; send a HostBuffer view (torch.frombuffer(hb.memory, ...)) instead")
        itemsize = obj.element_size()
        try:
            meta = ArrayMeta.make(dtype_name(obj.dtype), tuple(obj.shape), tuple(s * itemsize for s in obj.stride()))
            extent = meta.extent
        except IpcError:
            meta = None
            extent = (sum((d - 1) * s for d, s in zip(obj.shape, obj.stride())) + 1) * itemsize if obj.numel() else 0
        torch = sys.modules["torch"]
        waiter = (lambda: torch.cuda.current_stream(obj.device).synchronize()) if sync else None
        return _Exported(obj.data_ptr(), extent, meta, obj, waiter, obj.device.index)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        ptr = cai["data"][0]
        meta = None
        try:
            meta = ArrayMeta.make(dtype_name(cai["typestr"]), tuple(cai["shape"]), cai.get("strides"))
            extent = meta.extent
        except IpcError:
            itemsize = int(cai["typestr"][2:])
            shape = tuple(cai["shape"])
            strides = cai.get("strides")
            if strides is None:
                n = 1
                for d in shape:
                    n *= d
                extent = n * itemsize
            else:
                extent = 0 if 0 in shape else sum((d - 1) * s for d, s in zip(shape, strides)) + itemsize
        waiter = None
        stream = cai.get("stream")
        if sync and stream is not None and ptr:
            waiter = ("stream", stream)
        elif sync and ptr:
            waiter = ("device", None)
        return _Exported(ptr, extent, meta, obj, waiter)
    if mod.startswith("cuda.core") and hasattr(obj, "handle") and hasattr(obj, "size"):
        return _Exported(int(obj.handle), int(obj.size), None, obj, ("device", None) if sync else None, whole=True)
    raise IpcError("ERR_NOT_TRANSFERABLE", f"cannot share {type(obj).__qualname__}: not a CUDA tensor or array")


def _is_device_array(v) -> bool:
    if isinstance(v, (Shared, DeviceBuffer, ArrayView)):
        return True
    mod = type(v).__module__ or ""
    if mod.startswith("torch") and hasattr(v, "is_cuda"):
        return bool(v.is_cuda)
    if mod.startswith("cuda.core") and type(v).__name__ == "Buffer":
        return True
    return hasattr(type(v), "__cuda_array_interface__")


def _pool_ref_bytes(pool_id: bytes, device_uuid: str, max_size: int, attach: bool) -> bytearray:
    b = bytearray(POOL_BUFFER_BYTES)
    b[0:16] = pool_id
    b[16:32] = uuid_bytes(device_uuid)
    struct.pack_into("<QII", b, 32, max_size, FD_ATTACHED if attach else 0, 0)
    return b


def _pool_fd_for_link(link, pool_id: bytes, fd: int):
    """(attach, fds, on_commit): the pool's fd goes once per link, in the first message that needs it."""
    sent = link.handler_state.setdefault(_POOLS_SENT, set())
    if pool_id in sent:
        return False, [], None
    return True, [os.dup(fd)], (lambda: sent.add(pool_id))


class _DeviceMemoryTransfer(TransferHandler):
    """Sends device memory: received buffers onward, and tensors/arrays of this process."""

    kind = "cuda-ipc.device-memory"  # local name only: records go out as 'pool-buffer' or 'legacy-buffer'

    def can_transfer(self, value) -> bool:
        return _is_device_array(value)

    def encode(self, value, link) -> TransferEncoding:
        if isinstance(value, ArrayView):
            return self._resend(value.buffer, link, value.offset, value.meta.extent)
        if isinstance(value, DeviceBuffer):
            return self._resend(value, link, 0, value.nbytes)
        sync = True
        if isinstance(value, Shared):
            sync, value = value.sync, value.obj
            if isinstance(value, (DeviceBuffer, ArrayView)):
                return self.encode(value, link)
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

    def _send_legacy_memory(self, e: _Exported, facts, dev: Device) -> TransferEncoding:
        if facts.managed:
            raise IpcError("ERR_NOT_EXPORTABLE", "managed memory cannot be shared through CUDA IPC handles; allocate with cudaMalloc (PyTorch's default allocator) or from an IPC pool")
        if facts.memory_type != drv.CU_MEMORYTYPE_DEVICE:
            what = "pinned host memory" if facts.memory_type == drv.CU_MEMORYTYPE_HOST else "memory the CUDA driver does not know"
            raise IpcError("ERR_NOT_EXPORTABLE", f"{what} cannot be shared through CUDA IPC handles; send a HostBuffer instead")
        base, size = facts.base, facts.size
        offset = e.ptr - base
        if offset + e.extent > size:
            raise IpcError("ERR_OUT_OF_RANGE", f"{e.extent} bytes at 0x{e.ptr:x} run past the end of its allocation ({size - offset} bytes left)")
        # An allocation's handle never changes: ask the driver once per allocation (its buffer id
        # tells a new allocation at a reused address apart). PyTorch's caching allocator hands the
        # same blocks out again and again.
        known = _export_handles.get(base)
        if known is not None and facts.buffer_id and known[0] == facts.buffer_id:
            handle = known[1]
            _local_exports[handle] = base  # (still) ours, should it come back
        else:
            try:
                handle = drv.ipc_get_mem_handle(base)
            except CudaError as err:
                raise IpcError("ERR_NOT_EXPORTABLE", f"the driver has no IPC handle for this memory ({err.code}); it may come from cuMemCreate/VMM (e.g. PyTorch's expandable_segments:True), which legacy handles cannot share") from err
            with _export_lock:
                _export_handles[base] = (facts.buffer_id, handle)
                _local_exports[handle] = base
        meta = e.meta if e.meta is not None and e.meta.extent <= e.extent else None
        desc = LegacyHandleDescriptor(handle, offset, e.extent, dev.uuid, os.getpid(), meta)
        keep = e.keep
        return TransferEncoding(data=encode_descriptor(desc), hold=Hold(lambda: _drop(keep), e.extent), kind="legacy-buffer")

    def _send_pool_memory(self, e: _Exported, facts, dev: Device, link) -> TransferEncoding:
        pool = facts.pool
        base, size = (e.ptr, e.extent) if e.whole else (facts.base, facts.size)
        with _export_lock:
            known = _local_pools.get(pool)
            if known is None:
                try:
                    fd = drv.pool_export_fd(pool)
                except CudaError as err:
                    raise IpcError("ERR_NOT_EXPORTABLE", f"this memory lives in a memory pool that is not IPC-enabled ({err.code}); allocate it from an IPC pool (cuda.core: DeviceMemoryResourceOptions(ipc_enabled=True)) or from cudaMalloc") from err
                known = _local_pools[pool] = (os.urandom(16), fd)
        pool_id, fd = known
        cached = _export_handles.get(base)
        if cached is not None and facts.buffer_id and cached[0] == facts.buffer_id:
            export = cached[1]
            _local_pool_exports[export] = base
        else:
            export = drv.pool_export_pointer(base)
            with _export_lock:
                _export_handles[base] = (facts.buffer_id, export)
                _local_pool_exports[export] = base
        attach, fds, commit = _pool_fd_for_link(link, pool_id, fd)
        data = _pool_ref_bytes(pool_id, dev.uuid, 0, attach)
        data[48:112] = export
        struct.pack_into("<QQQ", data, 112, size, e.ptr - base, e.extent)
        keep = e.keep
        return TransferEncoding(data=bytes(data), fds=fds, close_fds_after_send=True, on_commit=commit,
                                hold=Hold(lambda: _drop(keep), e.extent), kind="pool-buffer")

    def _resend(self, buf: DeviceBuffer, link, offset: int, length: int) -> TransferEncoding:
        """A received buffer sent on: the same pool reference / handle, leased from our handle on it."""
        o = buf._origin
        if buf.closed:
            raise IpcError("ERR_CLOSED", "link.send: the DeviceBuffer is closed; send it before closing it")
        o.retain()
        hold = Hold(lambda: o.release(False), length)
        try:
            if o.kind == "legacy":
                d = o.descriptor
                desc = LegacyHandleDescriptor(d.handle, buf.offset + offset, length, d.device_uuid, d.pid)
                return TransferEncoding(data=encode_descriptor(desc), hold=hold, kind="legacy-buffer")
            attach, fds, commit = _pool_fd_for_link(link, o.pool.id, o.pool.fd)
            data = _pool_ref_bytes(o.pool.id, o.pool.device_uuid, o.pool.max_size, attach)
            data[48:112] = o.export_data
            struct.pack_into("<QQQ", data, 112, o.allocation_size, buf.offset + offset, length)
            return TransferEncoding(data=bytes(data), fds=fds, close_fds_after_send=True, on_commit=commit, hold=hold, kind="pool-buffer")
        except BaseException:
            hold.release()
            raise

    def decode(self, data, fds, link, lease):
        raise IpcError("ERR_FRAME_INVALID", f"'{self.kind}' is not a wire kind")


def _drop(_obj) -> None:
    """The hold's release: the last reference we kept goes with the closure."""


class _PoolBufferTransfer(TransferHandler):
    kind = "pool-buffer"

    def can_transfer(self, value) -> bool:
        return False  # sent by _DeviceMemoryTransfer

    def decode(self, data, fds, link, lease):
        if len(data) != POOL_BUFFER_BYTES:
            raise _frame_error("pool buffer")
        pool = _read_pool_ref(data, fds, link)
        size, offset, length = struct.unpack_from("<QQQ", data, 112)
        if size == 0 or offset + length > size:
            raise IpcError("ERR_OUT_OF_RANGE", f"a range of {length} bytes at {offset} does not fit a pool buffer of {size} bytes")
        origin = _Origin("pool", lease, pool.device_uuid, size, pool=pool, export_data=bytes(data[48:112]))
        return DeviceBuffer(origin, offset, length, _CREATE)


class _LegacyBufferTransfer(TransferHandler):
    kind = "legacy-buffer"

    def can_transfer(self, value) -> bool:
        return False

    def decode(self, data, fds, link, lease):
        desc = decode_descriptor(data, "cuda-legacy-handle")
        origin = _Origin("legacy", lease, desc.device_uuid, 0, descriptor=desc)
        buf = DeviceBuffer(origin, desc.offset, desc.byte_length, _CREATE)
        if desc.array is not None:
            buf.array = desc.array  # what the sender said the bytes hold
        return buf


class _IpcPoolTransfer(TransferHandler):
    kind = "ipc-pool"

    def can_transfer(self, value) -> bool:
        return False

    def decode(self, data, fds, link, lease):
        if len(data) != POOL_REF_BYTES:
            raise _frame_error("pool")
        ref = _read_pool_ref(data, fds, link)
        pool = ImportedPool(ref)
        if lease is not None:
            ref.after_destroy.append(lease.end)
        return pool


class _IpcEventTransfer(TransferHandler):
    kind = "ipc-event"

    def can_transfer(self, value) -> bool:
        return False

    def decode(self, data, fds, link, lease):
        desc = decode_descriptor(data, "cuda-ipc-event")
        return IpcEvent(desc.handle, desc.device_uuid, lease)


DeviceBuffer.array = None  # set on legacy buffers whose sender described the bytes

register_transfer_handler(_DeviceMemoryTransfer())
register_transfer_handler(_PoolBufferTransfer())
register_transfer_handler(_LegacyBufferTransfer())
register_transfer_handler(_IpcPoolTransfer())
register_transfer_handler(_IpcEventTransfer())
