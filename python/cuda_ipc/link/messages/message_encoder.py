"""Encoding link messages (src/link/messages/message-encoder.ts): ``link.send(value)`` as a MESSAGE frame's
payload (the format: message_format.py). Values JSON cannot carry are found by one walk and travel
as records: big ints, bytes-like arrays, and objects a transfer handler sends (handlers.py), whose
fds and lease holds the result hands to the link.
"""
from __future__ import annotations

import array
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Union

from ...errors import IpcError
from ..transport.fds import close_fds
from ..transport.frame import ENC_JSON, ENC_JSON_WITH_RECORDS, ENC_RAW, HEADER_BYTES, MAX_FDS
from ..transport.large_message import too_large_to_send
from .handlers import TransferHandler, handler_for_value, not_on_transport
from ..lifetimes.lease import next_lease_id, release_hold
from .message_format import FORMAT_TAG, MAX_DEPTH, RECORD_TAIL, SAFE_INT, TAG_UINT8

if TYPE_CHECKING:
    from ..lifetimes.lease import LeaseHold


class Link(Protocol):
    """What encoding reads of the link it sends on (the Link, connection/link.py, above this layer);
    the link itself is passed on to the transfer handlers."""

    max_message_bytes: int

    @property
    def transport(self) -> str: ...

#: Where a value sits in a message: dict keys and list indices from the root.
Path = Sequence[Union[str, int]]


def _where(path: Path) -> str:
    where = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in path)
    return f" at {where}" if where else ""


def _not_transferable(what: str, path: Path) -> IpcError:
    return IpcError(
        "ERR_NOT_TRANSFERABLE",
        f"link.send: cannot send {what}{_where(path)}. Messages hold JSON data (dict with str "
        "keys, list, tuple, str, int, finite float, bool, None), bytes, array.array, memoryview and objects with a "
        "registered transfer handler (HostBuffer, received buffers, CUDA tensors and arrays); convert other values first",
    )


def _typed_array_tag(v: object) -> tuple[int, memoryview] | None:
    """(tag, contiguous byte view) for bytes-like values, None for anything else."""
    if isinstance(v, (bytes, bytearray)):
        return TAG_UINT8, memoryview(v)
    if isinstance(v, array.array):
        tag = FORMAT_TAG.get((v.typecode, v.itemsize))
        return (tag, memoryview(v).cast("B")) if tag else None
    if isinstance(v, memoryview):
        if not v.c_contiguous:
            return None
        fmt = v.format.lstrip("@=<")
        tag = FORMAT_TAG.get((fmt, v.itemsize))
        return (tag, v.cast("B") if v.ndim != 1 or v.format != "B" else v) if tag else None
    return None


class _Found:
    __slots__ = ("path", "kind", "value", "handler")

    def __init__(self, path: list[str | int], kind: str, value: Any, handler: TransferHandler[Any] | None = None):
        self.path = path
        self.kind = kind
        self.value = value
        self.handler = handler


_PLAIN = (str, float, bool, type(None))


def _scan(v: Any, path: list[str | int], found: list[_Found], transport: str) -> Any:
    """Returns ``v`` when its subtree is plain JSON, else a copy with non-JSON values replaced by None
    (recorded in ``found`` with their paths); objects go to a handler of the link's ``transport``."""
    t = type(v)
    if t is str or t is bool or v is None:
        return v
    if t is int:
        if -SAFE_INT <= v <= SAFE_INT:
            return v
        found.append(_Found(list(path), "@bigint", v))
        return None
    if t is float:
        if v != v or v in (float("inf"), float("-inf")):
            raise _not_transferable(f"the float {v} (JSON has no NaN or Infinity)", path)
        return v
    if len(path) >= MAX_DEPTH:
        raise IpcError("ERR_INVALID_ARG", f"link.send: the message is nested deeper than {MAX_DEPTH} levels (or contains a cycle)")
    if t is dict or t is list or t is tuple:
        is_dict = t is dict
        copy: Any = None
        for k, e in v.items() if is_dict else enumerate(v):
            if is_dict and type(k) is not str:
                raise _not_transferable(f"a dict with the key {k!r} (keys must be str)", path)
            if type(e) in _PLAIN or (type(e) is int and -SAFE_INT <= e <= SAFE_INT):
                continue
            path.append(k)
            s = _scan(e, path, found, transport)
            path.pop()
            if s is not e:
                if copy is None:
                    copy = dict(v) if is_dict else list(v)
                copy[k] = s
        return v if copy is None else copy
    if isinstance(v, (bytes, bytearray, array.array, memoryview)):
        if _typed_array_tag(v) is None:
            raise _not_transferable(f"a {t.__name__} of this format (only contiguous int/float/byte arrays)", path)
        found.append(_Found(list(path), "@typed-array", v))
        return None
    if isinstance(v, int):  # an int subclass (e.g. IntEnum): its value
        return _scan(int(v), path, found, transport)
    h = handler_for_value(v, transport)
    if h is None:
        elsewhere = not_on_transport(v, transport)
        if elsewhere is not None:
            raise IpcError("ERR_NOT_TRANSFERABLE", f"link.send: cannot send a {t.__module__}.{t.__qualname__}{_where(path)} "
                           f"on a {transport.upper()} link: {elsewhere}")
        raise _not_transferable(f"an object of type {t.__module__}.{t.__qualname__} (no transfer handler is registered for it)", path)
    found.append(_Found(list(path), h.kind, v, h))
    return None


@dataclass
class EncodedMessage:
    #: The whole frame, header included.
    frame: bytearray
    fds: list[int]
    #: fds the link closes once the frame is sent (or the send failed).
    owned_fds: list[int]
    commits: list[Callable[[], None]]
    #: (lease id, hold) pairs to record once sent, release if the send failed.
    holds: list[tuple[int, LeaseHold]]


_json_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _dumps(value: Any) -> bytes:
    try:
        return _json_encode(value).encode("utf-8")
    except (ValueError, UnicodeEncodeError) as e:
        raise IpcError("ERR_NOT_TRANSFERABLE", f"link.send: the message is not JSON: {e}") from None


def encode_message(value: Any, link: Link) -> EncodedMessage:
    """Encodes ``value`` into one frame (which the link sends in a memfd when it is larger than a
    frame may be). On failure every fd a handler handed over has been closed and
    every hold released."""
    from ..transport import frame as fr

    if isinstance(value, (bytes, bytearray, memoryview)) and (not isinstance(value, memoryview) or value.c_contiguous):
        body = memoryview(value).cast("B") if isinstance(value, memoryview) else value
        n = len(body)
        if n > link.max_message_bytes:
            raise too_large_to_send(n, link.max_message_bytes)
        out = bytearray(HEADER_BYTES + n)
        fr.pack_header_into(out, fr.MESSAGE, ENC_RAW, n, 0)
        out[HEADER_BYTES:] = body
        return EncodedMessage(out, [], [], [], [])

    t = type(value)
    number: Any = value  # the tests are on its exact type, which mypy does not follow
    if t is int and -SAFE_INT <= number <= SAFE_INT or t is float and number - number == 0.0:
        # A lone number (a reply, an acknowledgement): its JSON text, without the encoder.
        payload = (str(number) if t is int else repr(number)).encode("ascii")
        out = bytearray(HEADER_BYTES)
        fr.pack_header_into(out, fr.MESSAGE, ENC_JSON, len(payload), 0)
        out += payload
        return EncodedMessage(out, [], [], [], [])
    found: list[_Found] = []
    root = _scan(value, [], found, link.transport)
    if not found:
        payload = _dumps(root)
        if len(payload) > link.max_message_bytes:
            raise too_large_to_send(len(payload), link.max_message_bytes)
        out = bytearray(HEADER_BYTES)
        fr.pack_header_into(out, fr.MESSAGE, ENC_JSON, len(payload), 0)
        out += payload
        return EncodedMessage(out, [], [], [], [])

    msg = EncodedMessage(bytearray(HEADER_BYTES), [], [], [], [])
    try:
        js = _dumps(root)
        out = msg.frame
        out += struct.pack("<I", len(js))
        out += js
        if len(found) > 0xFFFF:
            raise IpcError("ERR_MESSAGE_TOO_LARGE", "link.send: more than 65535 values in one message need records")
        out += struct.pack("<H", len(found))
        for f in found:
            _write_record(f, out, msg, link)
            if len(out) - HEADER_BYTES > link.max_message_bytes:
                raise too_large_to_send(len(out) - HEADER_BYTES, link.max_message_bytes)
        fr.pack_header_into(out, fr.MESSAGE, ENC_JSON_WITH_RECORDS, len(out) - HEADER_BYTES, len(msg.fds))
        return msg
    except BaseException:
        close_fds(msg.owned_fds)
        msg.owned_fds.clear()
        for _, hold in msg.holds:
            release_hold(hold)
        msg.holds.clear()
        raise


def _write_record(f: _Found, out: bytearray, msg: EncodedMessage, link: Link) -> None:
    lease_id = 0
    fds: list[int] = []
    if f.kind == "@bigint":
        data = str(f.value).encode("ascii")
    elif f.kind == "@typed-array":
        tagged = _typed_array_tag(f.value)
        assert tagged is not None, "_scan records typed arrays it can tag"
        data = bytes([tagged[0]]) + bytes(tagged[1])
    else:
        handler = f.handler
        assert handler is not None, "_scan records handled values with their handler"
        enc = handler.encode(f.value, link)
        fds = list(enc.fds or [])
        if fds and enc.close_fds_after_send:
            msg.owned_fds.extend(fds)  # taken over before anything else can fail
        if enc.hold is not None:
            if not callable(getattr(enc.hold, "release", None)):
                raise IpcError("ERR_INVALID_ARG", f"transfer handler '{f.kind}' returned a hold without a release() method")
            lease_id = next_lease_id()
            msg.holds.append((lease_id, enc.hold))
        if enc.on_commit is not None:
            msg.commits.append(enc.on_commit)
        if fds and link.transport != "unix":
            raise IpcError("ERR_NOT_TRANSFERABLE", f"link.send: the '{f.kind}' transfer handler returned file descriptors, "
                           f"which a {link.transport.upper()} link cannot carry")
        data = bytes(enc.data)
        if enc.kind is not None:
            f.kind = enc.kind
    kind = f.kind.encode("ascii")
    out.append(len(kind))
    out += kind
    if len(f.path) > 255:
        raise IpcError("ERR_INVALID_ARG", f"link.send: the message is nested deeper than {MAX_DEPTH} levels")
    out.append(len(f.path))
    for seg in f.path:
        if isinstance(seg, int):
            out += struct.pack("<BI", 0, seg)
        else:
            k = seg.encode("utf-8")
            if len(k) > 0xFFFF:
                raise IpcError("ERR_INVALID_ARG", "link.send: a dict key is longer than 65535 bytes")
            out += struct.pack("<BH", 1, len(k))
            out += k
    if len(msg.fds) + len(fds) > MAX_FDS:
        raise IpcError("ERR_MESSAGE_TOO_LARGE", f"link.send: the message would carry more than {MAX_FDS} fds; split it into several messages")
    msg.fds.extend(fds)
    out += RECORD_TAIL.pack(len(fds), lease_id, len(data))
    out += data
