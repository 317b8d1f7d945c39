// A layout's compact form: its numbers in one Float64Array and its entries as offsets into it,
// what the planner reads. A group's 384 layout records of a 1T model hold ~300,000 local tensors:
// decoded into objects (arrays per start, length, at and stride), they took seconds to build and
// collect; decoded into this form, the objects of the public RankLayout are built only when
// someone reads them (layoutOfCompact). Global tensor tables are shared between layouts that
// list the same ones (every FSDP rank does). checkCompact is validateLayout's fast path: it
// passes the common layout without building an object and leaves anything unusual (non-ASCII
// names, strided memory, many pieces, padding) to validateLayout on the objects, which says what
// is wrong.
import { DTYPES, dtypeInfo, type DType } from '../../ipc/dtype.js';
import type { Box } from './errors.js';
import {
  MAX_NAME_BYTES, MAX_NDIM, MAX_NODE_BYTES, validateLayout,
  type GlobalTensor, type LocalTensor, type Piece, type RankLayout,
} from './layout.js';

const SAFE = Number.MAX_SAFE_INTEGER;
const U31 = 0x7fffffff;

/** One layout, compact: locals are sources then destinations. */
export interface CompactLayout {
  readonly rank: number;
  readonly node: string;
  readonly gpu: number;
  /** The global tensors (shared with other layouts that list the same). */
  readonly tensors: readonly GlobalTensor[];
  readonly sourceCount: number;
  readonly localCount: number;
  readonly lName: readonly string[];
  /** The decoder's ids of the local tensors' names (equal names, equal ids), when it interned them all. */
  readonly lId?: Int32Array;
  readonly lDtype: readonly DType[];
  readonly lNdim: Uint8Array;
  /** Offsets into `nums`: a local's shape, its byte strides. */
  readonly lShape: Uint32Array;
  readonly lStrides: Uint32Array;
  /** Per local, its first piece and first padding box (localCount + 1 entries each). */
  readonly lPieces: Uint32Array;
  readonly lPadding: Uint32Array;
  /** Per piece: the global tensor's index; the offset of its start (length at +ndim, at at +2 ndim). */
  readonly pTensor: Uint32Array;
  readonly pAt: Uint32Array;
  /** Per padding box: the offset of its start (length at +ndim). */
  readonly padAt: Uint32Array;
  readonly nums: Float64Array;
  /** Whether every name (node, tensors, locals) is ASCII: the fast check handles only those. */
  readonly ascii: boolean;
}

const compactOfLayout = new WeakMap<RankLayout, CompactLayout>();

/** The compact form of a layout (kept for the layout object; layouts are not changed once built). */
export function compactOf(layout: RankLayout): CompactLayout {
  let c = compactOfLayout.get(layout);
  if (!c) compactOfLayout.set(layout, (c = compactFromLayout(layout)));
  return c;
}

const isAscii = (s: string): boolean => {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) >= 0x80) return false;
  return true;
};

function compactFromLayout(l: RankLayout): CompactLayout {
  const locals = [...l.sources, ...l.destinations];
  const index = new Map(l.tensors.map((t, i) => [t.name, i]));
  let size = 0;
  let pieces = 0;
  let pads = 0;
  for (const x of locals) {
    const n = x.shape.length;
    size += 2 * n + x.pieces.length * 3 * n + x.padding.length * 2 * n;
    pieces += x.pieces.length;
    pads += x.padding.length;
  }
  const nums = new Float64Array(size);
  const L = locals.length;
  const lNdim = new Uint8Array(L);
  const lShape = new Uint32Array(L);
  const lStrides = new Uint32Array(L);
  const lPieces = new Uint32Array(L + 1);
  const lPadding = new Uint32Array(L + 1);
  const pTensor = new Uint32Array(pieces);
  const pAt = new Uint32Array(pieces);
  const padAt = new Uint32Array(pads);
  let o = 0;
  let k = 0;
  let q = 0;
  const put = (xs: readonly number[]): void => { for (const v of xs) nums[o++] = v; };
  locals.forEach((x, i) => {
    lNdim[i] = x.shape.length;
    lShape[i] = o; put(x.shape);
    lStrides[i] = o; put(x.strides);
    lPieces[i] = k;
    for (const p of x.pieces) {
      pTensor[k] = index.get(p.tensor) ?? 0xffffffff;
      pAt[k++] = o;
      put(p.start); put(p.length); put(p.at);
    }
    lPadding[i] = q;
    for (const b of x.padding) { padAt[q++] = o; put(b.start); put(b.length); }
  });
  lPieces[L] = k;
  lPadding[L] = q;
  return {
    rank: l.rank, node: l.node, gpu: l.gpu, tensors: l.tensors, sourceCount: l.sources.length, localCount: L,
    lName: locals.map((x) => x.name), lDtype: locals.map((x) => x.dtype), lNdim, lShape, lStrides, lPieces, lPadding, pTensor, pAt, padAt, nums,
    ascii: isAscii(l.node) && l.tensors.every((t) => isAscii(t.name)) && locals.every((x) => isAscii(x.name)),
  };
}

/** Numbers of `nums` from `at`, `n` of them, as an array. */
function slice(nums: Float64Array, at: number, n: number): number[] {
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) out[i] = nums[at + i]!;
  return out;
}

const ZEROS: number[][] = [];
function zeros(ndim: number): number[] {
  return (ZEROS[ndim] ??= Object.freeze(new Array<number>(ndim).fill(0)) as number[]);
}

/** Local tensor `i` of `c` as an object. */
function localObject(c: CompactLayout, i: number): LocalTensor {
  const ndim = c.lNdim[i]!;
  const nums = c.nums;
  const shape = slice(nums, c.lShape[i]!, ndim);
  const strides = slice(nums, c.lStrides[i]!, ndim);
  const pieces: Piece[] = [];
  for (let k = c.lPieces[i]!; k < c.lPieces[i + 1]!; k++) {
    const o = c.pAt[k]!;
    let length = slice(nums, o + ndim, ndim);
    let at = slice(nums, o + 2 * ndim, ndim);
    // Most pieces fill their local tensor from its origin: share those arrays (fewer objects).
    if (length.every((x, d) => x === shape[d])) length = shape;
    if (at.every((x) => x === 0)) at = zeros(ndim);
    pieces.push({ tensor: c.tensors[c.pTensor[k]!]!.name, start: slice(nums, o, ndim), length, at });
  }
  const padding: Box[] = [];
  for (let k = c.lPadding[i]!; k < c.lPadding[i + 1]!; k++) {
    const o = c.padAt[k]!;
    padding.push({ start: slice(nums, o, ndim), length: slice(nums, o + ndim, ndim) });
  }
  return { name: c.lName[i]!, dtype: c.lDtype[i]!, shape, strides, pieces, padding };
}

/**
 * The RankLayout of a compact form: a plain object whose `sources` and `destinations` are built
 * on first read (then kept). compactOf() gives the compact form back without building them.
 */
export function layoutOfCompact(c: CompactLayout): RankLayout {
  let sources: LocalTensor[] | undefined;
  let destinations: LocalTensor[] | undefined;
  const layout = { rank: c.rank, node: c.node, gpu: c.gpu, tensors: c.tensors } as RankLayout;
  Object.defineProperty(layout, 'sources', {
    enumerable: true,
    get: () => (sources ??= Array.from({ length: c.sourceCount }, (_, i) => localObject(c, i))),
  });
  Object.defineProperty(layout, 'destinations', {
    enumerable: true,
    get: () => (destinations ??= Array.from({ length: c.localCount - c.sourceCount }, (_, i) => localObject(c, c.sourceCount + i))),
  });
  compactOfLayout.set(layout, c);
  return layout;
}

const ITEMSIZE = new Map<string, number>(DTYPES.map((d) => [d, dtypeInfo(d).itemsize]));

/** Stamps by name id: a name seen in this layout's role has the role's stamp. */
let stamps = new Int32Array(0);
let stamp = 0;

/** Whether no two sources and no two destinations of `c` have one name. */
function uniqueNames(c: CompactLayout): boolean {
  const ids = c.lId;
  if (!ids || ids.some((x) => x < 0)) {
    for (const [from, to] of [[0, c.sourceCount], [c.sourceCount, c.localCount]] as const) {
      if (new Set(c.lName.slice(from, to)).size !== to - from) return false;
    }
    return true;
  }
  for (const [from, to] of [[0, c.sourceCount], [c.sourceCount, c.localCount]] as const) {
    if (stamp >= 0x7ffffffe) { stamps.fill(0); stamp = 0; }
    stamp++;
    for (let i = from; i < to; i++) {
      const id = ids[i]!;
      if (id >= stamps.length) { const grown = new Int32Array(Math.max(id + 1, stamps.length * 2, 1024)); grown.set(stamps); stamps = grown; }
      if (stamps[id] === stamp) return false;
      stamps[id] = stamp;
    }
  }
  return true;
}

const checkedTables = new WeakSet<readonly GlobalTensor[]>();

/** The global tensors: ASCII names of 1..MAX bytes, sorted and unique, known dtypes, shapes in bounds. */
function checkTable(tensors: readonly GlobalTensor[]): boolean {
  if (checkedTables.has(tensors)) return true;
  let previous = '';
  for (const t of tensors) {
    const n = t.name;
    if (typeof n !== 'string' || n.length === 0 || n.length > MAX_NAME_BYTES || !isAscii(n) || !(previous < n)) return false;
    previous = n;
    let info;
    try { info = dtypeInfo(t.dtype); } catch { return false; }
    if (!info || !Array.isArray(t.shape) || t.shape.length > MAX_NDIM) return false;
    let bytes = info.itemsize;
    for (const d of t.shape) {
      if (!Number.isSafeInteger(d) || d < 1) return false;
      bytes *= d;
    }
    if (bytes > SAFE) return false;
  }
  checkedTables.add(tensors);
  return true;
}

/**
 * Whether `c` is certainly a valid layout, checked on its compact form (what validateLayout
 * checks). False means "not certain": validateLayout on the objects decides and says why.
 */
export function checkCompact(c: CompactLayout): boolean {
  if (!c.ascii || !Number.isInteger(c.rank) || c.rank < 0 || c.rank > U31 || !Number.isInteger(c.gpu) || c.gpu < 0 || c.gpu > U31) return false;
  if (c.node.length < 1 || c.node.length > MAX_NODE_BYTES) return false;
  const tensors = c.tensors;
  if (!checkTable(tensors)) return false;
  const used = new Uint8Array(tensors.length);
  const nums = c.nums;
  if (!uniqueNames(c)) return false;
  for (let i = 0; i < c.localCount; i++) {
    const name = c.lName[i]!;
    if (name.length < 1 || name.length > MAX_NAME_BYTES) return false;
    const ndim = c.lNdim[i]!;
    const dtype = c.lDtype[i]!;
    const itemsize = ITEMSIZE.get(dtype);
    if (itemsize === undefined) return false;
    const sh = c.lShape[i]!;
    const st = c.lStrides[i]!;
    // Contiguous strides only (anything else: the object check); the span in bounds.
    let s = itemsize;
    for (let d = ndim - 1; d >= 0; d--) {
      const n = nums[sh + d]!;
      if (!Number.isSafeInteger(n) || n < 1 || nums[st + d] !== s) return false;
      s *= n;
    }
    if (s > SAFE) return false;
    const p0 = c.lPieces[i]!;
    const p1 = c.lPieces[i + 1]!;
    const q0 = c.lPadding[i]!;
    const q1 = c.lPadding[i + 1]!;
    const source = i < c.sourceCount;
    // No pieces, a source's padding, or many boxes: the object check says what it makes of them.
    if (p1 === p0 || (source && q1 !== q0) || p1 - p0 + q1 - q0 > 8) return false;
    let covered = 0;
    for (let k = p0; k < p1; k++) {
      const g = c.pTensor[k]!;
      const t = tensors[g];
      if (!t || t.dtype !== dtype || t.shape.length !== ndim) return false;
      used[g] = 1;
      const o = c.pAt[k]!;
      let v = 1;
      for (let d = 0; d < ndim; d++) {
        const start = nums[o + d]!;
        const length = nums[o + ndim + d]!;
        const at = nums[o + 2 * ndim + d]!;
        if (!Number.isSafeInteger(start) || !Number.isSafeInteger(length) || !Number.isSafeInteger(at) || start < 0 || length < 1 || at < 0) return false;
        if (start + length > t.shape[d]! || at + length > nums[sh + d]!) return false;
        v *= length;
      }
      covered += v;
    }
    for (let k = q0; k < q1; k++) {
      const o = c.padAt[k]!;
      let v = 1;
      for (let d = 0; d < ndim; d++) {
        const start = nums[o + d]!;
        const length = nums[o + ndim + d]!;
        if (!Number.isSafeInteger(start) || !Number.isSafeInteger(length) || start < 0 || length < 1 || start + length > nums[sh + d]!) return false;
        v *= length;
      }
      covered += v;
    }
    // Boxes of the local tensor pairwise apart; a destination's fill it (apart and inside: their
    // volumes add up to its own exactly when they cover it).
    const boxes = p1 - p0 + q1 - q0;
    for (let a = 0; a < boxes; a++) {
      for (let b = a + 1; b < boxes; b++) {
        const [as, al] = placed(c, p0, p1, q0, a, ndim);
        const [bs, bl] = placed(c, p0, p1, q0, b, ndim);
        let meet = true;
        for (let d = 0; d < ndim && meet; d++) meet = nums[as + d]! < nums[bs + d]! + nums[bl + d]! && nums[bs + d]! < nums[as + d]! + nums[al + d]!;
        if (meet) return false;
      }
    }
    if (!source) {
      let whole = 1;
      for (let d = 0; d < ndim; d++) whole *= nums[sh + d]!;
      if (covered !== whole) return false;
    }
  }
  for (let g = 0; g < used.length; g++) if (!used[g]) return false;
  return true;
}

/** Box `b` of a local's pieces then padding: the offsets of its start and length in its own coordinates. */
function placed(c: CompactLayout, p0: number, p1: number, q0: number, b: number, ndim: number): [number, number] {
  if (p0 + b < p1) {
    const o = c.pAt[p0 + b]!;
    return [o + 2 * ndim, o + ndim];
  }
  const o = c.padAt[q0 + b - (p1 - p0)]!;
  return [o, o + ndim];
}

/** Checks `c` (throws validateLayout's LayoutError when it is invalid); `layout` is its object form. */
export function validateCompact(c: CompactLayout, layout: RankLayout): void {
  if (!checkCompact(c)) validateLayout(layout);
}

