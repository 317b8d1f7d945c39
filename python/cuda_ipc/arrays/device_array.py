"""Device memory received from another process (src/cuda/buffer.ts): ``DeviceBuffer`` and its typed
views, ``DeviceArray``.

A DeviceBuffer exposes ``__cuda_array_interface__`` (v3, bytes) and DLPack, so
``torch.as_tensor(buf, device='cuda')``, ``cupy.asarray(buf)``, ``numba.cuda.as_cuda_array(buf)`` and
``torch.from_dlpack(buf)`` view it without a copy; ``buf.view('float32', shape)`` gives a typed view.
The memory is mapped (in the device's primary context, which those libraries use) on first use, and
unmapped when the buffer is closed or collected; that ends the sender's lease.
"""
from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..cuda import driver as drv
from ..ipc.descriptor import DTYPES, ArrayMeta, LegacyHandleDescriptor, dtype_name
from ..cuda.device import Device, importing_device
from ..dlpack import DL_CUDA, make_capsule
from ..errors import IpcError
from ..leak import Resource
from ..ipc.legacy import open_legacy, open_legacy_many
from ..ipc.pool import PoolImport
from ..ipc.pool_interop import CudaCoreImport, _cuda_core, ipc_buffer_descriptor
from .._renamed import renamed_attribute

if TYPE_CHECKING:
    from ..leak import ReceivedLease


class _Origin:
    """One received allocation range: the sender's lease, how to map it, and who still uses it (open
    DeviceBuffer handles and leases granted onward). Mapped on first use, for the working device
    (working_device(), else the device the memory lives on); unmapped, then the lease ended, once
    nobody uses it. Kind 'owned' (owned.py): memory this process allocated for bytes received over
    NCCL, mapped from the start and freed once nobody uses it."""

    __slots__ = ("kind", "lease", "device_uuid", "allocation_size", "pool", "export_data", "descriptor", "users",
                 "base", "user", "_unmap", "handed_to_cuda_core", "_lock")

    def __init__(self, kind: str, lease: ReceivedLease | None, device_uuid: str, allocation_size: int, *, pool: PoolImport | None = None,
                 export_data: bytes = b"", descriptor: LegacyHandleDescriptor | None = None):
        self.kind = kind  # 'pool', 'legacy' or 'owned'
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
        self._unmap: Callable[[], None] | None = None
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
                    pool, export = self.pool, self.export_data
                    assert pool is not None, "a pool origin has its pool"
                    base = pool.import_pointer(export, user)
                    unmap_pointer = pool.unmap
                    self._unmap = lambda: unmap_pointer(export)
                else:
                    desc = self.descriptor
                    assert desc is not None, "a legacy origin has its descriptor"
                    base, self._unmap = open_legacy(desc, user)
                self.user = user
                self.base = base
            return self.base

    def adopt(self, base: int, unmap: Callable[[], None], user: Device) -> None:
        """Takes a mapping a batch made for it (map_buffers); one it no longer wants is undone."""
        with self._lock:
            if self.base is None and self.users > 0:
                self.base, self._unmap, self.user = base, unmap, user
                return
        unmap()

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
                if sync and self.user is not None:  # (mapped: set)
                    # Work queued on the memory (a kernel on a view of it) must finish before the
                    # mapping goes and the sender may reuse the memory.
                    self.user.synchronize()
                unmap()
        finally:
            if self.pool is not None:
                self.pool.release()
            if self.lease is not None:
                self.lease.end()


class DeviceBuffer(Resource):
    """Device memory received over a link (a Node pool buffer or legacy buffer, or over a TCP link
    memory of this process's own that NCCL filled), or a view of it.

    ``ptr``, ``nbytes``, ``device``; ``__cuda_array_interface__`` and DLPack (uint8 bytes);
    ``view(dtype, shape, strides, offset)`` for a typed array; ``read``/``write`` copy to/from host;
    ``close(sync=True)`` releases it (first waiting for the device's queued work, unless
    ``sync=False``), which tells the sender; dropping the last reference does the same.
    """

    #: What the sender said the bytes hold (legacy buffers whose sender described them), else None.
    array: ArrayMeta | None = None

    def __init__(self, origin: _Origin, offset: int, length: int, _token: object = None):
        if _token is not _CREATE:
            raise IpcError("ERR_INVALID_ARG", "DeviceBuffer objects come from links (receive)")
        self._origin = origin
        self._offset = offset
        self._length = length
        self._closed = False

    # -- facts --

    @property
    def kind(self) -> str:
        """'pool' (from an IPC pool), 'legacy' (a legacy IPC handle) or 'owned' (memory of this
        process's own holding bytes received over NCCL on a TCP link)."""
        return self._origin.kind

    # nbytes, len() and offset as HostBuffer has them: one interface over two kinds of memory.
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
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self._length,), "typestr": "|u1", "data": (self.ptr if self._length else 0, False),
                "version": 3, "strides": None, "stream": None}

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: bool | None = None) -> object:
        # The memory has no pending work in this process: nothing to order on the consumer's stream.
        if copy:
            raise BufferError("DeviceBuffer.__dlpack__: copy=True is not supported; it shares memory")
        return make_capsule(self.ptr, (DL_CUDA, self.device.ordinal), "|u1", (self._length,), None, owner=self)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (DL_CUDA, self.device.ordinal)

    def view(self, dtype: object = "uint8", shape: int | Sequence[int] | None = None, strides: Sequence[int] | None = None,
             offset: int = 0) -> DeviceArray:
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
        return DeviceArray(self, meta, offset)

    def to_cuda_core(self) -> Any:
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
        pool = o.pool
        if o.kind != "pool" or pool is None:
            raise IpcError("ERR_NOT_EXPORTABLE", "only pool buffers have cuda.core IPC data; this one is a legacy-handle buffer")
        if o.base is not None or pool._handle is not None:
            raise IpcError("ERR_INVALID_ARG", "cuda_ipc already imported this buffer's pool in this process; importing it again through "
                           "cuda.core would map it twice: use to_cuda_core() (a cuda.core Buffer over cuda_ipc's mapping) instead")
        desc = ipc_buffer_descriptor(o.export_data, o.allocation_size)
        ordinal = self.device.ordinal
        o.handed_to_cuda_core = True
        pool.handed_to_cuda_core = True
        return CudaCoreImport(os.dup(pool.fd), desc, self._offset, self._length, ordinal)

    @property
    def export_data(self) -> bytes:
        """The 64 bytes of pool export data of the allocation (pool buffers only)."""
        if self._origin.kind != "pool":
            raise IpcError("ERR_NOT_EXPORTABLE", "only pool buffers have export data")
        return self._origin.export_data

    def descriptor(self) -> LegacyHandleDescriptor:
        """The legacy-handle descriptor of this range (legacy buffers only)."""
        o = self._origin
        d = o.descriptor
        if o.kind != "legacy" or d is None:
            raise IpcError("ERR_NOT_EXPORTABLE", "a pool buffer has no legacy handle; send it over a link instead")
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

    def write(self, data: Any, offset: int = 0) -> None:
        """Copies host bytes in (synchronous)."""
        src = bytes(memoryview(data).cast("B"))
        if offset < 0 or offset + len(src) > self._length:
            raise IpcError("ERR_OUT_OF_RANGE", f"{len(src)} bytes at {offset} do not fit a {self._length}-byte buffer")
        if src:
            with self.device.activate():
                drv.memcpy_htod(self.ptr + offset, ctypes.cast(ctypes.c_char_p(src), ctypes.c_void_p).value or 0, len(src))

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

    def __repr__(self) -> str:
        return f"<cuda_ipc.DeviceBuffer {self.kind} {self._length} bytes{' closed' if self._closed else ''}>"


def map_buffers(buffers: Sequence[DeviceBuffer]) -> None:
    """Maps the buffers not mapped yet, as one batch (a tensor set's allocations): legacy handles
    through open_legacy_many (those open already found under one lock, the others opened several at
    once), pool buffers one by one (an import takes about a microsecond). Raises the first failure,
    after mapping the rest."""
    legacy: list[tuple[_Origin, Device]] = []
    wanted: list[tuple[LegacyHandleDescriptor, Device]] = []
    users: dict[str, Device] = {}
    for b in buffers:
        o = b._origin
        if o.base is not None or b._closed:
            continue
        if o.kind != "legacy" or o.descriptor is None:
            o.map()
            continue
        user = users.get(o.device_uuid)
        if user is None:
            user = users[o.device_uuid] = importing_device(Device.by_uuid(o.device_uuid))
        legacy.append((o, user))
        wanted.append((o.descriptor, user))
    if not legacy:
        return
    first: BaseException | None = None
    for (o, user), r in zip(legacy, open_legacy_many(wanted)):
        if isinstance(r, BaseException):
            first = first or r
        else:
            o.adopt(r[0], r[1], user)
    if first is not None:
        raise first


class DeviceArray:
    """A typed array over a DeviceBuffer (``buf.view(...)``): ``__cuda_array_interface__`` and DLPack."""

    __slots__ = ("buffer", "meta", "offset", "_cai", "__weakref__")

    def __init__(self, buffer: DeviceBuffer, meta: ArrayMeta, offset: int):
        self.buffer = buffer
        self.meta = meta
        self.offset = offset
        self._cai: dict[str, Any] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.meta.shape

    @property
    def dtype(self) -> str:
        return self.meta.dtype

    @property
    def ptr(self) -> int:
        return self.buffer.ptr + self.offset

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        cai = self._cai
        if cai is None or self.buffer.closed:
            m = self.meta
            cai = self._cai = {"shape": m.shape, "typestr": m.typestr, "data": (self.ptr if m.extent else 0, False), "version": 3,
                               "strides": None if m.c_contiguous else m.strides, "stream": None}
        return dict(cai)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: bool | None = None) -> object:
        if copy:
            raise BufferError("__dlpack__: copy=True is not supported; it shares memory")
        m = self.meta
        return make_capsule(self.ptr, (DL_CUDA, self.buffer.device.ordinal), m.typestr, m.shape,
                            None if m.c_contiguous else m.strides, owner=self)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (DL_CUDA, self.buffer.device.ordinal)

    def __repr__(self) -> str:
        return f"<cuda_ipc.DeviceArray {self.meta.dtype}{list(self.meta.shape)} of {self.buffer!r}>"



_CREATE = object()


def __getattr__(name: str) -> Any:
    # The old names of these (_renamed.py): each use warns, for one release.
    return renamed_attribute(__name__, {"DeviceArray": DeviceArray}, name)
