"""The sharded sync group's NCCL path on the CPU: each pair's stream cut into chunks (the chunk rule both
languages follow), rounds and their staging, and whole groups of device memory through the fake
driver and the fake libnccl (two nodes: NCCL rounds beside local copies; one node: mapped sources,
one copy_runs launch), an NCCL failure no rank's loss explains."""
from __future__ import annotations

import os
import unittest
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from cuda_ipc import HostArray, IpcError
from cuda_ipc.tensors.sharded import ShardError, ShardGroup
from cuda_ipc.tensors.sharded.plan import PlanPair
from cuda_ipc.tensors.sharded.runs import PlanRun

from .sharded_group_fixture import allocate, check_destinations, fill_sources
from .test_sharded_group import unique


class NcclRounds(unittest.TestCase):
    def test_a_pairs_stream_is_cut_into_chunks_of_its_packed_runs_and_rounds_stage_what_is_not_one_range(self):
        from cuda_ipc.tensors.sharded.host_copy import DeviceMemory
        from cuda_ipc.tensors.sharded.nccl_runs import SLOT_ALIGN, pair_chunks, plan_rounds, staging_rows
        runs = (PlanRun(0, 1, 0, 0, 100, 1, 0, 0), PlanRun(1, 0, 40, 8, 8, 4, 16, 8), PlanRun(0, 0, 100, 200, 30, 1, 0, 0))
        pair = PlanPair(0, 1, "nccl", 162, runs)
        mems = [DeviceMemory(0, 0x1000, 4096), DeviceMemory(0, 0x8000, 4096)]
        for send in (True, False):
            addresses = []  # every byte of the stream, in order: where it is in local memory
            for r in runs:
                base = mems[r.src_tensor if send else r.dst_tensor].pointer + (r.src_offset if send else r.dst_offset)
                for i in range(r.count):
                    start = base + i * (r.src_stride if send else r.dst_stride)
                    addresses += range(start, start + r.bytes)
            chunks = pair_chunks(pair, mems, send, 64)
            self.assertEqual([c.bytes for c in chunks], [64, 64, 34])
            got = [a for c in chunks for addr, n in c.segments for a in range(addr, addr + n)]
            self.assertEqual(got, addresses)
            for c in chunks:
                flat = [a for addr, n in c.segments for a in range(addr, addr + n)]
                self.assertEqual(c.direct, flat == list(range(flat[0], flat[0] + len(flat))), "direct: one range of memory")
        sent = pair_chunks(pair, mems, True, 64)
        self.assertEqual([c.direct for c in sent], [True, False, False])
        other = pair_chunks(PlanPair(2, 0, "nccl", 8, (PlanRun(0, 0, 0, 0, 8, 1, 0, 0),)), mems, False, 64)
        rounds, slot = plan_rounds([sent, other], 0x100000)
        self.assertEqual([[(e.stream, e.slot_offset) for e in r] for r in rounds], [[(0, -1), (1, -1)], [(0, 0)], [(0, 0)]])
        self.assertEqual(slot, SLOT_ALIGN, "staging: one round's staged chunks, each aligned")
        self.assertEqual(rounds[0][0].address, 0x1000)
        dsts, srcs, sizes = staging_rows(rounds[1][0], True)
        self.assertEqual(dsts[0], 0x100000)
        self.assertEqual(sum(sizes), 64)
        self.assertEqual([d - 0x100000 for d in dsts], [sum(sizes[:i]) for i in range(len(sizes))], "gathered back to back")
        self.assertEqual([s for s, _ in sent[1].segments], srcs)

    def test_each_pairs_chunk_is_the_plan_chunk_over_the_busier_ranks_streams_as_node_cuts_it(self):
        # The figures of Node's twin (test/cpu/sharded-runs-chunks.test.ts): the rule is part of the wire.
        from cuda_ipc.tensors.sharded.nccl_runs import nccl_chunk_bytes

        def pair(src: int, dst: int, path: str = "nccl") -> PlanPair:
            return PlanPair(src, dst, path, 1, ())
        pairs = [pair(s, d) for s in (0, 1) for d in (2, 3, 4, 5)]
        chunk_of = nccl_chunk_bytes(pairs + [pair(2, 2, "local"), pair(0, 1, "ipc")], 64 << 20)
        self.assertEqual([chunk_of(p) for p in pairs], [16 << 20] * 8, "every pair touches a source with 4 streams")
        for r in range(6):
            self.assertLessEqual(sum(chunk_of(p) for p in pairs if r in (p.src, p.dst)), 64 << 20, f"rank {r}'s round")
        two = [pair(0, 1), pair(1, 0)]
        self.assertEqual([nccl_chunk_bytes(two, 64 << 20)(p) for p in two], [32 << 20] * 2)
        self.assertEqual([nccl_chunk_bytes(two, 10_000)(p) for p in two], [4864] * 2, "5000 down to a multiple of 256")
        self.assertEqual([nccl_chunk_bytes(two, 1000)(p) for p in two], [500] * 2, "under 512: as divided")
        self.assertEqual(nccl_chunk_bytes([pair(0, 1)], 3)(pair(0, 1)), 3, "one stream each: the chunk itself")
        three = [pair(0, 1), pair(0, 2), pair(0, 3)]
        self.assertEqual([nccl_chunk_bytes(three, 2)(p) for p in three], [1, 1, 1], "never under one byte")



class FakeDevices(unittest.TestCase):
    """Device memory through the fake driver (host memory standing in for the GPU; copy_runs run on the
    CPU) and the fake libnccl (bytes moved between the communicators of this process): the device
    copier and the NCCL rounds run whole on the CPU, two ranks on two nodes."""

    def setUp(self) -> None:
        from . import fake_cuda
        from .nccl_fixture import use_fake_nccl
        from cuda_ipc.nccl import library as library_mod
        self.saved_env = use_fake_nccl(self, move_timeout_ms=10000)
        library_mod._forget_discoveries()
        self.library_mod = library_mod
        self.fake_cuda = fake_cuda
        self.fake = fake_cuda.install()

    def tearDown(self) -> None:
        self.fake_cuda.uninstall(self.fake)
        os.environ.clear()
        os.environ.update(self.saved_env)
        self.library_mod._forget_discoveries()

    def test_two_nodes_of_device_memory_sync_over_nccl_rounds_and_local_copies_values_exact(self):
        results = self.sync_pair(("a", "b"))
        for r in results:
            self.assertGreater(r.paths["nccl"], 0)
            self.assertGreater(r.paths["local"], 0)
            self.assertEqual(r.paths["ipc"], 0)
            self.assertGreater(r.staging, 0, "a strided chunk went through the staging slot")
            self.assertLessEqual(r.staging, 2 * 256, "one round's staged chunks: a send and a receive, 64 bytes each, aligned")

    def test_one_node_of_device_memory_maps_the_other_ranks_sources_and_copies_in_one_launch(self):
        launches = len(self.fake.launches)
        results = self.sync_pair(("n0", "n0"))
        for r in results:
            self.assertGreater(r.paths["ipc"], 0)
            self.assertGreater(r.paths["local"], 0)
            self.assertEqual((r.paths["nccl"], r.staging), (0, 0))
        self.assertEqual(len(self.fake.launches) - launches, 4, "one copy_runs launch per rank and sync")

    def test_nccl_failing_with_no_rank_lost_fails_each_sync_peer_lost_naming_its_nccl_peer_after_the_verdict_wait(self):
        # NCCL's error (ncclRemoteError from every send and receive) names no rank and no rank dies
        # (the network between them): each rank waits NCCL_VERDICT_S for the hub's verdict, then
        # names its NCCL peers; its version stays.
        errors: list[Any] = []

        def fail_rounds(groups: list[ShardGroup], pool: ThreadPoolExecutor) -> None:
            os.environ["FAKE_NCCL_OP_RESULT"] = "6"
            for f in [pool.submit(g.sync, 30) for g in groups]:
                with self.assertRaises(ShardError) as c:
                    f.result(timeout=30)
                errors.append(c.exception)
            self.assertEqual([g.version for g in groups], [2, 2], "the versions stay")
        self.sync_pair(("a", "b"), then=fail_rounds)
        self.assertEqual([e.code for e in errors], ["ERR_SHARD_PEER_LOST"] * 2)
        self.assertEqual([e.detail["ranks"] for e in errors], [[1], [0]], "each names its NCCL peer")
        for e in errors:
            self.assertIn("its NCCL transfers failed", str(e))
            self.assertIn("the hub named none", str(e))
            self.assertEqual(e.detail["version"], 2)

    def test_a_sync_given_the_sources_stream_waits_for_it_and_not_the_whole_gpu(self):
        class TorchLikeStream:
            cuda_stream = 0x5157

        def with_streams(groups: list[ShardGroup], pool: ThreadPoolExecutor) -> None:
            syncs, stream_syncs = self.fake.syncs, len(self.fake.stream_syncs)
            results = [f.result(timeout=30) for f in [pool.submit(g.sync, 30, s) for g, s in zip(groups, (0x5156, TorchLikeStream()))]]
            self.assertEqual([r.version for r in results], [3, 3])
            self.assertEqual(self.fake.syncs, syncs, "no context-wide synchronize")
            waited = self.fake.stream_syncs[stream_syncs:]
            self.assertEqual([h for h in waited if h in (0x5156, 0x5157)].count(0x5156), 1, "rank 0's stream, given as an int")
            self.assertEqual(waited.count(0x5157), 1, "rank 1's, given as a torch.cuda.Stream's cuda_stream")
            for bad in ("stream 1", -1, True):
                with self.assertRaises(IpcError) as cm:
                    groups[0].sync(30, bad)
                self.assertEqual(cm.exception.code, "ERR_INVALID_ARG")
                self.assertIn("stream must be None, an int CUstream, or a PyTorch, CuPy or cuda.core stream", str(cm.exception))
        self.sync_pair(("a", "b"), then=with_streams)

    def sync_pair(self, nodes: tuple[str, str], then: Callable[[list[ShardGroup], ThreadPoolExecutor], None] | None = None) -> list[Any]:
        import ctypes
        from .sharded_group_fixture import interop
        layouts = [interop(0, 0, nodes[0]), interop(1, 0, nodes[1])]
        host = [allocate(x) for x in layouts]

        def device(a: HostArray) -> Any:
            ptr = self.fake.alloc(a.nbytes)
            return self.fake_cuda.FakeArray(ptr, a.shape, "<i4")
        dev = [([device(a) for a in s], [device(a) for a in d]) for s, d in host]
        address = unique("fake-device")
        pool = ThreadPoolExecutor(max_workers=4)
        groups: list[ShardGroup] = []
        try:
            hub = ShardGroup.host(listen=address, size=2, layout=layouts[0], sources=dev[0][0], destinations=dev[0][1], chunk_bytes=64, timeout=0)
            groups.append(hub)
            member = pool.submit(ShardGroup.join, connect=address, layout=layouts[1], sources=dev[1][0], destinations=dev[1][1], timeout=30)
            hub.wait_ready(30)
            groups.append(member.result(timeout=30))
            for v in (1, 2):
                for x, (s, _), (ds, _) in zip(layouts, host, dev):
                    fill_sources(x, s, v)
                    for h, d in zip(s, ds):
                        ctypes.memmove(d.ptr, bytes(h.memory), h.nbytes)
                results = [f.result(timeout=30) for f in [pool.submit(g.sync, 30) for g in groups]]
                for x, (_, d), (_, dd) in zip(layouts, host, dev):
                    for h, a in zip(d, dd):
                        h.memory[:] = ctypes.string_at(a.ptr, h.nbytes)
                    self.assertEqual(check_destinations(x, d, v), [], f"sync {v}")
            self.assertEqual([g.version for g in groups], [2, 2])
            if then is not None:
                then(groups, pool)
            return results
        finally:
            for g in reversed(groups):
                g.close()
            pool.shutdown(wait=True)


if __name__ == "__main__":
    unittest.main()
