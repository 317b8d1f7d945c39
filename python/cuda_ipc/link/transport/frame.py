"""The link's wire format (docs/PROTOCOL.md; the Node side is src/link/transport/frame.ts).

Every SOCK_SEQPACKET record is one frame, and a TCP link's byte stream carries them back to back
(stream.py): a 16-byte header and a payload, little-endian::

    0  4  magic 0x4C504943 ("CIPL")
    4  1  version (2)
    5  1  type: 1 HELLO, 2 MESSAGE, 3 GOODBYE, 4 REFUSE, 5 RELEASE, 6 GONE, (7 RING, 8 RING_START:
          Node's frame rings, never announced by this package), 9 NCCL_ABORT (TCP links only)
    6  2  flags: MESSAGE only: bits 0-7 the payload encoding, bit 8 (0x0100) the payload is in the
          attached memfd (large_message.py); 0 for other types
    8  4  payload length: exactly the record length minus 16
   12  2  fd count: exactly the number of fds that arrived with the record
   14  2  reserved, 0
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Union

from ...errors import frame_invalid

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
GONE = 6
RING = 7
RING_START = 8
NCCL_ABORT = 9

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
REFUSE_TOO_LARGE = 3
#: The listener holds as many connections in their handshake as it takes (from this uid, or in all).
REFUSE_BUSY = 4

#: HELLO feature bits: 1 = accepts large messages (PROTOCOL.md 3.1; inline on TCP); 2 = accepts GONE
#: frames (3.2); 8 = takes device memory over NCCL (section 8), set on TCP links only.
FEATURE_LARGE_MESSAGES = 1
FEATURE_GONE = 2
FEATURE_NCCL = 8
OUR_FEATURES = FEATURE_LARGE_MESSAGES | FEATURE_GONE
GONE_HEAD_BYTES = 8
MAX_GONE_KEY_BYTES = 1024
#: MESSAGE flags: bits 0-7 the encoding, bit 8 a large message (large_message.py).
ENCODING_MASK = 0xFF
LARGE_PAYLOAD = 0x0100
LARGE_INLINE_BYTES = 8

#: NCCL_ABORT: 16-byte communicator id, u32 reason, u32 reserved, then at most 1024 bytes of UTF-8.
NCCL_ABORT_HEAD_BYTES = 24
MAX_NCCL_ABORT_TEXT = 1024
#: NCCL_ABORT reasons: the receiver could not take the transfer, NCCL failed, the communicator
#: could not be made (PROTOCOL.md 8.4).
NCCL_ABORT_REASONS = (1, 2, 3)

_HEADER = struct.Struct("<IBBHIHH")


def header(frame_type: int, flags: int, payload_length: int, fd_count: int) -> bytes:
    return _HEADER.pack(FRAME_MAGIC, FRAME_VERSION, frame_type, flags, payload_length, fd_count, 0)


def pack_header_into(buf: bytearray, frame_type: int, flags: int, payload_length: int, fd_count: int) -> None:
    _HEADER.pack_into(buf, 0, FRAME_MAGIC, FRAME_VERSION, frame_type, flags, payload_length, fd_count, 0)


def declared_fds(buf: Buffer) -> int:
    """The fd count a record's header announces (read before the header is checked against it)."""
    return int(_HEADER.unpack_from(buf, 0)[5])


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
        encoding = flags & ENCODING_MASK
        if flags & ~(ENCODING_MASK | LARGE_PAYLOAD):
            raise frame_invalid(f"unknown message flags 0x{flags:x}")
        if encoding > ENC_JSON_WITH_RECORDS:
            raise frame_invalid(f"unknown message encoding {encoding}")
        # A large message's first fd is its payload; the others belong to its records.
        large = bool(flags & LARGE_PAYLOAD)
        if large and (payload_length != LARGE_INLINE_BYTES or fd_count == 0):
            raise frame_invalid(f"a large message must carry an 8-byte length and its memfd (got {payload_length} bytes, {fd_count} fds)")
        if (fd_count - 1 if large else fd_count) > 0 and encoding != ENC_JSON_WITH_RECORDS:
            raise frame_invalid("fds arrived with a message that has no transfer records")
    elif ftype in (HELLO, GOODBYE, REFUSE, RELEASE, GONE, NCCL_ABORT):
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
        elif ftype == GONE and payload_length < GONE_HEAD_BYTES:
            raise frame_invalid(f"GONE payload of {payload_length} bytes")
        elif ftype == NCCL_ABORT and not NCCL_ABORT_HEAD_BYTES <= payload_length <= NCCL_ABORT_HEAD_BYTES + MAX_NCCL_ABORT_TEXT:
            raise frame_invalid(f"NCCL_ABORT payload of {payload_length} bytes")
    else:
        raise frame_invalid(f"unknown frame type {ftype}")
    return ftype, flags, payload_length


def hello_frame(features: int = OUR_FEATURES) -> bytes:
    return header(HELLO, 0, HELLO_PAYLOAD_BYTES, 0) + struct.pack("<II", features, 0)


def hello_features(buf: Buffer) -> int:
    """The feature bits of a received HELLO (parse_header checked its size)."""
    return int(struct.unpack_from("<I", buf, HEADER_BYTES)[0])


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


def release_frames(ids: Sequence[int]) -> list[bytes]:
    """RELEASE frames for any number of lease ids, MAX_RELEASE_IDS to a frame."""
    return [release_frame(ids[i:i + MAX_RELEASE_IDS]) for i in range(0, len(ids), MAX_RELEASE_IDS)]


def read_release_ids(buf: Buffer, payload_length: int) -> list[int]:
    count = (payload_length - RELEASE_HEAD_BYTES) // 8
    ids = list(struct.unpack_from(f"<{count}Q", buf, HEADER_BYTES + RELEASE_HEAD_BYTES))
    for i in ids:
        if i == 0 or i > MAX_LEASE_ID:
            raise frame_invalid("RELEASE of lease id 0 or of an id above 2^53")
    return ids


def read_gone_entries(buf: Buffer, payload_length: int) -> list[tuple[str, bytes]]:
    """The (kind, key) entries of a GONE frame (PROTOCOL.md 3.2); ERR_FRAME_INVALID for a count,
    length or kind that does not add up, as the Node side decides."""
    end = HEADER_BYTES + payload_length
    count, reserved = struct.unpack_from("<II", buf, HEADER_BYTES)
    if count == 0 or reserved != 0:
        raise frame_invalid(f"GONE with count {count} and reserved {reserved}")
    at = HEADER_BYTES + GONE_HEAD_BYTES
    entries: list[tuple[str, bytes]] = []
    for _ in range(count):
        if at + 1 > end:
            raise frame_invalid("GONE entries end before their count")
        kind_length = buf[at]
        at += 1
        if kind_length < 1 or kind_length > 64 or at + kind_length + 2 > end:
            raise frame_invalid("GONE entry kind of a bad length")
        kind = bytes(buf[at:at + kind_length])
        if any(c < 0x21 or c > 0x7E for c in kind):
            raise frame_invalid("GONE entry kind outside printable ASCII")
        at += kind_length
        key_length = struct.unpack_from("<H", buf, at)[0]
        at += 2
        if key_length > MAX_GONE_KEY_BYTES or at + key_length > end:
            raise frame_invalid("GONE entry key of a bad length")
        entries.append((kind.decode("ascii"), bytes(buf[at:at + key_length])))
        at += key_length
    if at != end:
        raise frame_invalid("GONE frame with bytes after its last entry")
    return entries


def nccl_abort_frame(communicator: bytes, reason: int, text: bytes) -> bytes:
    """A whole NCCL_ABORT frame (arguments checked by the caller)."""
    payload = communicator + struct.pack("<II", reason, 0) + text
    return header(NCCL_ABORT, 0, len(payload), 0) + payload


def read_nccl_abort(buf: Buffer, payload_length: int) -> tuple[bytes, int, str]:
    """(communicator id, reason, text) of an NCCL_ABORT frame whose header parse_header checked;
    ERR_FRAME_INVALID for an unknown reason or reserved bits set. The text is advice, read as REFUSE's
    is (bytes that are not UTF-8 become U+FFFD), as the Node side reads it."""
    at = HEADER_BYTES
    communicator = bytes(buf[at:at + 16])
    reason, reserved = struct.unpack_from("<II", buf, at + 16)
    if reason not in NCCL_ABORT_REASONS or reserved != 0:
        raise frame_invalid(f"NCCL_ABORT with reason {reason} and reserved {reserved}")
    text = bytes(buf[at + NCCL_ABORT_HEAD_BYTES:at + payload_length]).decode("utf-8", "replace")
    return communicator, reason, text
