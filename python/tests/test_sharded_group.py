"""The sharded sync group on the CPU (host memory): whole groups of ranks in threads of this process
and in processes of their own, FSDP Shard(0) trainers to tensor-parallel engines with fused, padded
and strided destinations, values checked against slicing the whole tensors; repeated syncs and
versions; a member killed mid-sync (ERR_SHARD_PEER_LOST: ranks, half-written tensors, version
unchanged) and its replacement re-planning the group; a timeout naming the ranks waited for;
relayout; bad control messages (ERR_SHARD_PROTOCOL)."""
from __future__ import annotations

import gc
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import unittest
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from cuda_ipc import HostArray, IpcError, connect
from cuda_ipc.tensors.sharded import LayoutBuilder, ShardError, ShardGroup, encode_layout, plan_sharded
from cuda_ipc.tensors.sharded.group_wire import (
    AT_DESTINATION, AT_HUB, AT_MEMBER, AT_SOURCE, Join, Plan, Ready, go_message, join_message, parse_message, plan_message, ready_message,
)
from cuda_ipc.tensors.sharded.host_copy import CopyPair, HostMemory, HostRunCopier
from cuda_ipc.tensors.sharded.plan import PlanPair
from cuda_ipc.tensors.sharded.runs import PlanRun

from .test_link import open_fds
from .sharded_group_fixture import allocate, check_destinations, colocated, engine, fill_sources, fsdp_to_tp, trainer

MEMBER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharded_member.py")
TOKEN = "sharded-group-test-token-0123456789"
_names = itertools.count()


def unique(what: str) -> str:
    return f"shg-{os.getpid()}-{what}-{next(_names)}"


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    """Waits for a state the test cannot be told of otherwise, failing loudly past a generous deadline."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds} s")
        time.sleep(0.005)


class Group:
    """Ranks in threads of this process: rank layouts[0] hosts on ``address``."""

    def __init__(self, layouts: list[Any], address: str, token: str | None = None, members: list[int] | None = None):
        self.layouts = layouts
        self.mem = [allocate(x) for x in layouts]
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.hub = ShardGroup.host(listen=address, size=len(layouts), layout=layouts[0], sources=self.mem[0][0],
                                   destinations=self.mem[0][1], token=token, timeout=0)
        joining = [self.pool.submit(ShardGroup.join, connect=self.hub.address or address, layout=layouts[i], sources=self.mem[i][0],
                                    destinations=self.mem[i][1], token=token, timeout=30) for i in (members or range(1, len(layouts)))]
        self.joining = joining
        self.groups: list[ShardGroup] = [self.hub]

    def ready(self) -> None:
        self.hub.wait_ready(30)
        self.groups += [f.result(timeout=30) for f in self.joining]

    def fill(self, version: int) -> None:
        for x, (s, _) in zip(self.layouts, self.mem):
            fill_sources(x, s, version)

    def sync(self, groups: list[ShardGroup] | None = None, timeout: float = 30) -> list[Future[Any]]:
        return [self.pool.submit(g.sync, timeout) for g in (groups or self.groups)]

    def problems(self, version: int) -> list[str]:
        out: list[str] = []
        for x, (_, d) in zip(self.layouts, self.mem):
            if x.destinations:
                out += check_destinations(x, d, version)
        return out

    def close(self) -> None:
        for g in reversed(self.groups):
            g.close()
        self.pool.shutdown(wait=True)


class Member:
    """A rank in a process of its own (sharded_member.py)."""

    def __init__(self, spec: dict[str, Any]):
        self.proc = subprocess.Popen([sys.executable, MEMBER, json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the member exited ({self.proc.wait(timeout=10)}) without answering")
        out: dict[str, Any] = json.loads(line)
        return out

    def command(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


class Holding:
    """A copier that holds its copy until ``release`` is set (the test decides what happens meanwhile)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()

    def copy(self) -> int:
        self.entered.set()
        if not self.release.wait(30):
            raise AssertionError("the copy was never released")
        n: int = self.inner.copy()
        return n

    def close(self) -> None:
        self.inner.close()


class FsdpToTensorParallel(unittest.TestCase):
    def test_fsdp_shard0_to_tp2_over_tcp_values_exact_after_every_sync_versions_count(self):
        fds = open_fds()
        threads = threading.active_count()
        g = Group(fsdp_to_tp(2, 2), "tcp://127.0.0.1:0", TOKEN)
        try:
            g.ready()
            self.assertEqual([x.epoch for x in g.groups], [1, 1, 1, 1])
            self.assertTrue(g.hub.address and g.hub.address.startswith("tcp://127.0.0.1:"))
            for v in (1, 2, 3):
                g.fill(v)
                results = [f.result(timeout=30) for f in g.sync()]
                self.assertEqual([r.version for r in results], [v] * 4)
                self.assertEqual(g.problems(v), [], f"sync {v}")
                self.assertEqual([x.version for x in g.groups], [v] * 4)
            whole = plan_sharded(g.layouts)
            for r, x in zip(results, g.layouts):
                self.assertEqual(r.sent, sum(p.bytes for p in whole.pairs if p.src == x.rank))
                self.assertEqual(r.received, sum(p.bytes for p in whole.pairs if p.dst == x.rank))
                self.assertEqual(r.paths["ipc"], r.received, "one node: every run goes over IPC")
            self.assertGreater(results[2].received, 0)
            with self.assertRaises(IpcError) as cm:
                g.groups[0].sync(5, stream=1)
            self.assertEqual(cm.exception.code, "ERR_INVALID_ARG")
            self.assertIn("stream is for device memory; rank 0 holds host memory", str(cm.exception))
        finally:
            g.close()
        # Nothing stays: every link, listener, mapping and thread of the four ranks goes with close().
        del g, results
        gc.collect()
        wait_until(lambda: open_fds() <= fds and threading.active_count() <= threads, "the group's fds and threads going")

    def test_colocated_ranks_copy_their_own_runs_locally_and_the_rest_over_ipc(self):
        g = Group([colocated(0, 2, 2, 0), colocated(1, 2, 2, 1)], unique("colo"))
        try:
            g.ready()
            for v in (5, 6):
                g.fill(v)
                results = [f.result(timeout=30) for f in g.sync()]
                self.assertEqual(g.problems(v), [])
            self.assertEqual([r.version for r in results], [2, 2])
            for r in results:
                self.assertGreater(r.paths["local"], 0)
                self.assertGreater(r.paths["ipc"], 0)
                self.assertEqual(r.paths["local"] + r.paths["ipc"], r.received)
            # The hub's close ends the group: the member's sync fails naming the hub's rank.
            g.hub.close()
            with self.assertRaises(ShardError) as cm:
                g.groups[1].sync(timeout=30)
            self.assertEqual((cm.exception.code, cm.exception.detail["ranks"], cm.exception.detail["version"]), ("ERR_SHARD_PEER_LOST", [0], 2))
        finally:
            g.close()


class Failures(unittest.TestCase):
    def test_member_killed_mid_sync_peer_lost_version_unchanged_then_a_replacement_replans(self):
        address = unique("kill")
        layouts = [colocated(0, 2, 2, 0), trainer(1, 2), engine(2, 2, 1)]
        g = Group(layouts, address, members=[1])
        spec = {"join": address, "layout": ["engine", 2, 2, 1]}
        member = Member(spec)
        replacement: Member | None = None
        try:
            g.ready()
            self.assertEqual(member.read()["ready"], True)
            g.fill(1)
            pending = g.sync()
            member.command("sync 1")
            self.assertEqual(member.read(), {"version": 1, "problems": [], "paths": {"local": 0, "ipc": member_bytes(layouts, 2), "nccl": 0}, "epoch": 1})
            self.assertEqual([f.result(timeout=30).version for f in pending], [1, 1])
            self.assertEqual(check_destinations(layouts[0], g.mem[0][1], 1), [])
            # Sync 2: rank 2 never takes part. Rank 0 takes rank 1's go and starts copying; rank 2 dies
            # while that copy runs (held here until rank 0 learnt of the loss).
            copier = Holding(g.hub._copier)
            g.hub._copier = copier
            g.fill(2)
            pending = g.sync()
            self.assertTrue(copier.entered.wait(30), "rank 0 did not start its copy")
            self.assertEqual(g.hub.waiting_for, [2])
            member.proc.kill()
            member.proc.wait(timeout=10)
            wait_until(lambda: g.hub._failure is not None, "rank 0 learning that rank 2 is lost")
            copier.release.set()
            errors = [expect_error(self, f, "ERR_SHARD_PEER_LOST") for f in pending]
            self.assertEqual([e.detail["ranks"] for e in errors], [[2], [2]])
            self.assertEqual([e.detail["version"] for e in errors], [1, 1], "the version stays")
            self.assertEqual(errors[0].detail["half_written"], [t.name for t in layouts[0].destinations])
            self.assertEqual(errors[1].detail["half_written"], [], "rank 1 has no destinations")
            self.assertEqual([x.version for x in g.groups], [1, 1])
            # Until the group plans again, syncs fail at once with the loss.
            with self.assertRaises(ShardError) as cm:
                g.groups[1].sync(timeout=30)
            self.assertEqual((cm.exception.code, cm.exception.detail["ranks"]), ("ERR_SHARD_PEER_LOST", [2]))
            wait_until(lambda: len(g.groups[1]._served) == 1, "rank 1 dropping its serve link to the dead rank")
            # A replacement rank 2 joins: epoch 2, and the group syncs again; versions continue.
            replacement = Member(spec)
            self.assertEqual(replacement.read(), {"ready": True, "rank": 2, "epoch": 2})
            self.assertEqual([x.epoch for x in g.groups], [2, 2])
            g.fill(3)
            pending = g.sync()
            replacement.command("sync 3")
            self.assertEqual(replacement.read()["problems"], [])
            self.assertEqual([f.result(timeout=30).version for f in pending], [2, 2])
            self.assertEqual(check_destinations(layouts[0], g.mem[0][1], 3), [])
        finally:
            member.close()
            if replacement is not None:
                replacement.command("exit")
                replacement.close()
            g.close()

    def test_host_ranks_on_two_nodes_leave_the_group_unsupported_instead_of_waiting(self):
        address = unique("nodes")
        a = LayoutBuilder(rank=0, node="a", gpu=0).hold("w", dtype="int32", shape=(4,)).build()
        b = LayoutBuilder(rank=1, node="b", gpu=0).need("w", dtype="int32", shape=(4,)).build()
        hub = ShardGroup.host(listen=address, size=2, layout=a, sources=[HostArray.allocate("int32", (4,))], timeout=0)
        try:
            with self.assertRaises(ShardError) as cm:
                ShardGroup.join(connect=address, layout=b, destinations=[HostArray.allocate("int32", (4,))], timeout=30)
            self.assertEqual(cm.exception.code, "ERR_UNSUPPORTED")
            self.assertIn("'nccl' path", str(cm.exception))
            with self.assertRaises(ShardError) as cm:
                hub.wait_ready(30)
            self.assertEqual(cm.exception.code, "ERR_UNSUPPORTED")
        finally:
            hub.close()

    def test_timeout_names_the_ranks_waited_for_and_the_group_needs_a_new_plan(self):
        layouts = [engine(0, 1, 0), trainer(1, 2, 0), trainer(2, 2, 1)]
        g = Group(layouts, unique("timeout"))
        try:
            g.ready()
            with self.assertRaises(ShardError) as cm:
                g.hub.sync(timeout=0.3)  # ranks 1 and 2 never sync: their go never comes
            e = cm.exception
            self.assertEqual((e.code, e.detail["waiting_for"], e.detail["version"], e.detail["half_written"]), ("ERR_TIMEOUT", [1, 2], 0, []))
            self.assertIn("ranks 1, 2", str(e))
            with self.assertRaises(ShardError) as cm:
                g.hub.sync(timeout=30)
            self.assertEqual(cm.exception.code, "ERR_TIMEOUT", "failed until a new plan")
            # A source that times out names the destination it waited for.
            with self.assertRaises(ShardError) as cm:
                g.groups[1].sync(timeout=0.3)
            self.assertEqual(cm.exception.detail["waiting_for"], [0])
            # relayout() with the same layout plans the group again (epoch 2); then it syncs.
            g.hub.relayout(g.layouts[0], g.mem[0][0], g.mem[0][1])
            self.assertEqual(g.hub.epoch, 2)
            g.fill(7)
            self.assertEqual([f.result(timeout=30).version for f in g.sync()], [1, 1, 1])
            self.assertEqual(g.problems(7), [])
        finally:
            g.close()

    def test_a_destination_whose_copy_fails_raises_its_error_and_its_source_fails_at_once_naming_it(self):
        g = Group([trainer(0, 1), engine(1, 1, 0)], unique("copyfail"))
        try:
            g.ready()

            class Faulting:
                """What the device copier meets when its kernel faults (a mapping made for the wrong GPU)."""

                def copy(self) -> int:
                    raise RuntimeError("cuStreamSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)")

                def close(self) -> None:
                    pass

            g.fill(2)
            self.assertEqual([f.result(timeout=30).version for f in g.sync()], [1, 1])
            self.assertEqual(g.problems(2), [])
            g.groups[1]._copier = Faulting()  # from the second sync on
            g.fill(3)
            hub, engine_rank = g.sync(timeout=60)
            mine = expect_error(self, engine_rank, "ERR_SHARD_COPY")
            self.assertRegex(str(mine), r"rank 1's copy of version 2 failed: .*ILLEGAL_ADDRESS")
            self.assertIsInstance(mine.__cause__, RuntimeError)
            self.assertEqual((mine.detail["ranks"], mine.detail["version"]), ([], 1), "the version kept")
            self.assertEqual(sorted(mine.detail["half_written"]), sorted(d.name for d in g.layouts[1].destinations), "the copy was writing every one")
            with self.assertRaises(ShardError) as cm:
                g.groups[1].sync(timeout=5)
            self.assertEqual(cm.exception.code, "ERR_SHARD_COPY", "failed until a new plan")
            # The source learns from the dropped serve link, not from its timeout (ERR_TIMEOUT after 60 s).
            e = expect_error(self, hub, "ERR_SHARD_PEER_LOST")
            self.assertEqual((e.detail["ranks"], e.detail["version"]), ([1], 1))
            self.assertEqual([g.hub.version, g.groups[1].version], [1, 1])
        finally:
            g.close()

    def test_relayout_replans_into_new_memory_and_a_refused_one_keeps_the_old(self):
        layouts = [engine(0, 1, 0), trainer(1, 2, 0), trainer(2, 2, 1)]
        g = Group(layouts, unique("relayout"))
        try:
            g.ready()
            g.fill(1)
            [f.result(timeout=30) for f in g.sync()]
            self.assertEqual(g.problems(1), [])
            # The engine's new layout: the same tensors, down_proj contiguous now, in new memory.
            b = LayoutBuilder(rank=0, node="n0", gpu=0)
            for t in layouts[0].destinations:
                pieces = [{"tensor": p.tensor, "shape": next(x.shape for x in layouts[0].tensors if x.name == p.tensor),
                           "start": p.start, "length": p.length, "at": p.at} for p in t.pieces]
                b.need_parameter(t.name, dtype=t.dtype, shape=t.shape, pieces=pieces, padding=t.padding)
            new = b.build()
            self.assertNotEqual(encode_layout(new), encode_layout(layouts[0]))
            _, dst = allocate(new)
            g.hub.relayout(new, [], dst)
            self.assertEqual(g.hub.epoch, 2)
            g.layouts[0], g.mem[0] = new, ([], dst)
            g.fill(2)
            self.assertEqual([f.result(timeout=30).version for f in g.sync()], [2, 2, 2])
            self.assertEqual(g.problems(2), [])
            # A layout no source covers is refused by the hub; the group keeps the one it had.
            bad = LayoutBuilder(rank=0, node="n0", gpu=0).need("nobody_holds", dtype="int32", shape=(4,)).build()
            with self.assertRaises(IpcError) as cm:
                g.hub.relayout(bad, [], [HostArray.allocate("int32", (4,))])
            self.assertEqual(cm.exception.code, "ERR_LAYOUT_UNCOVERED")
            g.fill(3)
            self.assertEqual([f.result(timeout=30).version for f in g.sync()], [3, 3, 3])
            self.assertEqual(g.problems(3), [])
        finally:
            g.close()


class Protocol(unittest.TestCase):
    def test_bad_control_messages_are_err_shard_protocol(self):
        layout = encode_layout(trainer(0, 1))
        good = [(join_message(0, layout, None), AT_HUB, Join), (plan_message(1, [layout], [None], 1 << 20), AT_MEMBER, Plan),
                (ready_message(1, None), AT_MEMBER, Ready)]
        for m, at, kind in good:
            self.assertIsInstance(parse_message(m, at), kind)
        bad = [
            ("not an object", [1, 2], AT_HUB), ("unknown shard", {"shard": "hello"}, AT_HUB), ("shard not a string", {"shard": 1}, AT_HUB),
            ("not on this link", go_message(1, 1), AT_HUB), ("plan at the hub", plan_message(1, [layout], [None], 1), AT_HUB),
            ("missing rank", {"shard": "join", "layout": layout, "serve": None}, AT_HUB),
            ("rank a bool", {**join_message(0, layout, None), "rank": True}, AT_HUB),
            ("rank negative", {**join_message(0, layout, None), "rank": -1}, AT_HUB),
            ("layout a string", {**join_message(0, layout, None), "layout": "CISL"}, AT_HUB),
            ("serve a number", {**join_message(0, layout, None), "serve": 5}, AT_HUB),
            ("epoch 0", plan_message(0, [layout], [None], 1), AT_MEMBER),
            ("serve shorter", plan_message(1, [layout], [], 1), AT_MEMBER),
            ("chunkBytes 0", plan_message(1, [layout], [None], 0), AT_MEMBER),
            ("nccl id short", {"shard": "ready", "epoch": 1, "nccl": {"id": b"x" * 127, "ranks": [0]}}, AT_MEMBER),
            ("nccl ranks unsorted", {"shard": "ready", "epoch": 1, "nccl": {"id": b"x" * 128, "ranks": [1, 0]}}, AT_MEMBER),
            ("version a float", {"shard": "go", "epoch": 1, "version": 1.5}, AT_DESTINATION),
            ("done without epoch", {"shard": "done", "version": 1}, AT_SOURCE),
            ("sources without a set", {"shard": "sources", "epoch": 1, "rank": 0, "tensors": {}}, AT_DESTINATION),
            ("refused code", {"shard": "refused", "code": "nope", "message": ""}, AT_MEMBER),
            ("planned nccl not bool", {"shard": "planned", "epoch": 1, "fingerprint": "ab", "nccl": 0}, AT_HUB),
        ]
        for what, m, at in bad:
            with self.assertRaises(ShardError, msg=what) as cm:
                parse_message(m, at)
            self.assertEqual(cm.exception.code, "ERR_SHARD_PROTOCOL", what)

    def test_the_hub_closes_a_link_that_sends_a_bad_message_and_refuses_bad_joins(self):
        address = unique("proto")
        hub = ShardGroup.host(listen=address, size=2, layout=trainer(0, 1), sources=allocate(trainer(0, 1))[0], timeout=0)
        links = []
        try:
            # A join whose layout does not decode is refused; the link stays for another try.
            link = connect(address)
            links.append(link)
            link.send(join_message(1, b"CISL" + bytes(40), None))
            answer = link.receive(timeout=30)
            self.assertEqual((answer["shard"], answer["code"]), ("refused", "ERR_LAYOUT_INVALID"))
            # A rank already live on another link is refused, and that link closed.
            link.send({"shard": "join", "rank": 0, "layout": encode_layout(trainer(0, 1)), "serve": None})
            self.assertEqual(link.receive(timeout=30)["code"], "ERR_SHARD_PROTOCOL")
            with self.assertRaises(IpcError):
                link.receive(timeout=30)
            # An unknown message is answered ERR_SHARD_PROTOCOL and the sender's link closed.
            other = connect(address)
            links.append(other)
            other.send({"shard": "bogus"})
            answer = other.receive(timeout=30)
            self.assertEqual((answer["shard"], answer["code"]), ("refused", "ERR_SHARD_PROTOCOL"))
            with self.assertRaises(IpcError) as cm:
                other.receive(timeout=30)
            self.assertIn(cm.exception.code, ("ERR_LINK_CLOSED", "ERR_PEER_GONE"))
            self.assertEqual(hub.epoch, 0, "nothing was planned")
        finally:
            for x in links:
                x.close()
            hub.close()


    def test_fingerprints_that_differ_fail_the_epoch_for_all_and_a_serve_link_must_begin_with_hello(self):
        address = unique("fp")
        layout = trainer(0, 1)
        hub = ShardGroup.host(listen=address, size=2, layout=layout, sources=allocate(layout)[0], timeout=0)
        raw = connect(address)
        try:
            raw.send(join_message(1, encode_layout(engine(1, 1, 0)), None))
            plan = raw.receive(timeout=30)
            self.assertEqual((plan["shard"], plan["epoch"], plan["hub"]), ("plan", 1, 0))
            self.assertEqual(parse_message(plan, AT_MEMBER), Plan(1, tuple(plan["layouts"]), (plan["serve"][0], None), plan["chunkBytes"], 0))
            # A serve link that does not begin with hello is closed.
            serve = connect(plan["serve"][0])
            serve.send(go_message(1, 1))
            with self.assertRaises(IpcError):
                serve.receive(timeout=30)
            serve.close()
            raw.send({"shard": "planned", "epoch": 1, "fingerprint": "0" * 64, "nccl": False})
            failed = raw.receive(timeout=30)
            self.assertEqual((failed["shard"], failed["code"], failed["ranks"]), ("failed", "ERR_SHARD_PLAN", [1]))
            with self.assertRaises(ShardError) as cm:
                hub.wait_ready(30)
            self.assertEqual((cm.exception.code, cm.exception.detail["ranks"]), ("ERR_SHARD_PLAN", [1]))
        finally:
            raw.close()
            hub.close()


class HostCopy(unittest.TestCase):
    def test_contiguous_stepped_and_block_runs_and_bounds(self):
        src = memoryview(bytearray(range(256)))
        dst = memoryview(bytearray(256))
        runs = (PlanRun(0, 0, 0, 100, 10, 1, 0, 0),       # one contiguous run
                PlanRun(0, 0, 16, 0, 4, 5, 8, 12),        # 4-byte blocks: a stepped slice
                PlanRun(0, 0, 64, 200, 3, 4, 5, 10))       # 3-byte blocks: block by block
        pair = PlanPair(1, 0, "ipc", sum(r.bytes * r.count for r in runs), runs)
        copier = HostRunCopier()
        copier.compile([CopyPair(pair, [HostMemory(src)])], [HostMemory(dst)])
        self.assertEqual(copier.copy(), pair.bytes)
        want = bytearray(256)
        for r in runs:
            for i in range(r.count):
                want[r.dst_offset + i * r.dst_stride:r.dst_offset + i * r.dst_stride + r.bytes] = \
                    src[r.src_offset + i * r.src_stride:r.src_offset + i * r.src_stride + r.bytes]
        self.assertEqual(bytes(dst), bytes(want))
        copier.close()
        small = PlanPair(1, 0, "ipc", 8, (PlanRun(0, 0, 250, 0, 8, 1, 0, 0),))
        with self.assertRaises(IpcError) as cm:
            copier.compile([CopyPair(small, [HostMemory(src)])], [HostMemory(dst)])
        self.assertEqual(cm.exception.code, "ERR_OUT_OF_RANGE")
        self.assertIn("byte 258", str(cm.exception))


class DeviceTable(unittest.TestCase):
    def test_the_copy_runs_table_has_one_row_per_block_at_the_mapped_addresses_and_checks_bounds(self):
        from cuda_ipc.tensors.sharded.device_copy import table_rows
        from cuda_ipc.tensors.sharded.host_copy import DeviceMemory
        runs = (PlanRun(1, 0, 8, 16, 32, 1, 0, 0), PlanRun(0, 0, 0, 100, 4, 3, 12, 20))
        pair = PlanPair(1, 0, "ipc", 44, runs)
        sources = [DeviceMemory(0, 0x10000, 64), DeviceMemory(0, 0x20000, 64)]
        rows = table_rows([CopyPair(pair, sources)], [DeviceMemory(0, 0x90000, 200)])
        self.assertEqual(rows, ([0x90000 + 16, 0x90000 + 100, 0x90000 + 120, 0x90000 + 140],
                                [0x20000 + 8, 0x10000, 0x10000 + 12, 0x10000 + 24], [32, 4, 4, 4]))
        with self.assertRaises(IpcError) as cm:
            table_rows([CopyPair(pair, sources)], [DeviceMemory(0, 0x90000, 143)])
        self.assertEqual(cm.exception.code, "ERR_OUT_OF_RANGE")
        with self.assertRaises(IpcError) as cm:
            table_rows([CopyPair(pair, [HostMemory(memoryview(bytearray(64)))] * 2)], [DeviceMemory(0, 0x90000, 200)])
        self.assertEqual(cm.exception.code, "ERR_INVALID_ARG")


def member_bytes(layouts: list[Any], rank: int) -> int:
    return sum(p.bytes for p in plan_sharded(layouts).pairs if p.dst == rank)


def expect_error(case: unittest.TestCase, f: Future[Any], code: str) -> ShardError:
    e = f.exception(timeout=30)
    case.assertIsInstance(e, ShardError, repr(e))
    assert isinstance(e, ShardError)
    case.assertEqual(e.code, code, str(e))
    return e



if __name__ == "__main__":
    unittest.main()
