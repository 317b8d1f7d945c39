"""The bytes of a 'tensor-set' record (docs/PROTOCOL.md section 4.2), as src/tensors/wire.ts writes and
reads them: a 32-byte header, one entry per allocation (the record data of its own kind: a legacy
handle descriptor, a pool buffer, a host buffer, each naming the whole allocation), then a column
table of the tensors (offsets, allocations, front-coded names, dtypes, ranks, flags, shapes, strides
where not C-contiguous, name bytes). Little-endian, zero padding; every count, offset and length is
checked before use, and a table that lies is ERR_FRAME_INVALID for its message. Pure: no links, no
CUDA.
"""
from __future__ import annotations

import array
import struct
import sys
from collections.abc import Sequence

from ..arrays.buffer_array import c_strides, is_c_order, is_dense, torch_contiguous  # noqa: F401  (torch_contiguous, is_dense: re-exported)
from ..ipc.descriptor import DTYPES, MAX_NDIM, SAFE, _BY_CODE
from ..errors import IpcError

TENSOR_SET_KIND = "tensor-set"
VERSION = 1
MAGIC = 0x53544943  # 'CITS'
KIND_LEGACY, KIND_POOL, KIND_HOST = 1, 2, 3
#: entry kind -> (record kind, data bytes)
KINDS = {KIND_LEGACY: ("legacy-buffer", 128), KIND_POOL: ("pool-buffer", 136), KIND_HOST: ("host-buffer", 24)}
_HEADER = struct.Struct("<IHHIIIIQ")
_ENTRY = struct.Struct("<BBHI")
_U64 = struct.Struct("<Q").unpack_from
_ROW = 19
FLAG_STRIDES = 1
MAX_NAME_BYTES = 0xFFFF

if sys.byteorder != "little":  # pragma: no cover - the columns are read with native array types
    raise ImportError("cuda_ipc tensor sets need a little-endian machine")


def _malformed(why: str) -> IpcError:
    return IpcError("ERR_FRAME_INVALID", f"a received tensor set is malformed: {why}")


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def encode_table(names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], strides: Sequence[Sequence[int]],
                 offsets: Sequence[int], allocs: Sequence[int], allocation_count: int) -> bytes:
    """The tensor table (what a repeated send of the same tensors repeats byte for byte). Raises
    ERR_INVALID_ARG naming the first tensor it cannot carry."""
    count = len(names)
    name_bytes = []
    shared = array.array("H", bytes(2 * count))
    suffix = array.array("H", bytes(2 * count))
    flags = bytearray(count)
    codes = bytearray(count)
    ndims = bytearray(count)
    shape_col = array.array("Q")
    stride_col = array.array("Q")
    prev = b""
    # What a (dtype, shape, strides) allows and how it is written, checked once per distinct one: a
    # model repeats a few shapes across thousands of tensors.
    checked: dict[tuple[str, tuple[int, ...], tuple[int, ...]], tuple[int, int, bool]] = {}
    for i in range(count):
        name = names[i]
        b = name.encode("utf-8")
        if not b or len(b) > MAX_NAME_BYTES:
            raise IpcError("ERR_INVALID_ARG", f"tensor {name!r}: names are 1..{MAX_NAME_BYTES} UTF-8 bytes")
        name_bytes.append(b)
        # The longest common prefix: the first differing byte is where the XOR of the two prefixes,
        # read as big-endian integers, has its highest bit (C-level work; a byte loop cost ~2 us a name).
        m = min(len(prev), len(b))
        k = m - ((int.from_bytes(prev[:m], "big") ^ int.from_bytes(b[:m], "big")).bit_length() + 7) // 8
        shared[i] = k
        suffix[i] = len(b) - k
        prev = b
        given_shape, given_strides = shapes[i], strides[i]
        shape = given_shape if isinstance(given_shape, tuple) else tuple(given_shape)
        st = given_strides if isinstance(given_strides, tuple) else tuple(given_strides)
        key = (dtypes[i], shape, st)
        known = checked.get(key)
        if known is None:
            known = checked[key] = _check_tensor(name, *key)
        code, itemsize, strided = known
        codes[i] = code
        off = offsets[i]
        if off < 0 or off % itemsize:
            raise IpcError("ERR_INVALID_ARG", f"tensor {name!r} starts at offset {off}, not a multiple of its {itemsize}-byte elements")
        if not 0 <= allocs[i] < allocation_count:
            raise IpcError("ERR_INVALID_ARG", f"tensor {name!r} names allocation {allocs[i]} of {allocation_count}")
        ndims[i] = len(shape)
        shape_col.extend(shape)
        if strided:
            flags[i] = FLAG_STRIDES
            stride_col.extend(st)
    if len(set(names)) != count:
        raise IpcError("ERR_INVALID_ARG", "tensor names must be unique")
    head = (array.array("Q", offsets).tobytes() + array.array("I", allocs).tobytes() + shared.tobytes() + suffix.tobytes()
            + bytes(codes) + bytes(ndims) + bytes(flags))
    out = bytearray(head)
    out += bytes(_pad8(len(out)) - len(out))
    out += shape_col.tobytes()
    out += stride_col.tobytes()
    tail = b"".join(b[shared[i]:] for i, b in enumerate(name_bytes))
    out += tail
    out += bytes(_pad8(len(tail)) - len(tail))
    return bytes(out)


def _check_tensor(name: str, dtype: str, shape: tuple[int, ...], st: tuple[int, ...]) -> tuple[int, int, bool]:
    """(dtype code, item size, whether its strides travel) of a tensor a table can carry; raises
    ERR_INVALID_ARG naming ``name`` otherwise."""
    info = DTYPES.get(dtype)
    if info is None:
        raise IpcError("ERR_INVALID_ARG", f"tensor {name!r} has dtype {dtype!r}, which a tensor set cannot carry")
    itemsize, _t, code = info
    if len(shape) > MAX_NDIM or len(st) != len(shape):
        raise IpcError("ERR_INVALID_ARG", f"tensor {name!r} has a bad shape {shape} / strides {st}")
    if 0 in shape:
        raise IpcError("ERR_INVALID_ARG", f"tensor {name!r} has no elements (shape {shape}); send its shape as plain data instead")
    return code, itemsize, st != c_strides(shape, itemsize)


def encode_set(entries: Sequence[tuple[int, int, bytes]], table: bytes, count: int) -> bytes:
    """The record data: header, ``entries`` ((kind, fd count, data) per allocation), the table."""
    out = bytearray(_HEADER.pack(MAGIC, VERSION, 0, len(entries), count, len(table), 0, 0))
    for kind, fd_count, data in entries:
        if len(data) != KINDS[kind][1]:
            raise IpcError("ERR_INVALID_ARG", f"an allocation entry of kind {kind} has {len(data)} bytes of data")
        out += _ENTRY.pack(kind, fd_count, 0, len(data))
        out += data
    out += table
    return bytes(out)


def _allocation_size(kind: int, body: memoryview, i: int) -> int:
    size: int
    if kind == KIND_LEGACY:
        offset, length = struct.unpack_from("<QQ", body, 96)
        size = length
        if body[120] != 0:
            raise _malformed(f"allocation {i} carries array metadata; the table describes the tensors")
    elif kind == KIND_POOL:
        size, offset, length = struct.unpack_from("<QQQ", body, 112)
    else:
        size, offset, length = struct.unpack_from("<QQQ", body, 0)
    if size == 0 or size > SAFE or offset != 0 or length != size:
        raise _malformed(f"allocation {i} does not describe one whole allocation (size {size}, range {offset}+{length})")
    return size


#: A received allocation entry: kind, fd count, its data (a view into the record), size.
Entry = tuple[int, int, memoryview, int]


def parse_set(data: memoryview, fd_count: int) -> tuple[list[Entry], bytes, int]:
    """(allocations, table, tensor count) of a received record; each allocation is (kind, fd count,
    its data (a view into ``data``), size); the table is a bytes copy."""
    n = len(data)
    if n < _HEADER.size:
        raise _malformed(f"{n} bytes are too few for its header")
    magic, version, r0, allocation_count, count, table_length, r1, r2 = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise _malformed("bad magic")
    if version != VERSION:
        raise _malformed(f"version {version} (this process reads version {VERSION}); update both sides to the same cuda-ipc")
    if r0 or r1 or r2:
        raise _malformed("reserved header bytes are not zero")
    if (allocation_count == 0) != (count == 0):
        raise _malformed(f"{allocation_count} allocations for {count} tensors")
    allocations = []
    at = _HEADER.size
    fds = 0
    for i in range(allocation_count):
        if at + _ENTRY.size > n:
            raise _malformed(f"allocation {i} runs past the end")
        kind, entry_fds, reserved, length = _ENTRY.unpack_from(data, at)
        spec = KINDS.get(kind)
        if spec is None:
            raise _malformed(f"allocation {i} has unknown kind {kind}")
        if reserved:
            raise _malformed(f"allocation {i} has non-zero reserved bytes")
        if length != spec[1]:
            raise _malformed(f"allocation {i} ({spec[0]}) has {length} bytes of data, not {spec[1]}")
        if at + _ENTRY.size + length > n:
            raise _malformed(f"allocation {i} runs past the end")
        body = data[at + _ENTRY.size:at + _ENTRY.size + length]
        expected = 1 if kind == KIND_HOST else (body[40] & 1) if kind == KIND_POOL else 0
        if entry_fds != expected:
            raise _malformed(f"allocation {i} ({spec[0]}) claims {entry_fds} fds where it must carry {expected}")
        allocations.append((kind, entry_fds, body, _allocation_size(kind, body, i)))
        fds += entry_fds
        at += _ENTRY.size + length
    if fds != fd_count:
        raise _malformed(f"its allocations claim {fds} fds but the record has {fd_count}")
    if at + table_length != n:
        raise _malformed(f"the table of {table_length} bytes does not end the record ({n - at} bytes left)")
    return allocations, bytes(data[at:]), count


def _check_entry(name: str, code: int, shape: tuple[int, ...], given: tuple[int, ...] | None) -> tuple[str, int, tuple[int, ...], int, bool, int]:
    """(dtype, item size, byte strides, extent, C-contiguous, bytes) of a received table entry
    (``given``: its explicit strides, None when C-contiguous); ERR_FRAME_INVALID naming ``name`` when
    the entry cannot be."""
    dtype = _BY_CODE.get(code)
    if dtype is None:
        raise _malformed(f"tensor {name!r} has unknown dtype code {code}")
    itemsize = DTYPES[dtype][0]
    elements = 1
    for d, dim in enumerate(shape):
        if dim == 0 or dim > SAFE:
            raise _malformed(f"tensor {name!r} has dimension {d} of {dim if dim == 0 else 'more than 2^53-1'} elements (tensors with no elements do not travel in sets)")
        elements *= dim
    if elements * itemsize > SAFE:
        raise _malformed(f"tensor {name!r} holds more than 2^53-1 bytes")
    c = c_strides(shape, itemsize)
    if given is None:
        return dtype, itemsize, c, elements * itemsize, True, elements * itemsize
    for d, s in enumerate(given):
        if s > SAFE or s % itemsize:
            raise _malformed(f"tensor {name!r} has stride {s} in dimension {d}, not a non-negative multiple of {itemsize}")
    if given == c:
        raise _malformed(f"tensor {name!r} carries explicit strides equal to the C-contiguous ones (they must be left out)")
    extent = sum((dim - 1) * s for dim, s in zip(shape, given)) + itemsize
    return dtype, itemsize, given, extent, extent == elements * itemsize and is_c_order(shape, given, itemsize), elements * itemsize


class TensorLayout:
    """A decoded tensor table: one entry per tensor, in the sender's order. ``strides`` are in bytes
    (filled in for C-contiguous tensors); ``ends[a]`` is where the tensors of allocation ``a`` end."""

    __slots__ = ("count", "names", "index", "dtypes", "shapes", "strides", "contiguous", "offsets", "extents", "nbytes",
                 "allocations", "allocation_count", "table", "ends", "__weakref__")
    count: int
    names: list[str]
    index: dict[str, int]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    strides: list[tuple[int, ...]]
    contiguous: list[bool]
    offsets: list[int]
    extents: list[int]
    nbytes: list[int]
    allocations: list[int]
    allocation_count: int
    table: bytes
    ends: list[int]


def decode_table(table: bytes, count: int, sizes: Sequence[int]) -> TensorLayout:
    """Decodes and checks a tensor table against its allocations' sizes (see the module notes)."""
    allocation_count = len(sizes)
    n = len(table)
    head_end = _pad8(_ROW * count)
    if head_end > n:
        raise _malformed(f"a table of {n} bytes cannot hold {count} tensors")
    mv = memoryview(table)
    if any(table[_ROW * count:head_end]):
        raise _malformed("padding bytes are not zero")
    offsets = mv[0:8 * count].cast("Q").tolist()
    allocs = mv[8 * count:12 * count].cast("I").tolist()
    shared = mv[12 * count:14 * count].cast("H").tolist()
    suffix = mv[14 * count:16 * count].cast("H").tolist()
    codes = table[16 * count:17 * count]
    ndims = table[17 * count:18 * count]
    flags = table[18 * count:19 * count]
    dims = sum(ndims)
    strided = 0
    for i in range(count):
        f = flags[i]
        if f & ~FLAG_STRIDES:
            raise _malformed(f"tensor #{i} has unknown flags {f}")
        if ndims[i] > MAX_NDIM:
            raise _malformed(f"tensor #{i} has {ndims[i]} dimensions (at most {MAX_NDIM})")
        if f:
            strided += ndims[i]
    suffix_bytes = sum(suffix)
    shape_at = head_end
    strides_at = shape_at + 8 * dims
    names_at = strides_at + 8 * strided
    total = names_at + _pad8(suffix_bytes)
    if total != n:
        raise _malformed(f"its table should hold {total} bytes for what it announces, not {n}")
    if any(table[names_at + suffix_bytes:total]):
        raise _malformed("padding bytes are not zero")
    shape_col = mv[shape_at:strides_at].cast("Q").tolist()
    stride_col = mv[strides_at:names_at].cast("Q").tolist()

    names: list[str] = []
    dtypes: list[str] = []
    shapes: list[tuple[int, ...]] = []
    strides_out: list[tuple[int, ...]] = []
    contiguous: list[bool] = []
    extents: list[int] = []
    nbytes: list[int] = []
    index: dict[str, int] = {}
    ends = [0] * allocation_count
    used = bytearray(allocation_count)
    prev = b""
    name_at = names_at
    shape_i = 0
    stride_i = 0
    # Each distinct (dtype code, shape, strides) checked once (see _check_entry).
    checked: dict[tuple[int, tuple[int, ...], tuple[int, ...] | None], tuple[str, int, tuple[int, ...], int, bool, int]] = {}
    for i in range(count):
        sh = shared[i]
        sl = suffix[i]
        if sh > len(prev):
            raise _malformed(f"tensor #{i} shares {sh} name bytes with a previous name of {len(prev)}")
        suf = table[name_at:name_at + sl]
        name_at += sl
        if sh < len(prev) and sl and prev[sh] == suf[0]:
            raise _malformed(f"tensor #{i} shares fewer name bytes with the previous name than it could (front coding must share the longest common prefix)")
        nb = prev[:sh] + suf
        if not nb:
            raise _malformed(f"tensor #{i} has an empty name")
        try:
            name = nb.decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed(f"tensor #{i} has a name that is not UTF-8") from None
        if name in index:
            raise _malformed(f"tensor {name!r} appears twice")
        index[name] = i
        names.append(name)
        prev = nb
        nd = ndims[i]
        shape = tuple(shape_col[shape_i:shape_i + nd])
        shape_i += nd
        if flags[i]:
            given: tuple[int, ...] | None = tuple(stride_col[stride_i:stride_i + nd])
            stride_i += nd
        else:
            given = None
        key = (codes[i], shape, given)
        known = checked.get(key)
        if known is None:
            known = checked[key] = _check_entry(name, codes[i], shape, given)
        dtype, itemsize, st, extent, contig, size = known
        a = allocs[i]
        if a >= allocation_count:
            raise _malformed(f"tensor {name!r} names allocation {a} of {allocation_count}")
        off = offsets[i]
        if off > SAFE or off % itemsize:
            raise _malformed(f"tensor {name!r} starts at offset {off}, not a multiple of its {itemsize}-byte elements")
        end = off + extent
        if end > sizes[a]:
            raise _malformed(f"tensor {name!r} reaches byte {end} of its allocation, which holds {sizes[a]}")
        if end > ends[a]:
            ends[a] = end
        used[a] = 1
        dtypes.append(dtype)
        shapes.append(shape)
        strides_out.append(st)
        contiguous.append(contig)
        extents.append(extent)
        nbytes.append(size)
    if allocation_count and not all(used):
        raise _malformed(f"allocation {used.index(0)} holds no tensor")
    layout = TensorLayout()
    layout.count = count
    layout.names = names
    layout.index = index
    layout.dtypes = dtypes
    layout.shapes = shapes
    layout.strides = strides_out
    layout.contiguous = contiguous
    layout.offsets = offsets
    layout.extents = extents
    layout.nbytes = nbytes
    layout.allocations = allocs
    layout.allocation_count = allocation_count
    layout.table = bytes(table)
    layout.ends = ends
    return layout
