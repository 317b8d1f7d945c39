// The plan: from every rank's layout, which byte runs go from which source rank to which
// destination rank, checked before anything moves. Sources whose boxes of a tensor are equal are
// replicas of one box; where a tensor's distinct source boxes never partly overlap (DTensor
// placements: Shard and Replicate), each destination piece's cells are its intersections with
// them; otherwise the edges of the sources that meet the piece cut it into a grid. Each cell goes
// from one of the sources that hold it (sources on the destination's node first; among several,
// a big cell is split into slabs spread over them and a small one rotates by destination and
// cell), so every rank computes the same choice for a cell from the layouts alone. With `rank`, a
// rank computes only the pairs it is in: the same runs the whole plan has for it.
import { dtypeInfo } from '../../ipc/dtype.js';
import { LayoutError, formatRange, type Box } from './errors.js';
import { validateLayoutOnce, type GlobalTensor, type RankLayout } from './layout.js';
import { compactOf, type CompactLayout } from './compact.js';
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

/** A piece of a local tensor, as the planner reads it: offsets into its layout's numbers. */
interface Entry {
  readonly rank: number; // index into the sorted layouts
  readonly local: number; // index in its role's list (sources or destinations)
  readonly c: CompactLayout;
  readonly li: number; // index among the layout's locals (sources then destinations)
  readonly nums: Float64Array;
  /** start at o, length at o + ndim, at at o + 2 ndim (in `nums`). */
  readonly o: number;
  readonly ndim: number;
  /** First-dimension start and end (0 and 1 for a 0-d tensor). */
  readonly s0: number;
  readonly e0: number;
  order: number;
  /** Sources: the id of the entry's box among the distinct ones, and the first source of that box. */
  gid: number;
  rep: Entry | undefined;
  /** On a box's first source: every source of that box, in order, when there are several. */
  members: Entry[] | undefined;
  strides: Float64Array | undefined;
}

const lo = (e: Entry, d: number): number => e.nums[e.o + d]!;
const hi = (e: Entry, d: number): number => e.nums[e.o + d]! + e.nums[e.o + e.ndim + d]!;
const startOf = (e: Entry): number[] => Array.from({ length: e.ndim }, (_, d) => lo(e, d));
const endOf = (e: Entry): number[] => Array.from({ length: e.ndim }, (_, d) => hi(e, d));
const stridesOf = (e: Entry): Float64Array => (e.strides ??= e.nums.subarray(e.c.lStrides[e.li]!, e.c.lStrides[e.li]! + e.ndim));

interface TensorIndex {
  readonly tensor: GlobalTensor;
  readonly itemsize: number;
  readonly sources: Entry[];
  readonly dests: Entry[];
  maxSource: number;
  maxDest: number;
  /** Whether the rank planned for has a piece of it (always, for the whole plan). */
  mine: boolean;
  /** The distinct source boxes (their first sources) by first-dimension start, or undefined where two partly overlap (grid mode). */
  groups?: Entry[];
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
  const sinkFor = (src: number, dst: number): RunSink => {
    const key = src * n + dst;
    let s = out.get(key);
    if (!s) out.set(key, (s = new RunSink()));
    return s;
  };
  const ctx: Ctx = { layouts: sorted, nodes: sorted.map((l) => l.node), sinkFor };
  for (const t of index.values()) {
    if (!t.mine) continue;
    if (me < 0) {
      for (const p of t.dests) planPiece(ctx, t, p);
      continue;
    }
    for (const p of t.dests) if (p.rank === me) planPiece(ctx, t, p);
    for (const s of t.sources) {
      if (s.rank !== me) continue;
      for (const p of overlapping(t.dests, t.maxDest, s)) if (p.rank !== me) planPiece(ctx, t, p, s);
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
  readonly sinkFor: (src: number, dst: number) => RunSink;
}

/**
 * Every global tensor's source and destination pieces (with `me`, only of the tensors that rank
 * has a piece of; every tensor's dtype and shape are checked across layouts either way). Layouts
 * that share a table of global tensors (decoded records listing the same ones) look it up once.
 */
function buildIndex(layouts: readonly RankLayout[], compacts: readonly CompactLayout[], me: number): Map<string, TensorIndex> {
  const index = new Map<string, TensorIndex>();
  const owner = new Map<string, number>();
  const slotsOf = new Map<readonly GlobalTensor[], TensorIndex[]>();
  const slots = compacts.map((c, r) => {
    let list = slotsOf.get(c.tensors);
    if (list) return list;
    list = c.tensors.map((g) => {
      const t = index.get(g.name);
      if (!t) {
        const created: TensorIndex = { tensor: g, itemsize: dtypeInfo(g.dtype).itemsize, sources: [], dests: [], maxSource: 0, maxDest: 0, mine: me < 0 };
        index.set(g.name, created);
        owner.set(g.name, layouts[r]!.rank);
        return created;
      }
      const first = owner.get(g.name)!;
      if (t.tensor.dtype !== g.dtype) {
        throw new LayoutError('ERR_LAYOUT_DTYPE', `tensor ${g.name} is ${t.tensor.dtype} in rank ${first}'s layout but ${g.dtype} in rank ${layouts[r]!.rank}'s; every rank must give one dtype`, { tensor: g.name, rank: layouts[r]!.rank });
      }
      if (t.tensor.shape.length !== g.shape.length || t.tensor.shape.some((d, i) => d !== g.shape[i])) {
        throw new LayoutError('ERR_LAYOUT_SHAPE', `tensor ${g.name} is [${t.tensor.shape.join(', ')}] in rank ${first}'s layout but [${g.shape.join(', ')}] in rank ${layouts[r]!.rank}'s; every rank must give one global shape`, { tensor: g.name, rank: layouts[r]!.rank });
      }
      return t;
    });
    slotsOf.set(c.tensors, list);
    return list;
  });
  if (me >= 0) for (const t of slots[me]!) t.mine = true;
  compacts.forEach((c, r) => {
    const mine = slots[r]!;
    const nums = c.nums;
    for (let li = 0; li < c.localCount; li++) {
      const source = li < c.sourceCount;
      const local = source ? li : li - c.sourceCount;
      const ndim = c.lNdim[li]!;
      for (let k = c.lPieces[li]!; k < c.lPieces[li + 1]!; k++) {
        const t = mine[c.pTensor[k]!]!;
        if (!t.mine) continue;
        const o = c.pAt[k]!;
        const s0 = ndim > 0 ? nums[o]! : 0;
        const e0 = ndim > 0 ? s0 + nums[o + ndim]! : 1;
        const e: Entry = { rank: r, local, c, li, nums, o, ndim, s0, e0, order: 0, gid: 0, rep: undefined, members: undefined, strides: undefined };
        (source ? t.sources : t.dests).push(e);
      }
    }
  });
  for (const t of index.values()) {
    if (!t.mine) continue;
    // Sources in rank order give each its tie-breaking number; then both lists by first-dimension start.
    t.sources.forEach((e, i) => { e.order = i; });
    t.dests.forEach((e, i) => { e.order = i; });
    t.groups = groupReplicas(t.sources);
    sortByStart(t.sources);
    sortByStart(t.dests);
    for (const e of t.sources) t.maxSource = Math.max(t.maxSource, e.e0 - e.s0);
    for (const e of t.dests) t.maxDest = Math.max(t.maxDest, e.e0 - e.s0);
  }
  return index;
}

/** Sorts entries by first-dimension start, then order (often already so: FSDP shards in rank order). */
function sortByStart(entries: Entry[]): void {
  let sorted = true;
  for (let i = 1; i < entries.length && sorted; i++) {
    const a = entries[i - 1]!;
    const b = entries[i]!;
    sorted = a.s0 < b.s0 || (a.s0 === b.s0 && a.order < b.order);
  }
  if (!sorted) entries.sort((a, b) => a.s0 - b.s0 || a.order - b.order);
}

/**
 * The sources' distinct boxes (their first sources, replicas grouped), sorted by first-dimension
 * start; undefined when two distinct ones partly overlap. `sources` are in order (rank, local tensor, piece).
 */
function groupReplicas(sources: readonly Entry[]): Entry[] | undefined {
  // The common case, FSDP's Shard(0): in order, each box past the previous on the first dimension.
  let apart = sources.length > 0 && sources[0]!.ndim > 0;
  for (let i = 1; i < sources.length && apart; i++) apart = sources[i]!.s0 >= sources[i - 1]!.e0;
  if (apart) {
    sources.forEach((e, id) => { e.gid = id; e.rep = e; });
    return [...sources];
  }
  // Otherwise a sweep along the first dimension: boxes that meet must be equal (replicas).
  const sorted = [...sources];
  sortByStart(sorted);
  const ndim = sorted[0]?.ndim ?? 0;
  if (ndim === 0) return undefined; // no sources, or 0-d ones: the grid (one cell)
  const groups: Entry[] = [];
  let open: Entry[] = [];
  for (const e of sorted) {
    open = open.filter((o) => o.e0 > e.s0);
    let home: Entry | undefined;
    for (const o of open) {
      let meets = true;
      let equal = true;
      for (let d = 0; d < ndim; d++) {
        const os = lo(o, d);
        const oe = hi(o, d);
        const es = lo(e, d);
        const ee = hi(e, d);
        if (os >= ee || oe <= es) { meets = false; break; }
        if (os !== es || oe !== ee) equal = false;
      }
      if (!meets) continue;
      if (!equal) return undefined;
      home = o;
    }
    if (home) {
      (home.members ??= [home]).push(e);
      e.rep = home;
    } else {
      e.rep = e;
      groups.push(e);
      open.push(e);
    }
  }
  // Ids in the order of each box's first source; members in source order; the list by start.
  // Sorted by start then order, a box's first member met is its first in order.
  groups.forEach((g) => {
    if (g.members) g.members.sort((a, b) => a.order - b.order);
  });
  [...groups].sort((a, b) => a.order - b.order).forEach((g, id) => {
    for (const m of g.members ?? [g]) m.gid = id;
  });
  return groups;
}

/** Entries (sorted by first-dimension start, none longer than `maxLen` there) that share an element with `box`. */
function overlapping(entries: readonly Entry[], maxLen: number, box: Entry): Entry[] {
  const found: Entry[] = [];
  const ndim = box.ndim;
  let i = 0;
  if (ndim > 0) {
    // The first entry that could reach box.s0: its start is above box.s0 - maxLen.
    const from = box.s0 - maxLen;
    let l = 0;
    let h = entries.length;
    while (l < h) {
      const mid = (l + h) >>> 1;
      if (entries[mid]!.s0 <= from) l = mid + 1; else h = mid;
    }
    i = l;
  }
  for (; i < entries.length; i++) {
    const e = entries[i]!;
    if (ndim > 0 && e.s0 >= box.e0) break;
    let meets = true;
    for (let d = 0; d < ndim; d++) {
      if (lo(e, d) >= hi(box, d) || hi(e, d) <= lo(box, d)) { meets = false; break; }
    }
    if (meets) found.push(e);
  }
  return found;
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
  const sources = overlapping(t.sources, t.maxSource, p);
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
function planPieceByBoxes(ctx: Ctx, t: TensorIndex, groups: readonly Entry[], p: Entry, only?: Entry): void {
  const dstLayout = ctx.layouts[p.rank]!;
  const ndim = p.ndim;
  const meeting = only ? [only.rep!] : overlapping(groups, t.maxSource, p);
  let covered = 0;
  for (const g of meeting) {
    const start = new Array<number>(ndim);
    const length = new Array<number>(ndim);
    let cells = 1;
    for (let d = 0; d < ndim; d++) {
      start[d] = Math.max(lo(g, d), lo(p, d));
      length[d] = Math.min(hi(g, d), hi(p, d)) - start[d]!;
      cells *= length[d]!;
    }
    covered += cells;
    let held = g.members ?? [g];
    if (held.length > 1) {
      const near = held.filter((s) => ctx.nodes[s.rank] === dstLayout.node);
      if (near.length > 0) held = near;
    }
    assignCell(ctx, t, p, { start, length }, held, (dstLayout.rank + g.gid) % held.length, only);
  }
  if (!only) {
    let whole = 1;
    for (let d = 0; d < ndim; d++) whole *= hi(p, d) - lo(p, d);
    if (covered < whole) {
      const ps = startOf(p);
      const pe = endOf(p);
      const boxes = meeting.map((g) => ({ start: startOf(g).map((x, d) => Math.max(x, ps[d]!) - ps[d]!), length: endOf(g).map((x, d) => Math.min(x, pe[d]!) - Math.max(lo(g, d), ps[d]!)) }));
      const hole = findHole(pe.map((e, d) => e - ps[d]!), boxes)!;
      throw uncovered(t.tensor.name, dstLayout, { start: hole.start.map((x, d) => x + ps[d]!), length: hole.length });
    }
  }
}

/** Sends cell `box` of piece `p` from `held[rot]`, or in slabs over several of `held` when it is large. */
function assignCell(ctx: Ctx, t: TensorIndex, p: Entry, box: Box, held: readonly Entry[], rot: number, only?: Entry): void {
  let slabs = 1;
  const dim = box.length.findIndex((l) => l > 1);
  if (held.length > 1 && dim >= 0) {
    const bytes = box.length.reduce((a, b) => a * b, t.itemsize);
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
  const ss = stridesOf(s);
  const ps = stridesOf(p);
  let src = 0;
  let dst = 0;
  for (let d = 0; d < box.start.length; d++) {
    src += (box.start[d]! - lo(s, d) + s.nums[s.o + 2 * s.ndim + d]!) * ss[d]!;
    dst += (box.start[d]! - lo(p, d) + p.nums[p.o + 2 * p.ndim + d]!) * ps[d]!;
  }
  ctx.sinkFor(s.rank, p.rank).box(s.local, p.local, src, dst, box.length, ss, ps, t.itemsize);
}

function uncovered(name: string, dst: RankLayout, range: Box): LayoutError {
  return new LayoutError('ERR_LAYOUT_UNCOVERED',
    `tensor ${name}: ${formatRange(range)}, which rank ${dst.rank} needs, is held by no source rank; add the sources that hold it, or take it out of the destination's pieces`,
    { tensor: name, rank: dst.rank, range });
}
