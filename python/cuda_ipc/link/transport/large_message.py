"""Messages larger than a frame (docs/PROTOCOL.md 3.1; the Node side is src/link/transport/large-message.ts).

The whole payload travels in a memfd sealed against any change, attached as the frame's first fd;
the frame itself carries the payload's length. The receiver checks the seals and the size before
reading, so a peer can neither lie about the length nor change the bytes while they are decoded,
and reading (pread, no mapping) can never fault.
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct

from ...errors import IpcError, frame_invalid
from .frame import MAX_PAYLOAD_BYTES, Buffer

#: Default largest message (payload bytes) a link sends or accepts: 256 MiB, the default inbox bound,
#: as on the Node side.
DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20
#: MESSAGE flag: the payload is in the attached memfd.
LARGE_PAYLOAD = 0x0100
#: A large message's frame payload: the u64 length of the real payload.
LARGE_INLINE_BYTES = 8
_MAX_LENGTH = 2**53 - 1

_F_ADD_SEALS = int(getattr(fcntl, "F_ADD_SEALS", 1033))
_F_GET_SEALS = int(getattr(fcntl, "F_GET_SEALS", 1034))
_SEAL_SEAL = int(getattr(fcntl, "F_SEAL_SEAL", 1))
_SEAL_SHRINK = int(getattr(fcntl, "F_SEAL_SHRINK", 2))
_SEAL_GROW = int(getattr(fcntl, "F_SEAL_GROW", 4))
_SEAL_WRITE = int(getattr(fcntl, "F_SEAL_WRITE", 8))
#: Seals a large message's memfd must carry: its size and its bytes are fixed.
LARGE_PAYLOAD_SEALS = _SEAL_SHRINK | _SEAL_GROW | _SEAL_WRITE

_U64 = struct.Struct("<Q")


def check_max_message_bytes(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_message_bytes must be an int, got {type(value).__name__}")
    if value < 1 or value > _MAX_LENGTH:
        raise ValueError(f"max_message_bytes must be between 1 and 2**53-1, got {value}")
    return value


def too_large_to_send(n: int, limit: int) -> IpcError:
    return IpcError(
        "ERR_MESSAGE_TOO_LARGE",
        f"link.send: the encoded message needs {n} bytes, more than this link sends (max_message_bytes {limit}); "
        "send bulk data in a HostBuffer or a device buffer instead, or raise max_message_bytes",
        limit="max_message_bytes")


def write_large_payload(payload: Buffer) -> int:
    """A new memfd holding ``payload``, sealed (LARGE_PAYLOAD_SEALS and F_SEAL_SEAL); the caller owns
    the fd. Running out of fds is ERR_FD_LIMIT."""
    try:
        fd = os.memfd_create("cuda-ipc-message", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise IpcError("ERR_FD_LIMIT", "link.send: a large message needs a memfd, and this process has no descriptor left "
                           "(see `ulimit -n`); close buffers or links you no longer need") from None
        raise
    try:
        view = memoryview(payload).cast("B")
        at = 0
        while at < len(view):
            at += os.pwrite(fd, view[at:], at)
        fcntl.fcntl(fd, _F_ADD_SEALS, LARGE_PAYLOAD_SEALS | _SEAL_SEAL)
        return fd
    except BaseException:
        os.close(fd)
        raise


def large_frame_length(buf: Buffer, header_bytes: int) -> int:
    """The payload length a large message's frame announces (its 8-byte payload)."""
    return int(_U64.unpack_from(buf, header_bytes)[0])


def check_large_length(length: int, limit: int) -> None:
    """Checks the announced length: ERR_FRAME_INVALID out of spec, ERR_MESSAGE_TOO_LARGE over ``limit``."""
    if length > _MAX_LENGTH:
        raise frame_invalid("a large message announces more than 2^53 bytes")
    if length <= MAX_PAYLOAD_BYTES:
        raise frame_invalid(f"a large message of {length} bytes would have fit in a frame")
    check_message_length(length, limit)


def check_message_length(length: int, limit: int) -> None:
    if length > limit:
        raise IpcError(
            "ERR_MESSAGE_TOO_LARGE",
            f"the peer sent a message of {length} bytes, more than this link accepts (max_message_bytes {limit}); the link was closed",
            limit="max_message_bytes")


def read_large_payload(fd: int, length: int) -> bytearray:
    """The ``length``-byte payload in the memfd ``fd`` (not closed here); ERR_FRAME_INVALID when the fd
    is not a memfd sealed with LARGE_PAYLOAD_SEALS or its size is not ``length``."""
    try:
        seals = fcntl.fcntl(fd, _F_GET_SEALS)
    except OSError:
        raise frame_invalid("the payload fd of a large message is not a memfd") from None
    if seals & LARGE_PAYLOAD_SEALS != LARGE_PAYLOAD_SEALS:
        raise frame_invalid("the memfd of a large message is not sealed against writing, shrinking and growing")
    size = os.fstat(fd).st_size
    if size != length:
        raise frame_invalid(f"a large message announces {length} bytes but its memfd holds {size}")
    payload = bytearray(length)
    view = memoryview(payload)
    at = 0
    while at < length:
        n = os.preadv(fd, [view[at:]], at)
        if n == 0:
            raise frame_invalid(f"the memfd of a large message ended after {at} of {length} bytes")
        at += n
    return payload
