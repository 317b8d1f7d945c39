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

interface Entry {
  readonly rank: number; // index into the sorted layouts
  readonly local: number;
  readonly start: readonly number[];
  readonly end: readonly number[];
  readonly at: readonly number[];
  readonly strides: readonly number[];
  order: number;
  /** The replicas of this entry's box (sources only). */
  group?: Group;
}

/** Sources with one box of a tensor: id in box order, members in rank order. */
interface Group {
  id: number;
  readonly start: readonly number[];
  readonly end: readonly number[];
  readonly members: Entry[];
}

interface TensorIndex {
  readonly tensor: GlobalTensor;
  readonly itemsize: number;
  readonly sources: Entry[];
  readonly dests: Entry[];
  maxSource: number;
  maxDest: number;
  /** The distinct source boxes by first-dimension start, or undefined where two partly overlap (grid mode). */
  groups?: Group[];
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
  const index = buildIndex(sorted);
  const out = new Map<number, RunSink>();
  const n = sorted.length;
  const sinkFor = (src: number, dst: number): RunSink => {
    const key = src * n + dst;
    let s = out.get(key);
    if (!s) out.set(key, (s = new RunSink()));
    return s;
  };
  const ctx: Ctx = { layouts: sorted, sinkFor };
  for (const t of index.values()) {
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
  readonly sinkFor: (src: number, dst: number) => RunSink;
}

function buildIndex(layouts: readonly RankLayout[]): Map<string, TensorIndex> {
  const index = new Map<string, TensorIndex>();
  const owner = new Map<string, number>();
  layouts.forEach((l, r) => {
    for (const g of l.tensors) {
      const t = index.get(g.name);
      if (!t) {
        index.set(g.name, { tensor: g, itemsize: dtypeInfo(g.dtype).itemsize, sources: [], dests: [], maxSource: 0, maxDest: 0 });
        owner.set(g.name, l.rank);
        continue;
      }
      const first = owner.get(g.name)!;
      if (t.tensor.dtype !== g.dtype) {
        throw new LayoutError('ERR_LAYOUT_DTYPE', `tensor ${g.name} is ${t.tensor.dtype} in rank ${first}'s layout but ${g.dtype} in rank ${l.rank}'s; every rank must give one dtype`, { tensor: g.name, rank: l.rank });
      }
      if (t.tensor.shape.length !== g.shape.length || t.tensor.shape.some((d, i) => d !== g.shape[i])) {
        throw new LayoutError('ERR_LAYOUT_SHAPE', `tensor ${g.name} is [${t.tensor.shape.join(', ')}] in rank ${first}'s layout but [${g.shape.join(', ')}] in rank ${l.rank}'s; every rank must give one global shape`, { tensor: g.name, rank: l.rank });
      }
    }
    for (const [list, key] of [[l.sources, 'sources'], [l.destinations, 'dests']] as const) {
      for (let li = 0; li < list.length; li++) {
        const local = list[li]!;
        for (const p of local.pieces) {
          const end = new Array<number>(p.start.length);
          for (let i = 0; i < end.length; i++) end[i] = p.start[i]! + p.length[i]!;
          index.get(p.tensor)![key].push({ rank: r, local: li, start: p.start, end, at: p.at, strides: local.strides, order: 0 });
        }
      }
    }
  });
  for (const t of index.values()) {
    // Sources in rank order give each its tie-breaking number; then both lists by first-dimension start.
    t.sources.forEach((e, i) => { e.order = i; });
    t.dests.forEach((e, i) => { e.order = i; });
    t.groups = groupReplicas(t.sources);
    sortByStart(t.sources);
    sortByStart(t.dests);
    for (const e of t.sources) t.maxSource = Math.max(t.maxSource, (e.end[0] ?? 1) - (e.start[0] ?? 0));
    for (const e of t.dests) t.maxDest = Math.max(t.maxDest, (e.end[0] ?? 1) - (e.start[0] ?? 0));
  }
  return index;
}

/** Sorts entries by first-dimension start, then order (often already so: FSDP shards in rank order). */
function sortByStart<E extends { start: readonly number[]; order: number }>(entries: E[]): void {
  let sorted = true;
  for (let i = 1; i < entries.length && sorted; i++) {
    const a = entries[i - 1]!;
    const b = entries[i]!;
    sorted = (a.start[0] ?? 0) < (b.start[0] ?? 0) || ((a.start[0] ?? 0) === (b.start[0] ?? 0) && a.order < b.order);
  }
  if (!sorted) entries.sort((a, b) => (a.start[0] ?? 0) - (b.start[0] ?? 0) || a.order - b.order);
}

/**
 * The sources' distinct boxes (replicas grouped), sorted by first-dimension start; undefined when
 * two distinct ones partly overlap. `sources` are in order (rank, local tensor, piece).
 */
function groupReplicas(sources: readonly Entry[]): Group[] | undefined {
  // The common case, FSDP's Shard(0): in order, each box past the previous on the first dimension.
  let apart = sources.length > 0 && sources[0]!.start.length > 0;
  for (let i = 1; i < sources.length && apart; i++) apart = sources[i]!.start[0]! >= sources[i - 1]!.end[0]!;
  if (apart) {
    return sources.map((e, id) => {
      const g: Group = { id, start: e.start, end: e.end, members: [e] };
      e.group = g;
      return g;
    });
  }
  // Otherwise a sweep along the first dimension: boxes that meet must be equal (replicas).
  const sorted = [...sources];
  sortByStart(sorted);
  const ndim = sorted[0]?.start.length ?? 0;
  if (ndim === 0) return undefined; // no sources, or 0-d ones: the grid (one cell)
  const groups: Group[] = [];
  let open: Group[] = [];
  for (const e of sorted) {
    open = open.filter((o) => o.end[0]! > e.start[0]!);
    let home: Group | undefined;
    for (const o of open) {
      let meets = true;
      let equal = true;
      for (let d = 0; d < ndim; d++) {
        if (o.start[d]! >= e.end[d]! || o.end[d]! <= e.start[d]!) { meets = false; break; }
        if (o.start[d] !== e.start[d] || o.end[d] !== e.end[d]) equal = false;
      }
      if (!meets) continue;
      if (!equal) return undefined;
      home = o;
    }
    if (home) {
      home.members.push(e);
    } else {
      home = { id: 0, start: e.start, end: e.end, members: [e] };
      groups.push(home);
      open.push(home);
    }
    e.group = home;
  }
  // Ids in the order of each box's first source; members in source order; the list by start.
  for (const g of groups) g.members.sort((a, b) => a.order - b.order);
  [...groups].sort((a, b) => a.members[0]!.order - b.members[0]!.order).forEach((g, id) => { g.id = id; });
  return groups;
}

/** Entries (sorted by first-dimension start, none longer than `maxLen` there) that share an element with `box`. */
function overlapping<E extends { start: readonly number[]; end: readonly number[] }>(entries: readonly E[], maxLen: number, box: { start: readonly number[]; end: readonly number[] }): E[] {
  const found: E[] = [];
  const ndim = box.start.length;
  let i = 0;
  if (ndim > 0) {
    // The first entry that could reach box.start[0]: its start is above box.start[0] - maxLen.
    const from = box.start[0]! - maxLen;
    let lo = 0;
    let hi = entries.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (entries[mid]!.start[0]! <= from) lo = mid + 1; else hi = mid;
    }
    i = lo;
  }
  for (; i < entries.length; i++) {
    const e = entries[i]!;
    if (ndim > 0 && e.start[0]! >= box.end[0]!) break;
    let meets = true;
    for (let d = 0; d < ndim; d++) {
      if (e.start[d]! >= box.end[d]! || e.end[d]! <= box.start[d]!) { meets = false; break; }
    }
    if (meets) found.push(e);
  }
  return found;
}

function bisect(cuts: readonly number[], x: number): number {
  let lo = 0;
  let hi = cuts.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (cuts[mid]! < x) lo = mid + 1; else hi = mid;
  }
  return lo;
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
  const ndim = p.start.length;
  const sources = overlapping(t.sources, t.maxSource, p);
  const dstLayout = ctx.layouts[p.rank]!;
  const name = t.tensor.name;
  if (sources.length === 0) throw uncovered(name, dstLayout, { start: p.start, length: p.end.map((e, i) => e - p.start[i]!) });
  const cuts: number[][] = [];
  for (let d = 0; d < ndim; d++) {
    const set = new Set<number>([p.start[d]!, p.end[d]!]);
    for (const s of sources) {
      if (s.start[d]! > p.start[d]!) set.add(s.start[d]!);
      if (s.end[d]! < p.end[d]!) set.add(s.end[d]!);
    }
    cuts.push([...set].sort((a, b) => a - b));
  }
  const grid = cuts.map((c) => c.length - 1);
  // The part of the grid to plan: all of it, or the cells inside `only`.
  const lo = cuts.map((c, d) => (only ? bisect(c, Math.max(only.start[d]!, p.start[d]!)) : 0));
  const hi = cuts.map((c, d) => (only ? bisect(c, Math.min(only.end[d]!, p.end[d]!)) : grid[d]!));
  const span = lo.map((l, d) => hi[d]! - l);
  let cells = 1;
  for (const s of span) cells *= s;
  const candidates: Entry[][] = Array.from({ length: cells }, () => []);
  for (const s of sources) {
    const a = cuts.map((c, d) => Math.max(bisect(c, Math.max(s.start[d]!, p.start[d]!)), lo[d]!));
    const b = cuts.map((c, d) => Math.min(bisect(c, Math.min(s.end[d]!, p.end[d]!)), hi[d]!));
    if (a.some((x, d) => x >= b[d]!)) continue;
    const k = [...a];
    for (;;) {
      let cell = 0;
      for (let d = 0; d < ndim; d++) cell = cell * span[d]! + (k[d]! - lo[d]!);
      candidates[cell]!.push(s);
      let d = ndim - 1;
      while (d >= 0 && ++k[d]! === b[d]!) { k[d] = a[d]!; d--; }
      if (d < 0) break;
    }
  }
  const k = [...lo];
  for (let c = 0; c < cells; c++) {
    const start = k.map((x, d) => cuts[d]![x]!);
    const length = k.map((x, d) => cuts[d]![x + 1]! - cuts[d]![x]!);
    let ordinal = 0;
    for (let d = 0; d < ndim; d++) ordinal = ordinal * grid[d]! + k[d]!;
    let held = candidates[c]!;
    if (held.length === 0) throw uncovered(name, dstLayout, { start, length });
    const near = held.filter((s) => ctx.layouts[s.rank]!.node === dstLayout.node);
    if (near.length > 0) held = near;
    if (held.length > 1) held.sort((a, b) => a.order - b.order);
    assignCell(ctx, t, p, { start, length }, held, (dstLayout.rank + ordinal) % held.length, only);
    let d = ndim - 1;
    while (d >= 0 && ++k[d]! === hi[d]!) { k[d] = lo[d]!; d--; }
  }
}

/**
 * Plans destination piece `p` where the tensor's distinct source boxes do not partly overlap: a
 * cell per box that meets it, held by that box's replicas. With `only`, just that source's box.
 */
function planPieceByBoxes(ctx: Ctx, t: TensorIndex, groups: readonly Group[], p: Entry, only?: Entry): void {
  const dstLayout = ctx.layouts[p.rank]!;
  const ndim = p.start.length;
  const meeting = only ? [only.group!] : overlappingGroups(groups, t.maxSource, p);
  let covered = 0;
  for (const g of meeting) {
    const start = new Array<number>(ndim);
    const length = new Array<number>(ndim);
    let cells = 1;
    for (let d = 0; d < ndim; d++) {
      start[d] = Math.max(g.start[d]!, p.start[d]!);
      length[d] = Math.min(g.end[d]!, p.end[d]!) - start[d]!;
      cells *= length[d]!;
    }
    covered += cells;
    let held = g.members;
    if (held.length > 1) {
      const near = held.filter((s) => ctx.layouts[s.rank]!.node === dstLayout.node);
      if (near.length > 0) held = near;
    }
    assignCell(ctx, t, p, { start, length }, held, (dstLayout.rank + g.id) % held.length, only);
  }
  if (!only) {
    let whole = 1;
    for (let d = 0; d < ndim; d++) whole *= p.end[d]! - p.start[d]!;
    if (covered < whole) {
      const boxes = meeting.map((g) => ({ start: g.start.map((x, d) => Math.max(x, p.start[d]!) - p.start[d]!), length: g.end.map((x, d) => Math.min(x, p.end[d]!) - Math.max(g.start[d]!, p.start[d]!)) }));
      const hole = findHole(p.end.map((e, d) => e - p.start[d]!), boxes)!;
      throw uncovered(t.tensor.name, dstLayout, { start: hole.start.map((x, d) => x + p.start[d]!), length: hole.length });
    }
  }
}

function overlappingGroups(groups: readonly Group[], maxLen: number, box: { start: readonly number[]; end: readonly number[] }): Group[] {
  return overlapping(groups, maxLen, box);
}

/** Sends cell `box` of piece `p` from `held[rot]`, or in slabs over several of `held` when it is large. */
function assignCell(ctx: Ctx, t: TensorIndex, p: Entry, box: Box, held: Entry[], rot: number, only?: Entry): void {
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
  let src = 0;
  let dst = 0;
  for (let d = 0; d < box.start.length; d++) {
    src += (box.start[d]! - s.start[d]! + s.at[d]!) * s.strides[d]!;
    dst += (box.start[d]! - p.start[d]! + p.at[d]!) * p.strides[d]!;
  }
  ctx.sinkFor(s.rank, p.rank).box(s.local, p.local, src, dst, box.length, s.strides, p.strides, t.itemsize);
}

function uncovered(name: string, dst: RankLayout, range: Box): LayoutError {
  return new LayoutError('ERR_LAYOUT_UNCOVERED',
    `tensor ${name}: ${formatRange(range)}, which rank ${dst.rank} needs, is held by no source rank; add the sources that hold it, or take it out of the destination's pieces`,
    { tensor: name, rank: dst.rank, range });
}
