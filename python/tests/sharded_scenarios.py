"""The layouts of test/cpu/sharded-scenarios.ts, built with the Python builder (the Node/Python
agreement test compares their records byte for byte), and a reference that applies a plan to
materialised tensors."""
from __future__ import annotations

from cuda_ipc.tensors.sharded import LayoutBuilder, RankLayout, ShardPlan, tensor_parallel_parameter
from cuda_ipc.tensors.sharded.layout import itemsize

H, Q, KV, I, V, E = 6, 8, 4, 6, 10, 4
GLOBALS = {
    "q": (Q, H), "k": (KV, H), "v": (KV, H), "o": (H, Q), "gate": (I, H), "up": (I, H), "down": (H, I), "embed": (V, H),
    "norm": (H,), "experts": (E, I, H),
}
DT = "bfloat16"


def _trainer(rank: int, node: str, gpu: int, mesh: list, coord: list, place) -> LayoutBuilder:
    b = LayoutBuilder(rank=rank, node=node, gpu=gpu)
    for name, shape in GLOBALS.items():
        b.hold(name, dtype=DT, shape=shape, mesh=mesh, placements=place(name), coordinate=coord)
    return b


def _engine(rank: int, node: str, gpu: int, tp: int, r: int) -> RankLayout:
    b = LayoutBuilder(rank=rank, node=node, gpu=gpu)
    b.need_parameter("qkv_proj", **tensor_parallel_parameter(dtype=DT, dim=0, size=tp, rank=r, parts=[("q", GLOBALS["q"]), ("k", GLOBALS["k"]), ("v", GLOBALS["v"])]))
    b.need_parameter("o_proj", **tensor_parallel_parameter(dtype=DT, dim=1, size=tp, rank=r, parts=[("o", GLOBALS["o"])]))
    b.need_parameter("gate_up_proj", **tensor_parallel_parameter(dtype=DT, dim=0, size=tp, rank=r, parts=[("gate", GLOBALS["gate"]), ("up", GLOBALS["up"])]))
    b.need_parameter("down_proj", **tensor_parallel_parameter(dtype=DT, dim=1, size=tp, rank=r, parts=[("down", GLOBALS["down"])]))
    b.need_parameter("embed_tokens", **tensor_parallel_parameter(dtype=DT, dim=0, size=tp, rank=r, pad_multiple=8, parts=[("embed", GLOBALS["embed"])]))
    b.need("norm", dtype=DT, shape=GLOBALS["norm"])
    b.need("experts", dtype=DT, shape=GLOBALS["experts"], start=(r % E, 0, 0), length=(1, I, H))
    return b.build()


def scenarios() -> list[tuple[str, list[RankLayout]]]:
    shard0 = lambda name: [("shard", 0)]  # noqa: E731
    out = [("fsdp Shard(0) -> tp2", [_trainer(r, "train", r, [4], [r], shard0).build() for r in range(4)]
            + [_engine(4, "infer", 0, 2, 0), _engine(5, "infer", 1, 2, 1)])]
    out.append(("Shard(1) -> tp3 colocated", [_trainer(r, "n0", r, [3], [r], lambda n: [("shard", 0 if n == "norm" else 1)]).build() for r in range(3)]
                + [_engine(3, "n0", 0, 3, 0), _engine(4, "n0", 1, 3, 1), _engine(5, "n0", 2, 3, 2)]))
    out.append(("hsdp Replicate x Shard(0) -> 2 replicas of tp2",
                [_trainer(r, "a" if r < 2 else "b", r % 2, [2, 2], [r >> 1, r & 1], lambda n: ["replicate", ("shard", 0)]).build() for r in range(4)]
                + [_engine(4, "a", 2, 2, 0), _engine(5, "a", 3, 2, 1), _engine(6, "b", 2, 2, 0), _engine(7, "b", 3, 2, 1)]))
    out.append(("Shard(0) x Shard(1) 2x3 -> tp2",
                [_trainer(r, "t", r, [2, 3], [r // 3, r % 3], lambda n: [("shard", 0), ("shard", 0)] if n == "norm" else [("shard", 0), ("shard", 1)]).build() for r in range(6)]
                + [_engine(6, "i", 0, 2, 0), _engine(7, "i", 1, 2, 1)]))
    out.append(("_StridedShard(0, 2) x Shard(0) 2x3 -> tp2",
                [_trainer(r, "s", r, [2, 3], [r // 3, r % 3], lambda n: [("shard", 0, 2), ("shard", 0)]).build() for r in range(6)]
                + [_engine(6, "i", 0, 2, 0), _engine(7, "i", 1, 2, 1)]))
    def part(rank, node, start, length):
        b = LayoutBuilder(rank=rank, node=node, gpu=rank).hold("w", dtype="float32", shape=(10, 4), start=start, length=length)
        if rank < 2:
            b.hold("scale", dtype="float32", shape=())
        return b.build()
    out.append(("partly overlapping sources -> grid", [
        part(0, "x", (0, 0), (6, 4)), part(1, "x", (4, 0), (6, 4)), part(2, "y", (0, 0), (10, 2)),
        LayoutBuilder(rank=3, node="y", gpu=3).need("w", dtype="float32", shape=(10, 4)).need("scale", dtype="float32", shape=()).build(),
        LayoutBuilder(rank=4, node="z", gpu=0).need("w", dtype="float32", shape=(10, 4), start=(2, 1), length=(6, 3)).need("scale", dtype="float32", shape=()).build(),
    ]))
    return out


def _global_byte(tensor: str, flat: int) -> int:
    h = 2166136261
    for ch in tensor:
        h = ((h ^ ord(ch)) * 16777619) & 0xFFFFFFFF
    h = ((h ^ flat) * 2246822519) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 3266489917) & 0xFFFFFFFF
    return (h ^ (h >> 16)) & 0xFF


def _elements(start, length, at):
    import itertools
    for idx in itertools.product(*(range(n) for n in length)):
        yield tuple(s + i for s, i in zip(start, idx)), tuple(a + i for a, i in zip(at, idx))


def _flat(shape, idx) -> int:
    f = 0
    for n, x in zip(shape, idx):
        f = f * n + x
    return f


def check_plan(layouts: list[RankLayout], plans: list[ShardPlan]) -> list[str]:
    """Applies the plans to materialised sources; the problems found at the destinations."""
    shapes = {t.name: t.shape for l in layouts for t in l.tensors}
    extent = lambda t: itemsize(t.dtype) + sum((n - 1) * s for n, s in zip(t.shape, t.strides))  # noqa: E731
    src, dst, writes = {}, {}, {}
    for l in layouts:
        mems = []
        for t in l.sources:
            m = bytearray(extent(t))
            size = itemsize(t.dtype)
            for p in t.pieces:
                for g, li in _elements(p.start, p.length, p.at):
                    o = sum(i * s for i, s in zip(li, t.strides))
                    f = _flat(shapes[p.tensor], g) * size
                    for b in range(size):
                        m[o + b] = _global_byte(p.tensor, f + b)
            mems.append(m)
        src[l.rank] = mems
        dst[l.rank] = [bytearray([0xEE]) * extent(t) for t in l.destinations]
        writes[l.rank] = [bytearray(extent(t)) for t in l.destinations]
    seen = set()
    for plan in plans:
        for pair in plan.pairs:
            if (pair.src, pair.dst) in seen:
                continue
            seen.add((pair.src, pair.dst))
            for r in pair.runs:
                for c in range(r.count):
                    for b in range(r.bytes):
                        dst[pair.dst][r.dst_tensor][r.dst_offset + c * r.dst_stride + b] = src[pair.src][r.src_tensor][r.src_offset + c * r.src_stride + b]
                        writes[pair.dst][r.dst_tensor][r.dst_offset + c * r.dst_stride + b] += 1
    problems = []
    for l in layouts:
        for ti, t in enumerate(l.destinations):
            size = itemsize(t.dtype)
            want = [-1] * extent(t)
            for p in t.pieces:
                for g, li in _elements(p.start, p.length, p.at):
                    o = sum(i * s for i, s in zip(li, t.strides))
                    f = _flat(shapes[p.tensor], g) * size
                    for b in range(size):
                        want[o + b] = _global_byte(p.tensor, f + b)
            for o, w in enumerate(want):
                got, n = dst[l.rank][ti][o], writes[l.rank][ti][o]
                if (w < 0 and (n or got != 0xEE)) or (w >= 0 and (n != 1 or got != w)):
                    problems.append(f"rank {l.rank} {t.name} byte {o}: {got} written {n} times, expected {w}")
    return problems[:20]
