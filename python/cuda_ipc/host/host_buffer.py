"""HostBuffer: shared host memory (memfd + mmap MAP_SHARED), the Python twin of Node's HostBuffer.

Sending one over a link passes its memfd; the peer maps the same bytes. ``buffer.memory`` is a
memoryview over them, so ``numpy.frombuffer(buffer.memory, numpy.float32)`` and
``torch.frombuffer(buffer.memory, dtype=torch.float32)`` are zero-copy views.

Lifetime: the memory stays mapped while any HostBuffer over it is open, any lease on it is
outstanding (it was sent and the peer has not released it), or any memoryview taken from
``memory`` is alive. A received buffer's lease ends (the sender is told) once all of that is gone.
"""
from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import IpcError
from ..leak import Resource

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class _Mapping:
    """One mmap of one memfd, shared by HostBuffers, their views and the leases on them."""

    def __init__(self, fd: int, length: int, sealed: bool):
        self.fd = fd
        self.length = length
        self.sealed = sealed
        self.mmap = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.base = memoryview(self.mmap)
        self.users = 1
        self.unmapped = False
        self._lock = threading.Lock()
        self._on_unmap: list[Callable[[], None]] = []
        # Fires once the mmap object is gone: after our last handle let go AND every memoryview
        # handed out is released (the kernel unmaps then). A weakref callback, not
        # weakref.finalize, which costs ten times as much per buffer.
        # The weakref lives in _watches until it fires, however long the mapping object lives.
        callbacks = self._on_unmap

        def unmapped(ref: weakref.ref[mmap.mmap], callbacks: list[Callable[[], None]] = callbacks) -> None:
            _watches.discard(ref)
            _run_all(callbacks)
        self._watch = weakref.ref(self.mmap, unmapped)
        _watches.add(self._watch)

    def when_unmapped(self, callback: Callable[[], None]) -> None:
        if self._watch() is not None:
            self._on_unmap.append(callback)
        else:
            callback()

    def retain(self) -> None:
        with self._lock:
            if self.unmapped:
                raise IpcError("ERR_CLOSED", "the HostBuffer is closed")
            self.users += 1

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users > 0 or self.unmapped:
                return
            self.unmapped = True
            base = self.base
            del self.base, self.mmap  # the mmap goes once every view of it is released too
            fd, self.fd = self.fd, -1
        try:
            base.release()
        except (BufferError, AttributeError):
            pass
        if fd >= 0:
            os.close(fd)


_watches: set[weakref.ref[mmap.mmap]] = set()


def _run_all(callbacks: list[Callable[[], None]]) -> None:
    while callbacks:
        cb = callbacks.pop(0)
        try:
            cb()
        except Exception:  # noqa: BLE001 - the others must still run
            pass


class HostBuffer(Resource):
    """Shared host memory: ``HostBuffer.allocate(n)``; ``memory`` (a memoryview), ``read``/``write``/``fill``,
    ``view(offset, length)``, ``close()``; sent over links zero-copy."""

    __slots__ = ("_mapping", "_offset", "_length", "_closed", "__weakref__")

    def __init__(self, mapping: _Mapping, offset: int, length: int, _token: object = None):
        if _token is not _CREATE:
            raise IpcError("ERR_INVALID_ARG", "use HostBuffer.allocate(n), or receive one from a link")
        self._mapping = mapping
        self._offset = offset
        self._length = length
        self._closed = False

    @staticmethod
    def allocate(nbytes: int) -> "HostBuffer":
        """``nbytes`` of zeroed shared memory in a new memfd, sealed against resizing."""
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise IpcError("ERR_INVALID_ARG", f"HostBuffer.allocate: bytes must be a positive int, got {nbytes!r}")
        fd = os.memfd_create("cuda-ipc-host", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, nbytes)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            mapping = _Mapping(fd, nbytes, True)
        except BaseException:
            os.close(fd)
            raise
        return HostBuffer(mapping, 0, nbytes, _CREATE)

    @staticmethod
    def _from_fd(fd: int, file_length: int) -> "HostBuffer":
        """Maps the whole sealed memfd ``fd`` (owned from the call on, closed with the buffer)."""
        try:
            st = os.fstat(fd)
            if st.st_size < file_length:
                raise IpcError("ERR_DESCRIPTOR_INVALID", f"received a host-buffer file of {st.st_size} bytes where {file_length} were announced")
            mapping = _Mapping(fd, file_length, True)
        except BaseException:
            os.close(fd)
            raise
        return HostBuffer(mapping, 0, file_length, _CREATE)

    def _check(self) -> _Mapping:
        if self._closed:
            raise IpcError("ERR_CLOSED", "this HostBuffer is closed")
        return self._mapping

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def nbytes(self) -> int:
        return self._length

    byte_length = nbytes

    def __len__(self) -> int:
        return self._length

    @property
    def offset(self) -> int:
        """Where this buffer starts in its memfd."""
        return self._offset

    @property
    def fd(self) -> int:
        """The memfd (shared by this buffer and its views). Borrowed: do not close it."""
        return self._check().fd

    @property
    def memory(self) -> memoryview:
        """A writable memoryview of the bytes (no copy). While it (or anything made from it, such as a
        NumPy array) is alive, the memory stays mapped."""
        m = self._check()
        return m.base[self._offset:self._offset + self._length]

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """A copy of ``length`` bytes at ``offset``."""
        end = self._length if length is None else offset + length
        if offset < 0 or end > self._length or end < offset:
            raise IpcError("ERR_OUT_OF_RANGE", f"{end - offset} bytes at {offset} do not fit a {self._length}-byte buffer")
        m = self._check()
        return bytes(m.base[self._offset + offset:self._offset + end])

    def write(self, data: Any, offset: int = 0) -> None:
        src = memoryview(data).cast("B")
        if offset < 0 or offset + len(src) > self._length:
            raise IpcError("ERR_OUT_OF_RANGE", f"{len(src)} bytes at {offset} do not fit a {self._length}-byte buffer")
        m = self._check()
        m.base[self._offset + offset:self._offset + offset + len(src)] = src

    def fill(self, byte: int) -> None:
        m = self._check()
        m.base[self._offset:self._offset + self._length] = bytes([byte]) * self._length

    def view(self, offset: int, length: int) -> "HostBuffer":
        """A HostBuffer over ``length`` bytes at ``offset`` of this one, sharing the memory; close it too."""
        if offset < 0 or length <= 0 or offset + length > self._length:
            raise IpcError("ERR_OUT_OF_RANGE", f"a view of {length} bytes at {offset} does not fit a {self._length}-byte buffer")
        m = self._check()
        m.retain()
        return HostBuffer(m, self._offset + offset, length, _CREATE)

    def close(self) -> None:
        """Lets go of this handle. The memory is unmapped once no handle, lease or memoryview uses it.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._mapping.release()

    # DLPack (host memory: kDLCPU), so torch.from_dlpack / numpy.from_dlpack view it without a copy.
    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: bool | None = None) -> object:
        from ..dlpack import DL_CPU, make_capsule
        if copy:
            raise BufferError("HostBuffer.__dlpack__: copy=True is not supported; it shares memory")
        m = self._check()
        import ctypes
        arr = (ctypes.c_char * self._length).from_buffer(m.mmap, self._offset)
        return make_capsule(ctypes.addressof(arr), (DL_CPU, 0), "|u1", (self._length,), None, owner=(arr, self))

    def __dlpack_device__(self) -> tuple[int, int]:
        from ..dlpack import DL_CPU
        return (DL_CPU, 0)

    def __repr__(self) -> str:
        return f"<cuda_ipc.HostBuffer {self._length} bytes{' closed' if self._closed else ''}>"


_CREATE = object()


def host_address(buf: HostBuffer) -> int:
    """Where ``buf``'s bytes start in this process (for copies that take addresses)."""
    c = ctypes.c_char.from_buffer(buf._check().mmap, buf.offset)
    try:
        return ctypes.addressof(c)
    finally:
        del c  # the mmap stays exportable: nothing keeps a view of it
