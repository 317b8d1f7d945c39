"""Every check of the NCCL records at its bound: the cases of test/cpu/nccl-records-bounds.test.ts
(issue 41; scripts/mutate-python.py checks that these catch a moved bound)."""
from __future__ import annotations

import struct
import unittest

from cuda_ipc.errors import IpcError
from cuda_ipc.link.messages.nccl_records import CommReference, decode_nccl_buffer, encode_nccl_buffer
from cuda_ipc.tensors.nccl_wire import decode_nccl_tensor_set, encode_nccl_tensor_set, encode_packed_table
from cuda_ipc.tensors.wire import encode_table

HEAD = 168
FIXED = HEAD + 32
SET_HEADER = 48
MAX_NDIM = 32
ID = bytes(range(1, 17))
UUID = bytes(0xA0 + i for i in range(16))
COMM = CommReference(ID, 2, 1, False, None)


def changed(good: bytes, at: int, fmt: str, value: int) -> memoryview:
    b = bytearray(good)
    struct.pack_into(fmt, b, at, value)
    return memoryview(bytes(b))


class NcclRecordBoundsTest(unittest.TestCase):
    def invalid(self, pattern: str, f, *args) -> None:  # type: ignore[no-untyped-def]
        with self.assertRaises(IpcError) as cm:
            f(*args)
        self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID")
        self.assertRegex(str(cm.exception), pattern)

    def test_transfer_head(self) -> None:
        good = encode_nccl_buffer(COMM, 5, 8, UUID)
        self.assertEqual(len(good), FIXED)
        r = decode_nccl_buffer(memoryview(good))
        self.assertEqual((r.comm, r.sequence, r.nbytes, r.device_uuid), (COMM, 5, 8, UUID))
        self.invalid("167 bytes is shorter than its 168-byte head", decode_nccl_buffer, memoryview(good[:HEAD - 1]))
        self.invalid("168 bytes is shorter than its 200 fixed bytes", decode_nccl_buffer, memoryview(good[:HEAD]))
        self.invalid("199 bytes is shorter than its 200 fixed bytes", decode_nccl_buffer, memoryview(good[:FIXED - 1]))
        self.invalid("reserved bytes are not zero", decode_nccl_buffer, changed(good, 28, "<I", 1))
        self.assertEqual(decode_nccl_buffer(changed(good, 160, "<Q", (1 << 53) - 1)).sequence, (1 << 53) - 1)
        self.invalid("sequence number is past 2\\^53", decode_nccl_buffer, changed(good, 160, "<Q", 1 << 53))
        self.invalid("unique id field is not zero without its flag", decode_nccl_buffer, changed(good, HEAD - 9, "<B", 1))
        self.invalid("unknown communicator flags 0x4", decode_nccl_buffer, changed(good, 24, "<I", 4))

    def test_buffer(self) -> None:
        plain = encode_nccl_buffer(COMM, 0, 1, UUID)
        self.assertEqual(decode_nccl_buffer(memoryview(plain)).nbytes, 1)
        self.invalid("a length of 0 bytes", decode_nccl_buffer, changed(plain, HEAD, "<Q", 0))
        self.invalid("a length of 9007199254740992 bytes", decode_nccl_buffer, changed(plain, HEAD, "<Q", 1 << 53))
        no_dtype = bytearray(plain) + bytes(8)
        no_dtype[HEAD + 25] = 1
        self.invalid("dimensions without a dtype", decode_nccl_buffer, memoryview(bytes(no_dtype)))

        def ones(ndim: int) -> bytes:
            return encode_nccl_buffer(COMM, 0, 4, UUID, ("float32", (1,) * ndim))

        self.assertEqual(len(decode_nccl_buffer(memoryview(ones(MAX_NDIM))).array[1]), MAX_NDIM)  # type: ignore[index]
        self.invalid(f"{MAX_NDIM + 1} dimensions \\(at most {MAX_NDIM}\\)", decode_nccl_buffer, memoryview(ones(MAX_NDIM + 1)))
        arr = encode_nccl_buffer(COMM, 0, 24, UUID, ("float32", (2, 3)))
        self.invalid("is 24 bytes, not the 20 announced", decode_nccl_buffer, changed(arr, HEAD, "<Q", 20))
        self.invalid("is 24 bytes, not the 28 announced", decode_nccl_buffer, changed(arr, HEAD, "<Q", 28))
        self.invalid("reserved bytes are not zero", decode_nccl_buffer, changed(arr, HEAD + 26, "<B", 1))
        self.invalid("reserved bytes are not zero", decode_nccl_buffer, changed(arr, FIXED - 1, "<B", 1))
        self.invalid("224 bytes for 2 dimensions", decode_nccl_buffer, memoryview(arr + bytes(8)))

    def test_tensor_set(self) -> None:
        one = encode_packed_table(["x"], ["uint8"], [(1,)], [0])
        good = encode_nccl_tensor_set(COMM, 0, one, 1, 1, 1 << 20)
        r = decode_nccl_tensor_set(memoryview(good))
        self.assertEqual((r.layout.names, r.packed_length), (["x"], 1))
        at = HEAD
        self.invalid("215 bytes is shorter than its head and header", decode_nccl_tensor_set, memoryview(good[:at + SET_HEADER - 1]))
        bare = changed(good[:at + SET_HEADER], at + 12, "<I", 0)  # a head and header, an empty table
        with self.assertRaises(IpcError) as cm:
            decode_nccl_tensor_set(bare)
        self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID")
        self.assertNotIn("shorter than its head", str(cm.exception))
        self.invalid("bad magic", decode_nccl_tensor_set, changed(good, at, "<B", good[at] ^ 1))
        self.invalid("version 2, this build reads 1", decode_nccl_tensor_set, changed(good, at + 4, "<H", 2))
        for off in (6, 7, 32, 47):
            self.invalid("reserved bytes are not zero", decode_nccl_tensor_set, changed(good, at + off, "<B", 1))
        self.invalid("no tensors", decode_nccl_tensor_set, changed(good, at + 8, "<I", 0))
        self.invalid("a packed length of 0", decode_nccl_tensor_set, changed(good, at + 16, "<Q", 0))
        self.invalid(f"its table should be {len(one)} bytes, {len(one) + 1} follow", decode_nccl_tensor_set, memoryview(good + b"\0"))
        self.invalid(f"its table should be {len(one)} bytes, {len(one) - 1} follow", decode_nccl_tensor_set, memoryview(good[:-1]))

    def test_a_tensor_that_is_not_c_contiguous(self) -> None:
        c, transposed = (12, 4), (4, 8)
        for strides in ([transposed, c], [c, transposed]):
            names = ["t", "c"] if strides[0] == transposed else ["c", "t"]
            table = encode_table(names, ["float32", "float32"], [(2, 3), (2, 3)], strides, [0, 24], [0, 0], 1)
            self.invalid("tensor 't' is not C-contiguous", decode_nccl_tensor_set, memoryview(encode_nccl_tensor_set(COMM, 0, table, 2, 48, 1 << 20)))


if __name__ == "__main__":
    unittest.main()
