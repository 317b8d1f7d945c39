// The planner's reference: every global tensor materialised as bytes, every source's local tensors
// filled from them through their strides, the plan's runs applied byte by byte, and every
// destination byte compared with the global tensor it came from (padding left as it was, no byte
// written twice, none outside the pieces).
import { dtypeInfo } from '../../src/ipc/dtype.js';
import type { RankLayout, LocalTensor, ShardPlan } from '../../src/tensors/sharded/index.js';
import { RUN_FIELDS } from '../../src/tensors/sharded/index.js';
import { byteOffset, eachElement, flatIndex } from '../helpers/piece-elements.js';
import { globalByte, SENTINEL } from '../helpers/shard-group.js';


function extent(local: LocalTensor): number {
  let e = dtypeInfo(local.dtype).itemsize;
  local.shape.forEach((n, i) => { e += (n - 1) * local.strides[i]!; });
  return e;
}

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
          for (let b = 0; b < size; b++) mem[o + b] = globalByte(p.tensor, f + b, 0);
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
          for (let b = 0; b < size; b++) expected[o + b] = globalByte(p.tensor, f + b, 0);
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
