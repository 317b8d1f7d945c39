"""The link's wire format (docs/PROTOCOL.md; the Node side is src/link/frame.ts).

Every SOCK_SEQPACKET record is one frame: a 16-byte header and a payload, little-endian::

    0  4  magic 0x4C504943 ("CIPL")
    4  1  version (2)
    5  1  type: 1 HELLO, 2 MESSAGE, 3 GOODBYE, 4 REFUSE, 5 RELEASE
    6  2  flags: MESSAGE only, the payload encoding; 0 for other types
    8  4  payload length: exactly the record length minus 16
   12  2  fd count: exactly the number of fds that arrived with the record
   14  2  reserved, 0
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Union

from ..errors import frame_invalid

#: A frame or the buffer it was received into.
Buffer = Union[bytes, bytearray, memoryview]

FRAME_MAGIC = 0x4C504943
FRAME_VERSION = 2
HEADER_BYTES = 16
MAX_FRAME_BYTES = 128 * 1024
MAX_PAYLOAD_BYTES = MAX_FRAME_BYTES - HEADER_BYTES
#: Most fds in one frame (the Node side's receive buffer holds this many).
MAX_FDS = 64

HELLO = 1
MESSAGE = 2
GOODBYE = 3
REFUSE = 4
RELEASE = 5

# MESSAGE encodings (the header's flags).
ENC_JSON = 0
ENC_RAW = 1
ENC_JSON_WITH_RECORDS = 2

HELLO_PAYLOAD_BYTES = 8
RELEASE_HEAD_BYTES = 8
MAX_RELEASE_IDS = (MAX_PAYLOAD_BYTES - RELEASE_HEAD_BYTES) // 8
MAX_LEASE_ID = 2**53 - 1

REFUSE_UID = 1
REFUSE_PROTOCOL = 2

_HEADER = struct.Struct("<IBBHIHH")


def header(frame_type: int, flags: int, payload_length: int, fd_count: int) -> bytes:
    return _HEADER.pack(FRAME_MAGIC, FRAME_VERSION, frame_type, flags, payload_length, fd_count, 0)


def pack_header_into(buf: bytearray, frame_type: int, flags: int, payload_length: int, fd_count: int) -> None:
    _HEADER.pack_into(buf, 0, FRAME_MAGIC, FRAME_VERSION, frame_type, flags, payload_length, fd_count, 0)


def parse_header(buf: Buffer, length: int, fd_count: int) -> tuple[int, int, int]:
    """Checks the header of a ``length``-byte record that arrived with ``fd_count`` fds.

    Returns (type, flags, payload_length); raises IpcError ERR_FRAME_INVALID for anything out of
    spec, exactly as the Node side does."""
    if length < HEADER_BYTES:
        raise frame_invalid(f"{length} bytes is shorter than the {HEADER_BYTES}-byte header")
    magic, version, ftype, flags, payload_length, declared_fds, reserved = _HEADER.unpack_from(buf, 0)
    if magic != FRAME_MAGIC:
        raise frame_invalid(f"bad magic 0x{magic:x}")
    if version != FRAME_VERSION:
        raise frame_invalid(f"protocol version {version}, this build speaks {FRAME_VERSION}")
    if reserved != 0:
        raise frame_invalid("reserved header bytes are not zero")
    if payload_length != length - HEADER_BYTES:
        raise frame_invalid(f"payload length {payload_length} does not match the {length - HEADER_BYTES} bytes received")
    if declared_fds != fd_count:
        raise frame_invalid(f"header announces {declared_fds} fds but {fd_count} arrived")
    if ftype == MESSAGE:
        if flags > ENC_JSON_WITH_RECORDS:
            raise frame_invalid(f"unknown message encoding {flags}")
        if fd_count > 0 and flags != ENC_JSON_WITH_RECORDS:
            raise frame_invalid("fds arrived with a message that has no transfer records")
    elif ftype in (HELLO, GOODBYE, REFUSE, RELEASE):
        if flags != 0:
            raise frame_invalid(f"flags 0x{flags:x} on a control frame")
        if fd_count != 0:
            raise frame_invalid("fds arrived with a control frame")
        if ftype == HELLO:
            if payload_length != HELLO_PAYLOAD_BYTES:
                raise frame_invalid(f"HELLO payload of {payload_length} bytes")
            if struct.unpack_from("<I", buf, HEADER_BYTES + 4)[0] != 0:
                raise frame_invalid("HELLO reserved bytes are not zero")
        elif ftype == GOODBYE and payload_length != 0:
            raise frame_invalid("GOODBYE with a payload")
        elif ftype == REFUSE and payload_length < 2:
            raise frame_invalid("REFUSE without a reason")
        elif ftype == RELEASE:
            count = struct.unpack_from("<I", buf, HEADER_BYTES)[0] if payload_length >= RELEASE_HEAD_BYTES else 0
            if count == 0 or count > MAX_RELEASE_IDS or payload_length != RELEASE_HEAD_BYTES + 8 * count:
                raise frame_invalid(f"RELEASE of {payload_length} bytes announcing {count} ids")
            if struct.unpack_from("<I", buf, HEADER_BYTES + 4)[0] != 0:
                raise frame_invalid("RELEASE reserved bytes are not zero")
    else:
        raise frame_invalid(f"unknown frame type {ftype}")
    return ftype, flags, payload_length


def hello_frame() -> bytes:
    return header(HELLO, 0, HELLO_PAYLOAD_BYTES, 0) + bytes(HELLO_PAYLOAD_BYTES)


def goodbye_frame() -> bytes:
    return header(GOODBYE, 0, 0, 0)


def refuse_frame(reason: int, text: str) -> bytes:
    payload = struct.pack("<H", reason) + text.encode("utf-8")[:1024]
    return header(REFUSE, 0, len(payload), 0) + payload


_RELEASE_ONE = struct.Struct("<IBBHIHHIIQ")


def release_frame(ids: Sequence[int]) -> bytes:
    """A whole RELEASE frame for 1..MAX_RELEASE_IDS lease ids."""
    n = len(ids)
    if n == 1:
        return _RELEASE_ONE.pack(FRAME_MAGIC, FRAME_VERSION, RELEASE, 0, RELEASE_HEAD_BYTES + 8, 0, 0, 1, 0, ids[0])
    return header(RELEASE, 0, RELEASE_HEAD_BYTES + 8 * n, 0) + struct.pack(f"<II{n}Q", n, 0, *ids)


def read_release_ids(buf: Buffer, payload_length: int) -> list[int]:
    count = (payload_length - RELEASE_HEAD_BYTES) // 8
    ids = list(struct.unpack_from(f"<{count}Q", buf, HEADER_BYTES + RELEASE_HEAD_BYTES))
    for i in ids:
        if i == 0 or i > MAX_LEASE_ID:
            raise frame_invalid("RELEASE of lease id 0 or of an id above 2^53")
    return ids
