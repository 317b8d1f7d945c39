// The planner's reference: every global tensor materialised as bytes, every source's local tensors
// filled from them through their strides, the plan's runs applied byte by byte, and every
// destination byte compared with the global tensor it came from (padding left as it was, no byte
// written twice, none outside the pieces).
import { dtypeInfo } from '../../src/ipc/dtype.js';
import type { RankLayout, LocalTensor, ShardPlan } from '../../src/tensors/sharded/index.js';
import { RUN_FIELDS } from '../../src/tensors/sharded/index.js';

const SENTINEL = 0xee;

function globalByte(tensor: string, flat: number): number {
  let h = 2166136261;
  for (let i = 0; i < tensor.length; i++) h = Math.imul(h ^ tensor.charCodeAt(i), 16777619);
  h = Math.imul(h ^ flat, 2246822519);
  h ^= h >>> 13;
  h = Math.imul(h, 3266489917);
  return (h ^ (h >>> 16)) & 0xff;
}

function extent(local: LocalTensor): number {
  let e = dtypeInfo(local.dtype).itemsize;
  local.shape.forEach((n, i) => { e += (n - 1) * local.strides[i]!; });
  return e;
}

/** Calls fn(global index, local index) for each element of a piece. */
function eachElement(start: readonly number[], length: readonly number[], at: readonly number[], fn: (g: number[], l: number[]) => void): void {
  const k = length.map(() => 0);
  if (length.some((n) => n === 0)) return;
  for (;;) {
    fn(k.map((x, d) => start[d]! + x), k.map((x, d) => at[d]! + x));
    let d = length.length - 1;
    while (d >= 0 && ++k[d]! === length[d]!) k[d--] = 0;
    if (d < 0) return;
  }
}

const flatIndex = (shape: readonly number[], idx: readonly number[]): number => idx.reduce((f, x, d) => f * shape[d]! + x, 0);
const byteOffset = (strides: readonly number[], idx: readonly number[]): number => idx.reduce((o, x, d) => o + x * strides[d]!, 0);

/**
 * Applies `plans` (the whole plan, or every rank's own plans) to materialised sources and returns
 * the problems found at the destinations (empty when every declared byte arrived exactly once).
 */
export function checkPlan(layouts: readonly RankLayout[], plans: readonly ShardPlan[]): string[] {
  const byRank = new Map(layouts.map((l) => [l.rank, l]));
  const shapes = new Map<string, readonly number[]>();
  for (const l of layouts) for (const t of l.tensors) shapes.set(t.name, t.shape);
  const srcMem = new Map<number, Uint8Array[]>();
  const dstMem = new Map<number, Uint8Array[]>();
  const writes = new Map<number, Uint8Array[]>();
  for (const l of layouts) {
    srcMem.set(l.rank, l.sources.map((local) => {
      const mem = new Uint8Array(extent(local));
      const size = dtypeInfo(local.dtype).itemsize;
      for (const p of local.pieces) {
        eachElement(p.start, p.length, p.at, (g, li) => {
          const f = flatIndex(shapes.get(p.tensor)!, g) * size;
          const o = byteOffset(local.strides, li);
          for (let b = 0; b < size; b++) mem[o + b] = globalByte(p.tensor, f + b);
        });
      }
      return mem;
    }));
    dstMem.set(l.rank, l.destinations.map((local) => new Uint8Array(extent(local)).fill(SENTINEL)));
    writes.set(l.rank, l.destinations.map((local) => new Uint8Array(extent(local))));
  }
  const seen = new Set<string>();
  for (const plan of plans) {
    for (const pair of plan.pairs) {
      const key = `${pair.src}->${pair.dst}`;
      if (seen.has(key)) continue; // the same pair in the source's and the destination's own plans
      seen.add(key);
      const src = srcMem.get(pair.src)!;
      const dst = dstMem.get(pair.dst)!;
      const w = writes.get(pair.dst)!;
      const r = pair.runs;
      for (let i = 0; i < r.length; i += RUN_FIELDS) {
        const [st, dt, so, doff, bytes, count, ss, ds] = Array.from(r.subarray(i, i + RUN_FIELDS));
        for (let c = 0; c < count!; c++) {
          for (let b = 0; b < bytes!; b++) {
            const from = so! + c * ss! + b;
            const to = doff! + c * ds! + b;
            dst[dt!]![to] = src[st!]![from]!;
            w[dt!]![to]! += 1;
          }
        }
      }
    }
  }
  const problems: string[] = [];
  for (const l of layouts) {
    l.destinations.forEach((local, li) => {
      const mem = dstMem.get(l.rank)![li]!;
      const w = writes.get(l.rank)![li]!;
      const size = dtypeInfo(local.dtype).itemsize;
      const expected = new Int16Array(mem.length).fill(-1); // -1: must stay untouched
      for (const p of local.pieces) {
        eachElement(p.start, p.length, p.at, (g, li2) => {
          const f = flatIndex(shapes.get(p.tensor)!, g) * size;
          const o = byteOffset(local.strides, li2);
          for (let b = 0; b < size; b++) expected[o + b] = globalByte(p.tensor, f + b);
        });
      }
      for (let o = 0; o < mem.length && problems.length < 20; o++) {
        const want = expected[o]!;
        if (want < 0 && (w[o] !== 0 || mem[o] !== SENTINEL)) problems.push(`rank ${l.rank} ${local.name} byte ${o}: written but it is padding or outside the pieces`);
        else if (want >= 0 && w[o] !== 1) problems.push(`rank ${l.rank} ${local.name} byte ${o}: written ${w[o]} times`);
        else if (want >= 0 && mem[o] !== want) problems.push(`rank ${l.rank} ${local.name} byte ${o}: ${mem[o]} instead of ${want}`);
      }
    });
  }
  return problems;
}
