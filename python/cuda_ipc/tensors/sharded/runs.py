"""Byte runs (src/tensors/sharded/runs.ts): a run is ``count`` blocks of ``bytes`` contiguous bytes;
block i starts at src_offset + i*src_stride in the source's local tensor and at dst_offset +
i*dst_stride in the destination's (count 1: strides 0). One run is what cuMemcpy2D copies, a row of a
copy kernel's table, or count*bytes packed bytes of an NCCL staging chunk."""
from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Iterator, Sequence

#: Numbers per run, in this order.
RUN_FIELDS = 8


@dataclass(frozen=True)
class PlanRun:
    """One run: local tensor indices (in the source's ``sources``, the destination's
    ``destinations``), byte offsets from their first elements, block size, blocks, block strides."""
    src_tensor: int
    dst_tensor: int
    src_offset: int
    dst_offset: int
    bytes: int
    count: int
    src_stride: int
    dst_stride: int

    def __iter__(self) -> Iterator[int]:
        return iter(astuple(self))


def box_runs(out: list[PlanRun], src_tensor: int, dst_tensor: int, src: int, dst: int, length: Sequence[int],
             src_strides: Sequence[int], dst_strides: Sequence[int], size: int) -> None:
    """Appends the runs of a box: the innermost dimensions contiguous on both sides become one
    block, the next dimension the count, the outer ones one run each."""
    block = size
    d = len(length) - 1
    while d >= 0 and (length[d] == 1 or (src_strides[d] == block and dst_strides[d] == block)):
        block *= length[d]
        d -= 1
    if d < 0:
        out.append(PlanRun(src_tensor, dst_tensor, src, dst, block, 1, 0, 0))
        return
    count, ss, ds = length[d], src_strides[d], dst_strides[d]
    outer = [i for i in range(d) if length[i] > 1]
    index = [0] * len(outer)
    while True:
        s = src + sum(index[k] * src_strides[outer[k]] for k in range(len(outer)))
        t = dst + sum(index[k] * dst_strides[outer[k]] for k in range(len(outer)))
        out.append(PlanRun(src_tensor, dst_tensor, s, t, block, count, ss, ds))
        k = len(outer) - 1
        while k >= 0:
            index[k] += 1
            if index[k] < length[outer[k]]:
                break
            index[k] = 0
            k -= 1
        if k < 0:
            return


def sort_and_merge(runs: Sequence[PlanRun]) -> tuple[PlanRun, ...]:
    """A pair's runs in their one order (destination tensor and offset, then source), adjacent ones
    merged exactly as Node merges them."""
    out: list[list[int]] = []
    for b in sorted(runs, key=lambda r: (r.dst_tensor, r.dst_offset, r.src_tensor, r.src_offset)):
        if out and out[-1][0] == b.src_tensor and out[-1][1] == b.dst_tensor:
            a = out[-1]
            a_src, a_dst, a_bytes, a_count, a_ss, a_ds = a[2:]
            if a_count == 1 and b.count == 1 and b.src_offset == a_src + a_bytes and b.dst_offset == a_dst + a_bytes:
                a[4] = a_bytes + b.bytes
                continue
            if a_bytes == b.bytes:
                if a_count > 1 and (b.count == 1 or (b.src_stride == a_ss and b.dst_stride == a_ds)) \
                        and b.src_offset == a_src + a_count * a_ss and b.dst_offset == a_dst + a_count * a_ds:
                    a[5] = a_count + b.count
                    continue
                if a_count == 1 and b.src_offset - a_src >= a_bytes and b.dst_offset - a_dst >= a_bytes \
                        and (b.count == 1 or (b.src_stride == b.src_offset - a_src and b.dst_stride == b.dst_offset - a_dst)):
                    a[5] = 1 + b.count
                    a[6] = b.src_offset - a_src
                    a[7] = b.dst_offset - a_dst
                    continue
        out.append(list(b))
    return tuple(PlanRun(*r) for r in out)
