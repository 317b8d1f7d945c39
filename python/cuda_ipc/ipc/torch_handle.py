"""PyTorch's CUDA IPC handle format, both ways.

``tensor.untyped_storage()._share_cuda_()`` (what torch.multiprocessing sends) returns an 8-tuple::

    (device index, handle, storage size bytes, storage offset bytes, ref counter handle,
     ref counter offset, event handle, event_sync_required)

where ``handle`` is 66 bytes: a version byte (2 up to torch 2.12, 3 from 2.13, same payload), a type
byte ``b'c'`` (a cudaMalloc block; ``b'e'`` = expandable segment, which legacy handles cannot open),
then the 64-byte cudaIpcMemHandle of the caching allocator's *block*; the storage lies ``storage
offset bytes`` into that block. A cuda-ipc descriptor carries the 64-byte handle and that offset.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .descriptor import ArrayMeta, LegacyHandleDescriptor
from ..errors import IpcError

TORCH_HANDLE_BYTES = 66
TORCH_HANDLE_VERSION = 2  # what torch <= 2.12 writes and every version since reads
TYPE_CUDA_MALLOC = ord("c")
TYPE_EXPANDABLE = ord("e")


def split_torch_handle(handle: bytes | bytearray | memoryview) -> bytes:
    """The 64-byte cudaIpcMemHandle inside PyTorch's 66-byte handle (checked)."""
    h = bytes(handle)
    if len(h) == 64:
        return h  # a raw cudaIpcMemHandle, as very old torch sent
    if len(h) != TORCH_HANDLE_BYTES:
        raise IpcError("ERR_DESCRIPTOR_INVALID", f"a PyTorch CUDA handle is {TORCH_HANDLE_BYTES} bytes (version, type, 64-byte handle), got {len(h)}")
    if h[1] == TYPE_EXPANDABLE:
        raise IpcError("ERR_NOT_EXPORTABLE", "this PyTorch handle is of an expandable segment (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which CUDA legacy IPC handles cannot open; allocate the tensor with expandable_segments:False")
    if h[1] != TYPE_CUDA_MALLOC or h[0] not in (2, 3):
        raise IpcError("ERR_DESCRIPTOR_INVALID", f"unknown PyTorch handle (version {h[0]}, type {h[1]!r}); expected version 2 or 3 and type 'c'")
    return h[2:]


def descriptor_from_torch(share: Sequence[Any], device_uuid: str, *, pid: int | None = None, byte_offset: int = 0,
                          byte_length: int | None = None, array: ArrayMeta | None = None) -> LegacyHandleDescriptor:
    """A cuda-ipc descriptor from ``storage._share_cuda_()``'s tuple (or from (handle, storage size
    bytes, storage offset bytes)), for Node's ``openIpcHandle`` / ``openIpcArray``.

    ``byte_offset`` is where the data starts inside the storage (a tensor's ``storage_offset() *
    element_size()``); ``byte_length`` defaults to the rest of the storage. Note that the storage
    stays in PyTorch's IPC limbo (its ref counter) until a torch consumer releases it: a Node
    consumer does not, so decrement it yourself once Node is done
    (``torch.UntypedStorage._release_ipc_counter(share[4], share[5], device=share[0])``), and keep
    the tensor alive until then.
    """
    if len(share) == 8:
        _, handle, size, offset = share[:4]
    elif len(share) == 3:
        handle, size, offset = share
    else:
        raise IpcError("ERR_INVALID_ARG", "pass the 8-tuple of _share_cuda_() or (handle, storage size bytes, storage offset bytes)")
    raw = split_torch_handle(handle)
    if byte_offset < 0 or byte_offset > size:
        raise IpcError("ERR_OUT_OF_RANGE", f"byte_offset {byte_offset} lies outside the {size}-byte storage")
    length = size - byte_offset if byte_length is None else byte_length
    if byte_offset + length > size:
        raise IpcError("ERR_OUT_OF_RANGE", f"{length} bytes at {byte_offset} run past the {size}-byte storage")
    return LegacyHandleDescriptor(raw, int(offset) + byte_offset, length, device_uuid, pid or os.getpid(), array)


def torch_handle(desc: LegacyHandleDescriptor, version: int = TORCH_HANDLE_VERSION) -> bytes:
    """PyTorch's 66-byte handle for a descriptor's allocation."""
    return bytes([version, TYPE_CUDA_MALLOC]) + bytes(desc.handle)


def torch_storage_args(desc: LegacyHandleDescriptor, device_index: int) -> tuple[Any, ...]:
    """Arguments for ``torch.UntypedStorage._new_shared_cuda(*args)``, which opens the memory the way
    torch.multiprocessing does and returns a storage of exactly the described bytes. There is no
    torch ref counter or event behind it: the exporter must keep the memory alive, and have finished
    writing it, while the storage is used (cuda_ipc's own links do both for you)."""
    return (device_index, torch_handle(desc), desc.byte_length, desc.offset, b"", 0, bytes(64), False)
