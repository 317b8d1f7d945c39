"""Tensor sets over TCP links (cuda_ipc/tensors/nccl_transfer_send.py, nccl_transfer.py, chunk_pipeline.py;
docs/PROTOCOL.md 8.3) and Fanout (link/nccl/fanout.py), both ends in this process over the fake libnccl
and the fake driver (nccl_fixture.py; copy_runs runs on the CPU): update_in_place straight into
parameters (direct chunks, or staged and scattered), the sender's gathers, repeated syncs reusing
the plan and the uploaded table, fetch and views, an unused set drained, a lazy set forced by a
later transfer, mismatches named before anything moves, what a set cannot carry; a broadcast to
three receivers, all or nothing. Chunks are 1 MiB here (the protocol's smallest) so that a few MiB
cross as several."""
from __future__ import annotations

import ctypes
import os
import struct

from cuda_ipc import Fanout, HostArray, HostBuffer, IpcError, RemoteTensorSet, share_tensors, update_in_place
from cuda_ipc.tensors import nccl_transfer_send as nccl_tensor_send

from . import fake_cuda
from .nccl_fixture import NcclCase, read_f32

MiB = 1 << 20
#: A few large tensors and small ones (float32 elements), about 2.6 MiB: three 1 MiB chunks.
SIZES = [300_000, 7, 200_000, 123, 150_000, 1000, 3, 64]
NAMES = [f"layers.{i}.weight" for i in range(len(SIZES))]


def fill(arrays: dict[str, fake_cuda.FakeArray], seed: int) -> None:
    for j, a in enumerate(arrays.values()):
        n = a.shape[0]
        ctypes.memmove(a.ptr, struct.pack(f"<{n}f", *[float(seed + 1000 * j + i % 4096) for i in range(n)]), 4 * n)


def same(x: fake_cuda.FakeArray | int, y: fake_cuda.FakeArray, n: int | None = None) -> bool:
    n = y.shape[0] if n is None else n
    px = x if isinstance(x, int) else x.ptr
    return ctypes.string_at(px, 4 * n) == ctypes.string_at(y.ptr, 4 * n)


class TensorSetCase(NcclCase):
    def setUp(self) -> None:
        super().setUp()
        real = nccl_tensor_send.chunk_bytes_for
        nccl_tensor_send.chunk_bytes_for = lambda length: min(MiB, real(length))  # type: ignore[assignment]
        self.addCleanup(setattr, nccl_tensor_send, "chunk_bytes_for", real)

    def tensors(self, one_allocation: bool, seed: int = 0) -> dict[str, fake_cuda.FakeArray]:
        """The set's tensors: back to back in one allocation (as a pool-backed trainer keeps them), or one allocation each."""
        out: dict[str, fake_cuda.FakeArray] = {}
        # 256-aligned, as device allocations are: the packed stream then starts with the first tensor.
        base = (self.fake.alloc(4 * sum(SIZES) + 256) + 255) // 256 * 256 if one_allocation else 0
        at = 0
        for name, n in zip(NAMES, SIZES):
            ptr = base + at if one_allocation else self.fake.alloc(4 * n)
            out[name] = fake_cuda.FakeArray(ptr, (n,), "<f4")
            at += 4 * n
        fill(out, seed)
        return out

    def sync(self, shared: object, params: dict[str, fake_cuda.FakeArray]) -> object:
        self.a.send({"weights": shared})
        ts = self.b.receive(timeout=10)["weights"]
        self.assertIsInstance(ts, RemoteTensorSet)
        self.assertTrue(ts.pending)
        r = update_in_place(params, ts)
        self.assertEqual(ts.received_into_memory if hasattr(ts, "received_into_memory") else None, None)
        return r

    def received_ptrs(self) -> list[int]:
        return [int(line.split("ptr=")[1].split()[0], 16) for line in self.lines("recv ")]


class UpdateTests(TensorSetCase):
    def test_straight_into_parameters_laid_out_like_the_senders_every_chunk_direct(self) -> None:
        src = self.tensors(one_allocation=True)
        params = self.tensors(one_allocation=True, seed=99)
        base = params[NAMES[0]].ptr
        shared = share_tensors(src)
        for step in range(3):
            fill(src, 7 * step)
            before = len(self.lines("recv "))
            r = self.sync(shared, params)
            self.assertEqual((r.method, r.copied, r.operations), ("nccl", len(NAMES), 3))  # type: ignore[attr-defined]
            self.assertTrue(all(same(params[n], src[n]) for n in NAMES), f"sync {step}: the parameters hold the sender's values")
            ptrs = self.received_ptrs()[before:]
            self.assertEqual(ptrs, [base, base + MiB, base + 2 * MiB], "each chunk received straight into the parameters")
            if step:
                self.assertEqual(r.timings["uploaded"], 0)  # type: ignore[attr-defined]
        self.assertEqual(self.fake.launches, [], "nothing gathered or scattered")
        self.wait_for(lambda: self.a.leases.count == 0, "the sender's leases to end", poll=self.a.poll)
        self.assertEqual(self.b.received_leases, 0)

    def test_parameters_of_their_own_allocations_get_chunks_staged_and_scattered(self) -> None:
        src = self.tensors(one_allocation=True)
        params = self.tensors(one_allocation=False, seed=5)
        shared = share_tensors(src)
        uploads = []
        for step in range(2):
            fill(src, 100 + step)
            r = self.sync(shared, params)
            self.assertEqual((r.method, r.operations), ("nccl", 3))  # type: ignore[attr-defined]
            self.assertTrue(all(same(params[n], src[n]) for n in NAMES), f"sync {step}")
            uploads.append(r.timings["uploaded"])  # type: ignore[attr-defined]
        self.assertGreater(uploads[0], 0)
        self.assertEqual(uploads[1], 0, "a repeated sync reuses the routes and the uploaded scatter table")
        self.assertTrue(self.fake.launches, "the staged chunks were scattered by copy_runs")

    def test_a_sender_gathers_tensors_of_several_allocations(self) -> None:
        src = self.tensors(one_allocation=False)
        params = self.tensors(one_allocation=False, seed=3)
        r = self.sync(share_tensors(src), params)
        self.assertEqual(r.method, "nccl")  # type: ignore[attr-defined]
        self.assertTrue(all(same(params[n], src[n]) for n in NAMES))
        sends = self.lines("send ")
        self.assertEqual(len(sends), 3)

    def test_mismatches_are_named_before_anything_is_received(self) -> None:
        src = self.tensors(one_allocation=True)
        params = self.tensors(one_allocation=True, seed=1)
        self.a.send({"weights": share_tensors(src)})
        ts = self.b.receive(timeout=10)["weights"]
        wrong = dict(params)
        wrong[NAMES[1]] = fake_cuda.FakeArray(self.fake.alloc(32), (8,), "<f4")
        with self.assertRaises(IpcError) as caught:
            update_in_place(wrong, ts)
        self.assertEqual(caught.exception.code, "ERR_TENSOR_MISMATCH")
        self.assertIn("shape [7] received, [8] here", str(caught.exception))
        self.assertTrue(ts.pending)
        self.assertEqual(self.lines("recv "), [], "nothing was received")
        partial = {n: params[n] for n in NAMES[2:]}
        partial["not.sent"] = fake_cuda.FakeArray(self.fake.alloc(4), (1,), "<f4")
        r = update_in_place(partial, ts, strict=False)
        self.assertEqual((r.method, r.copied, r.missing, sorted(r.unexpected)), ("nccl", len(NAMES) - 2, ["not.sent"], sorted(NAMES[:2])))
        self.assertTrue(all(same(params[n], src[n]) for n in NAMES[2:]))
        self.assertFalse(same(params[NAMES[0]], src[NAMES[0]]), "tensors not asked for were dropped")

    def test_a_set_received_into_parameters_holds_no_bytes(self) -> None:
        src = self.tensors(one_allocation=True)
        params = self.tensors(one_allocation=True, seed=1)
        self.a.send({"weights": share_tensors(src)})
        ts = self.b.receive(timeout=10)["weights"]
        update_in_place(params, ts)
        self.assertFalse(ts.pending)
        for call in (lambda: ts.view(NAMES[0]), lambda: ts.fetch(), lambda: update_in_place(params, ts)):
            with self.assertRaises(IpcError) as caught:
                call()
            self.assertEqual(caught.exception.code, "ERR_INVALID_STATE")
        ts.close()

    def test_parameters_that_cannot_take_the_bytes_get_the_set_fetched_first(self) -> None:
        src = self.tensors(one_allocation=True)
        params = self.tensors(one_allocation=True, seed=1)
        strided = dict(params)
        n = SIZES[-1]
        strided[NAMES[-1]] = fake_cuda.FakeArray(self.fake.alloc(8 * n), (n,), "<f4", strides=(8,))
        self.a.send({"weights": share_tensors(src)})
        ts = self.b.receive(timeout=10)["weights"]
        with self.assertRaises(IpcError) as caught:
            update_in_place(strided, ts)  # a strided pair needs torch's copy here
        self.assertEqual(caught.exception.code, "ERR_UNSUPPORTED")
        self.assertFalse(ts.pending, "the set was received into memory of its own first")
        r = update_in_place(params, ts)
        self.assertEqual(r.method, "kernel")
        self.assertTrue(all(same(params[n], src[n]) for n in NAMES))


class FetchTests(TensorSetCase):
    def test_views_and_fetch_receive_into_memory_of_its_own(self) -> None:
        src = self.tensors(one_allocation=False)
        self.a.send({"weights": share_tensors(src)})
        ts = self.b.receive(timeout=10)["weights"]
        self.assertEqual((len(ts), list(ts), ts.memory, ts.allocations), (len(NAMES), NAMES, "device", []))
        v = ts[NAMES[2]]  # no torch here: the cuda_ipc view
        self.assertFalse(ts.pending)
        self.assertTrue(same(v.ptr, src[NAMES[2]]))
        self.assertIs(ts.fetch(), ts)
        self.assertTrue(all(same(ts.view(n).ptr, src[n]) for n in NAMES))
        self.assertEqual(len(ts.allocations), 1)
        self.assertEqual(self.b.received_leases, 0, "the lease ended once the bytes were here")
        ts.close()
        self.assertEqual(ts.closed, True)

    def test_a_set_closed_unused_is_drained_and_the_next_transfer_arrives_whole(self) -> None:
        src = self.tensors(one_allocation=True)
        params = self.tensors(one_allocation=True, seed=1)
        shared = share_tensors(src)
        self.a.send({"weights": shared})
        self.b.receive(timeout=10)["weights"].close()
        self.wait_for(lambda: self.a.leases.count == 0, "the drained set's lease to end", poll=self.a.poll)
        fill(src, 42)
        r = self.sync(shared, params)
        self.assertEqual(r.method, "nccl")  # type: ignore[attr-defined]
        self.assertTrue(all(same(params[n], src[n]) for n in NAMES))

    def test_a_later_transfer_forces_an_earlier_lazy_set_to_fetch(self) -> None:
        src = self.tensors(one_allocation=True)
        params = self.tensors(one_allocation=True, seed=1)
        shared = share_tensors(src)
        self.a.send({"first": shared})
        first = self.b.receive(timeout=10)["first"]
        copy = {n: bytes(ctypes.string_at(a.ptr, 4 * a.shape[0])) for n, a in src.items()}
        fill(src, 77)  # the next step's weights (after the first transfer went: the fake moves bytes at once)
        self.a.send({"second": shared})
        second = self.b.receive(timeout=10)["second"]
        update_in_place(params, second)
        self.assertTrue(all(same(params[n], src[n]) for n in NAMES))
        self.assertFalse(first.pending, "received into memory of its own to make way")
        self.assertTrue(all(ctypes.string_at(first.view(n).ptr, 4 * src[n].shape[0]) == copy[n] for n in NAMES))
        first.close()

    def test_what_a_tensor_set_cannot_carry_is_refused_before_anything_is_sent(self) -> None:
        hb = HostBuffer.allocate(64)
        cases = {
            "host memory": {"h": HostArray(hb, "float32", (4,))},
            "strided": {"s": fake_cuda.FakeArray(self.fake.alloc(64), (4,), "<f4", strides=(8,))},
            "no elements": {"e": fake_cuda.FakeArray(self.fake.alloc(4), (0,), "<f4")},
        }
        for words, tensors in cases.items():
            with self.assertRaises(IpcError) as caught:
                self.a.send({"weights": share_tensors(tensors)})
            self.assertEqual(caught.exception.code, "ERR_NOT_TRANSFERABLE")
            self.assertIn(words, str(caught.exception))
        self.assertEqual(self.a.leases.count, 0)
        self.assertEqual(self.lines("getUniqueId"), [])
        hb.close()


class FanoutTests(TensorSetCase):
    links = 3

    def test_one_message_to_three_links_its_bytes_broadcast_once(self) -> None:
        src = self.tensors(one_allocation=True)
        array = fake_cuda.FakeArray(self.fake.alloc(40), (10,), "<f4")
        ctypes.memmove(array.ptr, struct.pack("<10f", *range(10)), 40)
        fan = Fanout([x for x, _ in self.pairs])
        shared = share_tensors(src)
        for step in range(2):
            fill(src, 300 * step)
            # The array first: a device value after a lazy set in one message would make the set be
            # fetched (its transfer comes first on the communicator, and the message waits for the array's).
            fan.send({"step": step, "extra": array, "weights": shared})
            for k, (_, y) in enumerate(self.pairs):
                m = y.receive(timeout=10)
                self.assertEqual(m["step"], step)
                self.assertEqual(read_f32(m["extra"].ptr, 10), [float(i) for i in range(10)])
                params = self.tensors(one_allocation=k == 0, seed=1)
                r = update_in_place(params, m["weights"])
                self.assertEqual(r.method, "nccl")
                self.assertTrue(all(same(params[n], src[n]) for n in NAMES), f"receiver {k}, sync {step}")
        inits = sorted(line.split()[1:3] for line in self.lines("init "))
        self.assertEqual(inits, [["nranks=4", f"rank={r}"] for r in range(4)], "one communicator: rank 0 here, ranks 1..3 there")
        roots = [line for line in self.lines("broadcast ") if " root=0 " in line]
        self.assertEqual(len(roots), 4 * 2 * 4, "per sync: the tensor set's 3 chunks and the array, once here and once per receiver")
        self.assertEqual(len(self.lines("send ")), 0)
        fan.close()
        for x, _ in self.pairs:
            self.wait_for(lambda x=x: x.leases.count == 0, "every link's lease to end", poll=x.poll)

    def test_all_or_nothing_a_link_that_refuses_aborts_the_broadcast_for_all(self) -> None:
        os.environ["FAKE_NCCL_MOVE_TIMEOUT_MS"] = "300"
        fan = Fanout([x for x, _ in self.pairs])
        self.pairs[2][1].close()
        self.wait_for(lambda: self.pairs[2][0].closed, "the third link to close", poll=self.pairs[2][0].poll)
        with self.assertRaises(IpcError) as refused:
            fan.send({"w": share_tensors(self.tensors(one_allocation=True))})
        self.assertEqual(refused.exception.code, "ERR_LINK_CLOSED")
        for _, y in self.pairs[:2]:
            ts = y.receive(timeout=10)["w"]  # the set arrives; its bytes never will
            with self.assertRaises(IpcError) as caught:
                ts.fetch(timeout=10)
            self.assertEqual(caught.exception.code, "ERR_NCCL")
            self.assertIn("Fanout send failed", str(caught.exception))
            self.assertEqual(y.received_leases, 0)
        fan.close()
