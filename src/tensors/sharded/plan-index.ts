// The planner's index: per global tensor, its source and destination pieces over every layout,
// kept as parallel arrays of numbers (which layout, which local tensor, where its numbers are)
// rather than an object per piece: a 1T model's group has ~300,000 pieces, and a rank's own plan
// reads few of them. Entries (objects) are made on demand for the pieces a plan touches; the
// sources' distinct boxes (replicas grouped) are found on the arrays.
import { dtypeInfo } from '../../ipc/dtype.js';
import { LayoutError } from './errors.js';
import type { GlobalTensor, RankLayout } from './layout.js';
import type { CompactLayout } from './compact.js';

/** A piece of a local tensor, as the planner reads it: offsets into its layout's numbers. */
export interface Entry {
  readonly rank: number; // index into the sorted layouts
  readonly local: number; // index in its role's list (sources or destinations)
  readonly nums: Float64Array;
  /** start at o, length at o + ndim, at at o + 2 ndim (in `nums`). */
  readonly o: number;
  readonly ndim: number;
  /** Where the local tensor's byte strides are in `nums`. */
  readonly so: number;
  /** First-dimension start and end (0 and 1 for a 0-d tensor). */
  readonly s0: number;
  readonly e0: number;
  /** Its index in its side's order (rank, local tensor, piece): sources break ties by it. */
  readonly order: number;
  /** Sources: the id of the entry's box among the distinct ones (box mode). */
  gid: number;
  /** Sources: the first source (in order) of the entry's box, and that box's sources when several. */
  rep: Entry | undefined;
  members: Entry[] | undefined;
}

export const lo = (e: Entry, d: number): number => e.nums[e.o + d]!;
export const hi = (e: Entry, d: number): number => e.nums[e.o + d]! + e.nums[e.o + e.ndim + d]!;
export const startOf = (e: Entry): number[] => Array.from({ length: e.ndim }, (_, d) => lo(e, d));
export const endOf = (e: Entry): number[] => Array.from({ length: e.ndim }, (_, d) => hi(e, d));

/** One side (sources or destinations) of a tensor: its pieces in order, as parallel arrays. */
export class Side {
  lay = new Int32Array(0);
  li = new Int32Array(0);
  o = new Int32Array(0);
  s0 = new Float64Array(0);
  e0 = new Float64Array(0);
  /** Each piece's box, start and end per dimension (ndim numbers each, side by side: read without visiting the layouts). */
  bs = new Float64Array(0);
  be = new Float64Array(0);
  length = 0;
  /** Order indices sorted by (first-dimension start, order). */
  byStart: number[] = [];
  /** The longest first-dimension extent. */
  max = 0;
  readonly #entries: Array<Entry | undefined> = [];
  constructor(readonly source: boolean, readonly ndim: number, readonly compacts: readonly CompactLayout[]) {}

  /** Room for `n` pieces in all. */
  reserve(n: number): void {
    if (n <= this.lay.length) return;
    const k = this.ndim;
    const i32 = (a: Int32Array<ArrayBuffer>): Int32Array<ArrayBuffer> => { const b = new Int32Array(n); b.set(a); return b; };
    const f64 = (a: Float64Array<ArrayBuffer>, m: number): Float64Array<ArrayBuffer> => { const b = new Float64Array(m); b.set(a); return b; };
    this.lay = i32(this.lay); this.li = i32(this.li); this.o = i32(this.o);
    this.s0 = f64(this.s0, n); this.e0 = f64(this.e0, n);
    this.bs = f64(this.bs, n * k); this.be = f64(this.be, n * k);
  }

  /** Piece `o` (offset in `nums`) of layout `r`'s local tensor `li`. */
  push(r: number, li: number, nums: Float64Array, o: number): void {
    if (this.length === this.lay.length) this.reserve(Math.max(16, 2 * this.length));
    const i = this.length++;
    const ndim = this.ndim;
    this.lay[i] = r; this.li[i] = li; this.o[i] = o;
    for (let d = 0, b = i * ndim; d < ndim; d++, b++) {
      const start = nums[o + d]!;
      this.bs[b] = start;
      this.be[b] = start + nums[o + ndim + d]!;
    }
    this.s0[i] = ndim > 0 ? this.bs[i * ndim]! : 0;
    this.e0[i] = ndim > 0 ? this.be[i * ndim]! : 1;
  }

  /** Sorts (once) and measures. */
  prepare(): void {
    const n = this.length;
    let sorted = true;
    for (let i = 1; i < n && sorted; i++) sorted = this.s0[i - 1]! <= this.s0[i]!;
    const order = new Array<number>(n);
    for (let i = 0; i < n; i++) order[i] = i;
    if (!sorted) order.sort((a, b) => this.s0[a]! - this.s0[b]! || a - b);
    this.byStart = order;
    for (let i = 0; i < n; i++) this.max = Math.max(this.max, this.e0[i]! - this.s0[i]!);
  }

  /** Where piece `i`'s box starts and ends on dimension `d`. */
  start(i: number, d: number): number { return this.bs[i * this.ndim + d]!; }
  end(i: number, d: number): number { return this.be[i * this.ndim + d]!; }

  /** The entry of piece `i` (made once). */
  entry(i: number): Entry {
    let e = this.#entries[i];
    if (e) return e;
    const r = this.lay[i]!;
    const c = this.compacts[r]!;
    const li = this.li[i]!;
    const so = c.lStrides[li]!;
    e = {
      rank: r, local: this.source ? li : li - c.sourceCount, nums: c.nums, o: this.o[i]!, ndim: this.ndim,
      so, s0: this.s0[i]!, e0: this.e0[i]!, order: i, gid: 0, rep: undefined, members: undefined,
    };
    this.#entries[i] = e;
    return e;
  }

  /** Order indices (by start) of the pieces in `among` (sorted by start, none longer than `max`) that share an element with `box`. */
  overlapping(among: readonly number[], box: Entry): number[] {
    const found: number[] = [];
    const ndim = this.ndim;
    let i = 0;
    if (ndim > 0) {
      // The first that could reach box.s0: its start is above box.s0 - max.
      const from = box.s0 - this.max;
      let l = 0;
      let h = among.length;
      while (l < h) {
        const mid = (l + h) >>> 1;
        if (this.s0[among[mid]!]! <= from) l = mid + 1; else h = mid;
      }
      i = l;
    }
    for (; i < among.length; i++) {
      const k = among[i]!;
      if (ndim > 0 && this.s0[k]! >= box.e0) break;
      let meets = true;
      for (let d = 0; d < ndim && meets; d++) {
        meets = this.start(k, d) < hi(box, d) && this.end(k, d) > lo(box, d);
      }
      if (meets) found.push(k);
    }
    return found;
  }
}

/** A global tensor's pieces on both sides. */
export interface TensorIndex {
  readonly tensor: GlobalTensor;
  readonly itemsize: number;
  readonly sources: Side;
  readonly dests: Side;
  /** Whether the rank planned for has a piece of it (always, for the whole plan). */
  mine: boolean;
  /** The distinct source boxes (their first sources' order indices) by start, or undefined where two partly overlap (grid mode). */
  groups?: number[];
  /** Per source (order index): its box's id and first source; the sources of boxes held by several. */
  gid?: Int32Array;
  rep?: Int32Array;
  members?: Map<number, number[]>;
}

/**
 * Every global tensor's source and destination pieces (with `me`, only of the tensors that rank
 * has a piece of; every tensor's dtype and shape are checked across layouts either way). Layouts
 * that share a table of global tensors (decoded records listing the same ones) look it up once.
 */
export function buildIndex(layouts: readonly RankLayout[], compacts: readonly CompactLayout[], me: number): Map<string, TensorIndex> {
  const index = new Map<string, TensorIndex>();
  const owner = new Map<string, number>();
  const slotsOf = new Map<readonly GlobalTensor[], TensorIndex[]>();
  const slots = compacts.map((c, r) => {
    let list = slotsOf.get(c.tensors);
    if (list) return list;
    list = c.tensors.map((g) => {
      const t = index.get(g.name);
      if (!t) {
        const created: TensorIndex = {
          tensor: g, itemsize: dtypeInfo(g.dtype).itemsize, mine: me < 0,
          sources: new Side(true, g.shape.length, compacts), dests: new Side(false, g.shape.length, compacts),
        };
        index.set(g.name, created);
        owner.set(g.name, layouts[r]!.rank);
        return created;
      }
      const first = owner.get(g.name)!;
      const rank = layouts[r]!.rank;
      if (t.tensor.dtype !== g.dtype) {
        throw new LayoutError('ERR_LAYOUT_DTYPE', `tensor ${g.name} is ${t.tensor.dtype} in rank ${first}'s layout but ${g.dtype} in rank ${rank}'s; every rank must give one dtype`, { tensor: g.name, rank });
      }
      if (t.tensor.shape.length !== g.shape.length || t.tensor.shape.some((d, i) => d !== g.shape[i])) {
        throw new LayoutError('ERR_LAYOUT_SHAPE', `tensor ${g.name} is [${t.tensor.shape.join(', ')}] in rank ${first}'s layout but [${g.shape.join(', ')}] in rank ${rank}'s; every rank must give one global shape`, { tensor: g.name, rank });
      }
      return t;
    });
    slotsOf.set(c.tensors, list);
    return list;
  });
  // With `me`: its source pieces per tensor. Another rank's destination piece matters to it only
  // where one of them meets it (it sends there); its own destination pieces always.
  const meSources = new Map<TensorIndex, number[]>();
  if (me >= 0) {
    for (const t of slots[me]!) t.mine = true;
    const c = compacts[me]!;
    for (let k = 0; k < c.lPieces[c.sourceCount]!; k++) {
      const t = slots[me]![c.pTensor[k]!]!;
      let list = meSources.get(t);
      if (!list) meSources.set(t, (list = []));
      list.push(c.pAt[k]!);
    }
  }
  const mine = me >= 0 ? compacts[me]!.nums : undefined;
  const wanted = (t: TensorIndex, nums: Float64Array, o: number): boolean => {
    const list = meSources.get(t);
    if (!list) return false;
    const ndim = t.sources.ndim;
    for (const m of list) {
      let meets = true;
      for (let d = 0; d < ndim && meets; d++) meets = nums[o + d]! < mine![m + d]! + mine![m + ndim + d]! && mine![m + d]! < nums[o + d]! + nums[o + ndim + d]!;
      if (meets) return true;
    }
    return false;
  };
  // Room first: a piece per layout that lists the tensor, counted once per shared table.
  const users = new Map<TensorIndex[], number>();
  for (const list of slots) users.set(list, (users.get(list) ?? 0) + 1);
  const hint = new Map<TensorIndex, number>();
  for (const [list, k] of users) for (const t of list) if (t.mine) hint.set(t, (hint.get(t) ?? 0) + k);
  for (const [t, k] of hint) {
    t.sources.reserve(k);
    if (me < 0) t.dests.reserve(k);
  }
  compacts.forEach((c, r) => {
    const tensors = slots[r]!;
    const nums = c.nums;
    for (let li = 0; li < c.localCount; li++) {
      const source = li < c.sourceCount;
      for (let k = c.lPieces[li]!; k < c.lPieces[li + 1]!; k++) {
        const t = tensors[c.pTensor[k]!]!;
        if (!t.mine) continue;
        if (!source && me >= 0 && r !== me && !wanted(t, nums, c.pAt[k]!)) continue;
        (source ? t.sources : t.dests).push(r, li, nums, c.pAt[k]!);
      }
    }
  });
  for (const t of index.values()) {
    if (!t.mine) continue;
    t.sources.prepare();
    t.dests.prepare();
    groupReplicas(t);
  }
  return index;
}

/**
 * The sources' distinct boxes (replicas grouped): t.groups sorted by first-dimension start, ids in
 * the order of each box's first source; undefined when two distinct ones partly overlap.
 */
function groupReplicas(t: TensorIndex): void {
  const s = t.sources;
  const n = s.length;
  const ndim = s.ndim;
  if (n === 0 || ndim === 0) return; // no sources, or 0-d ones: the grid (one cell)
  const gid = new Int32Array(n);
  const rep = new Int32Array(n);
  // The common case, FSDP's Shard(0): in order, each box past the previous on the first dimension.
  let apart = true;
  for (let i = 1; i < n && apart; i++) apart = s.s0[i]! >= s.e0[i - 1]!;
  if (apart) {
    for (let i = 0; i < n; i++) { gid[i] = i; rep[i] = i; }
    Object.assign(t, { groups: s.byStart, gid, rep, members: new Map() });
    return;
  }
  // Otherwise a sweep along the first dimension: boxes that meet must be equal (replicas). In
  // start order, then order, a box's first source met is its first in order.
  const groups: number[] = [];
  const members = new Map<number, number[]>();
  let open: number[] = [];
  for (const i of s.byStart) {
    open = open.filter((g) => s.e0[g]! > s.s0[i]!);
    let home = -1;
    for (const g of open) {
      let meets = true;
      let equal = true;
      for (let d = 0; d < ndim; d++) {
        const gs = s.start(g, d);
        const ge = s.end(g, d);
        const is = s.start(i, d);
        const ie = s.end(i, d);
        if (gs >= ie || ge <= is) { meets = false; break; }
        if (gs !== is || ge !== ie) equal = false;
      }
      if (!meets) continue;
      if (!equal) return;
      home = g;
    }
    if (home >= 0) {
      let m = members.get(home);
      if (!m) members.set(home, (m = [home]));
      m.push(i);
      rep[i] = home;
    } else {
      rep[i] = i;
      groups.push(i);
      open.push(i);
    }
  }
  for (const m of members.values()) m.sort((a, b) => a - b);
  [...groups].sort((a, b) => a - b).forEach((g, id) => {
    for (const i of members.get(g) ?? [g]) gid[i] = id;
  });
  Object.assign(t, { groups, gid, rep, members });
}

/** The entry of source `i` with its box's id, first source and (when several) sources. */
export function sourceEntry(t: TensorIndex, i: number): Entry {
  const e = t.sources.entry(i);
  if (e.rep === undefined && t.rep) {
    const r = t.rep[i]!;
    e.gid = t.gid![i]!;
    e.rep = r === i ? e : sourceEntry(t, r);
    const m = t.members!.get(r);
    if (m && r === i) e.members = m.map((k) => (k === i ? e : sourceEntry(t, k)));
  }
  return e;
}
