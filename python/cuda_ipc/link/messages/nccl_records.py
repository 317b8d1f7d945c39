"""The NCCL records of a TCP link (docs/PROTOCOL.md 8), as src/link/messages/nccl-records.ts: the head every
NCCL record starts with (a communicator reference and the transfer's sequence number) and ``nccl-buffer``
(one device buffer or array). The ``nccl-tensor-set`` record builds on the head in tensors/nccl_wire.py
(src/tensors/nccl-wire.ts). Pure: every field checked on decode (a lie fails the message with
ERR_FRAME_INVALID)."""
from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from ...ipc.descriptor import DTYPES, numel
from ...errors import IpcError

NCCL_BUFFER_KIND = "nccl-buffer"
COMM_ID_BYTES = 16
UNIQUE_ID_BYTES = 128
_COMM_REF_BYTES = 160
_HEAD_BYTES = _COMM_REF_BYTES + 8
_FLAG_UNIQUE_ID = 1
_FLAG_BROADCAST = 2
_BUFFER_FIXED = _HEAD_BYTES + 8 + 16 + 8
_MAX_NDIM = 32
_BY_CODE = {code: name for name, (_, _, code) in DTYPES.items()}


class CommReference(NamedTuple):
    """Which communicator a transfer uses and the receiver's rank in it (the sender is rank 0)."""

    id: bytes
    nranks: int
    rank: int
    broadcast: bool
    unique_id: bytes | None


class NcclBufferRecord(NamedTuple):
    comm: CommReference
    sequence: int
    nbytes: int
    device_uuid: bytes
    #: (dtype, shape) when an array was sent (C-contiguous), else None
    array: tuple[str, tuple[int, ...]] | None



def _malformed(kind: str, why: str) -> IpcError:
    return IpcError("ERR_FRAME_INVALID", f"a received {kind} is malformed: {why}")


def _head(comm: CommReference, sequence: int) -> bytearray:
    out = bytearray(_HEAD_BYTES)
    out[0:16] = comm.id
    flags = (_FLAG_UNIQUE_ID if comm.unique_id is not None else 0) | (_FLAG_BROADCAST if comm.broadcast else 0)
    struct.pack_into("<III", out, 16, comm.nranks, comm.rank, flags)
    if comm.unique_id is not None:
        out[32:_COMM_REF_BYTES] = comm.unique_id
    struct.pack_into("<Q", out, _COMM_REF_BYTES, sequence)
    return out


def _read_head(kind: str, data: memoryview) -> tuple[CommReference, int]:
    if len(data) < _HEAD_BYTES:
        raise _malformed(kind, f"{len(data)} bytes is shorter than its {_HEAD_BYTES}-byte head")
    nranks, rank, flags, reserved = struct.unpack_from("<IIII", data, 16)
    if nranks < 2 or rank < 1 or rank >= nranks:
        raise _malformed(kind, f"rank {rank} of {nranks} (a receiver is rank 1..nranks-1 of at least 2)")
    if flags & ~(_FLAG_UNIQUE_ID | _FLAG_BROADCAST):
        raise _malformed(kind, f"unknown communicator flags 0x{flags:x}")
    if reserved:
        raise _malformed(kind, "reserved bytes are not zero")
    has_id = bool(flags & _FLAG_UNIQUE_ID)
    if not has_id and any(data[32:_COMM_REF_BYTES]):
        raise _malformed(kind, "the unique id field is not zero without its flag")
    (sequence,) = struct.unpack_from("<Q", data, _COMM_REF_BYTES)
    if sequence >= 1 << 53:
        raise _malformed(kind, "its sequence number is past 2^53")
    comm = CommReference(bytes(data[0:16]), nranks, rank, bool(flags & _FLAG_BROADCAST),
                         bytes(data[32:_COMM_REF_BYTES]) if has_id else None)
    return comm, sequence


def encode_nccl_buffer(comm: CommReference, sequence: int, nbytes: int, device_uuid: bytes,
                       array: tuple[str, Sequence[int]] | None = None) -> bytes:
    shape = tuple(array[1]) if array is not None else ()
    out = _head(comm, sequence) + bytearray(_BUFFER_FIXED - _HEAD_BYTES + 8 * len(shape))
    struct.pack_into("<Q", out, _HEAD_BYTES, nbytes)
    out[_HEAD_BYTES + 8:_HEAD_BYTES + 24] = device_uuid
    if array is not None:
        out[_HEAD_BYTES + 24] = DTYPES[array[0]][2]
        out[_HEAD_BYTES + 25] = len(shape)
        struct.pack_into(f"<{len(shape)}Q", out, _BUFFER_FIXED, *shape)
    return bytes(out)


def decode_nccl_buffer(data: memoryview) -> NcclBufferRecord:
    kind = NCCL_BUFFER_KIND
    comm, sequence = _read_head(kind, data)
    if len(data) < _BUFFER_FIXED:
        raise _malformed(kind, f"{len(data)} bytes is shorter than its {_BUFFER_FIXED} fixed bytes")
    (nbytes,) = struct.unpack_from("<Q", data, _HEAD_BYTES)
    if nbytes < 1 or nbytes >= 1 << 53:
        raise _malformed(kind, f"a length of {nbytes} bytes")
    code = data[_HEAD_BYTES + 24]
    ndim = data[_HEAD_BYTES + 25]
    if any(data[_HEAD_BYTES + 26:_BUFFER_FIXED]):
        raise _malformed(kind, "reserved bytes are not zero")
    if len(data) != _BUFFER_FIXED + 8 * ndim:
        raise _malformed(kind, f"{len(data)} bytes for {ndim} dimensions")
    array: tuple[str, tuple[int, ...]] | None = None
    if code == 0:
        if ndim:
            raise _malformed(kind, "dimensions without a dtype")
    else:
        dtype = _BY_CODE.get(code)
        if dtype is None:
            raise _malformed(kind, f"unknown dtype code {code}")
        if ndim > _MAX_NDIM:
            raise _malformed(kind, f"{ndim} dimensions (at most {_MAX_NDIM})")
        shape = struct.unpack_from(f"<{ndim}Q", data, _BUFFER_FIXED)
        size = numel(shape) * DTYPES[dtype][0]
        if size != nbytes:
            raise _malformed(kind, f"shape {list(shape)} of {dtype} is {size} bytes, not the {nbytes} announced")
        array = (dtype, tuple(shape))
    return NcclBufferRecord(comm, sequence, nbytes, bytes(data[_HEAD_BYTES + 8:_HEAD_BYTES + 24]), array)
