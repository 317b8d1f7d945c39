"""Frame headers at their bounds (link/transport/frame.py's parse_header, the twin of src/link/transport/frame.ts): one
byte or one unit past what is valid is ERR_FRAME_INVALID, the last valid value parses (issue 41;
scripts/mutate-python.py checks that these catch a moved bound)."""
from __future__ import annotations

import struct
import unittest

from cuda_ipc import IpcError
from cuda_ipc.link.transport.frame import (
    ENC_JSON, ENC_JSON_WITH_RECORDS, HEADER_BYTES, MAX_RELEASE_IDS, MESSAGE, RELEASE, REFUSE, header, parse_header,
)


def frame(ftype: int, flags: int, payload: bytes, fds: int = 0) -> bytes:
    return header(ftype, flags, len(payload), fds) + payload


class FrameBoundsTest(unittest.TestCase):
    def invalid(self, pattern: str, buf: bytes, length: int | None = None, fds: int = 0) -> None:
        with self.assertRaises(IpcError) as cm:
            parse_header(buf, len(buf) if length is None else length, fds)
        self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID")
        self.assertRegex(str(cm.exception), pattern)

    def test_header(self) -> None:
        good = frame(MESSAGE, ENC_JSON, b"{}")
        self.assertEqual(parse_header(good, len(good), 0), (MESSAGE, ENC_JSON, 2))
        empty = frame(MESSAGE, ENC_JSON, b"")
        self.assertEqual(parse_header(empty, HEADER_BYTES, 0), (MESSAGE, ENC_JSON, 0), "a bare header")
        self.invalid("15 bytes is shorter than the 16-byte header", empty + b"\0", HEADER_BYTES - 1)
        reserved = bytearray(good)
        reserved[HEADER_BYTES - 1] = 1
        self.invalid("reserved header bytes are not zero", bytes(reserved))
        self.invalid("payload length 2 does not match the 3 bytes received", good + b"\0")
        self.invalid("payload length 2 does not match the 1 bytes received", good[:-1])
        with_fds = frame(MESSAGE, ENC_JSON_WITH_RECORDS, b"{}", 2)
        self.assertEqual(parse_header(with_fds, len(with_fds), 2)[0], MESSAGE)
        self.invalid("header announces 2 fds but 1 arrived", with_fds, fds=1)
        self.invalid("header announces 2 fds but 3 arrived", with_fds, fds=3)

    def test_message_encoding(self) -> None:
        last = frame(MESSAGE, ENC_JSON_WITH_RECORDS, b"{}")
        self.assertEqual(parse_header(last, len(last), 0)[1], ENC_JSON_WITH_RECORDS)
        self.invalid(f"unknown message encoding {ENC_JSON_WITH_RECORDS + 1}", frame(MESSAGE, ENC_JSON_WITH_RECORDS + 1, b"{}"))

    def test_refuse_and_release(self) -> None:
        refuse = frame(REFUSE, 0, b"\x01\x00")
        self.assertEqual(parse_header(refuse, len(refuse), 0)[2], 2, "a reason of two bytes")
        self.invalid("REFUSE without a reason", frame(REFUSE, 0, b"\x01"))

        def release(count: int, ids: int) -> bytes:
            return frame(RELEASE, 0, struct.pack("<II", count, 0) + bytes(8 * ids))

        self.assertEqual(parse_header(release(1, 1), len(release(1, 1)), 0)[0], RELEASE)
        most = release(MAX_RELEASE_IDS, MAX_RELEASE_IDS)
        self.assertEqual(parse_header(most, len(most), 0)[0], RELEASE, "the most ids a frame holds")
        self.invalid(f"announcing {MAX_RELEASE_IDS + 1} ids", release(MAX_RELEASE_IDS + 1, MAX_RELEASE_IDS + 1))
        self.invalid("RELEASE of 8 bytes announcing 0 ids", release(0, 0))
        self.invalid("RELEASE of 16 bytes announcing 0 ids", release(0, 1))
        self.invalid("RELEASE of 24 bytes announcing 1 ids", release(1, 2))


if __name__ == "__main__":
    unittest.main()
