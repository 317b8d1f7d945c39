"""Layouts and host tensors of the sync group tests (test_sharded_group.py, sharded_member.py, and the
Python side of test/cpu/sharded-interop.test.ts): FSDP Shard(0) trainers and tensor-parallel engines
with fused (qkv, gate_up), padded (embedding) and strided (a transposed) destinations, int32 so that
values compare exactly. A global element's value is a function of its tensor, its flat index and the
version, so a destination is checked against slicing the whole tensor."""
from __future__ import annotations

import itertools
from typing import Sequence

from cuda_ipc import HostArray, HostBuffer
from cuda_ipc.tensors.sharded import LayoutBuilder, RankLayout, tensor_parallel_parameter
from cuda_ipc.tensors.sharded.layout import LocalTensor

DT = "int32"
H, Q, KV, I, V = 6, 8, 4, 6, 10
GLOBALS = {"q": (Q, H), "k": (KV, H), "v": (KV, H), "o": (H, Q), "gate": (I, H), "up": (I, H), "down": (H, I), "embed": (V, H),
           "scale": (5, 2)}
PAD = -7


def value(tensor: str, flat: int, version: int) -> int:
    h = 0
    for ch in tensor:
        h = (h * 31 + ord(ch)) & 0xFFFF
    return (h * 1000 + flat + version * 100_000) & 0x3FFFFFFF


def trainer(rank: int, shards: int, coordinate: int | None = None, node: str = "n0") -> RankLayout:
    """Shard ``coordinate`` (default: the rank) of ``shards`` of every tensor, FSDP's Shard(0)."""
    b = LayoutBuilder(rank=rank, node=node, gpu=rank)
    for name, shape in GLOBALS.items():
        b.hold(name, dtype=DT, shape=shape, mesh=[shards], placements=[("shard", 0)], coordinate=[rank if coordinate is None else coordinate])
    return b.build()


def engine(rank: int, tp: int, r: int, node: str = "n0") -> RankLayout:
    b = LayoutBuilder(rank=rank, node=node, gpu=rank)
    b.need_parameter("qkv_proj", **tensor_parallel_parameter(dtype=DT, dim=0, size=tp, rank=r, parts=[("q", GLOBALS["q"]), ("k", GLOBALS["k"]), ("v", GLOBALS["v"])]))
    b.need_parameter("o_proj", **tensor_parallel_parameter(dtype=DT, dim=1, size=tp, rank=r, parts=[("o", GLOBALS["o"])]))
    b.need_parameter("gate_up_proj", **tensor_parallel_parameter(dtype=DT, dim=0, size=tp, rank=r, parts=[("gate", GLOBALS["gate"]), ("up", GLOBALS["up"])]))
    down = tensor_parallel_parameter(dtype=DT, dim=1, size=tp, rank=r, parts=[("down", GLOBALS["down"])])
    rows, cols = down["shape"]
    down["strides"] = (4, rows * 4)  # column-major: the destination is a transposed tensor's view
    b.need_parameter("down_proj", **down)
    b.need_parameter("embed_tokens", **tensor_parallel_parameter(dtype=DT, dim=0, size=tp, rank=r, pad_multiple=8, parts=[("embed", GLOBALS["embed"])]))
    b.need("scale", dtype=DT, shape=GLOBALS["scale"], start=(0, r), length=(5, 1))
    return b.build()


def fsdp_to_tp(trainers: int, engines: int) -> list[RankLayout]:
    """Ranks 0..trainers-1 hold Shard(0) of every tensor, the next ``engines`` ranks need tensor parallel ones."""
    return [trainer(r, trainers) for r in range(trainers)] + [engine(trainers + r, engines, r) for r in range(engines)]


def _extent(t: LocalTensor) -> int:
    return sum((n - 1) * s for n, s in zip(t.shape, t.strides)) + 4


def _offset(t: LocalTensor, idx: Sequence[int]) -> int:
    return sum(i * s for i, s in zip(idx, t.strides))


def allocate(layout: RankLayout) -> tuple[list[HostArray], list[HostArray]]:
    """Host arrays for a layout's sources and destinations (destinations filled with PAD)."""
    def make(t: LocalTensor, fill: int) -> HostArray:
        buf = HostBuffer.allocate(_extent(t))
        try:
            if fill:
                m = buf.memory.cast("i")
                m[:] = _ints([fill] * len(m))
                m.release()
            return HostArray(buf, t.dtype, t.shape, t.strides)
        finally:
            buf.close()
    return [make(t, 0) for t in layout.sources], [make(t, PAD) for t in layout.destinations]


def _ints(values: list[int]) -> memoryview:
    import array
    return memoryview(array.array("i", values))


def fill_sources(layout: RankLayout, sources: Sequence[HostArray], version: int) -> None:
    """Each source holds its box of the global tensors at ``version``."""
    for t, a in zip(layout.sources, sources):
        mem = a.memory.cast("i")
        for p in t.pieces:
            shape = {**GLOBALS, **INTEROP}[p.tensor]
            for idx in itertools.product(*(range(n) for n in p.length)):
                g = [s + i for s, i in zip(p.start, idx)]
                mem[_offset(t, [a + i for a, i in zip(p.at, idx)]) // 4] = value(p.tensor, _flat(shape, g), version)
        mem.release()


def check_destinations(layout: RankLayout, destinations: Sequence[HostArray], version: int) -> list[str]:
    """What differs from slicing the whole tensors at ``version`` (padding must still be PAD)."""
    problems: list[str] = []
    for t, a in zip(layout.destinations, destinations):
        want: dict[int, int] = {}
        for p in t.pieces:
            shape = {**GLOBALS, **INTEROP}[p.tensor]
            for idx in itertools.product(*(range(n) for n in p.length)):
                g = [s + i for s, i in zip(p.start, idx)]
                want[_offset(t, [a + i for a, i in zip(p.at, idx)])] = value(p.tensor, _flat(shape, g), version)
        mem = a.memory.cast("i")
        for idx in itertools.product(*(range(n) for n in t.shape)):
            o = _offset(t, idx)
            got, expected = mem[o // 4], want.get(o, PAD)
            if got != expected and len(problems) < 10:
                problems.append(f"rank {layout.rank} {t.name}{list(idx)}: {got}, expected {expected}")
        mem.release()
    return problems


def _flat(shape: Sequence[int], idx: Sequence[int]) -> int:
    f = 0
    for n, x in zip(shape, idx):
        f = f * n + x
    return f


def colocated(rank: int, shards: int, tp: int, r: int, node: str = "n0") -> RankLayout:
    """A rank that holds Shard(0) of every tensor and needs tensor parallel rank ``r``'s parameters."""
    t, e = trainer(rank, shards, None, node), engine(rank, tp, r, node)
    return RankLayout(rank, node, rank, tuple(sorted({*t.tensors, *e.tensors}, key=lambda g: g.name.encode())), t.sources, e.destinations)


#: The two ranks of the Node/Python interop test (test/cpu/sharded-interop.test.ts builds the same):
#: each holds Shard(0) of w (8 x 6) and b (5), and needs w's columns 3r..3r+2 and the whole b.
INTEROP = {"w": (8, 6), "b": (5,)}


def interop(rank: int, gpu: int | None = None, node: str = "n0") -> RankLayout:
    b = LayoutBuilder(rank=rank, node=node, gpu=rank if gpu is None else gpu)
    for name, shape in INTEROP.items():
        b.hold(name, dtype=DT, shape=shape, mesh=[2], placements=[("shard", 0)], coordinate=[rank])
    b.need("w_cols", dtype=DT, shape=INTEROP["w"], start=(0, 3 * rank), length=(8, 3), tensor="w")
    b.need("b", dtype=DT, shape=INTEROP["b"])
    return b.build()


def layout_by_name(spec: list) -> RankLayout:
    """A layout from [function name, args...] (the member script's argument)."""
    fn = {"trainer": trainer, "engine": engine, "colocated": colocated, "interop": interop}[spec[0]]
    return fn(*spec[1:])  # type: ignore[operator]
