"""The NCCL records (PROTOCOL.md 8.2, 8.3): the cases of test/cpu/nccl-records.test.ts."""
from __future__ import annotations

import struct
import unittest

from cuda_ipc.errors import IpcError
from cuda_ipc.link.messages.nccl_records import CommReference, decode_nccl_buffer, encode_nccl_buffer
from cuda_ipc.tensors.nccl_wire import decode_nccl_tensor_set, encode_nccl_tensor_set, encode_packed_table

ID = bytes(range(1, 17))
UNIQUE = bytes((i * 7) & 0xFF for i in range(128))
UUID = bytes(0xA0 + i for i in range(16))
COMM = CommReference(ID, 2, 1, False, UNIQUE)


class NcclRecordsTest(unittest.TestCase):
    def test_buffer_round_trip(self) -> None:
        plain = decode_nccl_buffer(memoryview(encode_nccl_buffer(COMM, 0, 4096, UUID)))
        self.assertEqual((plain.comm, plain.sequence, plain.nbytes, plain.array), (COMM, 0, 4096, None))
        comm = CommReference(ID, 4, 3, True, None)
        arr = decode_nccl_buffer(memoryview(encode_nccl_buffer(comm, 7, 24, UUID, ("float32", (2, 3)))))
        self.assertEqual((arr.comm, arr.sequence, arr.array), (comm, 7, ("float32", (2, 3))))

    def test_buffer_lies(self) -> None:
        good = encode_nccl_buffer(COMM, 1, 24, UUID, ("float32", (2, 3)))

        def lie(at: int, fmt: str, value: int, pattern: str) -> None:
            b = bytearray(good)
            struct.pack_into(fmt, b, at, value)
            with self.assertRaises(IpcError) as cm:
                decode_nccl_buffer(memoryview(bytes(b)))
            self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID")
            self.assertRegex(str(cm.exception), pattern)

        lie(20, "<I", 0, "rank 0 of 2")
        lie(20, "<I", 2, "rank 2 of 2")
        lie(24, "<I", 5, "unknown communicator flags")
        lie(24, "<I", 0, "unique id field is not zero")
        lie(168, "<I", 20, "not the 20 announced")
        lie(192, "<B", 99, "unknown dtype code 99")
        lie(197, "<B", 1, "reserved bytes")
        with self.assertRaisesRegex(IpcError, "for 2 dimensions"):
            decode_nccl_buffer(memoryview(good[:-8]))

    def test_tensor_set(self) -> None:
        table = encode_packed_table(["layers.0.w", "layers.0.b", "step"], ["bfloat16", "bfloat16", "int64"], [(4, 8), (8,), (1,)], [0, 64, 256])
        r = decode_nccl_tensor_set(memoryview(encode_nccl_tensor_set(COMM, 3, table, 3, 264, 1 << 20)))
        self.assertEqual(r.layout.names, ["layers.0.w", "layers.0.b", "step"])
        self.assertEqual(r.layout.offsets, [0, 64, 256])
        self.assertEqual((r.packed_length, r.chunk_bytes, r.sequence), (264, 1 << 20, 3))
        overlapping = encode_packed_table(["a", "b", "c"], ["bfloat16", "bfloat16", "int64"], [(4, 8), (8,), (1,)], [0, 32, 256])
        for data, pattern in [
            (encode_nccl_tensor_set(COMM, 0, overlapping, 3, 264, 1 << 20), "inside the tensor before it"),
            (encode_nccl_tensor_set(COMM, 0, table, 3, 300, 1 << 20), "last tensor ends at byte 264"),
            (encode_nccl_tensor_set(COMM, 0, table, 3, 264, 4096), "chunk of 4096 bytes"),
            (encode_nccl_tensor_set(COMM, 0, table, 3, 200, 1 << 20), "tensor"),
        ]:
            with self.assertRaises(IpcError) as cm:
                decode_nccl_tensor_set(memoryview(data))
            self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID")
            self.assertRegex(str(cm.exception), pattern)


if __name__ == "__main__":
    unittest.main()
