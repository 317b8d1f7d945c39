"""The packed stream of an nccl-tensor-set: the same cases as test/cpu/packed-stream.test.ts."""
from __future__ import annotations

import unittest

from cuda_ipc.errors import IpcError
from cuda_ipc.tensors.packed_stream import (
    ChunkRoute, PlacedTensor, SourceTensor, check_packed_layout, pack_offsets, route_chunks,
)

A = object()
B = object()


class PackedStreamTest(unittest.TestCase):
    def test_runs_and_alignment(self) -> None:
        base = 0x7F00_0000_0000
        offsets, length = pack_offsets([
            SourceTensor(1000, base + 64, A),
            SourceTensor(24, base + 1064, A),
            SourceTensor(512, base + 4096 + 8, A),
            SourceTensor(100, 0x10_0000_0000 + 3 * 256 + 2, B),
        ])
        self.assertEqual(offsets, [64, 1064, 1288, 2050])
        self.assertEqual(length, 2150)

    def test_receiver_checks(self) -> None:
        check_packed_layout([0, 8, 16], [8, 8, 4], [4, 8, 2], 20)
        for args, pattern in [
            (([0, 4], [8, 8], [4, 4], 12), "inside the tensor before it"),
            (([0, 10], [8, 8], [4, 4], 18), "not a multiple of its 4-byte"),
            (([0, 8], [8, 8], [4, 4], 32), "last tensor ends at byte 16"),
        ]:
            with self.assertRaises(IpcError) as cm:
                check_packed_layout(*args)
            self.assertEqual(cm.exception.code, "ERR_FRAME_INVALID")
            self.assertRegex(str(cm.exception), pattern)

    def test_routes(self) -> None:
        tensors = [PlacedTensor(0, 1000, 0x1000), PlacedTensor(1000, 2000, 0x1000 + 1000), PlacedTensor(3072, 1000, 0x9000)]
        routes = route_chunks(tensors, 4072, 1024)
        self.assertEqual(routes, [
            ChunkRoute(True, 1024, 0x1000, ()),
            ChunkRoute(True, 1024, 0x1000 + 1024, ()),
            ChunkRoute(False, 1024, 0, ((0, 0x1000 + 2048, 952),)),
            ChunkRoute(True, 1000, 0x9000, ()),
        ])

    def test_dropped_tensors_and_exact_ends(self) -> None:
        routes = route_chunks([PlacedTensor(0, 512, 0x2000), PlacedTensor(512, 512, 0x2200), PlacedTensor(1024, 1024, None)], 2048, 1024)
        self.assertEqual(routes, [ChunkRoute(True, 1024, 0x2000, ()), ChunkRoute(False, 1024, 0, ())])

    def test_own_memory_is_all_direct(self) -> None:
        routes = route_chunks([PlacedTensor(0, 70_010, 0x5000_0000)], 70_010, 16_384)
        self.assertEqual(len(routes), 5)
        self.assertTrue(all(r.direct for r in routes))
        self.assertEqual(routes[4].bytes, 70_010 - 4 * 16_384)


if __name__ == "__main__":
    unittest.main()
