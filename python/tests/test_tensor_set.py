"""Tensor sets between two Python ends: host memory for real, device memory through the fake driver
(tests/fake_cuda.py): each allocation once, values read back, the lease ending when the receiver lets
go, a repeated send reusing its encoding and opening no handle, the table's checks, and in-place
updates with the errors that name what does not match."""
import array
import ctypes
import gc
import os
import struct
import sys
import threading
import time
import unittest

from cuda_ipc import HostArray, HostBuffer, IpcError, TensorMap, share_tensors, update_in_place
from cuda_ipc.ipc import cache as memory_mod
from cuda_ipc.tensors import kernels as copy_kernels
from cuda_ipc.tensors import tensor_map as tensor_map_mod
from cuda_ipc.tensors import tensor_set_transfer as ts_mod
from cuda_ipc.tensors import update as update_mod
from cuda_ipc.tensors.kernels import ROW, plan_runs

from . import fake_cuda
from .test_link import deliver_releases, open_fds, pair


def host_tensors():
    a = HostBuffer.allocate(1 << 16)
    b = HostBuffer.allocate(4096)
    f = a.memory.cast("f")
    for i in range(len(f)):
        f[i] = i * 0.25
    f.release()
    b.write(bytes(i & 255 for i in range(4096)))
    named = {
        "model.layers.0.attn.q.weight": HostArray(a, "float32", (16, 64)),
        "model.layers.0.attn.k.weight": HostArray(a, "float32", (32, 32), offset=4096),
        "model.layers.0.attn.k.weight.T": HostArray(a, "float32", (8, 4), strides=(4, 32), offset=8192),
        "model.layers.1.mlp.ü": HostArray(a, "float32", (10,), strides=(8,), offset=16384),
        "bytes": HostArray(b, "uint8", (2, 100), offset=100),
        "bias.bf16": HostArray(b, "bfloat16", (32,), offset=1024),
    }
    return [a, b], named


class HostSetTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()
        self.la, self.lb = pair()

    def tearDown(self):
        self.la.close()
        self.lb.close()
        gc.collect()
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def test_host_tensors_cross_in_one_message_values_views_and_strides_arrive(self):
        buffers, named = host_tensors()
        self.la.send({"weights": share_tensors(named), "step": 3})
        msg = self.lb.receive(timeout=5)
        self.assertEqual(msg["step"], 3)
        got = msg["weights"]
        self.assertIsInstance(got, TensorMap)
        self.assertEqual(got.memory, "host")
        self.assertEqual(list(got), list(named))
        self.assertEqual(len(got.allocations), 2, "each allocation once")
        for name, sent in named.items():
            v = got.view(name)
            self.assertEqual((v.dtype, v.shape, v.strides), (sent.dtype, sent.shape, sent.strides), name)
            self.assertEqual(v.tolist(), sent.tolist(), name)
        self.assertEqual(got.view("model.layers.0.attn.k.weight.T").tolist()[1], (8192 + 32) / 4 * 0.25)
        # Zero-copy: a write through the received view reaches the sender's memory.
        got.view("model.layers.0.attn.q.weight").values()[3, 0] = -1.0
        self.assertEqual(named["model.layers.0.attn.q.weight"].values()[3, 0], -1.0)
        self.assertEqual(self.la.leases.count, 1, "one lease for the whole message")
        for a in named.values():
            a.close()
        for b in buffers:
            b.close()
        got.close()
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 0)

    def test_a_received_set_is_sent_on_unchanged(self):
        buffers, named = host_tensors()
        lc, ld = pair()
        try:
            self.la.send(share_tensors(named))
            first = self.lb.receive(timeout=5)
            lc.send({"relay": first})
            second = ld.receive(timeout=5)["relay"]
            for name, sent in named.items():
                self.assertEqual(second.view(name).tolist(), sent.tolist())
            first.close()
            second.close()
            deliver_releases(ld, lc)
            deliver_releases(self.lb, self.la)
            self.assertEqual((self.la.leases.count, lc.leases.count), (0, 0))
        finally:
            lc.close()
            ld.close()
            for a in named.values():
                a.close()
            for b in buffers:
                b.close()

    def test_update_in_place_copies_host_tensors_by_name(self):
        buffers, named = host_tensors()
        mine = {n: HostArray.allocate(a.dtype, a.shape) for n, a in named.items()}
        self.la.send(share_tensors(named))
        got = self.lb.receive(timeout=5)
        r = update_in_place(mine, got)
        self.assertEqual((r.copied, r.method, r.operations), (len(named), "host", 0))
        for n, a in named.items():
            self.assertEqual(mine[n].tolist(), a.tolist(), n)
        got.close()
        for x in (*mine.values(), *named.values(), *buffers):
            x.close()

    def test_update_in_place_names_what_does_not_match_and_copies_nothing(self):
        src = {"a": HostArray.allocate("float32", (4,)), "b": HostArray.allocate("float32", (2, 2)),
               "c": HostArray.allocate("int8", (3,)), "extra": HostArray.allocate("uint8", (1,))}
        for a in src.values():
            a.memory[:] = b"\x01" * len(a.memory)
        dst = {"a": HostArray.allocate("float32", (4,)), "b": HostArray.allocate("float32", (4,)),
               "c": HostArray.allocate("uint8", (3,)), "gone": HostArray.allocate("float32", (1,))}
        self.la.send(share_tensors(src))
        got = self.lb.receive(timeout=5)
        with self.assertRaises(IpcError) as cm:
            update_in_place(dst, got)
        e = cm.exception
        self.assertEqual(e.code, "ERR_TENSOR_MISMATCH")
        self.assertIn("'b': shape [2, 2] received, [4] here", str(e))
        self.assertIn("'c': dtype int8 received, uint8 here", str(e))
        self.assertIn("1 missing from what was received ('gone')", str(e))
        self.assertIn("1 received that are not parameters ('extra')", str(e))
        self.assertEqual(dst["a"].tolist(), [0.0] * 4, "nothing was copied")
        dst2 = {"a": dst["a"], "gone": dst["gone"]}
        with self.assertRaisesRegex(IpcError, "strict=False"):
            update_in_place(dst2, got)
        r = update_in_place(dst2, got, strict=False)
        self.assertEqual((r.copied, r.missing, r.unexpected), (1, ["gone"], ["b", "c", "extra"]))
        self.assertEqual(bytes(dst["a"].memory), b"\x01" * 16)
        got.close()
        for x in (*src.values(), *dst.values()):
            x.close()


class DeviceSetTests(unittest.TestCase):
    def setUp(self):
        self.fds = open_fds()
        self.fake = fake_cuda.install()
        self.la, self.lb = pair()

    def tearDown(self):
        self.la.close()
        self.lb.close()
        gc.collect()
        fake_cuda.uninstall(self.fake)
        self.assertEqual(open_fds() - self.fds, set(), "fds leaked by the test")

    def fill(self, ptr, values):
        ctypes.memmove(ptr, struct.pack(f"<{len(values)}f", *values), 4 * len(values))

    def fill_bytes(self, ptr, data):
        ctypes.memmove(ptr, data, len(data))

    def count_parses(self):
        """A list that grows by one for every tensor-set record parsed from now to the test's end."""
        parsed = []
        parse = tensor_map_mod.parse_set
        tensor_map_mod.parse_set = lambda *a: parsed.append(1) or parse(*a)
        self.addCleanup(setattr, tensor_map_mod, "parse_set", parse)
        return parsed

    def weights(self):
        """Six float32 tensors in two allocations (as a caching allocator's segments hold several)."""
        seg1 = self.fake.alloc(1 << 16)
        seg2 = self.fake.alloc(1 << 12)
        named = {}
        for i in range(4):
            ptr = seg1 + 4096 * i + 512
            self.fill(ptr, [i * 100 + k for k in range(64)])
            named[f"layers.{i}.weight"] = fake_cuda.FakeArray(ptr, (8, 8), "<f4", stream=5)
        self.fill(seg2, [-k for k in range(16)])
        named["head.weight"] = fake_cuda.FakeArray(seg2, (4, 4), "<f4")
        named["head.weight.T"] = fake_cuda.FakeArray(seg2, (4, 4), "<f4", strides=(4, 16))
        return seg1, seg2, named

    def test_each_allocation_crosses_once_and_a_repeated_send_reuses_everything(self):
        seg1, seg2, named = self.weights()
        shared = share_tensors(named)
        handles_before = ts_mod.handle_exports
        self.la.send({"weights": shared})
        self.assertEqual(ts_mod.handle_exports - handles_before, 2, "one handle per allocation")
        self.assertEqual(self.fake.stream_syncs.count(5), 1, "each producer stream synchronized once")
        first = self.lb.receive(timeout=5)["weights"]
        self.assertEqual(len(first.allocations), 2)
        memory_mod._local_exports.clear()  # as in another process: open the handles for real
        bases = first.bases()
        self.assertEqual(bases, [seg1, seg2])
        self.assertEqual((self.fake.opened[seg1], self.fake.opened[seg2]), (1, 1))
        v = first.view("layers.2.weight")
        self.assertEqual(v.ptr, seg1 + 2 * 4096 + 512)
        self.assertEqual(struct.unpack("<2f", ctypes.string_at(v.ptr, 8)), (200.0, 201.0))
        self.assertEqual(first.view("head.weight.T").meta.strides, (4, 16))

        # The next step's weights: the same tensors, sent again; the previous set still open.
        calls = len(self.fake.calls)
        self.la.send({"weights": shared})
        self.assertEqual(ts_mod.handle_exports - handles_before, 2, "no handle asked again")
        sent_calls = self.fake.calls[calls:]
        self.assertNotIn("cuPointerGetAttributes", sent_calls, "the encoding was reused: no pointer query")
        second = self.lb.receive(timeout=5)["weights"]
        self.assertIs(second.layout, first.layout, "the same table decodes to the same layout")
        memory_mod._local_exports.clear()
        self.assertEqual(second.bases(), [seg1, seg2])
        self.assertEqual((self.fake.opened[seg1], self.fake.opened[seg2]), (1, 1), "a repeated send opens no handle")
        first.close()
        self.assertEqual(self.fake.opened[seg1], 1, "the second set still maps it")
        second.close()
        self.assertEqual((self.fake.opened[seg1], self.fake.opened[seg2]), (0, 0),
                         "a set's mappings are closed with it, not left idle holding the sender's memory")
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 0)

    def test_a_repeated_record_decodes_from_the_last_and_a_buffer_made_from_it_outlives_the_set(self):
        seg1, seg2, named = self.weights()
        shared = share_tensors(named)
        self.la.send({"weights": shared})
        first = self.lb.receive(timeout=5)["weights"]
        memory_mod._local_exports.clear()  # as in another process
        self.assertEqual(first.bases(), [seg1, seg2])
        parsed = self.count_parses()
        self.la.send({"weights": shared})
        second = self.lb.receive(timeout=5)["weights"]
        self.assertEqual(parsed, [], "the same record as the last one on this link is not parsed again")
        self.assertIs(second.layout, first.layout)
        self.assertEqual(second.bases(), [seg1, seg2])
        self.assertEqual(memory_mod.legacy_cache_stats()["references"], 2, "the second set shares the open first one's mappings")
        self.assertEqual(struct.unpack("<2f", ctypes.string_at(second.view("layers.3.weight").ptr, 8)), (300.0, 301.0))
        self.assertEqual(memory_mod.legacy_cache_stats()["references"], 3, "the buffer a view needs holds its own")
        self.assertEqual(self.fake.opened[seg1], 1, "opened once for all of them")
        first.close()
        self.assertEqual((self.fake.opened[seg1], self.fake.opened[seg2]), (1, 1), "the second set still maps what it shared")
        self.assertEqual(second.bases(), [seg1, seg2])
        kept = second.allocations[0].slice(512, 256)  # outlives the set, as a torch tensor made from it does
        second.close()
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 1, "the second message's lease lasts while memory it brought is used")
        self.assertEqual((self.fake.opened[seg1], self.fake.opened[seg2]), (1, 0), "only the allocation still used stays mapped")
        self.assertEqual(struct.unpack("<f", ctypes.string_at(kept.ptr, 4)), (0.0,))
        kept.close()
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 0)
        self.assertEqual(self.fake.opened[seg1], 0)
        self.assertEqual(memory_mod.legacy_cache_stats()["mappings"], 0)
        # The same record once more, with no set of it open: mapped anew, and given back with it.
        self.la.send({"weights": shared})
        memory_mod._local_exports.clear()
        third = self.lb.receive(timeout=5)["weights"]
        self.assertEqual(third.bases(), [seg1, seg2])
        self.assertEqual((self.fake.opened[seg1], self.fake.opened[seg2]), (1, 1))
        third.close()
        self.assertEqual((self.fake.opened[seg1], self.fake.opened[seg2]), (0, 0))

    def test_a_state_dict_sent_as_several_sets_is_parsed_once_per_set(self):
        seg1, seg2, named = self.weights()
        names = list(named)
        halves = [share_tensors({n: named[n] for n in names[:3]}), share_tensors({n: named[n] for n in names[3:]})]
        parsed = self.count_parses()
        rounds = []
        for _ in range(3):
            for h in halves:
                self.la.send(h)
            rounds.append([self.lb.receive(timeout=5), self.lb.receive(timeout=5)])
        self.assertEqual(len(parsed), 2, "each set's record parsed once; the repeats, taken turn about, are not")
        memory_mod._local_exports.clear()
        for got in rounds:
            self.assertEqual([list(g) for g in got], [names[:3], names[3:]])
            self.assertEqual(got[0].bases(), [seg1])
            self.assertEqual(got[1].bases(), [seg1, seg2])
        self.assertEqual(memory_mod.legacy_cache_stats()["references"], 3, "the open sets of one record share its mappings")
        self.assertEqual((self.fake.opened[seg1], self.fake.opened[seg2]), (1, 1))
        for got in rounds:
            for g in got:
                g.close()
        self.assertEqual((self.fake.opened.get(seg1, 0), self.fake.opened.get(seg2, 0)), (0, 0))
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 0)

    def test_pool_backed_tensors_import_once_per_allocation_and_a_repeat_reuses_the_imports(self):
        pool = self.fake.create_pool()
        seg1 = self.fake.alloc(1 << 16, pool)
        seg2 = self.fake.alloc(4096, pool)
        named = {}
        for i in range(3):
            self.fill(seg1 + 4096 * i, [i * 10 + k for k in range(16)])
            named[f"layers.{i}.weight"] = fake_cuda.FakeArray(seg1 + 4096 * i, (4, 4), "<f4")
        self.fill(seg2, [-1.0, -2.0])
        named["head.bias"] = fake_cuda.FakeArray(seg2, (2,), "<f4")
        shared = share_tensors(named, sync=False)
        self.la.send({"weights": shared})
        first = self.lb.receive(timeout=5)["weights"]
        memory_mod._local_pool_exports.clear()  # as in another process
        self.assertEqual(first.bases(), [seg1, seg2])
        self.assertEqual((self.fake.imported[seg1], self.fake.imported[seg2]), (1, 1))
        self.la.send({"weights": shared})  # the next step: no fd this time, the same record
        second = self.lb.receive(timeout=5)["weights"]
        self.assertIs(second.layout, first.layout)
        self.assertEqual(second.bases(), [seg1, seg2])
        self.assertEqual((self.fake.imported[seg1], self.fake.imported[seg2]), (1, 1), "imported once, shared by both sets")
        self.assertEqual(struct.unpack("<2f", ctypes.string_at(second.view("layers.2.weight").ptr, 8)), (20.0, 21.0))
        self.assertEqual(len(self.lb.handler_state[memory_mod._POOLS_RECEIVED]), 1, "one pool, its fd sent once")
        first.close()
        kept = second.allocations[0].slice(0, 64)
        second.close()
        self.assertEqual((self.fake.imported[seg1], self.fake.imported[seg2]), (1, 0), "only the allocation still used stays imported")
        self.assertEqual(struct.unpack("<f", ctypes.string_at(kept.ptr, 4)), (0.0,))
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 1, "the second message's lease lasts while memory it brought is used")
        kept.close()
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 0)
        self.assertEqual(self.fake.imported[seg1], 0)
        self.lb.close()
        self.assertEqual(len(self.fake.destroyed), 1, "the imported pool is destroyed once the link and the sets let go")

    def test_a_first_sync_maps_as_it_is_received_off_the_receiving_thread(self):
        segs = [self.fake.alloc(4096) for _ in range(12)]
        named = {f"layers.{i}.w": fake_cuda.FakeArray(seg + 64, (4,), "<f4") for i, seg in enumerate(segs)}
        opened_on = set()
        open_handle = self.fake.cuIpcOpenMemHandle

        def counted(*args):
            opened_on.add(threading.get_ident())
            return open_handle(*args)
        self.fake.cuIpcOpenMemHandle = counted
        self.la.send({"weights": share_tensors(named, sync=False)})
        memory_mod._local_exports.clear()  # as in another process, before it arrives
        got = self.lb.receive(timeout=5)["weights"]
        self.assertEqual(got.bases(), segs)
        self.assertEqual([self.fake.opened[s] for s in segs], [1] * 12, "each opened once")
        self.assertNotIn(threading.get_ident(), opened_on, "opened while the set was decoded, on other threads")
        self.la.send({"weights": share_tensors(named, sync=False)})
        again = self.lb.receive(timeout=5)["weights"]
        self.assertEqual(again.bases(), segs)
        self.assertEqual([self.fake.opened[s] for s in segs], [1] * 12, "mapped already: nothing opened for the next set")
        got.close()
        again.close()
        self.assertEqual([self.fake.opened[s] for s in segs], [0] * 12)
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 0)

    def test_a_set_closed_before_use_gives_back_what_was_mapped_as_it_arrived(self):
        segs = [self.fake.alloc(4096) for _ in range(3)]
        named = {f"t{i}": fake_cuda.FakeArray(seg, (4,), "<f4") for i, seg in enumerate(segs)}
        self.la.send({"weights": share_tensors(named, sync=False)})
        memory_mod._local_exports.clear()
        gone = [h for h, b in self.fake.handles.items() if b == segs[1]][0]
        del self.fake.handles[gone]  # its exporter freed it before the message arrived
        got = self.lb.receive(timeout=5)["weights"]
        with self.assertRaises(IpcError) as e:
            got.bases()
        self.assertEqual(e.exception.code, "ERR_HANDLE_STALE")
        self.assertEqual([self.fake.opened.get(s, 0) for s in segs], [1, 0, 1], "the others were mapped")
        got.close()
        self.assertEqual([self.fake.opened.get(s, 0) for s in segs], [0, 0, 0])
        opens = []
        open_handle = self.fake.cuIpcOpenMemHandle
        self.fake.cuIpcOpenMemHandle = lambda *args: opens.append(1) or open_handle(*args)
        self.la.send({"weights": share_tensors({"t0": named["t0"]}, sync=False)})
        memory_mod._local_exports.clear()
        unused = self.lb.receive(timeout=5)["weights"]
        unused.close()
        self.assertEqual(opens, [1], "mapped as it arrived")
        self.assertEqual(self.fake.opened.get(segs[0], 0), 0, "closed unused: what it mapped on arrival given back")
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 0)

    def test_a_set_closed_unused_ends_its_lease_and_leaves_nothing_mapped(self):
        seg1, seg2, named = self.weights()
        self.la.send({"weights": share_tensors(named)})
        got = self.lb.receive(timeout=5)["weights"]
        self.assertEqual(self.la.leases.count, 1)
        got.close()
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 0)
        self.assertEqual((self.fake.opened.get(seg1, 0), self.fake.opened.get(seg2, 0)), (0, 0))
        with self.assertRaises(IpcError) as e:
            got.bases()
        self.assertEqual(e.exception.code, "ERR_CLOSED")

    def test_a_first_sync_asks_and_opens_its_handles_several_at_once_each_once(self):
        segs = [self.fake.alloc(4096) for _ in range(40)]
        named = {f"layers.{i}.w": fake_cuda.FakeArray(seg + 64, (4,), "<f4") for i, seg in enumerate(segs)}
        threads = set()
        open_handle = self.fake.cuIpcOpenMemHandle

        def counted(*args):
            threads.add(threading.get_ident())
            time.sleep(0.001)  # as a driver call, without the GIL
            return open_handle(*args)
        self.fake.cuIpcOpenMemHandle = counted
        saved = os.environ.get("CUDA_IPC_DRIVER_THREADS")
        os.environ["CUDA_IPC_DRIVER_THREADS"] = "4"
        self.addCleanup(lambda: os.environ.pop("CUDA_IPC_DRIVER_THREADS") if saved is None else os.environ.__setitem__("CUDA_IPC_DRIVER_THREADS", saved))
        before = ts_mod.handle_exports
        shared = share_tensors(named, sync=False)
        self.la.send({"weights": shared})
        self.assertEqual(ts_mod.handle_exports - before, 40, "each allocation's handle asked once")
        first = self.lb.receive(timeout=5)["weights"]
        memory_mod._local_exports.clear()  # as in another process
        self.assertEqual(first.bases(), segs)
        self.assertEqual([self.fake.opened[s] for s in segs], [1] * 40)
        self.assertGreater(len(threads), 1, "the opens ran on several threads")
        self.assertEqual(memory_mod.legacy_cache_stats()["references"], 40)
        # The next sync while the first set is open: the same record, no handle opened again.
        record = shared._encoding.record
        self.la.send({"weights": shared})
        self.assertIs(shared._encoding.record, record, "a repeated send reuses the record it built")
        second = self.lb.receive(timeout=5)["weights"]
        self.assertEqual(second.bases(), segs)
        self.assertEqual([self.fake.opened[s] for s in segs], [1] * 40)
        first.close()
        second.close()
        self.assertEqual([self.fake.opened[s] for s in segs], [0] * 40, "closed with the last set that used them")
        self.assertEqual(memory_mod.legacy_cache_stats()["mappings"], 0)
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 0)

    def test_a_stale_handle_in_a_batch_fails_the_batch_and_leaks_no_mapping(self):
        segs = [self.fake.alloc(4096) for _ in range(12)]
        named = {f"t{i}": fake_cuda.FakeArray(seg, (4,), "<f4") for i, seg in enumerate(segs)}
        self.la.send({"weights": share_tensors(named, sync=False)})
        got = self.lb.receive(timeout=5)["weights"]
        memory_mod._local_exports.clear()
        gone = [h for h, b in self.fake.handles.items() if b == segs[5]][0]
        del self.fake.handles[gone]  # its exporter freed it
        with self.assertRaises(IpcError) as e:
            got.bases()
        self.assertEqual(e.exception.code, "ERR_HANDLE_STALE")
        self.assertEqual(sum(self.fake.opened.get(s, 0) for s in segs), 11, "the others were mapped")
        got.close()
        self.assertEqual(sum(self.fake.opened.get(s, 0) for s in segs), 0, "and closed with the set")
        deliver_releases(self.lb, self.la)
        self.assertEqual(self.la.leases.count, 0)

    def test_a_tensor_moved_to_new_memory_is_described_again(self):
        seg1, seg2, named = self.weights()
        shared = share_tensors(named)
        self.la.send(shared)
        self.lb.receive(timeout=5).close()
        other = self.fake.alloc(1024)
        named["layers.0.weight"].ptr = other
        shared._objs[0] = named["layers.0.weight"]
        self.la.send(shared)
        got = self.lb.receive(timeout=5)
        self.assertEqual(len(got.allocations), 3)
        memory_mod._local_exports.clear()
        self.assertEqual(got.view("layers.0.weight").ptr, other)
        got.close()

    def test_update_in_place_batch_is_one_batched_driver_call_for_contiguous_pairs(self):
        seg1, seg2, named = self.weights()
        del named["head.weight.T"]  # the strided pair needs torch (see the GPU tests)
        self.la.send(share_tensors(named))
        got = self.lb.receive(timeout=5)
        memory_mod._local_exports.clear()
        dst_seg = self.fake.alloc(1 << 16)
        mine = {n: fake_cuda.FakeArray(dst_seg + 1024 * k, a.shape, "<f4") for k, (n, a) in enumerate(named.items())}
        r = update_in_place(mine, got, method="batch")
        self.assertEqual((r.copied, r.operations, r.method, r.bytes), (5, 1, "batch", 5 * 64 * 4 - 48 * 4))
        self.assertEqual(self.fake.batches, [5])
        self.assertEqual(self.fake.created_streams, [(r.stream, 0)], "a blocking stream of our own, not the legacy one")
        for n, a in named.items():
            self.assertEqual(ctypes.string_at(mine[n].ptr, 16), ctypes.string_at(a.ptr, 16), n)
        # A repeated update of the same parameters from the same layout reuses the plan.
        r2 = update_in_place(mine, got, method="batch")
        self.assertEqual((r2.operations, self.fake.batches), (1, [5, 5]))
        # Strided pairs without torch: named, not silently skipped. (Where this process imported torch, a
        # GPU machine, update_in_place hands them to torch, which rejects the fake's host memory.)
        if "torch" not in sys.modules:
            with self.assertRaisesRegex(IpcError, "needs torch"):
                update_in_place({"x": fake_cuda.FakeArray(dst_seg, (4, 4), "<f4", strides=(4, 16))}, {"x": fake_cuda.FakeArray(seg2, (4, 4), "<f4")})
        got.close()

    def test_update_in_place_is_one_copy_runs_launch_and_a_repeat_uploads_nothing(self):
        # Many tensors of odd sizes at odd offsets (some sharing a misalignment with their
        # destination, some not), in two segments; the fake driver runs copy_runs block by block.
        src1 = self.fake.alloc(1 << 20)
        src2 = self.fake.alloc(1 << 18)
        named, mine = {}, {}
        dst_seg = self.fake.alloc(1 << 21)
        at_src, at_dst = [0, 0], 0
        for i in range(300):
            n = 1 + (i * 37) % 701 + (70000 if i % 97 == 0 else 0)  # bytes; a few span several 64 KiB chunks
            seg = i % 2
            base = (src1, src2)[seg]
            off = at_src[seg] + (i % 5)
            at_src[seg] = off + n
            self.fill_bytes(base + off, bytes((i + k) % 251 for k in range(n)))
            named[f"t.{i}"] = fake_cuda.FakeArray(base + off, (n,), "|u1")
            doff = at_dst + (i % 3 if i % 4 else (off % 16))
            mine[f"t.{i}"] = fake_cuda.FakeArray(dst_seg + doff, (n,), "|u1")
            at_dst = doff + n
        self.assertLess(max(at_src[1], 0), 1 << 18)
        self.la.send(share_tensors(named))
        got = self.lb.receive(timeout=5)
        memory_mod._local_exports.clear()
        r = update_in_place(mine, got)
        self.assertEqual((r.copied, r.operations, r.method), (300, 1, "kernel"))
        self.assertEqual(len(self.fake.launches), 1)
        _, grid, block, runs, chunks = self.fake.launches[0]
        self.assertEqual((grid, block), (min(chunks, 4 * copy_kernels.BLOCKS_PER_SM), copy_kernels.BLOCK_THREADS))
        self.assertGreaterEqual(runs, 300)
        self.assertEqual(self.fake.batches, [], "no cuMemcpyBatchAsync")
        for n, a in named.items():
            self.assertEqual(ctypes.string_at(mine[n].ptr, a.shape[0]), ctypes.string_at(a.ptr, a.shape[0]), n)
        self.assertEqual(len(self.fake.uploads), 1)
        self.assertEqual(set(r.timings or {}), {"plan", "table", "launch", "sync", "uploaded"})
        self.assertEqual(r.timings["uploaded"], runs * 32)
        # The next step's weights: the same mappings, so the same table: no upload, one launch.
        for a in named.values():
            self.fill_bytes(a.ptr, bytes(255 - b for b in ctypes.string_at(a.ptr, a.shape[0])))
        r2 = update_in_place(mine, got)
        self.assertEqual((r2.operations, len(self.fake.uploads), len(self.fake.launches), r2.timings["uploaded"]), (1, 1, 2, 0))
        for n, a in named.items():
            self.assertEqual(ctypes.string_at(mine[n].ptr, a.shape[0]), ctypes.string_at(a.ptr, a.shape[0]), n)
        got.close()
        # The plan (and its device table) goes with the cache: its memory is freed.
        update_mod._plans.clear()
        gc.collect()
        self.assertEqual(self.fake.own_allocs, set())


class CopyRunsTableTests(unittest.TestCase):
    """The copy_runs table (copy_kernels.plan_runs), built on the host: no driver needed."""

    def rows(self, table):
        return [ROW.unpack_from(table.data, i * ROW.size) for i in range(table.runs)]

    def test_rows_name_each_run_with_its_first_chunk(self):
        t = plan_runs([0x1000, 0x20000, 0x90000], [0x5000, 0x60000, 0xA0000], [100, 3 * 4096 + 1, 4096], chunk_bytes=4096)
        self.assertEqual(self.rows(t), [(0x1000, 0x5000, 100, 0), (0x20000, 0x60000, 3 * 4096 + 1, 1), (0x90000, 0xA0000, 4096, 5)])
        self.assertEqual((t.runs, t.chunks, len(t.data)), (3, 6, 3 * 32))

    def test_a_shared_misalignment_is_split_off_so_the_rest_is_16_aligned(self):
        t = plan_runs([0x1003], [0x7013], [100], chunk_bytes=64)
        self.assertEqual(self.rows(t), [(0x1003, 0x7013, 13, 0), (0x1010, 0x7020, 87, 1)])
        self.assertEqual(t.chunks, 3)
        # Different misalignments cannot both be aligned: one row, copied with narrower loads.
        self.assertEqual(self.rows(plan_runs([0x1003], [0x7001], [100])), [(0x1003, 0x7001, 100, 0)])
        # A run shorter than its head stays one row.
        self.assertEqual(self.rows(plan_runs([0x1003], [0x2003], [5])), [(0x1003, 0x2003, 5, 0)])

    def test_empty_runs_are_left_out_and_chunk_bytes_must_be_a_multiple_of_16(self):
        t = plan_runs([0x1000, 0x2000], [0x3000, 0x4000], [0, 16])
        self.assertEqual(self.rows(t), [(0x2000, 0x4000, 16, 0)])
        self.assertEqual(plan_runs([], [], []), (b"", 0, 0))
        for bad in (0, 24, -16):
            with self.assertRaises(ValueError):
                plan_runs([0], [0], [1], chunk_bytes=bad)

    def test_many_runs_cover_every_byte_once(self):
        sizes = [1 + (i * 7919) % 300000 for i in range(3000)]
        t = plan_runs([i << 20 for i in range(3000)], [(i << 20) + 0x8000_0000 for i in range(3000)], sizes)
        rows = self.rows(t)
        self.assertEqual(sum(r[2] for r in rows), sum(sizes))
        firsts = [r[3] for r in rows]
        self.assertEqual(firsts, sorted(firsts))
        self.assertEqual(t.chunks, sum(-(-n // copy_kernels.CHUNK_BYTES) for n in sizes))

    def test_grid_fills_the_sms_and_never_exceeds_the_chunks(self):
        self.assertEqual(copy_kernels.grid_for(3, 132), 3)
        self.assertEqual(copy_kernels.grid_for(10**6, 132), 132 * copy_kernels.BLOCKS_PER_SM)
        self.assertEqual(copy_kernels.grid_for(0, 132), 1)

    def test_the_package_ships_the_kernels_ptx(self):
        ptx = copy_kernels.PTX_FILE.read_text()
        self.assertIn(".entry copy_runs(", ptx)


if __name__ == "__main__":
    unittest.main()
