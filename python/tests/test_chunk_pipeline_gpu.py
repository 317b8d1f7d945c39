"""The chunk pipeline (cuda_ipc/tensors/chunk_pipeline.py) on a real GPU with real NCCL, one rank: a
broadcast from this rank of staged chunks gathers each chunk's pieces into its staging slot before
NCCL takes it, and a direct chunk is sent from where it lies. (The receiving side, scattering, needs a
second GPU: test/gpu/nccl-python-link.test.ts.) Skipped, with the reason, without a GPU or NCCL; the
CPU tests run the same code on stand-ins (test_nccl_tensors.py)."""
from __future__ import annotations

import ctypes
import random
import unittest
from ctypes import byref

from cuda_ipc.cuda import driver as drv
from cuda_ipc.cuda.device import Device
from cuda_ipc.cuda.stream import Event, Stream
from cuda_ipc.errors import CudaError
from cuda_ipc.nccl import NcclCommunicator, NcclUnavailableError, load_nccl

MiB = 1 << 20


class ChunkPipelineOnOneGpu(unittest.TestCase):
    def setUp(self) -> None:
        try:
            self.dev = Device.get(0)
            lib = load_nccl()
        except (CudaError, NcclUnavailableError) as e:
            self.skipTest(f"needs a GPU and NCCL: {e}")
        self.comm = NcclCommunicator.init(lib.unique_id(), 1, 0, self.dev)
        self.addCleanup(self.comm.close)
        self.allocs: list[int] = []
        self.addCleanup(self._free)

    def _free(self) -> None:
        with self.dev.activate():
            for p in self.allocs:
                drv.driver().call("cuMemFree", drv.CUdeviceptr(p))

    def alloc(self, n: int) -> int:
        p = drv.CUdeviceptr()
        with self.dev.activate():
            drv.driver().call("cuMemAlloc", byref(p), n)
        self.allocs.append(p.value)
        return p.value

    def read(self, ptr: int, n: int) -> bytes:
        out = ctypes.create_string_buffer(n)
        with self.dev.activate():
            drv.memcpy_dtoh(ctypes.addressof(out), ptr, n)
        return out.raw

    def test_staged_chunks_are_gathered_into_their_slots_and_direct_ones_sent_in_place(self) -> None:
        from cuda_ipc.tensors.chunk_pipeline import ChunkMover, ChunkOperation
        from cuda_ipc.tensors.packed_stream import ChunkRoute

        rng = random.Random(7)
        total = 8 * MiB + 4096
        src = self.alloc(total)
        data = rng.randbytes(total)
        host = ctypes.create_string_buffer(data, total)
        with self.dev.activate():
            drv.memcpy_htod(src, ctypes.addressof(host), total)
        # Chunks 0 and 1: pieces of odd sizes taken from the source out of order (slots 0 and 1);
        # chunk 2 direct.
        sizes0 = [MiB + 3, 17, 2 * MiB - 20]
        at0 = [5 * MiB, 0, 2 * MiB + 1]
        sizes1 = [4096, MiB]
        at1 = [7 * MiB, 3 * MiB + 7]

        def route(sizes: list[int], at: list[int]) -> ChunkRoute:
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
            return ChunkRoute(False, sum(sizes), 0, tuple((o, src + a, n) for o, a, n in zip(offsets, at, sizes)))

        routes = [route(sizes0, at0), route(sizes1, at1), ChunkRoute(True, MiB, src + 6 * MiB, ())]
        stream = Stream(self.dev)
        mover = ChunkMover(self.dev, stream)
        self.addCleanup(mover.close)
        ready = Event(self.dev)
        ready.record(stream.handle)
        for attempt in range(2):  # the second reuses the plan and the table on the device
            mover.queue(self.comm, ChunkOperation("broadcast", 0), routes, after=[ready])
            stream.synchronize()
            self.assertEqual(mover.uploaded > 0, attempt == 0, "the run table is uploaded once")
            for k, (at, sizes) in enumerate(((at0, sizes0), (at1, sizes1))):
                gathered = b"".join(data[a:a + n] for a, n in zip(at, sizes))
                self.assertEqual(self.read(mover._slots[k], len(gathered)), gathered, f"chunk {k} gathered into slot {k}")
            self.assertEqual(self.read(src, total), data, "the sources untouched")


if __name__ == "__main__":
    unittest.main()
