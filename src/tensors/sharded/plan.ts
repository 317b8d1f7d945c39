// The plan: from every rank's layout, which byte runs go from which source rank to which
// destination rank, checked before anything moves. Sources whose boxes of a tensor are equal are
// replicas of one box; where a tensor's distinct source boxes never partly overlap (DTensor
// placements: Shard and Replicate), each destination piece's cells are its intersections with
// them; otherwise the edges of the sources that meet the piece cut it into a grid. Each cell goes
// from one of the sources that hold it (sources on the destination's node first; among several,
// a big cell is split into slabs spread over them and a small one rotates by destination and
// cell), so every rank computes the same choice for a cell from the layouts alone. With `rank`, a
// rank computes only the pairs it is in: the same runs the whole plan has for it.
import { LayoutError, formatRange, type Box } from './errors.js';
import { validateLayoutOnce, type RankLayout } from './layout.js';
import { compactOf, type CompactLayout } from './compact.js';
import { buildIndex, endOf, hi, lo, sourceEntry, startOf, type Entry, type TensorIndex } from './plan-index.js';
import { RunSink, sortAndMerge, tableBytes } from './runs.js';
import { findHole } from './box.js';
import { layoutFingerprint } from './layout-wire.js';

/** A cell at least this large is split among the sources that hold it (more senders, fewer bytes each). */
export const SPLIT_MIN_BYTES = 1 << 20;

/** How bytes go between two ranks: one rank (a copy on its GPU), CUDA IPC on one node, NCCL between nodes. */
export type PlanPath = 'local' | 'ipc' | 'nccl';

/** Everything one source rank sends one destination rank. */
export interface PlanPair {
  readonly src: number;
  readonly dst: number;
  readonly path: PlanPath;
  /** Bytes moved. */
  readonly bytes: number;
  /** The runs, RUN_FIELDS numbers each (see runs.ts; runsOf() gives objects). */
  readonly runs: Float64Array;
}

/** A plan: pairs sorted by source rank, then destination rank. */
export interface ShardPlan {
  /** SHA-256 of the layouts (layoutFingerprint): equal fingerprints, equal plans. */
  readonly fingerprint: string;
  /** The ranks, sorted. */
  readonly ranks: ReadonlyArray<{ readonly rank: number; readonly node: string; readonly gpu: number }>;
  /** 'all', or the rank whose pairs alone were computed. */
  readonly scope: 'all' | number;
  readonly pairs: readonly PlanPair[];
}

/** Options of planSharded. */
export interface PlanOptions {
  /** Compute only the pairs this rank sends or receives (and check only what it receives). */
  readonly rank?: number;
}

/**
 * The plan for `layouts` (every rank's, each rank once). Throws LayoutError when a layout is
 * invalid, two layouts disagree about a tensor, or a destination byte has no source.
 */
export function planSharded(layouts: readonly RankLayout[], options: PlanOptions = {}): ShardPlan {
  const sorted = [...layouts].sort((a, b) => a.rank - b.rank);
  for (let i = 0; i < sorted.length; i++) {
    validateLayoutOnce(sorted[i]!);
    if (i > 0 && sorted[i - 1]!.rank === sorted[i]!.rank) {
      throw new LayoutError('ERR_LAYOUT_INVALID', `two layouts are rank ${sorted[i]!.rank}; each rank gives one`, { rank: sorted[i]!.rank });
    }
  }
  const scope = options.rank;
  const me = scope === undefined ? -1 : sorted.findIndex((l) => l.rank === scope);
  if (scope !== undefined && me < 0) throw new LayoutError('ERR_LAYOUT_INVALID', `rank ${scope} has no layout among the ${sorted.length} given`, { rank: scope });
  const compacts = sorted.map(compactOf);
  const index = buildIndex(sorted, compacts, me);
  const out = new Map<number, RunSink>();
  const n = sorted.length;
  let lastKey = -1;
  let last: RunSink | undefined;
  const sinkFor = (src: number, dst: number): RunSink => {
    const key = src * n + dst;
    if (key === lastKey) return last!;
    let s = out.get(key);
    if (!s) out.set(key, (s = new RunSink()));
    lastKey = key;
    last = s;
    return s;
  };
  const ctx: Ctx = { layouts: sorted, nodes: sorted.map((l) => l.node), compacts, sinkFor };
  for (const t of index.values()) {
    if (!t.mine) continue;
    const { sources, dests } = t;
    if (me < 0) {
      for (const i of dests.byStart) planPiece(ctx, t, dests.entry(i));
      continue;
    }
    for (const i of dests.byStart) if (dests.lay[i] === me) planPiece(ctx, t, dests.entry(i));
    for (const i of sources.byStart) {
      if (sources.lay[i] !== me) continue;
      const s = sourceEntry(t, i);
      for (const j of dests.overlapping(dests.byStart, s)) if (dests.lay[j] !== me) planPiece(ctx, t, dests.entry(j), s);
    }
  }
  const pairs: PlanPair[] = [];
  for (const key of [...out.keys()].sort((a, b) => a - b)) {
    const src = sorted[Math.floor(key / n)]!;
    const dst = sorted[key % n]!;
    const runs = sortAndMerge(out.get(key)!.values);
    const path: PlanPath = src === dst ? 'local' : src.node === dst.node ? 'ipc' : 'nccl';
    pairs.push({ src: src.rank, dst: dst.rank, path, bytes: tableBytes(runs), runs });
  }
  return {
    fingerprint: layoutFingerprint(sorted),
    ranks: sorted.map((l) => ({ rank: l.rank, node: l.node, gpu: l.gpu })),
    scope: scope ?? 'all',
    pairs,
  };
}

/** Bytes each rank sends and receives in a plan (of its scope). */
export function planBytes(plan: ShardPlan): { sent: Map<number, number>; received: Map<number, number> } {
  const sent = new Map<number, number>();
  const received = new Map<number, number>();
  for (const p of plan.pairs) {
    sent.set(p.src, (sent.get(p.src) ?? 0) + p.bytes);
    received.set(p.dst, (received.get(p.dst) ?? 0) + p.bytes);
  }
  return { sent, received };
}

interface Ctx {
  readonly layouts: readonly RankLayout[];
  readonly nodes: readonly string[];
  readonly compacts: readonly CompactLayout[];
  readonly sinkFor: (src: number, dst: number) => RunSink;
}

function bisect(cuts: readonly number[], x: number): number {
  let l = 0;
  let h = cuts.length;
  while (l < h) {
    const mid = (l + h) >>> 1;
    if (cuts[mid]! < x) l = mid + 1; else h = mid;
  }
  return l;
}

/**
 * Plans destination piece `p`: the grid its sources cut it into, a source (or slabs over several)
 * per cell, the runs. With `only`, just the cells inside that source's box, and only its runs.
 */
function planPiece(ctx: Ctx, t: TensorIndex, p: Entry, only?: Entry): void {
  if (t.groups) {
    planPieceByBoxes(ctx, t, t.groups, p, only);
    return;
  }
  const ndim = p.ndim;
  const sources = t.sources.overlapping(t.sources.byStart, p).map((i) => sourceEntry(t, i));
  const dstLayout = ctx.layouts[p.rank]!;
  const name = t.tensor.name;
  const pStart = startOf(p);
  const pEnd = endOf(p);
  if (sources.length === 0) throw uncovered(name, dstLayout, { start: pStart, length: pEnd.map((e, i) => e - pStart[i]!) });
  const boxes = sources.map((s) => ({ s, start: startOf(s), end: endOf(s) }));
  const cuts: number[][] = [];
  for (let d = 0; d < ndim; d++) {
    const set = new Set<number>([pStart[d]!, pEnd[d]!]);
    for (const s of boxes) {
      if (s.start[d]! > pStart[d]!) set.add(s.start[d]!);
      if (s.end[d]! < pEnd[d]!) set.add(s.end[d]!);
    }
    cuts.push([...set].sort((a, b) => a - b));
  }
  const grid = cuts.map((c) => c.length - 1);
  // The part of the grid to plan: all of it, or the cells inside `only`.
  const onlyStart = only && startOf(only);
  const onlyEnd = only && endOf(only);
  const low = cuts.map((c, d) => (onlyStart ? bisect(c, Math.max(onlyStart[d]!, pStart[d]!)) : 0));
  const high = cuts.map((c, d) => (onlyEnd ? bisect(c, Math.min(onlyEnd[d]!, pEnd[d]!)) : grid[d]!));
  const span = low.map((l, d) => high[d]! - l);
  let cells = 1;
  for (const s of span) cells *= s;
  const candidates: Entry[][] = Array.from({ length: cells }, () => []);
  for (const { s, start: ss, end: se } of boxes) {
    const a = cuts.map((c, d) => Math.max(bisect(c, Math.max(ss[d]!, pStart[d]!)), low[d]!));
    const b = cuts.map((c, d) => Math.min(bisect(c, Math.min(se[d]!, pEnd[d]!)), high[d]!));
    if (a.some((x, d) => x >= b[d]!)) continue;
    const k = [...a];
    for (;;) {
      let cell = 0;
      for (let d = 0; d < ndim; d++) cell = cell * span[d]! + (k[d]! - low[d]!);
      candidates[cell]!.push(s);
      let d = ndim - 1;
      while (d >= 0 && ++k[d]! === b[d]!) { k[d] = a[d]!; d--; }
      if (d < 0) break;
    }
  }
  const k = [...low];
  for (let c = 0; c < cells; c++) {
    const start = k.map((x, d) => cuts[d]![x]!);
    const length = k.map((x, d) => cuts[d]![x + 1]! - cuts[d]![x]!);
    let ordinal = 0;
    for (let d = 0; d < ndim; d++) ordinal = ordinal * grid[d]! + k[d]!;
    let held = candidates[c]!;
    if (held.length === 0) throw uncovered(name, dstLayout, { start, length });
    const near = held.filter((s) => ctx.nodes[s.rank] === dstLayout.node);
    if (near.length > 0) held = near;
    if (held.length > 1) held.sort((a, b) => a.order - b.order);
    assignCell(ctx, t, p, { start, length }, held, (dstLayout.rank + ordinal) % held.length, only);
    let d = ndim - 1;
    while (d >= 0 && ++k[d]! === high[d]!) { k[d] = low[d]!; d--; }
  }
}

/**
 * Plans destination piece `p` where the tensor's distinct source boxes do not partly overlap: a
 * cell per box that meets it, held by that box's replicas. With `only`, just that source's box.
 */
function planPieceByBoxes(ctx: Ctx, t: TensorIndex, groups: readonly number[], p: Entry, only?: Entry): void {
  const dstLayout = ctx.layouts[p.rank]!;
  const ndim = p.ndim;
  const sources = t.sources;
  const meeting = only ? [only.rep!.order] : sources.overlapping(groups, p);
  let covered = 0;
  // One box reused for every cell (nothing downstream keeps it).
  const start = new Array<number>(ndim);
  const length = new Array<number>(ndim);
  const box = { start, length };
  for (const g of meeting) {
    let cells = 1;
    for (let d = 0; d < ndim; d++) {
      start[d] = Math.max(sources.start(g, d), lo(p, d));
      length[d] = Math.min(sources.end(g, d), hi(p, d)) - start[d]!;
      cells *= length[d]!;
    }
    covered += cells;
    if (!t.members!.has(g)) {
      // One source holds this box: no entry object needed (most cells of an FSDP layout).
      if (only && only.order !== g) continue;
      const c = ctx.compacts[sources.lay[g]!]!;
      const li = sources.li[g]!;
      emitFrom(ctx, t, sources.lay[g]!, li, c.nums, sources.o[g]!, c.lStrides[li]!, p, box);
      continue;
    }
    let held = sourceEntry(t, g).members!;
    const near = held.filter((s) => ctx.nodes[s.rank] === dstLayout.node);
    if (near.length > 0) held = near;
    assignCell(ctx, t, p, box, held, (dstLayout.rank + t.gid![g]!) % held.length, only);
  }
  if (!only) {
    let whole = 1;
    for (let d = 0; d < ndim; d++) whole *= hi(p, d) - lo(p, d);
    if (covered < whole) {
      const ps = startOf(p);
      const pe = endOf(p);
      const boxes = meeting.map((i) => sourceEntry(t, i)).map((g) => ({ start: startOf(g).map((x, d) => Math.max(x, ps[d]!) - ps[d]!), length: endOf(g).map((x, d) => Math.min(x, pe[d]!) - Math.max(lo(g, d), ps[d]!)) }));
      const hole = findHole(pe.map((e, d) => e - ps[d]!), boxes)!;
      throw uncovered(t.tensor.name, dstLayout, { start: hole.start.map((x, d) => x + ps[d]!), length: hole.length });
    }
  }
}

/** Sends cell `box` of piece `p` from `held[rot]`, or in slabs over several of `held` when it is large. */
function assignCell(ctx: Ctx, t: TensorIndex, p: Entry, box: Box, held: readonly Entry[], rot: number, only?: Entry): void {
  let slabs = 1;
  let dim = -1;
  for (let d = 0; d < box.length.length && dim < 0; d++) if (box.length[d]! > 1) dim = d;
  if (held.length > 1 && dim >= 0) {
    let bytes = t.itemsize;
    for (const l of box.length) bytes *= l;
    slabs = Math.max(1, Math.min(held.length, box.length[dim]!, Math.floor(bytes / SPLIT_MIN_BYTES)));
  }
  if (slabs === 1) {
    emit(ctx, t, held[rot]!, p, box, only);
    return;
  }
  const n = box.length[dim]!;
  const base = Math.floor(n / slabs);
  const extra = n % slabs;
  let offset = box.start[dim]!;
  for (let j = 0; j < slabs; j++) {
    const len = base + (j < extra ? 1 : 0);
    const start = [...box.start]; start[dim] = offset;
    const length = [...box.length]; length[dim] = len;
    emit(ctx, t, held[(j + rot) % held.length]!, p, { start, length }, only);
    offset += len;
  }
}

function emit(ctx: Ctx, t: TensorIndex, s: Entry, p: Entry, box: Box, only?: Entry): void {
  if (only && s !== only) return;
  emitFrom(ctx, t, s.rank, s.local, s.nums, s.o, s.so, p, box);
}

/** The runs of `box` from the source piece at `o` of layout `rank`'s local tensor `li` (strides at `so`) into `p`. */
function emitFrom(ctx: Ctx, t: TensorIndex, rank: number, li: number, nums: Float64Array, o: number, so: number, p: Entry, box: Box): void {
  const ndim = box.start.length;
  const pn = p.nums;
  let src = 0;
  let dst = 0;
  for (let d = 0; d < ndim; d++) {
    src += (box.start[d]! - nums[o + d]! + nums[o + 2 * ndim + d]!) * nums[so + d]!;
    dst += (box.start[d]! - pn[p.o + d]! + pn[p.o + 2 * ndim + d]!) * pn[p.so + d]!;
  }
  ctx.sinkFor(rank, p.rank).box(li, p.local, src, dst, box.length, nums, so, pn, p.so, t.itemsize);
}

function uncovered(name: string, dst: RankLayout, range: Box): LayoutError {
  return new LayoutError('ERR_LAYOUT_UNCOVERED',
    `tensor ${name}: ${formatRange(range)}, which rank ${dst.rank} needs, is held by no source rank; add the sources that hold it, or take it out of the destination's pieces`,
    { tensor: name, rank: dst.rank, range });
}
