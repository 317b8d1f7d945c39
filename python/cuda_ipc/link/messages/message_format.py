"""Message payloads (docs/PROTOCOL.md; src/link/messages/message-format.ts): what ``link.send(value)`` puts in a
MESSAGE frame (message_encoder.py) and how the receiver rebuilds it (message_decoder.py). What both
sides share of the format is here:

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

import re
import struct

from ...errors import IpcError

MAX_DEPTH = 255
SAFE_INT = 2**53 - 1

# '@typed-array' tags, as the Node side numbers them (message-format.ts TYPED_ARRAYS).
TAG_UINT8, TAG_INT8, TAG_UINT8_CLAMPED, TAG_INT16, TAG_UINT16, TAG_INT32, TAG_UINT32 = 1, 2, 3, 4, 5, 6, 7
TAG_FLOAT32, TAG_FLOAT64, TAG_BIGINT64, TAG_BIGUINT64, TAG_DATAVIEW = 8, 9, 10, 11, 12
# tag -> (array typecode, item size); Uint8Array and DataView arrive as bytes.
TAG_TYPECODE = {
    TAG_INT8: "b", TAG_UINT8_CLAMPED: "B", TAG_INT16: "h", TAG_UINT16: "H", TAG_INT32: "i", TAG_UINT32: "I",
    TAG_FLOAT32: "f", TAG_FLOAT64: "d", TAG_BIGINT64: "q", TAG_BIGUINT64: "Q",
}
TAG_SIZE = {TAG_UINT8: 1, TAG_DATAVIEW: 1, TAG_INT8: 1, TAG_UINT8_CLAMPED: 1, TAG_INT16: 2, TAG_UINT16: 2, TAG_INT32: 4,
             TAG_UINT32: 4, TAG_FLOAT32: 4, TAG_FLOAT64: 8, TAG_BIGINT64: 8, TAG_BIGUINT64: 8}
# (struct format character, item size) -> tag, for array.array and memoryview.
FORMAT_TAG = {("b", 1): TAG_INT8, ("B", 1): TAG_UINT8, ("c", 1): TAG_UINT8, ("h", 2): TAG_INT16, ("H", 2): TAG_UINT16,
               ("i", 4): TAG_INT32, ("I", 4): TAG_UINT32, ("l", 4): TAG_INT32, ("L", 4): TAG_UINT32,
               ("l", 8): TAG_BIGINT64, ("L", 8): TAG_BIGUINT64, ("q", 8): TAG_BIGINT64, ("Q", 8): TAG_BIGUINT64,
               ("f", 4): TAG_FLOAT32, ("d", 8): TAG_FLOAT64}

BIGINT_RE = re.compile(rb"^-?[0-9]{1,10000}$")
RECORD_TAIL = struct.Struct("<BQI")  # fdCount, leaseId, dataLength


class Malformed(IpcError):
    """The payload is out of spec: the link must close."""

    fatal = True

    def __init__(self, why: str):
        super().__init__("ERR_FRAME_INVALID", f"received a malformed message payload: {why}")
