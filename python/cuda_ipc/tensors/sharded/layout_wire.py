"""A rank's layout on the wire ('CISL', version 1; docs/PROTOCOL.md section 9), the same bytes as
src/tensors/sharded/layout-wire.ts: little-endian, reserved and padding bytes zero, one encoding
per layout (decoding is canonical), bounded before anything is allocated."""
from __future__ import annotations

import hashlib
import struct
from typing import Sequence

from .errors import Box, LayoutError
from .layout import (
    DTYPE_BY_CODE, DTYPE_CODES, MAX_NAME_BYTES, MAX_NDIM, MAX_NODE_BYTES, GlobalTensor, LocalTensor, Piece, RankLayout,
    contiguous_strides, itemsize, validate_layout,
)

LAYOUT_MAGIC = b"CISL"
LAYOUT_VERSION = 1
#: The largest layout record either side writes or reads.
MAX_LAYOUT_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct("<4sHHIIIIII")  # 32 bytes
_FLAG_STRIDES = 1


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def _bad(why: str) -> LayoutError:
    return LayoutError("ERR_LAYOUT_INVALID", f"layout record: {why}")


def _contiguous(local: LocalTensor) -> bool:
    return contiguous_strides(local.shape, itemsize(local.dtype)) == tuple(local.strides)


def _text(b: bytes) -> bytes:
    return b + bytes(_pad8(len(b)) - len(b))


def _u64s(values: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def encode_layout(layout: RankLayout) -> bytes:
    """The layout's record (checks it first: validate_layout)."""
    validate_layout(layout)
    index = {t.name: i for i, t in enumerate(layout.tensors)}
    parts = []
    node = layout.node.encode("utf-8")
    for t in layout.tensors:
        name = t.name.encode("utf-8")
        parts.append(struct.pack("<BBHI", DTYPE_CODES[t.dtype][1], len(t.shape), len(name), 0) + _u64s(t.shape) + _text(name))
    for local in (*layout.sources, *layout.destinations):
        name = local.name.encode("utf-8")
        strided = not _contiguous(local)
        body = [struct.pack("<BBBBHHII", DTYPE_CODES[local.dtype][1], len(local.shape), _FLAG_STRIDES if strided else 0, 0,
                            len(name), 0, len(local.pieces), len(local.padding)), _u64s(local.shape)]
        if strided:
            body.append(_u64s(local.strides))
        body.append(_text(name))
        for p in local.pieces:
            body.append(struct.pack("<II", index[p.tensor], 0) + _u64s(p.start) + _u64s(p.length) + _u64s(p.at))
        for b in local.padding:
            body.append(_u64s(b.start) + _u64s(b.length))
        parts.append(b"".join(body))
    size = _HEADER.size + _pad8(len(node)) + sum(len(p) for p in parts)
    if size > MAX_LAYOUT_BYTES:
        raise _bad(f"rank {layout.rank}'s layout takes {size} bytes, more than {MAX_LAYOUT_BYTES}")
    head = _HEADER.pack(LAYOUT_MAGIC, LAYOUT_VERSION, len(node), size, layout.rank, layout.gpu,
                        len(layout.tensors), len(layout.sources), len(layout.destinations))
    return head + _text(node) + b"".join(parts)


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def need(self, n: int, what: str) -> None:
        if self.pos + n > len(self.data):
            raise _bad(f"{what} runs past the record's {len(self.data)} bytes")

    def unpack(self, fmt: str, what: str) -> tuple[int, ...]:
        s = struct.calcsize(fmt)
        self.need(s, what)
        v = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += s
        return v

    def u64s(self, n: int, what: str) -> tuple[int, ...]:
        v = self.unpack(f"<{n}Q", what)
        if any(x > 2**53 - 1 for x in v):
            raise _bad(f"{what} has a value above 2^53-1")
        return v

    def zero(self, n: int, what: str) -> None:
        if any(self.data[self.pos:self.pos + n]):
            raise _bad(f"{what} must be zero")
        self.pos += n

    def text(self, n: int, what: str) -> str:
        self.need(_pad8(n), what)
        try:
            s = self.data[self.pos:self.pos + n].decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(f"{what} is not valid UTF-8") from None
        self.pos += n
        self.zero(_pad8(n) - n, f"the padding after {what}")
        return s


def _dtype(code: int, what: str) -> str:
    if code not in DTYPE_BY_CODE:
        raise _bad(f"{what} has unknown dtype code {code}")
    return DTYPE_BY_CODE[code]


def decode_layout(data: bytes) -> RankLayout:
    """A layout from its record: every field checked (ERR_LAYOUT_INVALID), then the layout itself
    (validate_layout: its own codes)."""
    data = bytes(data)
    if len(data) < _HEADER.size:
        raise _bad(f"{len(data)} bytes are shorter than the {_HEADER.size}-byte header")
    if len(data) > MAX_LAYOUT_BYTES:
        raise _bad(f"{len(data)} bytes are more than {MAX_LAYOUT_BYTES}")
    magic, version, node_length, total, rank, gpu, g, s, d = _HEADER.unpack_from(data)
    if magic != LAYOUT_MAGIC:
        raise _bad("the magic is not 'CISL'")
    if version != LAYOUT_VERSION:
        raise _bad(f"version {version}; this side reads version {LAYOUT_VERSION}")
    if total != len(data):
        raise _bad(f"the header says {total} bytes, the record has {len(data)}")
    if not 1 <= node_length <= MAX_NODE_BYTES:
        raise _bad(f"the node id has {node_length} bytes; 1..{MAX_NODE_BYTES}")
    if (g + s + d) * 16 > len(data):
        raise _bad(f"{g} tensors and {s + d} local tensors cannot fit in {len(data)} bytes")
    r = _Reader(data)
    r.pos = _HEADER.size
    node = r.text(node_length, "the node id")
    tensors = []
    for i in range(g):
        code, ndim, name_length = r.unpack("<BBH", f"global tensor {i}")
        r.need(4, f"global tensor {i}")
        r.zero(4, f"global tensor {i}'s reserved bytes")
        dtype = _dtype(code, f"global tensor {i}")
        if ndim > MAX_NDIM:
            raise _bad(f"global tensor {i} has {ndim} dimensions; at most {MAX_NDIM}")
        if not 1 <= name_length <= MAX_NAME_BYTES:
            raise _bad(f"global tensor {i}'s name has {name_length} bytes; 1..{MAX_NAME_BYTES}")
        shape = r.u64s(ndim, f"global tensor {i}'s shape")
        tensors.append(GlobalTensor(r.text(name_length, f"global tensor {i}'s name"), dtype, shape))
    locals_ = []
    for i in range(s + d):
        what = f"local tensor {i}"
        r.need(16, what)
        code, ndim, flags = r.unpack("<BBB", what)
        r.zero(1, f"{what}'s reserved byte")
        (name_length,) = r.unpack("<H", what)
        r.zero(2, f"{what}'s reserved bytes")
        piece_count, padding_count = r.unpack("<II", what)
        dtype = _dtype(code, what)
        if ndim > MAX_NDIM:
            raise _bad(f"{what} has {ndim} dimensions; at most {MAX_NDIM}")
        if flags > _FLAG_STRIDES:
            raise _bad(f"{what} has unknown flags {flags}")
        if not 1 <= name_length <= MAX_NAME_BYTES:
            raise _bad(f"{what}'s name has {name_length} bytes; 1..{MAX_NAME_BYTES}")
        if piece_count * (8 + 24 * ndim) + padding_count * 16 * ndim > len(data) - r.pos:
            raise _bad(f"{what}'s {piece_count} pieces and {padding_count} padding boxes run past the record")
        shape = r.u64s(ndim, f"{what}'s shape")
        strides = r.u64s(ndim, f"{what}'s strides") if flags & _FLAG_STRIDES else contiguous_strides(shape, itemsize(dtype))
        name = r.text(name_length, f"{what}'s name")
        pieces = []
        for k in range(piece_count):
            r.need(8, f"{what}'s piece {k}")
            (t,) = r.unpack("<I", f"{what}'s piece {k}")
            r.zero(4, f"{what}'s piece {k}'s reserved bytes")
            if t >= g:
                raise _bad(f"{what}'s piece {k} names tensor {t} of {g}")
            pieces.append(Piece(tensors[t].name, r.u64s(ndim, f"{what}'s piece {k}"), r.u64s(ndim, f"{what}'s piece {k}"), r.u64s(ndim, f"{what}'s piece {k}")))
        padding = tuple(Box(r.u64s(ndim, f"{what}'s padding {k}"), r.u64s(ndim, f"{what}'s padding {k}")) for k in range(padding_count))
        local = LocalTensor(name, dtype, shape, strides, tuple(pieces), padding)
        if flags & _FLAG_STRIDES and _contiguous(local):
            raise _bad(f"{what} flags explicit strides that are the C-contiguous ones; leave the flag clear")
        locals_.append(local)
    if r.pos != len(data):
        raise _bad(f"{len(data) - r.pos} bytes follow the last local tensor")
    layout = RankLayout(rank, node, gpu, tuple(tensors), tuple(locals_[:s]), tuple(locals_[s:]))
    validate_layout(layout)
    return layout


def layout_fingerprint(layouts: Sequence[RankLayout]) -> str:
    """SHA-256 (hex) of 'CISP', u32 version 1, u32 layout count, then per layout in rank order its
    record's u32 length and bytes: equal fingerprints, equal plans."""
    h = hashlib.sha256(b"CISP" + struct.pack("<II", 1, len(layouts)))
    for layout in sorted(layouts, key=lambda x: x.rank):
        b = encode_layout(layout)
        h.update(struct.pack("<I", len(b)))
        h.update(b)
    return h.hexdigest()
