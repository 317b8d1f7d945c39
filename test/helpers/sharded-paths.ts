// For the GPU tests of the sharded sync's device paths (test/gpu/sharded-paths.test.ts and its
// child ranks, test/fixtures/sharded-nccl-child.ts): a small model's layouts whose runs are
// strided on either side and misaligned, deterministic source bytes, and the reference: what each
// destination tensor holds after a sync, by applying the whole plan's runs byte by byte on the CPU.
import { dtypeInfo } from '../../src/ipc/dtype.js';
import {
  LayoutBuilder, RUN_FIELDS, tensorParallelParameter, type LocalTensor, type RankLayout, type ShardPlan,
} from '../../src/tensors/sharded/index.js';

/** What destinations hold before a sync (padding keeps it). */
export const SENTINEL = 0xee;

/** Bytes a local tensor spans from its first element. */
export function extentOf(local: LocalTensor): number {
  if (local.shape.some((n) => n === 0)) return 0;
  let e = dtypeInfo(local.dtype).itemsize;
  local.shape.forEach((n, i) => { e += (n - 1) * local.strides[i]!; });
  return e;
}

/** Byte i of source tensor `tensor` of rank `rank` in the sync with `seed`. */
export function sourceByte(seed: number, rank: number, tensor: number, i: number): number {
  let h = Math.imul(seed ^ 0x9e3779b9, 16777619) ^ Math.imul(rank + 1, 2246822519) ^ Math.imul(tensor + 7, 3266489917);
  h = Math.imul(h ^ i, 2654435761);
  h ^= h >>> 15;
  h = Math.imul(h, 2246822519);
  return (h ^ (h >>> 13)) & 0xff;
}

/** A rank's source tensors' bytes. */
export function sourceBytes(layout: RankLayout, seed: number): Uint8Array[] {
  return layout.sources.map((local, t) => {
    const out = new Uint8Array(extentOf(local));
    for (let i = 0; i < out.length; i++) out[i] = sourceByte(seed, layout.rank, t, i);
    return out;
  });
}

/** The reference: rank `rank`'s destination tensors after applying every pair of `plan` into it. */
export function expectedDestinations(layouts: readonly RankLayout[], plan: ShardPlan, rank: number, seed: number): Uint8Array[] {
  const byRank = new Map(layouts.map((l) => [l.rank, l]));
  const out = byRank.get(rank)!.destinations.map((local) => new Uint8Array(extentOf(local)).fill(SENTINEL));
  for (const pair of plan.pairs) {
    if (pair.dst !== rank) continue;
    const src = sourceBytes(byRank.get(pair.src)!, seed);
    const r = pair.runs;
    for (let i = 0; i < r.length; i += RUN_FIELDS) {
      const [st, dt, so, doff, bytes, count, ss, ds] = Array.from(r.subarray(i, i + RUN_FIELDS)) as number[];
      for (let c = 0; c < count!; c++) {
        for (let b = 0; b < bytes!; b++) out[dt!]![doff! + c * ds! + b] = src[st!]![so! + c * ss! + b]!;
      }
    }
  }
  return out;
}

/** Differences of `got` from `want`: a count and the first few, named. */
export function differences(got: readonly Uint8Array[], want: readonly Uint8Array[], names: readonly string[]): { count: number; first: string[] } {
  let count = 0;
  const first: string[] = [];
  want.forEach((w, t) => {
    const g = got[t]!;
    for (let i = 0; i < w.length; i++) {
      if (g[i] !== w[i]) {
        if (first.length < 5) first.push(`${names[t]} byte ${i}: ${g[i]} instead of ${w[i]}`);
        count++;
      }
    }
  });
  return { count, first };
}

const dtype = 'bfloat16' as const;
const GLOBALS: Record<string, number[]> = {
  q: [384, 256], k: [128, 256], v: [128, 256], o: [256, 384], down: [256, 770], embed: [1000, 256], w1: [200, 512], t: [64, 96], norm: [256],
};

/**
 * Two trainer halves and two tensor-parallel halves of a small model, as `ranks` ranks: with 2,
 * rank i holds FSDP shard i (Shard(0); `w1` Shard(1); `t` column-major, so its runs are single
 * elements on the source side) and needs TP shard i (fused qkv, row-parallel o and down (770
 * columns: misaligned rows), a vocabulary padded to 64 rows, w1 rows whose blocks are strided on
 * the destination side, norm whole); with 4, ranks 0-1 hold and 2-3 need. `nodes`: each rank's node.
 */
export function pathLayouts(ranks: 2 | 4, nodes: readonly string[]): RankLayout[] {
  const holders = [0, 1];
  const needers = ranks === 2 ? [0, 1] : [2, 3];
  const builders = Array.from({ length: ranks }, (_, r) => new LayoutBuilder({ rank: r, node: nodes[r]!, gpu: ranks === 2 ? r : r % 2 }));
  holders.forEach((r, i) => {
    const b = builders[r]!;
    for (const [name, shape] of Object.entries(GLOBALS)) {
      if (name === 't') {
        // Column-major local shard [32, 96]: element (i, j) at byte 2 * (i + 32 * j).
        b.hold(name, { dtype, shape, start: [32 * i, 0], length: [32, 96], strides: [2, 64] });
        continue;
      }
      b.hold(name, { dtype, shape, mesh: [2], placements: [{ shard: name === 'w1' ? 1 : 0 }], coordinate: [i] });
    }
  });
  needers.forEach((r, tp) => {
    const b = builders[r]!;
    const g = GLOBALS;
    b.needParameter('qkv_proj', tensorParallelParameter({ dtype, dim: 0, size: 2, rank: tp, parts: [{ tensor: 'q', shape: g.q! }, { tensor: 'k', shape: g.k! }, { tensor: 'v', shape: g.v! }] }));
    b.needParameter('o_proj', tensorParallelParameter({ dtype, dim: 1, size: 2, rank: tp, parts: [{ tensor: 'o', shape: g.o! }] }));
    b.needParameter('down_proj', tensorParallelParameter({ dtype, dim: 1, size: 2, rank: tp, parts: [{ tensor: 'down', shape: g.down! }] }));
    b.needParameter('embed_tokens', tensorParallelParameter({ dtype, dim: 0, size: 2, rank: tp, padMultiple: 64, parts: [{ tensor: 'embed', shape: g.embed! }] }));
    b.needParameter('w1', tensorParallelParameter({ dtype, dim: 0, size: 2, rank: tp, parts: [{ tensor: 'w1', shape: g.w1! }] }));
    b.needParameter('t', tensorParallelParameter({ dtype, dim: 1, size: 2, rank: tp, parts: [{ tensor: 't', shape: g.t! }] }));
    b.need('norm', { dtype, shape: g.norm! });
  });
  return builders.map((b) => b.build());
}
