"""The 'nccl-tensor-set' record (docs/PROTOCOL.md 8.3; src/tensors/nccl-wire.ts): named tensors whose bytes
follow over NCCL as one packed stream (packed_stream.py), after the head of every NCCL record
(link/messages/nccl_records.py). The table is section 4.2's (wire.py) with the stream as its one
allocation. Pure: every field checked on decode (a lie fails the message with ERR_FRAME_INVALID)."""
from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..ipc.descriptor import DTYPES
from ..link.messages.nccl_records import _HEAD_BYTES, CommReference, _head, _malformed, _read_head
from .packed_stream import check_chunk_bytes, check_packed_layout
from ..arrays.buffer_array import c_strides
from .wire import TensorLayout, decode_table, encode_table

NCCL_TENSOR_SET_KIND = "nccl-tensor-set"
_SET_HEADER = struct.Struct("<IHHIIQQ16x")  # magic, version, reserved, count, table length, packed length, chunk bytes
_SET_MAGIC = 0x544E4943  # 'CINT'
_SET_VERSION = 1


class NcclTensorSetRecord(NamedTuple):
    comm: CommReference
    sequence: int
    layout: TensorLayout
    packed_length: int
    chunk_bytes: int


def encode_packed_table(names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], offsets: Sequence[int]) -> bytes:
    """The table of a set to send (C-contiguous tensors, one 'allocation': the stream)."""
    strides = [c_strides(tuple(s), DTYPES[d][0]) for d, s in zip(dtypes, shapes)]
    return encode_table(names, dtypes, shapes, strides, offsets, [0] * len(names), 1)


def encode_nccl_tensor_set(comm: CommReference, sequence: int, table: bytes, count: int, packed_length: int, chunk_bytes: int) -> bytes:
    head = _head(comm, sequence)
    return bytes(head) + _SET_HEADER.pack(_SET_MAGIC, _SET_VERSION, 0, count, len(table), packed_length, chunk_bytes) + table


def decode_packed_table(table: bytes, count: int, packed_length: int) -> TensorLayout:
    layout = decode_table(table, count, [packed_length])
    for i in range(count):
        if not layout.contiguous[i]:
            raise _malformed(NCCL_TENSOR_SET_KIND, f"tensor {layout.names[i]!r} is not C-contiguous")
    check_packed_layout(layout.offsets, layout.nbytes, [DTYPES[d][0] for d in layout.dtypes], packed_length)
    return layout


def decode_nccl_tensor_set(data: memoryview,
                           decode: Callable[[bytes, int, int], TensorLayout] = decode_packed_table) -> NcclTensorSetRecord:
    """Decodes and checks a set; ``decode`` may be a cached decode_packed_table (a repeated sync repeats its table)."""
    kind = NCCL_TENSOR_SET_KIND
    comm, sequence = _read_head(kind, data)
    at = _HEAD_BYTES
    if len(data) < at + _SET_HEADER.size:
        raise _malformed(kind, f"{len(data)} bytes is shorter than its head and header")
    magic, version, reserved, count, table_length, packed_length, chunk_bytes = _SET_HEADER.unpack_from(data, at)
    if magic != _SET_MAGIC:
        raise _malformed(kind, "bad magic")
    if version != _SET_VERSION:
        raise _malformed(kind, f"version {version}, this build reads {_SET_VERSION}")
    if reserved or any(data[at + 32:at + _SET_HEADER.size]):
        raise _malformed(kind, "reserved bytes are not zero")
    if count < 1:
        raise _malformed(kind, "no tensors")
    if packed_length < 1 or packed_length >= 1 << 53:
        raise _malformed(kind, f"a packed length of {packed_length}")
    if len(data) != at + _SET_HEADER.size + table_length:
        raise _malformed(kind, f"its table should be {table_length} bytes, {len(data) - at - _SET_HEADER.size} follow")
    check_chunk_bytes(chunk_bytes, f"a received {kind}")
    layout = decode(bytes(data[at + _SET_HEADER.size:]), count, packed_length)
    return NcclTensorSetRecord(comm, sequence, layout, packed_length, chunk_bytes)
