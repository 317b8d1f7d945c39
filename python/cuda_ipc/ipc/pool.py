"""IPC memory pools a peer sent (src/ipc/pool.ts): the pool's fd is the capability; a pool is imported
into the driver on first use, and each of its buffers is mapped once per process from its 64 bytes
of export data.
"""
from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable

from ..cuda import driver as drv
from ..cuda.device import Device
from ..errors import CudaError, IpcError
from ..leak import Resource
from . import cache


class _PointerImport:
    """One buffer of a pool mapped in this process: its base, its users, the device it was mapped for."""

    __slots__ = ("base", "users", "device")

    def __init__(self, base: int, device: Device):
        self.base = base
        self.users = 1
        self.device = device


class PoolImport:
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
        self._imports: dict[bytes, _PointerImport] = {}  # by export data
        self._local: set[bytes] = set()  # imports that are allocations of this process
        self._lock = threading.RLock()
        # users alone, so that a set decoded on one thread (TensorMap retains its pools) does not wait
        # for the imports another thread makes under _lock (a first sync maps while it plans).
        self._users_lock = threading.Lock()
        self.after_destroy: list[Callable[[], None]] = []
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
            home = self._home
            assert home is not None, "handle() imported the pool"
            with home.activate():
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
                if entry.device is not user:
                    self.grant(user)
                entry.users += 1
                return entry.base
            local = cache._local_pool_exports.get(export_data)
            if local is not None and _still_exported(local, export_data, self.device):
                user.enable_peer_access(self.device)  # our own allocation, sent back to us
                self._imports[export_data] = _PointerImport(local, user)
                self.retain()
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
            self._imports[export_data] = _PointerImport(base, user)
            self.retain()
            return base

    def is_imported(self, export_data: bytes) -> bool:
        """Whether the buffer of ``export_data`` is mapped in this process."""
        return export_data in self._imports

    def import_pointers(self, exports: list[bytes], user: Device) -> list[int | BaseException]:
        """import_pointer of each, under one hold of the lock (a tensor set's buffers of this pool):
        its base, or its error (the others are imported all the same)."""
        out: list[int | BaseException] = []
        with self._lock:
            for export in exports:
                try:
                    out.append(self.import_pointer(export, user))
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    out.append(e)
        return out

    def unmap_many(self, exports: list[bytes]) -> None:
        """unmap of each, under one hold of the lock; all of them, then the first failure raised."""
        first: BaseException | None = None
        with self._lock:
            for export in exports:
                try:
                    self.unmap(export)
                except BaseException as e:  # noqa: BLE001 - the others must still go
                    first = first or e
        if first is not None:
            raise first

    def unmap(self, export_data: bytes) -> None:
        with self._lock:
            entry = self._imports[export_data]
            entry.users -= 1
            if entry.users > 0:
                return
            del self._imports[export_data]
            if export_data in self._local:
                self._local.discard(export_data)
            else:
                with entry.device.activate():
                    drv.driver().call("cuMemFree", entry.base)
        self.release()

    def retain(self) -> None:
        with self._users_lock:
            self.users += 1

    def release(self) -> None:
        with self._users_lock:
            self.users -= 1
            if self.users > 0:
                return
        with self._lock:
            if self.fd < 0:
                return
            h, self._handle = self._handle, None
            fd, self.fd = self.fd, -1
            home, self._home = self._home, None
        try:
            if h is not None and home is not None:  # (imported: both set)
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



class ImportedPool(Resource):
    """A pool a peer sent by itself (an ``IpcPool`` in a message). Its buffers arrive as DeviceBuffers;
    ``close()`` lets go of it (destroyed after its last buffer)."""

    def __init__(self, ref: PoolImport):
        self._ref = ref
        self._closed = False
        ref.retain()

    @property
    def id(self) -> str:
        return self._ref.id.hex()

    @property
    def device_uuid(self) -> str:
        return self._ref.device_uuid

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._ref.release()
