"""Descriptors: what one process sends another so it can open exported GPU memory or an event, in the
same binary ('CIPC', version 1) and JSON forms as the Node side (src/ipc/descriptor.ts). Parsing is
strict, as for untrusted input: anything malformed raises IpcError ERR_DESCRIPTOR_INVALID (naming
the field), ERR_DESCRIPTOR_VERSION or ERR_DESCRIPTOR_KIND.
"""
from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, Union, overload

from ..errors import IpcError
from .._renamed import renamed_attribute

#: Bytes a parser accepts.
BytesLike = Union[bytes, bytearray, memoryview]

MAGIC = b"CIPC"
VERSION = 1
HEADER_BYTES = 16
TAG_LEGACY = 1
TAG_EVENT = 2
MAX_NDIM = 32
SAFE = 2**53 - 1
MAX_PID = 0x7FFFFFFF

# name: (itemsize, typestr, wire code); the wire codes are the Node side's (src/ipc/dtype.ts).
DTYPES = {
    "int8": (1, "|i1", 1), "int16": (2, "<i2", 2), "int32": (4, "<i4", 3), "int64": (8, "<i8", 4),
    "uint8": (1, "|u1", 5), "uint16": (2, "<u2", 6), "uint32": (4, "<u4", 7), "uint64": (8, "<u8", 8),
    "float16": (2, "<f2", 9), "bfloat16": (2, "<V2", 10), "float32": (4, "<f4", 11), "float64": (8, "<f8", 12),
    # One byte each; the float8 formats (PyTorch's float8_e4m3fn / float8_e5m2) have no NumPy typestr.
    "bool": (1, "|b1", 13), "float8_e4m3fn": (1, "|V1", 14), "float8_e5m2": (1, "|V1", 15),
}
_BY_CODE = {v[2]: k for k, v in DTYPES.items()}
_BY_TYPESTR = {v[1]: k for k, v in DTYPES.items() if v[1] != "|V1"}  # '|V1' names two dtypes: not a typestr
_BY_TYPESTR.update({"<i1": "int8", "<u1": "uint8", "<b1": "bool"})
_UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_HEX_RE = re.compile(r"^[0-9a-f]*$")
_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "int": "int32", "long": "int64",
            "short": "int16", "uint8": "uint8", "byte": "int8", "f4": "float32", "f8": "float64", "f2": "float16"}


def _invalid(field: str, why: str) -> IpcError:
    return IpcError("ERR_DESCRIPTOR_INVALID", f"descriptor.{field} {why}")


def numel(shape: Iterable[int]) -> int:
    """Elements in an array of ``shape``."""
    n = 1
    for d in shape:
        n *= d
    return n


def dtype_name(dtype: object) -> str:
    """A cuda-ipc dtype name from a name ('float32'), a NumPy typestr ('<f4'), a NumPy dtype
    (``.str``) or a torch dtype (``torch.float32``)."""
    if isinstance(dtype, str):
        s = dtype
    elif hasattr(dtype, "str") and isinstance(dtype.str, str):
        s = dtype.str  # numpy.dtype
    else:
        s = str(dtype)  # torch.float32 -> 'torch.float32'
    if s.startswith("torch."):
        s = s[6:]
    if s in DTYPES:
        return s
    if s in _BY_TYPESTR:
        return _BY_TYPESTR[s]
    if s in _ALIASES:
        return _ALIASES[s]
    raise IpcError("ERR_INVALID_ARG", f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)} (or a NumPy typestr such as '<f4')")


#: torch dtype -> (cuda-ipc dtype name, item size), or None for a dtype cuda-ipc cannot describe.
_torch_dtypes: dict[Any, tuple[str, int] | None] = {}


def torch_dtype(dtype: Any) -> tuple[str, int] | None:
    """(cuda-ipc dtype name, item size) of a torch dtype, or None for one cuda-ipc cannot describe:
    worked out once per dtype (a first sync describes thousands of tensors)."""
    try:
        return _torch_dtypes[dtype]
    except KeyError:
        pass
    try:
        name = dtype_name(dtype)
        info: tuple[str, int] | None = (name, DTYPES[name][0])
    except IpcError:
        info = None
    _torch_dtypes[dtype] = info
    return info


@dataclass(frozen=True)
class ArrayMeta:
    """What a shared byte range holds: dtype, shape, strides in bytes (non-negative multiples of the
    item size)."""

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @staticmethod
    def make(dtype: object, shape: Iterable[int], strides: Iterable[int] | None = None) -> "ArrayMeta":
        # The same few array shapes come back message after message: remember them.
        try:
            key = (dtype, tuple(shape), None if strides is None else tuple(strides))
            hit = _made.get(key)
        except TypeError:  # an unhashable dtype object
            return ArrayMeta._make(dtype, shape, strides)
        if hit is None:
            hit = ArrayMeta._make(dtype, shape, strides)
            if len(_made) >= 256:
                _made.clear()
            _made[key] = hit
        return hit

    @staticmethod
    def _make(dtype: object, shape_in: Iterable[int], strides_in: Iterable[int] | None = None) -> "ArrayMeta":
        name = dtype_name(dtype)
        itemsize = DTYPES[name][0]
        shape = tuple(int(d) for d in shape_in)
        if len(shape) > MAX_NDIM or any(d < 0 or d > SAFE for d in shape):
            raise _invalid("array.shape", f"must be at most {MAX_NDIM} non-negative sizes, got {shape}")
        if strides_in is None:
            out, step = [], itemsize
            for d in reversed(shape):
                out.append(step)
                step *= max(d, 1)
            strides_in = reversed(out)
        strides = tuple(int(s) for s in strides_in)
        if len(strides) != len(shape):
            raise _invalid("array.strides", f"must have one entry per dimension ({len(shape)}), got {len(strides)}")
        for s in strides:
            if s < 0 or s > SAFE or s % itemsize:
                raise _invalid("array.strides", f"must be non-negative multiples of the itemsize {itemsize}, got {strides}")
        meta = ArrayMeta(name, shape, strides)
        if meta.extent > SAFE:
            raise _invalid("array", "reaches beyond 2^53-1 bytes")
        return meta

    @cached_property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][0]

    @cached_property
    def typestr(self) -> str:
        return DTYPES[self.dtype][1]

    @cached_property
    def extent(self) -> int:
        """Bytes from the first element to the end of the last one."""
        if 0 in self.shape:
            return 0
        return sum((d - 1) * s for d, s in zip(self.shape, self.strides)) + self.itemsize

    @cached_property
    def c_contiguous(self) -> bool:
        if 0 in self.shape:
            return True
        expected = self.itemsize
        for d, s in zip(reversed(self.shape), reversed(self.strides)):
            if d != 1 and s != expected:
                return False
            expected *= d
        return True


_made: dict[tuple[Any, ...], ArrayMeta] = {}


@dataclass(frozen=True)
class LegacyHandleDescriptor:
    """A CUDA legacy IPC memory handle (of a whole allocation) and where the bytes lie in it."""

    handle: bytes
    offset: int
    byte_length: int
    device_uuid: str
    pid: int
    array: ArrayMeta | None = None
    kind = "cuda-legacy-handle"

    def __post_init__(self) -> None:
        _check_bytes(self.handle, "handle")
        for name, v in (("offset", self.offset), ("byteLength", self.byte_length)):
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= SAFE:
                raise _invalid(name, f"must be an integer in 0..2^53-1, got {v!r}")
        if self.offset + self.byte_length > SAFE:
            raise _invalid("byteLength", "plus offset must not exceed 2^53-1")
        _check_uuid(self.device_uuid)
        _check_pid(self.pid)
        if self.array is not None and self.array.extent > self.byte_length:
            raise _invalid("array", f"needs {self.array.extent} bytes but byteLength is only {self.byte_length}")


@dataclass(frozen=True)
class IpcEventDescriptor:
    """An interprocess CUDA event."""

    handle: bytes
    device_uuid: str
    pid: int
    kind = "cuda-ipc-event"

    def __post_init__(self) -> None:
        _check_bytes(self.handle, "handle")
        _check_uuid(self.device_uuid)
        _check_pid(self.pid)


#: A descriptor of either kind.
Descriptor = Union[LegacyHandleDescriptor, IpcEventDescriptor]


def _check_bytes(v: object, field: str) -> None:
    if not isinstance(v, (bytes, bytearray)) or len(v) != 64:
        hint = ""
        if isinstance(v, (bytes, bytearray)) and len(v) == 66 and v[1:2] == b"c":
            hint = "; this looks like PyTorch's 66-byte handle: use cuda_ipc.descriptor_from_torch(...) instead"
        raise _invalid(field, f"must be exactly 64 bytes, got {len(v) if isinstance(v, (bytes, bytearray)) else type(v).__name__}{hint}")


def _check_uuid(v: object) -> None:
    if not isinstance(v, str) or not _UUID_RE.match(v):
        raise _invalid("deviceUuid", f"must look like 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx' with lower-case hex digits, got {v!r}")


def _check_pid(v: object) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_PID:
        raise _invalid("pid", f"must be an integer in 1..2^31-1 (the exporting process id), got {v!r}")


def _uuid_raw(uuid: str) -> bytes:
    return bytes.fromhex(uuid[4:].replace("-", ""))


def _uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def encode_descriptor(desc: Descriptor) -> bytes:
    """The binary form ('CIPC' header + body), as links carry legacy buffers and events."""
    if isinstance(desc, LegacyHandleDescriptor):
        a = desc.array
        ndim = len(a.shape) if a else 0
        body = bytes(desc.handle) + _uuid_raw(desc.device_uuid) + struct.pack("<QQII", desc.offset, desc.byte_length, desc.pid, 0)
        body += struct.pack("<BB6x", DTYPES[a.dtype][2] if a else 0, ndim)
        if a:
            body += struct.pack(f"<{ndim}Q{ndim}q", *a.shape, *a.strides)
        tag = TAG_LEGACY
    elif isinstance(desc, IpcEventDescriptor):
        body = bytes(desc.handle) + _uuid_raw(desc.device_uuid) + struct.pack("<II", desc.pid, 0)
        tag = TAG_EVENT
    else:
        raise IpcError("ERR_INVALID_ARG", f"not a descriptor: {desc!r}")
    return MAGIC + struct.pack("<HHII", VERSION, tag, HEADER_BYTES + len(body), 0) + body


@overload
def decode_descriptor(data: BytesLike, expected_kind: Literal["cuda-legacy-handle"]) -> LegacyHandleDescriptor: ...
@overload
def decode_descriptor(data: BytesLike, expected_kind: Literal["cuda-ipc-event"]) -> IpcEventDescriptor: ...
@overload
def decode_descriptor(data: BytesLike, expected_kind: None = None) -> Descriptor: ...


def decode_descriptor(data: BytesLike, expected_kind: str | None = None) -> Descriptor:
    """Decodes one whole binary descriptor."""
    b = bytes(data)
    if len(b) < HEADER_BYTES:
        raise _invalid("length", f"is {len(b)} bytes, shorter than the {HEADER_BYTES}-byte header")
    if b[:4] != MAGIC:
        raise _invalid("magic", "is not 'CIPC': these bytes are not a cuda-ipc binary descriptor")
    version, tag, length, reserved = struct.unpack_from("<HHII", b, 4)
    if version != VERSION:
        raise IpcError("ERR_DESCRIPTOR_VERSION", f"descriptor version {version} is not supported; this version of cuda-ipc reads version {VERSION}")
    kind = {TAG_LEGACY: "cuda-legacy-handle", TAG_EVENT: "cuda-ipc-event"}.get(tag)
    if kind is None:
        raise IpcError("ERR_DESCRIPTOR_KIND", f"descriptor type tag {tag} is not one this version of cuda-ipc understands")
    if expected_kind is not None and kind != expected_kind:
        raise IpcError("ERR_DESCRIPTOR_KIND", f"expected a {expected_kind} descriptor, got {kind!r}")
    if length != len(b):
        raise _invalid("length", f"says {length} bytes but the input is {len(b)}")
    if reserved:
        raise _invalid("reserved", "must be zero")
    if tag == TAG_EVENT:
        if len(b) != 104:
            raise _invalid("length", f"of an event descriptor must be 104 bytes, got {len(b)}")
        pid, r2 = struct.unpack_from("<II", b, 96)
        if r2:
            raise _invalid("reserved", "must be zero")
        return IpcEventDescriptor(b[16:80], _uuid_text(b[80:96]), pid)
    if len(b) < 128:
        raise _invalid("length", f"is cut off: a legacy-handle descriptor has at least 128 bytes, got {len(b)}")
    offset, byte_length, pid, r2 = struct.unpack_from("<QQII", b, 96)
    code, ndim = struct.unpack_from("<BB", b, 120)
    if r2 or any(b[122:128]):
        raise _invalid("reserved", "must be zero")
    array = None
    if code == 0:
        if ndim:
            raise _invalid("array.ndim", f"must be 0 when there is no array (dtype code 0), got {ndim}")
        if len(b) != 128:
            raise _invalid("length", f"has {len(b) - 128} unexpected trailing bytes")
    else:
        if code not in _BY_CODE:
            raise _invalid("array.dtype", f"is not a known dtype code (got {code})")
        if ndim > MAX_NDIM:
            raise _invalid("array.ndim", f"must be at most {MAX_NDIM}, got {ndim}")
        if len(b) != 128 + 16 * ndim:
            raise _invalid("length", f"must be {128 + 16 * ndim} bytes for {ndim} dimensions, got {len(b)}")
        vals = struct.unpack_from(f"<{ndim}Q{ndim}q", b, 128)
        array = ArrayMeta.make(_BY_CODE[code], vals[:ndim], vals[ndim:])
    if offset > SAFE or byte_length > SAFE:
        raise _invalid("offset", "and byteLength must be at most 2^53-1")
    return LegacyHandleDescriptor(b[16:80], offset, byte_length, _uuid_text(b[80:96]), pid, array)


def descriptor_to_json(desc: Descriptor) -> dict[str, Any]:
    """The JSON form (a dict for json.dumps), as Node's descriptorToJson writes it."""
    if isinstance(desc, LegacyHandleDescriptor):
        out: dict[str, Any] = {"kind": desc.kind, "version": 1, "handle": bytes(desc.handle).hex(), "offset": desc.offset,
               "byteLength": desc.byte_length, "deviceUuid": desc.device_uuid, "pid": desc.pid}
        if desc.array is not None:
            a = desc.array
            out["array"] = {"dtype": a.dtype, "typestr": a.typestr, "shape": list(a.shape), "strides": list(a.strides)}
        return out
    if isinstance(desc, IpcEventDescriptor):
        return {"kind": desc.kind, "version": 1, "handle": bytes(desc.handle).hex(), "deviceUuid": desc.device_uuid, "pid": desc.pid}
    raise IpcError("ERR_INVALID_ARG", f"not a descriptor: {desc!r}")


def parse_descriptor_json(value: Any) -> Descriptor:
    """Parses the JSON form (text or a parsed dict), strictly (unknown keys are rejected)."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise IpcError("ERR_DESCRIPTOR_INVALID", f"descriptor is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise IpcError("ERR_DESCRIPTOR_INVALID", "descriptor must be a JSON object")
    kind = value.get("kind")
    if kind not in ("cuda-legacy-handle", "cuda-ipc-event"):
        raise IpcError("ERR_DESCRIPTOR_KIND", f"descriptor.kind {kind!r} is not one this version of cuda-ipc understands")
    if value.get("version") != 1:
        raise IpcError("ERR_DESCRIPTOR_VERSION", f"descriptor version {value.get('version')!r} is not supported; this version reads version 1")
    allowed = {"kind", "version", "handle", "deviceUuid", "pid"}
    if kind == "cuda-legacy-handle":
        allowed |= {"offset", "byteLength", "array"}
    extra = set(value) - allowed
    if extra:
        raise _invalid(sorted(extra)[0], "is not a known key")
    h = value.get("handle")
    if not isinstance(h, str) or len(h) != 128 or not _HEX_RE.match(h):
        hint = ""
        if isinstance(h, str) and len(h) == 132 and h[2:4] == "63":
            hint = "; this looks like PyTorch's 66-byte handle: use cuda_ipc.descriptor_from_torch(...) instead"
        raise _invalid("handle", f"must be exactly 128 lower-case hex digits{hint}")
    handle = bytes.fromhex(h)
    fields: Any = value  # values of any JSON type: the descriptor's constructor checks each
    if kind == "cuda-ipc-event":
        return IpcEventDescriptor(handle, fields.get("deviceUuid"), fields.get("pid"))
    array = None
    a = value.get("array")
    if a is not None:
        if not isinstance(a, dict) or set(a) - {"dtype", "typestr", "shape", "strides"} or "dtype" not in a or "shape" not in a:
            raise _invalid("array", "must be {dtype, shape, strides?, typestr?}")
        if a["dtype"] not in DTYPES:
            raise _invalid("array.dtype", f"must be one of {', '.join(DTYPES)}")
        array = ArrayMeta.make(a["dtype"], a["shape"], a.get("strides"))
        if "typestr" in a and a["typestr"] != array.typestr:
            raise _invalid("array.typestr", f"must be {array.typestr!r} for dtype {array.dtype}")
    return LegacyHandleDescriptor(handle, fields.get("offset"), fields.get("byteLength"), fields.get("deviceUuid"), fields.get("pid"), array)


def __getattr__(name: str) -> Any:
    # The old names of these (_renamed.py): each use warns, for one release.
    return renamed_attribute(__name__, {"parse_descriptor_json": parse_descriptor_json}, name)
