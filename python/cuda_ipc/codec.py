"""Message payloads: what ``link.send(value)`` puts in a MESSAGE frame and how the receiver rebuilds
it. The same format as the Node side (src/link/codec.ts, docs/PROTOCOL.md):

* Raw: the message is ``bytes``/``bytearray``/``memoryview``; the payload is its bytes.
* Json: UTF-8 JSON; an empty payload is None.
* JsonWithRecords: JSON in which every value JSON cannot carry was replaced by null, followed by one
  record per replaced value saying what it is and where it goes::

    u32 jsonLength | json | u16 recordCount (>= 1) | record*
    record  = u8 kindLength | kind (ASCII) | u8 pathLength | segment* | u8 fdCount | u64 leaseId
              | u32 dataLength | data
    segment = u8 0, u32 array index | u8 1, u16 keyLength, key (UTF-8)

Built-in kinds: '@bigint' (ASCII decimal) and '@typed-array' (u8 type tag, then the bytes).
"""
from __future__ import annotations

import array
import json
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import IpcError
from .frame import ENC_JSON, ENC_JSON_WITH_RECORDS, ENC_RAW, HEADER_BYTES, MAX_FDS, MAX_FRAME_BYTES, MAX_PAYLOAD_BYTES
from .lease import next_lease_id, release_hold

MAX_DEPTH = 255
SAFE_INT = 2**53 - 1

# '@typed-array' tags, as the Node side numbers them (codec.ts TYPED_ARRAYS).
TAG_UINT8, TAG_INT8, TAG_UINT8_CLAMPED, TAG_INT16, TAG_UINT16, TAG_INT32, TAG_UINT32 = 1, 2, 3, 4, 5, 6, 7
TAG_FLOAT32, TAG_FLOAT64, TAG_BIGINT64, TAG_BIGUINT64, TAG_DATAVIEW = 8, 9, 10, 11, 12
# tag -> (array typecode, item size); Uint8Array and DataView arrive as bytes.
_TAG_TYPECODE = {
    TAG_INT8: "b", TAG_UINT8_CLAMPED: "B", TAG_INT16: "h", TAG_UINT16: "H", TAG_INT32: "i", TAG_UINT32: "I",
    TAG_FLOAT32: "f", TAG_FLOAT64: "d", TAG_BIGINT64: "q", TAG_BIGUINT64: "Q",
}
_TAG_SIZE = {TAG_UINT8: 1, TAG_DATAVIEW: 1, TAG_INT8: 1, TAG_UINT8_CLAMPED: 1, TAG_INT16: 2, TAG_UINT16: 2, TAG_INT32: 4,
             TAG_UINT32: 4, TAG_FLOAT32: 4, TAG_FLOAT64: 8, TAG_BIGINT64: 8, TAG_BIGUINT64: 8}
# (struct format character, item size) -> tag, for array.array and memoryview.
_FORMAT_TAG = {("b", 1): TAG_INT8, ("B", 1): TAG_UINT8, ("c", 1): TAG_UINT8, ("h", 2): TAG_INT16, ("H", 2): TAG_UINT16,
               ("i", 4): TAG_INT32, ("I", 4): TAG_UINT32, ("l", 4): TAG_INT32, ("L", 4): TAG_UINT32,
               ("l", 8): TAG_BIGINT64, ("L", 8): TAG_BIGUINT64, ("q", 8): TAG_BIGINT64, ("Q", 8): TAG_BIGUINT64,
               ("f", 4): TAG_FLOAT32, ("d", 8): TAG_FLOAT64}

_BIGINT_RE = re.compile(rb"^-?[0-9]{1,10000}$")
_RECORD_TAIL = struct.Struct("<BQI")  # fdCount, leaseId, dataLength
_KIND_RE = re.compile(r"^[\x21-\x7e]{1,64}$")


# ------------------------------------------------------------------------------------------------
# Transfer handlers


@dataclass
class TransferEncoding:
    """What a handler's ``encode()`` returns for one value."""

    #: Bytes for the receiver's decode; copied into the frame during send.
    data: bytes
    #: fds to pass with the message, borrowed (read during send only) unless close_fds_after_send.
    fds: list[int] = field(default_factory=list)
    close_fds_after_send: bool = False
    #: Runs once the message went out; never if the send failed.
    on_commit: Callable[[], None] | None = None
    #: The sender-side resource the value keeps alive while the peer uses it (a lease), with
    #: ``release()`` and ``bytes``.
    hold: Any = None
    #: The record kind, for a handler that sends values under several kinds (default: its own).
    kind: str | None = None


class TransferHandler:
    """How objects that own OS or GPU resources travel inside link messages (see register_transfer_handler)."""

    kind: str = ""

    def can_transfer(self, value: Any) -> bool:
        raise NotImplementedError

    def encode(self, value: Any, link) -> TransferEncoding:
        raise NotImplementedError

    def decode(self, data: memoryview, fds: list[int], link, lease) -> Any:
        """Rebuilds the value. ``data`` is valid during the call only. On return the handler owns
        ``fds``; if it raises, the link closes every fd still in ``fds`` (a handler that already took
        one sets its entry to -1). The value must call ``lease.end()`` once finally released."""
        raise NotImplementedError


_by_kind: dict[str, TransferHandler] = {}
_handlers: list[TransferHandler] = []


def register_transfer_handler(handler: TransferHandler) -> None:
    """Registers a handler for every link in this process (the receiving process needs it too)."""
    kind = getattr(handler, "kind", None)
    if not isinstance(kind, str) or not _KIND_RE.match(kind) or kind.startswith("@"):
        raise IpcError("ERR_INVALID_ARG", f"transfer handler kind {kind!r} must be 1..64 printable ASCII characters not starting with '@'")
    if kind in _by_kind:
        raise IpcError("ERR_INVALID_ARG", f"a transfer handler for '{kind}' is already registered; unregister it first to replace it")
    _by_kind[kind] = handler
    _handlers.append(handler)


def unregister_transfer_handler(kind: str) -> bool:
    h = _by_kind.pop(kind, None)
    if h is None:
        return False
    _handlers.remove(h)
    return True


def handler_for_value(value: Any) -> TransferHandler | None:
    for h in _handlers:
        if h.can_transfer(value):
            return h
    return None


# ------------------------------------------------------------------------------------------------
# Encoding


def _not_transferable(what: str, path) -> IpcError:
    where = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in path)
    return IpcError(
        "ERR_NOT_TRANSFERABLE",
        f"link.send: cannot send {what}{' at ' + where if where else ''}. Messages hold JSON data (dict with str "
        "keys, list, tuple, str, int, finite float, bool, None), bytes, array.array, memoryview and objects with a "
        "registered transfer handler (HostBuffer, received buffers, CUDA tensors and arrays); convert other values first",
    )


def _too_large(n) -> IpcError:
    return IpcError(
        "ERR_MESSAGE_TOO_LARGE",
        f"link.send: the encoded message needs {n} bytes, more than a link frame holds ({MAX_PAYLOAD_BYTES}); send bulk "
        "data in a HostBuffer (or device memory) and put the buffer in the message instead",
    )


def _typed_array_tag(v) -> tuple[int, memoryview] | None:
    """(tag, contiguous byte view) for bytes-like values, None for anything else."""
    if isinstance(v, (bytes, bytearray)):
        return TAG_UINT8, memoryview(v)
    if isinstance(v, array.array):
        tag = _FORMAT_TAG.get((v.typecode, v.itemsize))
        return (tag, memoryview(v).cast("B")) if tag else None
    if isinstance(v, memoryview):
        if not v.c_contiguous:
            return None
        fmt = v.format.lstrip("@=<")
        tag = _FORMAT_TAG.get((fmt, v.itemsize))
        return (tag, v.cast("B") if v.ndim != 1 or v.format != "B" else v) if tag else None
    return None


class _Found:
    __slots__ = ("path", "kind", "value", "handler")

    def __init__(self, path, kind, value, handler=None):
        self.path = path
        self.kind = kind
        self.value = value
        self.handler = handler


_PLAIN = (str, float, bool, type(None))


def _scan(v, path: list, found: list) -> Any:
    """Returns ``v`` when its subtree is plain JSON, else a copy with non-JSON values replaced by None
    (recorded in ``found`` with their paths)."""
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
    if t is dict:
        copy = None
        for k, e in v.items():
            if type(k) is not str:
                raise _not_transferable(f"a dict with the key {k!r} (keys must be str)", path)
            if type(e) in _PLAIN or (type(e) is int and -SAFE_INT <= e <= SAFE_INT):
                continue
            path.append(k)
            s = _scan(e, path, found)
            path.pop()
            if s is not e:
                if copy is None:
                    copy = dict(v)
                copy[k] = s
        return v if copy is None else copy
    if t is list or t is tuple:
        copy = None
        for i, e in enumerate(v):
            if type(e) in _PLAIN or (type(e) is int and -SAFE_INT <= e <= SAFE_INT):
                continue
            path.append(i)
            s = _scan(e, path, found)
            path.pop()
            if s is not e:
                if copy is None:
                    copy = list(v)
                copy[i] = s
        return v if copy is None else copy
    if isinstance(v, (bytes, bytearray, array.array, memoryview)):
        if _typed_array_tag(v) is None:
            raise _not_transferable(f"a {t.__name__} of this format (only contiguous int/float/byte arrays)", path)
        found.append(_Found(list(path), "@typed-array", v))
        return None
    if isinstance(v, int):  # an int subclass (e.g. IntEnum): its value
        return _scan(int(v), path, found)
    h = handler_for_value(v)
    if h is None:
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
    commits: list
    #: (lease id, hold) pairs to record once sent, release if the send failed.
    holds: list


_json_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _dumps(value) -> bytes:
    try:
        return _json_encode(value).encode("utf-8")
    except (ValueError, UnicodeEncodeError) as e:
        raise IpcError("ERR_NOT_TRANSFERABLE", f"link.send: the message is not JSON: {e}") from None


def encode_message(value: Any, link) -> EncodedMessage:
    """Encodes ``value`` into one frame. On failure every fd a handler handed over has been closed and
    every hold released."""
    from . import frame as fr

    if isinstance(value, (bytes, bytearray, memoryview)) and (not isinstance(value, memoryview) or value.c_contiguous):
        body = memoryview(value).cast("B") if isinstance(value, memoryview) else value
        n = len(body)
        if n > MAX_PAYLOAD_BYTES:
            raise _too_large(n)
        out = bytearray(HEADER_BYTES + n)
        fr.pack_header_into(out, fr.MESSAGE, ENC_RAW, n, 0)
        out[HEADER_BYTES:] = body
        return EncodedMessage(out, [], [], [], [])

    t = type(value)
    if t is int and -SAFE_INT <= value <= SAFE_INT or t is float and value - value == 0.0:
        # A lone number (a reply, an acknowledgement): its JSON text, without the encoder.
        payload = (str if t is int else repr)(value).encode("ascii")
        out = bytearray(HEADER_BYTES)
        fr.pack_header_into(out, fr.MESSAGE, ENC_JSON, len(payload), 0)
        out += payload
        return EncodedMessage(out, [], [], [], [])
    found: list[_Found] = []
    root = _scan(value, [], found)
    if not found:
        payload = _dumps(root)
        if len(payload) > MAX_PAYLOAD_BYTES:
            raise _too_large(len(payload))
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
            if len(out) > MAX_FRAME_BYTES:
                raise _too_large(f"more than {MAX_PAYLOAD_BYTES}")
        fr.pack_header_into(out, fr.MESSAGE, ENC_JSON_WITH_RECORDS, len(out) - HEADER_BYTES, len(msg.fds))
        return msg
    except BaseException:
        for fd in msg.owned_fds:
            _close_quietly(fd)
        msg.owned_fds.clear()
        for _, hold in msg.holds:
            release_hold(hold)
        msg.holds.clear()
        raise


def _write_record(f: _Found, out: bytearray, msg: EncodedMessage, link) -> None:
    lease_id = 0
    fds: list[int] = []
    if f.kind == "@bigint":
        data = str(f.value).encode("ascii")
    elif f.kind == "@typed-array":
        tag, view = _typed_array_tag(f.value)
        data = bytes([tag]) + bytes(view)
    else:
        enc = f.handler.encode(f.value, link)
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
    out += _RECORD_TAIL.pack(len(fds), lease_id, len(data))
    out += data


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


# ------------------------------------------------------------------------------------------------
# Decoding


class Malformed(IpcError):
    """The payload is out of spec: the link must close."""

    fatal = True

    def __init__(self, why: str):
        super().__init__("ERR_FRAME_INVALID", f"received a malformed message payload: {why}")


def dispose_values(values) -> None:
    """Closes decoded values that will never reach the user."""
    for v in values or ():
        close = getattr(v, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - best effort, the value is being discarded
                pass


def decode_message(encoding: int, buf: memoryview, fds: list[int], link, leases):
    """Decodes a MESSAGE payload ``buf`` that arrived with ``fds`` (owned from the call on).

    Returns ``(value, owned)`` where owned lists decoded objects holding resources; raises Malformed
    (the link must close) or an IpcError for this message only. Either way every fd is in a decoded
    value or closed."""
    if encoding == ENC_RAW:
        return bytes(buf), None
    if encoding == ENC_JSON:
        if len(buf) == 0:
            return None, None
        try:
            return json.loads(bytes(buf)), None
        except ValueError:
            raise Malformed("the JSON does not parse") from None
    try:
        return _decode_with_records(buf, fds, link, leases)
    except BaseException:
        for fd in fds:
            if fd >= 0:
                _close_quietly(fd)
        raise


_U32 = struct.Struct("<I").unpack_from
_U16 = struct.Struct("<H").unpack_from
_TAIL = _RECORD_TAIL.unpack_from
_TAIL_SIZE = _RECORD_TAIL.size
_json_decode = json.JSONDecoder().decode


def _parse_records(buf: memoryview):
    # The head (JSON, kinds, paths) is parsed from a bytes copy, cheaper to index and slice than
    # the memoryview; record data stays a view of the frame.
    end = len(buf)
    if end < 4:
        raise Malformed("truncated JSON length")
    (json_length,) = _U32(buf, 0)
    at = 4 + json_length
    if at > end:
        raise Malformed("JSON length past the end")
    try:
        root = _json_decode(bytes(buf[4:at]).decode("utf-8", "surrogatepass"))
    except ValueError:  # UnicodeDecodeError included
        raise Malformed("the JSON does not parse") from None
    if at + 2 > end:
        raise Malformed("truncated record count")
    (count,) = _U16(buf, at)
    at += 2
    if count == 0:
        raise Malformed("no records in a message that announces records")
    data = bytes(buf[at:]) if end - at <= 4096 else None
    base = at
    records = []
    fd_total = 0
    for _ in range(count):
        if data is None:  # a large tail (typed arrays): parse it from the view
            data = buf
            base = 0
        i = at - base
        if at + 1 > end:
            raise Malformed("truncated record")
        kind_length = data[i]
        at += 1
        i += 1
        if kind_length == 0 or at + kind_length + 1 > end:
            raise Malformed("bad record kind")
        kind = bytes(data[i:i + kind_length]).decode("latin-1")
        at += kind_length
        i += kind_length
        path_length = data[i]
        at += 1
        i += 1
        path: list = []
        for _s in range(path_length):
            if at + 1 > end:
                raise Malformed("truncated path")
            tag = data[i]
            at += 1
            i += 1
            if tag == 0:
                if at + 4 > end:
                    raise Malformed("truncated path index")
                path.append(_U32(data, i)[0])
                at += 4
                i += 4
            elif tag == 1:
                if at + 2 > end:
                    raise Malformed("truncated path key")
                (n,) = _U16(data, i)
                at += 2
                i += 2
                if at + n > end:
                    raise Malformed("path key past the end")
                try:
                    path.append(bytes(data[i:i + n]).decode("utf-8"))
                except UnicodeDecodeError:
                    raise Malformed("a path key is not UTF-8") from None
                at += n
                i += n
            else:
                raise Malformed(f"unknown path segment tag {tag}")
        if at + _TAIL_SIZE > end:
            raise Malformed("truncated record data")
        fd_count, lease_id, data_length = _TAIL(data, i)
        if lease_id > SAFE_INT:
            raise Malformed("a lease id above 2^53")
        at += _TAIL_SIZE
        if at + data_length > end:
            raise Malformed("record data past the end")
        records.append((kind, path, fd_count, lease_id, at, at + data_length))
        at += data_length
        fd_total += fd_count
    if at != end:
        raise Malformed(f"{end - at} stray bytes after the records")
    return root, records, fd_total


def _decode_with_records(buf: memoryview, fds: list[int], link, leases):
    root, records, fd_total = _parse_records(buf)
    if fd_total != len(fds):
        raise Malformed(f"records claim {fd_total} fds but {len(fds)} arrived")
    # Check every lease and placement before decoding anything.
    seen: set[int] = set()
    holder = [root]
    slots = []
    for kind, path, _n, lease_id, _s, _e in records:
        if lease_id:
            if kind in ("@bigint", "@typed-array"):
                raise Malformed(f"a leased '{kind}' record")
            if leases is None:
                raise Malformed("a leased value where no lease can be received")
            if leases.is_live(lease_id):
                raise Malformed(f"lease id {lease_id} is already held")
            if lease_id in seen:
                raise Malformed(f"lease id {lease_id} appears twice")
            seen.add(lease_id)
        parent, key = holder, 0
        for seg in path:
            nxt = parent[key]
            t = type(nxt)
            if t is dict:
                if type(seg) is not str:
                    raise Malformed("a record path does not match the JSON")
            elif t is list:
                if type(seg) is not int:
                    raise Malformed("a record path does not match the JSON")
            else:
                raise Malformed("a record path leads through a non-container")
            parent, key = nxt, seg
        if type(parent) is list:
            ok = 0 <= key < len(parent) and parent[key] is None
        else:
            ok = key in parent and parent[key] is None
        if not ok:
            raise Malformed("a record path does not point at a null placeholder")
        slots.append((parent, key))

    # From here every lease is open: a failure must end them all.
    received = [leases.open(r[3]) if r[3] else None for r in records]
    owned = []
    fd_at = 0
    for i, (kind, _p, fd_count, _l, start, end) in enumerate(records):
        mine = fds[fd_at:fd_at + fd_count]
        try:
            value = _decode_record(kind, buf[start:end], mine, link, received[i])
        except BaseException as e:
            for k in range(fd_count):
                fds[fd_at + k] = mine[k]
            dispose_values(owned)
            for lease in received:
                if lease is not None:
                    lease.end()
            if isinstance(e, IpcError):
                raise
            if not isinstance(e, Exception):
                raise
            raise IpcError("ERR_DESCRIPTOR_INVALID", f"the '{kind}' transfer handler could not rebuild a received value: {e}") from e
        for k in range(fd_at, fd_at + fd_count):
            fds[k] = -1
        fd_at += fd_count
        if kind not in ("@bigint", "@typed-array") and value is not None and not isinstance(value, (int, str, float, bool)):
            owned.append(value)
        parent, key = slots[i]
        parent[key] = value
    return holder[0], (owned or None)


def _decode_record(kind: str, data: memoryview, fds: list[int], link, lease):
    if kind == "@bigint":
        raw = bytes(data)
        if fds or not _BIGINT_RE.match(raw):
            raise Malformed("a bigint record is malformed")
        return int(raw)
    if kind == "@typed-array":
        tag = data[0] if len(data) else 0
        size = _TAG_SIZE.get(tag)
        n = len(data) - 1
        if fds or size is None or n % size != 0:
            raise Malformed("a typed-array record is malformed")
        if tag in (TAG_UINT8, TAG_DATAVIEW):
            return bytes(data[1:])
        a = array.array(_TAG_TYPECODE[tag])
        a.frombytes(data[1:])
        return a
    handler = _by_kind.get(kind)
    if handler is None:
        raise IpcError(
            "ERR_NOT_TRANSFERABLE",
            f"received a '{kind}' but no transfer handler for it is registered in this process; import the module "
            "that provides it (import cuda_ipc registers all of its own) before receiving",
        )
    return handler.decode(data, fds, link, lease)
