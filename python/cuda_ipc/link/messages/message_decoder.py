"""Decoding link messages (src/link/messages/message-decoder.ts): a MESSAGE frame's payload back into the value
that was sent (the format: message_format.py). Records are checked whole before any value is
rebuilt, so that a malformed payload never strands a decoded value, an fd or a lease; transfer
handlers (handlers.py) rebuild the objects that own resources.
"""
from __future__ import annotations

import array
import itertools
import json
import re
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import IpcError
from .deferred import Completion, DeferredValue
from ..transport.fds import close_fds
from ..transport.frame import ENC_JSON, ENC_RAW
from .handlers import by_kind
from .message_format import BIGINT_RE, RECORD_TAIL, SAFE_INT, TAG_DATAVIEW, TAG_SIZE, TAG_TYPECODE, TAG_UINT8, Malformed

if TYPE_CHECKING:
    from ..lifetimes.lease import IncomingLeases, LeaseFromPeer


class Link(Protocol):
    """What decoding reads of the link a message came on (the Link, connection/link.py, above this
    layer); the link itself is passed on to the transfer handlers."""

    @property
    def transport(self) -> str: ...

#: A parsed record: kind, path, fd count, lease id, and where its data starts and ends in the payload.
Record = tuple[str, list[Any], int, int, int, int]


def dispose_values(values: Iterable[object] | None) -> None:
    """Closes decoded values that will never reach the user."""
    for v in values or ():
        close = getattr(v, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - best effort, the value is being discarded
                pass


def decode_message(encoding: int, buf: memoryview, fds: list[int], link: Link, leases: IncomingLeases | None,
                   waits: list[Completion]) -> tuple[Any, list[object] | None]:
    """Decodes a MESSAGE payload ``buf`` that arrived with ``fds`` (owned from the call on).

    Returns ``(value, owned)`` where owned lists decoded objects holding resources; raises Malformed
    (the link must close) or an IpcError for this message only. Either way every fd is in a decoded
    value or closed. Values still arriving (a handler returned a DeferredValue) are in the message
    already; what they wait for is appended to ``waits`` (the message is usable once all settled)."""
    if encoding == ENC_RAW:
        return bytes(buf), None
    if encoding == ENC_JSON:
        if len(buf) == 0:
            return None, None
        try:
            return _json_decode(bytes(buf)), None
        except ValueError:  # UnicodeDecodeError and NaN/Infinity (not JSON) included
            raise Malformed("the JSON does not parse") from None
    try:
        return _decode_with_records(buf, fds, link, leases, waits)
    except BaseException:
        close_fds(fds)
        raise


_U32 = struct.Struct("<I").unpack_from
_U16 = struct.Struct("<H").unpack_from
_TAIL = RECORD_TAIL.unpack_from
_TAIL_SIZE = RECORD_TAIL.size


def _not_json(constant: str) -> Any:
    # NaN, Infinity and -Infinity are not JSON: Node's JSON.parse refuses them, and so does this side.
    raise ValueError(f"{constant} is not JSON")


_json_decode_unchecked = json.JSONDecoder(parse_constant=_not_json).decode

#: Deepest nesting of arrays and objects accepted in a message. Python's json parses recursively
#: (the interpreter's recursion limit, 1000 frames by default, ends it with a RecursionError); Node's
#: JSON.stringify overflows its stack a few thousand levels down, so no honest Node sender goes much
#: deeper either. Deeper is a malformed message: the link closes with ERR_FRAME_INVALID.
MAX_JSON_DEPTH = 512
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
#: Brackets to '(' and ')', every other byte deleted.
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_DEPTH_STEP = {ord("("): 1, ord(")"): -1}


def _nests_deeper_than(raw: bytes, limit: int) -> bool:
    """Whether the JSON text ``raw`` (UTF-8: no multi-byte sequence holds an ASCII byte) nests arrays
    and objects deeper than ``limit``, brackets inside strings not counted."""
    # Strings out: split at quotes where no escape can hide one, else the string pattern.
    outside = _JSON_STRING.sub(b"", raw) if b"\\" in raw else b"".join(raw.split(b'"')[::2])
    brackets = outside.translate(_BRACKETS, _NOT_BRACKETS)
    # Shallow JSON (the usual) empties in a few passes that each remove the innermost pairs.
    for _ in range(min(limit, 8)):
        if not brackets:
            return False
        brackets = brackets.replace(b"()", b"")
    return max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) > limit - min(limit, 8)


def _json_decode(raw: bytes, errors: str = "strict") -> Any:
    """The JSON text ``raw`` (UTF-8) decoded; ValueError if it does not parse; Malformed if it nests
    deeper than MAX_JSON_DEPTH (or than this thread's stack allows)."""
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _nests_deeper_than(raw, MAX_JSON_DEPTH):
        raise Malformed(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels")
    text = raw.decode("utf-8", errors)
    try:
        return _json_decode_unchecked(text)
    except RecursionError:
        # Within the bound, but this thread was already deep in its stack.
        raise Malformed("the JSON nests deeper than this thread's stack allows") from None


def _parse_records(buf: memoryview) -> tuple[Any, list[Record], int]:
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
        root = _json_decode(bytes(buf[4:at]), "surrogatepass")
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
        path: list[Any] = []
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


def lease_ids_of(buf: memoryview) -> list[int] | None:
    """The lease ids a records payload grants; None when it does not parse or names an id twice
    (message-decoder.ts leaseIdsOf)."""
    try:
        _root, records, _fds = _parse_records(buf)
    except Malformed:
        return None
    ids = [r[3] for r in records if r[3]]
    return ids if len(set(ids)) == len(ids) else None


def _decode_with_records(buf: memoryview, fds: list[int], link: Link, leases: IncomingLeases | None,
                         waits: list[Completion]) -> tuple[Any, list[object] | None]:
    root, records, fd_total = _parse_records(buf)
    if fd_total != len(fds):
        raise Malformed(f"records claim {fd_total} fds but {len(fds)} arrived")
    # Check every lease and placement before decoding anything.
    seen: set[int] = set()
    holder = [root]
    slots = []
    placed: set[tuple[int, object]] = set()
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
        # Two records for one placeholder: the second would replace the first value, stranding its fds.
        spot = (id(parent), key)
        if spot in placed:
            raise Malformed("two records point at the same placeholder")
        placed.add(spot)
        slots.append((parent, key))

    # From here every lease is open: a failure must end them all.
    received: list[LeaseFromPeer | None] = [leases.open(r[3]) if r[3] and leases is not None else None for r in records]
    owned: list[object] = []
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
        if isinstance(value, DeferredValue):
            waits.append(value.ready)
            value = value.value
        if kind not in ("@bigint", "@typed-array") and value is not None and not isinstance(value, (int, str, float, bool)):
            owned.append(value)
        parent, key = slots[i]
        parent[key] = value
    return holder[0], (owned or None)


def _decode_record(kind: str, data: memoryview, fds: list[int], link: Link, lease: LeaseFromPeer | None) -> Any:
    if kind == "@bigint":
        raw = bytes(data)
        if fds or not BIGINT_RE.match(raw):
            raise Malformed("a bigint record is malformed")
        return int(raw)
    if kind == "@typed-array":
        tag = data[0] if len(data) else 0
        size = TAG_SIZE.get(tag)
        n = len(data) - 1
        if fds or size is None or n % size != 0:
            raise Malformed("a typed-array record is malformed")
        if tag in (TAG_UINT8, TAG_DATAVIEW):
            return bytes(data[1:])
        a = array.array(TAG_TYPECODE[tag])
        a.frombytes(data[1:])
        return a
    handler = by_kind.get(kind)
    if handler is None:
        raise IpcError(
            "ERR_NOT_TRANSFERABLE",
            f"received a '{kind}' but no transfer handler for it is registered in this process; import the module "
            "that provides it (import cuda_ipc registers all of its own) before receiving",
        )
    if link.transport not in handler.transports:
        raise IpcError("ERR_NOT_TRANSFERABLE", f"received a '{kind}' on a {link.transport.upper()} link, where that kind "
                       "never travels (PROTOCOL.md 1.1); the message was dropped")
    return handler.decode(data, fds, link, lease)
