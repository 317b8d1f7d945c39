"""Sharded planning in Python (cuda_ipc.tensors.sharded), on the CPU: DTensor placements read
duck-typed from fake DTensors (and, where torch is installed, checked against torch's own rule),
plans applied to materialised tensors, refusals with their code, tensor and range, layout records."""
import itertools
import struct
import unittest

from cuda_ipc.ipc.descriptor import DTYPES
from cuda_ipc.tensors.sharded import (
    Box, LayoutBuilder, LayoutError, decode_layout, encode_layout, layout_fingerprint, placement_box, placement_pieces, plan_bytes,
    plan_sharded, shard_range, tensor_parallel_parameter,
)
from cuda_ipc.tensors.sharded.layout import DTYPE_CODES, itemsize
from tests.sharded_scenarios import check_plan, scenarios


# Fake DTensor pieces: the attribute and method names torch's DTensor, DeviceMesh and placements have.
class Shard:
    def __init__(self, dim):
        self.dim = dim

    def is_shard(self, dim=None):
        return dim is None or dim == self.dim

    def is_replicate(self):
        return False


class _StridedShard(Shard):
    def __init__(self, dim, split_factor):
        super().__init__(dim)
        self.split_factor = split_factor


class Replicate:
    def is_shard(self, dim=None):
        return False

    def is_replicate(self):
        return True


class Partial:
    def is_shard(self, dim=None):
        return False

    def is_replicate(self):
        return False


class FakeDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


class FakeMesh:
    def __init__(self, shape, coordinate):
        self.shape = tuple(shape)
        self._coordinate = coordinate

    def get_coordinate(self):
        return self._coordinate


class FakeTensor:
    def __init__(self, shape, dtype="bfloat16", stride=None):
        self.shape = tuple(shape)
        self.dtype = FakeDtype(dtype)
        self._stride = stride or tuple(int(__import__("math").prod(shape[i + 1:])) for i in range(len(shape)))

    def stride(self):
        return self._stride


class FakeDTensor:
    def __init__(self, shape, placements, mesh, local_shape, dtype="bfloat16"):
        self.shape = tuple(shape)
        self.dtype = FakeDtype(dtype)
        self.placements = tuple(placements)
        self.device_mesh = mesh
        self._local = FakeTensor(local_shape, dtype)

    def to_local(self):
        return self._local


class TestPlacements(unittest.TestCase):
    def test_dtype_codes_are_the_descriptor_codes(self):
        self.assertEqual({k: (v[0], v[2]) for k, v in DTYPES.items()}, DTYPE_CODES)

    def test_shard_range_and_nested_mesh(self):
        self.assertEqual([shard_range(10, 4, i) for i in range(4)], [(0, 3), (3, 3), (6, 3), (9, 1)])
        self.assertEqual([shard_range(5, 4, i) for i in range(4)], [(0, 2), (2, 2), (4, 1), (5, 0)])
        boxes = [placement_box((7, 3), (2, 2), [("shard", 0), ("shard", 0)], c) for c in ([0, 0], [0, 1], [1, 0], [1, 1])]
        self.assertEqual(boxes, [Box((0, 0), (2, 3)), Box((2, 0), (2, 3)), Box((4, 0), (2, 3)), Box((6, 0), (1, 3))])
        with self.assertRaises(LayoutError) as e:
            placement_box((4,), (2,), [("shard", 1)], (0,))
        self.assertEqual(e.exception.code, "ERR_LAYOUT_INVALID")

    def test_fsdp2_state_dict_dtensors_without_boxes(self):
        # FSDP2 over 4 ranks, Shard(0): 10 rows -> 3, 3, 3, 1; 3 rows -> 1, 1, 1, empty.
        for rank in range(4):
            start, n = shard_range(10, 4, rank)
            dt = FakeDTensor((10, 6), [Shard(0)], FakeMesh((4,), [rank]), (n, 6))
            small = FakeDTensor((3, 6), [Shard(0)], FakeMesh((4,), [rank]), (shard_range(3, 4, rank)[1], 6))
            got = LayoutBuilder(rank=rank, node="n", gpu=rank).hold_dtensor("w", dt).hold_dtensor("b", small)
            if rank == 3:
                layout = got.build()
                self.assertEqual([s.name for s in layout.sources], ["w"], "the empty shard holds nothing")
            else:
                layout = got.build()
            want = LayoutBuilder(rank=rank, node="n", gpu=rank).hold("w", dtype="bfloat16", shape=(10, 6), start=(start, 0), length=(n, 6))
            if rank < 3:
                want.hold("b", dtype="bfloat16", shape=(3, 6), start=(rank, 0), length=(1, 6))
            self.assertEqual(encode_layout(layout), encode_layout(want.build()))
        # HSDP: (Replicate, Shard(1)) on a 2 x 3 mesh; a transposed local tensor keeps its strides.
        dt = FakeDTensor((4, 9), [Replicate(), Shard(1)], FakeMesh((2, 3), [1, 2]), (4, 3))
        dt._local = FakeTensor((4, 3), stride=(1, 4))
        layout = LayoutBuilder(rank=5, node="n", gpu=0).need_dtensor("w", dt).build()
        self.assertEqual(layout.destinations[0].pieces[0].start, (0, 6))
        self.assertEqual(layout.destinations[0].strides, (2, 8))
        # Not on the mesh: nothing.
        off = FakeDTensor((4, 9), [Shard(0)], FakeMesh((2,), None), (2, 9))
        self.assertEqual(LayoutBuilder(rank=0, node="n", gpu=0).hold_dtensor("w", off).hold("x", dtype="float32", shape=(1,)).build().sources[0].name, "x")

    def test_dtensor_refusals(self):
        mesh = FakeMesh((2,), [0])
        for placement, code in ((Partial(), "ERR_LAYOUT_INVALID"),):
            with self.assertRaises(LayoutError) as e:
                LayoutBuilder(rank=0, node="n", gpu=0).hold_dtensor("w", FakeDTensor((4, 2), [placement], mesh, (2, 2)))
            self.assertEqual(e.exception.code, code)
        # torch's local tensor disagreeing with the computed box: refused, not guessed.
        with self.assertRaises(LayoutError) as e:
            LayoutBuilder(rank=0, node="n", gpu=0).hold_dtensor("w", FakeDTensor((5, 2), [Shard(0)], mesh, (2, 2)))
        self.assertEqual((e.exception.code, e.exception.tensor), ("ERR_LAYOUT_SHAPE", "w"))

    def test_strided_shard_pieces_follow_torch_split_tensor(self):
        # torch's definition on lists of indices: torch.chunk (ceil-sized chunks, filled with empty
        # ones) and _StridedShard._split_tensor (split_factor chunks, each chunked, the i-th of each
        # concatenated), mesh dimension by mesh dimension.
        def chunk(xs, k):
            size = -(-len(xs) // k)
            out = [xs[i:i + size] for i in range(0, len(xs), size)] if size else []
            return out + [[]] * (k - len(out))

        def split(xs, k, f):
            if f is None:
                return chunk(xs, k)
            second = [chunk(s, k) for s in chunk(xs, f)]
            return [sum((s[i] for s in second), []) for i in range(k)]

        cases = [((8, 8), (2, 2), [("shard", 0, 2), ("shard", 0)]), ((10, 6), (2, 3), [("shard", 0, 2), ("shard", 0)]),
                 ((10, 6), (2, 3), [("shard", 0, 3), ("shard", 0)]), ((7,), (2,), [("shard", 0, 2)]),
                 ((5, 11), (3, 2), [("shard", 1, 2), ("shard", 1)]), ((9, 5), (2, 2, 2), [("shard", 0, 2), ("shard", 1), ("shard", 0, 3)]),
                 ((13, 4), (2, 2), ["replicate", ("shard", 0, 4)]), ((3, 4), (4, 2), [("shard", 0, 2), ("shard", 0)])]
        multi = 0
        for shape, mesh, placements in cases:
            for coord in itertools.product(*(range(n) for n in mesh)):
                ref = [list(range(n)) for n in shape]
                for size, at, p in zip(mesh, coord, placements):
                    if p != "replicate":
                        ref[p[1]] = split(ref[p[1]], size, p[2] if len(p) == 3 else None)[at]
                local, pieces = placement_pieces(shape, mesh, placements, list(coord))
                where = (shape, mesh, placements, coord)
                self.assertEqual(local, tuple(len(x) for x in ref), where)
                seen = set()
                for start, length, at in pieces:
                    for k in itertools.product(*(range(n) for n in length)):
                        here = tuple(a + x for a, x in zip(at, k))
                        self.assertEqual(tuple(ref[d][i] for d, i in enumerate(here)), tuple(s + x for s, x in zip(start, k)), where)
                        self.assertNotIn(here, seen, where)
                        seen.add(here)
                self.assertEqual(len(seen), __import__("math").prod(local), where)
                multi += len(pieces) > 1
        self.assertGreaterEqual(multi, 4)
        # torch's docstring: [8, 8], 2 x 2 mesh, _StridedShard(0, split_factor=2) then Shard(0): rows 0-1, 4-5, 2-3, 6-7.
        rows = [placement_box((8, 8), (2, 2), [("shard", 0, 2), ("shard", 0)], list(c)).start[0] for c in ((0, 0), (0, 1), (1, 0), (1, 1))]
        self.assertEqual(rows, [0, 4, 2, 6])
        with self.assertRaises(LayoutError) as e:
            placement_box((10, 6), (2, 3), [("shard", 0, 2), ("shard", 0)], (0, 1))
        self.assertEqual(e.exception.code, "ERR_LAYOUT_INVALID")

    def test_strided_shard_dtensor_read_duck_typed(self):
        # FSDP2 over TP: a DTensor with (_StridedShard(0, 2), Shard(0)) on a 2 x 3 mesh; rank (0, 1)
        # holds rows 2 and 5 of a [10, 6] tensor: two pieces of its [2, 6] local tensor.
        dt = FakeDTensor((10, 6), [_StridedShard(0, 2), Shard(0)], FakeMesh((2, 3), [0, 1]), (2, 6))
        layout = LayoutBuilder(rank=1, node="n", gpu=1).hold_dtensor("w", dt).build()
        want = LayoutBuilder(rank=1, node="n", gpu=1).hold("w", dtype="bfloat16", shape=(10, 6), mesh=(2, 3), placements=[("shard", 0, 2), ("shard", 0)], coordinate=(0, 1)).build()
        self.assertEqual(encode_layout(layout), encode_layout(want))
        self.assertEqual([(p.start, p.length, p.at) for p in layout.sources[0].pieces], [((2, 0), (1, 6), (0, 0)), ((5, 0), (1, 6), (1, 0))])
        # A local tensor whose shape disagrees with the placements: refused.
        with self.assertRaises(LayoutError) as e:
            LayoutBuilder(rank=1, node="n", gpu=1).hold_dtensor("w", FakeDTensor((10, 6), [_StridedShard(0, 2), Shard(0)], FakeMesh((2, 3), [0, 1]), (3, 6)))
        self.assertEqual(e.exception.code, "ERR_LAYOUT_SHAPE")

    def test_tensor_parallel_padded_vocabulary(self):
        p = tensor_parallel_parameter(dtype="bfloat16", dim=0, size=2, rank=1, pad_multiple=64, parts=[("embed", (100, 6))])
        self.assertEqual(p["shape"], (64, 6))
        self.assertEqual([(x["start"], x["length"]) for x in p["pieces"]], [((64, 0), (36, 6))])
        self.assertEqual(p["padding"], [Box((36, 0), (28, 6))])


@unittest.skipUnless(__import__("importlib").util.find_spec("torch"), "torch is not installed (the GPU machine has it)")
class TestAgainstTorch(unittest.TestCase):
    def test_boxes_match_torch_compute_local_shape_and_global_offset(self):
        from torch.distributed.tensor import Replicate as TR, Shard as TS  # type: ignore
        from torch.distributed.tensor import _utils  # type: ignore

        class Mesh:
            def __init__(self, shape, coordinate):
                self.shape, self._c = tuple(shape), list(coordinate)
                self.ndim = len(shape)

            def get_coordinate(self):
                return self._c

            def size(self, dim=None):
                return self.shape[dim]

            def _is_current_rank_part_of_mesh(self):
                return True

        def torch_box(shape, mesh, coord, placements):
            # torch's own entry for plain data ("simpler unit testing without creating device mesh"),
            # where this torch has it; else the public one over the stand-in mesh.
            plain = getattr(_utils, "_compute_local_shape_and_global_offset", None)
            if plain is not None:
                return plain(shape, tuple(mesh), list(coord), placements)
            return _utils.compute_local_shape_and_global_offset(shape, Mesh(mesh, coord), placements)

        cases = [((10, 6), (4,), [TS(0)]), ((5, 3), (4,), [TS(0)]), ((7, 3), (2, 2), [TS(0), TS(0)]),
                 ((4, 9), (2, 3), [TR(), TS(1)]), ((6, 10, 4), (2, 3), [TS(0), TS(1)]), ((3,), (8,), [TS(0)])]
        for shape, mesh, placements in cases:
            for coord in itertools.product(*(range(n) for n in mesh)):
                ours = placement_box(shape, mesh, [("shard", p.dim) if p.is_shard() else "replicate" for p in placements], list(coord))
                local, offset = torch_box(shape, mesh, coord, placements)
                self.assertEqual(tuple(local), ours.length, (shape, mesh, coord))
                if min(ours.length) > 0:
                    self.assertEqual(tuple(offset), ours.start, (shape, mesh, coord))


    def test_strided_shard_matches_torch_split_tensor(self):
        import torch  # type: ignore
        try:
            from torch.distributed.tensor.placement_types import _StridedShard as TSS  # type: ignore
        except ImportError:
            self.skipTest("this torch has no _StridedShard")
        for n, mesh, f in ((8, 2, 2), (10, 3, 2), (10, 2, 3), (7, 2, 2), (13, 4, 2)):
            try:
                shards, _ = TSS(0, split_factor=f)._split_tensor(torch.arange(n), mesh, with_padding=False, contiguous=True)
            except TypeError:
                self.skipTest("this torch's _StridedShard._split_tensor takes other arguments")
            for at in range(mesh):
                local, pieces = placement_pieces((n,), (mesh,), [("shard", 0, f)], [at])
                got = [0] * local[0]
                for start, length, off in pieces:
                    got[off[0]:off[0] + length[0]] = range(start[0], start[0] + length[0])
                self.assertEqual(got, shards[at].tolist(), (n, mesh, f, at))


class TestPlans(unittest.TestCase):
    def test_scenarios_against_materialised_tensors(self):
        for name, layouts in scenarios():
            with self.subTest(name):
                plan = plan_sharded(layouts)
                self.assertEqual(check_plan(layouts, [plan]), [])
                own = [plan_sharded(layouts, rank=l.rank) for l in layouts]
                self.assertEqual(check_plan(layouts, own), [])
                for mine in own:
                    self.assertEqual([p for p in plan.pairs if mine.scope in (p.src, p.dst)], list(mine.pairs))
                sent, received = plan_bytes(plan)
                needed = sum(itemsize(d.dtype) * __import__("math").prod(p.length) for l in layouts for d in l.destinations for p in d.pieces)
                self.assertEqual(sum(received.values()), needed)

    def _refused(self, fn, code, tensor, range_=None):
        with self.assertRaises(LayoutError) as e:
            fn()
        self.assertEqual((e.exception.code, e.exception.tensor), (code, tensor), str(e.exception))
        if range_ is not None:
            self.assertEqual(e.exception.range, range_)
        self.assertIn(tensor, str(e.exception))

    def test_refusals(self):
        def src(r, start, n):
            return LayoutBuilder(rank=r, node="n", gpu=r).hold("w", dtype="bfloat16", shape=(10, 4), start=(start, 0), length=(n, 4)).build()
        dst = LayoutBuilder(rank=9, node="n", gpu=7).need("w", dtype="bfloat16", shape=(10, 4)).build()
        self._refused(lambda: plan_sharded([src(0, 0, 3), src(1, 5, 5), dst]), "ERR_LAYOUT_UNCOVERED", "w", Box((3, 0), (2, 4)))
        pieces = [{"tensor": "w", "shape": (10, 4), "start": (0, 0), "length": (4, 4), "at": (0, 0)},
                  {"tensor": "w", "shape": (10, 4), "start": (4, 0), "length": (4, 4), "at": (2, 0)}]
        self._refused(lambda: LayoutBuilder(rank=9, node="n", gpu=7).need_parameter("p", dtype="bfloat16", shape=(6, 4), pieces=pieces).build(),
                      "ERR_LAYOUT_OVERLAP", "p", Box((2, 0), (2, 4)))
        self._refused(lambda: LayoutBuilder(rank=9, node="n", gpu=7).need_parameter("p", dtype="bfloat16", shape=(6, 4), pieces=pieces[:1], padding=[Box((5, 0), (1, 4))]).build(),
                      "ERR_LAYOUT_UNCOVERED", "p", Box((4, 0), (1, 4)))
        f32 = LayoutBuilder(rank=9, node="n", gpu=7).need("w", dtype="float32", shape=(10, 4)).build()
        self._refused(lambda: plan_sharded([src(0, 0, 10), f32]), "ERR_LAYOUT_DTYPE", "w")
        self._refused(lambda: LayoutBuilder(rank=0, node="n", gpu=0).hold("w", dtype="bfloat16", shape=(10, 4), start=(8, 0), length=(3, 4)).build(),
                      "ERR_LAYOUT_BOUNDS", "w", Box((8, 0), (3, 4)))


class TestRecords(unittest.TestCase):
    def test_round_trip_and_refusals(self):
        for _, layouts in scenarios():
            for l in layouts:
                b = encode_layout(l)
                self.assertEqual(decode_layout(b), l)
                self.assertEqual(encode_layout(decode_layout(b)), b)
        layouts = scenarios()[0][1]
        fp = layout_fingerprint(layouts)
        self.assertEqual(layout_fingerprint(list(reversed(layouts))), fp)
        self.assertEqual(plan_sharded(layouts).fingerprint, fp)
        good = encode_layout(layouts[4])

        def refused(data, why):
            with self.assertRaises(LayoutError) as e:
                decode_layout(data)
            self.assertEqual(e.exception.code, "ERR_LAYOUT_INVALID")
            self.assertIn(why, str(e.exception))
        refused(b"X" + good[1:], "magic")
        refused(good[:4] + struct.pack("<H", 2) + good[6:], "version 2")
        refused(good[:-8], "header says")
        refused(good[:20], "shorter than")
        refused(good[:37] + b"\x01" + good[38:], "padding after the node id must be zero")
        refused(good[:44] + b"\x01" + good[45:], "reserved bytes must be zero")
        refused(good[:40] + b"\x63" + good[41:], "dtype code 99")


if __name__ == "__main__":
    unittest.main()
