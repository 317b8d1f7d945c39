// Layouts: per rank, which boxes of which global tensors it holds (sources) or needs
// (destinations), and where in its own local tensors they lie. A local tensor is one memory (a
// DeviceArray, a torch tensor): its dtype, shape and byte strides; its pieces are boxes of global
// tensors placed at an offset of it (a fused qkv is three pieces), and a destination declares the
// rest of it as padding, left untouched. The plan's byte offsets are relative to a local
// tensor's first element; the pointer stays with the rank and never travels in a layout.
import { dtypeInfo, isDType, type DType } from '../../ipc/dtype.js';
import { LayoutError, formatRange, type Box } from './errors.js';
import { boxesOverlap, findHole, volume } from './box.js';

export const MAX_NDIM = 32;
export const MAX_NAME_BYTES = 1024;
export const MAX_NODE_BYTES = 255;
const SAFE = Number.MAX_SAFE_INTEGER;
const U31 = 0x7fffffff;

/** A global tensor: what every rank that holds or needs a piece of it agrees on. */
export interface GlobalTensor {
  readonly name: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
}

/** A box of a global tensor placed in a local tensor at `at` (its own coordinates). */
export interface Piece {
  readonly tensor: string;
  readonly start: readonly number[];
  readonly length: readonly number[];
  readonly at: readonly number[];
}

/** One local tensor of a rank (one memory): its pieces and, for a destination, its padding. */
export interface LocalTensor {
  readonly name: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
  /** Byte strides (C-contiguous unless the memory is laid out otherwise). */
  readonly strides: readonly number[];
  readonly pieces: readonly Piece[];
  /** Boxes of this tensor (its own coordinates) no one writes: a padded vocabulary's last rows. */
  readonly padding: readonly Box[];
}

/** A rank's layout: who it is and where it is, what it holds and what it needs. */
export interface RankLayout {
  /** Unique in the group, 0..2^31-1. */
  readonly rank: number;
  /** Names the machine: ranks with one node id use CUDA IPC between them, others NCCL. */
  readonly node: string;
  /** The GPU's ordinal on its node. */
  readonly gpu: number;
  /** The global tensors the pieces name, sorted by name (UTF-8 bytes). */
  readonly tensors: readonly GlobalTensor[];
  /** Local tensors this rank sends from. */
  readonly sources: readonly LocalTensor[];
  /** Local tensors this rank receives into. */
  readonly destinations: readonly LocalTensor[];
}

/** C-contiguous byte strides of `shape` with items of `itemsize` bytes. */
export function contiguousStrides(shape: readonly number[], itemsize: number): number[] {
  const strides = new Array<number>(shape.length);
  let s = itemsize;
  for (let i = shape.length - 1; i >= 0; i--) {
    strides[i] = s;
    s *= shape[i]!;
  }
  return strides;
}

/** Compares names by their UTF-8 bytes (the order of the wire and of both languages). */
export function compareNames(a: string, b: string): number {
  // UTF-16 order is UTF-8 byte order except past the basic plane: compare bytes only there.
  if (isPlainText(a) && isPlainText(b)) return a < b ? -1 : a > b ? 1 : 0;
  return Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));
}

/** Whether every character of `s` is below U+D800 (no surrogates, no U+E000..U+FFFF). */
function isPlainText(s: string): boolean {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) >= 0xd800) return false;
  return true;
}

function invalid(message: string, tensor?: string, rank?: number): LayoutError {
  return new LayoutError('ERR_LAYOUT_INVALID', message, { ...(tensor !== undefined && { tensor }), ...(rank !== undefined && { rank }) });
}

function checkName(name: unknown, what: string, rank: number, max = MAX_NAME_BYTES): void {
  if (typeof name === 'string' && name.length > 0 && name.length <= max / 3 && isPlainText(name)) return; // fits whatever its characters
  if (typeof name !== 'string' || name.length === 0 || Buffer.byteLength(name, 'utf8') > max || name.includes('\uFFFD') || /[\uD800-\uDFFF]/.test(name)) {
    throw invalid(`rank ${rank}: ${what} must be a string of 1..${max} UTF-8 bytes (got ${JSON.stringify(name)})`, undefined, rank);
  }
}

function checkDims(dims: readonly number[], what: string, rank: number, tensor: string, min: number): void {
  if (!Array.isArray(dims) || dims.length > MAX_NDIM) throw invalid(`rank ${rank}: ${what} of ${tensor} must be an array of at most ${MAX_NDIM} integers`, tensor, rank);
  for (const d of dims) {
    if (!Number.isSafeInteger(d) || d < min) throw invalid(`rank ${rank}: ${what} of ${tensor} has ${d}; each must be an integer >= ${min}`, tensor, rank);
  }
}

const checked = new WeakSet<RankLayout>();

/** Notes that `layout` was checked (the decoder checks its compact form: compact.ts). */
export function markValid(layout: RankLayout): void {
  checked.add(layout);
}

/** validateLayout, once per layout object (layouts are not changed after they are built or decoded). */
export function validateLayoutOnce(layout: RankLayout): void {
  if (checked.has(layout)) return;
  validateLayout(layout);
}

/**
 * Checks one rank's layout on its own (names, bounds, dtypes, pieces not overlapping, a
 * destination covered by its pieces and padding exactly once). Throws LayoutError.
 */
export function validateLayout(layout: RankLayout): void {
  const { rank } = layout;
  if (!Number.isInteger(rank) || rank < 0 || rank > U31) throw invalid(`a layout's rank must be an integer 0..2^31-1 (got ${rank})`);
  if (!Number.isInteger(layout.gpu) || layout.gpu < 0 || layout.gpu > U31) throw invalid(`rank ${rank}: gpu must be an integer 0..2^31-1 (got ${layout.gpu})`, undefined, rank);
  checkName(layout.node, 'the node id', rank, MAX_NODE_BYTES);
  const globals = new Map<string, GlobalTensor>();
  let previous: string | undefined;
  for (const t of layout.tensors) {
    checkName(t.name, 'a tensor name', rank);
    if (previous !== undefined && compareNames(previous, t.name) >= 0) {
      throw invalid(`rank ${rank}: global tensors must be unique and sorted by name (${JSON.stringify(t.name)} after ${JSON.stringify(previous)})`, t.name, rank);
    }
    previous = t.name;
    if (!isDType(t.dtype)) throw invalid(`rank ${rank}: tensor ${t.name} has unknown dtype ${JSON.stringify(t.dtype)}`, t.name, rank);
    checkDims(t.shape, 'the shape', rank, t.name, 1);
    if (volume(t.shape) * dtypeInfo(t.dtype).itemsize > SAFE) throw invalid(`rank ${rank}: tensor ${t.name} has more than 2^53-1 bytes`, t.name, rank);
    globals.set(t.name, t);
  }
  const used = new Set<string>();
  for (const [role, list] of [['source', layout.sources], ['destination', layout.destinations]] as const) {
    const names = new Set<string>();
    for (const local of list) {
      checkName(local.name, `a ${role} tensor name`, rank);
      if (names.has(local.name)) throw invalid(`rank ${rank}: two ${role} tensors are named ${local.name}`, local.name, rank);
      names.add(local.name);
      validateLocal(rank, role, local, globals, used);
    }
  }
  for (const name of globals.keys()) {
    if (!used.has(name)) throw invalid(`rank ${rank}: global tensor ${name} is named by no piece; leave it out`, name, rank);
  }
  checked.add(layout);
}

function validateLocal(rank: number, role: 'source' | 'destination', local: LocalTensor, globals: Map<string, GlobalTensor>, used: Set<string>): void {
  const where = `rank ${rank}: ${role} ${local.name}`;
  if (!isDType(local.dtype)) throw invalid(`${where} has unknown dtype ${JSON.stringify(local.dtype)}`, local.name, rank);
  const itemsize = dtypeInfo(local.dtype).itemsize;
  checkDims(local.shape, 'the shape', rank, local.name, 1);
  checkDims(local.strides, 'the strides', rank, local.name, 0);
  const ndim = local.shape.length;
  if (local.strides.length !== ndim) throw invalid(`${where} has ${local.strides.length} strides for ${ndim} dimensions`, local.name, rank);
  checkStrides(where, local, itemsize, rank);
  if (local.pieces.length === 0 && (role === 'source' || local.padding.length === 0)) throw invalid(`${where} has no pieces; leave it out`, local.name, rank);
  const boxes: Box[] = [];
  const what = (i: number): string => {
    if (i >= local.pieces.length) return 'padding';
    const p = local.pieces[i]!;
    return `the piece ${formatRange({ start: p.start, length: p.length })} of ${p.tensor}`;
  };
  for (const p of local.pieces) {
    const g = globals.get(p.tensor);
    if (!g) throw invalid(`${where}: a piece names tensor ${JSON.stringify(p.tensor)}, which the layout's tensors do not list`, local.name, rank);
    used.add(p.tensor);
    if (g.dtype !== local.dtype) {
      throw new LayoutError('ERR_LAYOUT_DTYPE', `${where} is ${local.dtype} but its piece of ${g.name} is ${g.dtype}; the dtypes must be equal (no conversion)`, { tensor: g.name, rank });
    }
    if (p.start.length !== g.shape.length || p.length.length !== g.shape.length || p.at.length !== ndim || g.shape.length !== ndim) {
      throw new LayoutError('ERR_LAYOUT_SHAPE', `${where}: its piece of ${g.name} (${g.shape.length} dimensions) must give start, length and at for each of the ${ndim} dimensions of both`, { tensor: g.name, rank });
    }
    checkDims(p.start, 'a piece start', rank, g.name, 0);
    checkDims(p.length, 'a piece length', rank, g.name, 1);
    checkDims(p.at, 'a piece offset (at)', rank, local.name, 0);
    const box = { start: p.start, length: p.length };
    for (let i = 0; i < ndim; i++) {
      if (p.start[i]! + p.length[i]! > g.shape[i]!) {
        throw new LayoutError('ERR_LAYOUT_BOUNDS', `${where}: its piece ${formatRange(box)} of ${g.name} is outside the tensor's shape [${g.shape.join(', ')}]`, { tensor: g.name, rank, range: box });
      }
    }
    const placed = { start: p.at, length: p.length };
    checkInside(where, local, placed, g.name, rank);
    boxes.push(placed);
  }
  for (const pad of local.padding) {
    checkDims(pad.start, 'a padding start', rank, local.name, 0);
    checkDims(pad.length, 'a padding length', rank, local.name, 1);
    if (pad.start.length !== ndim || pad.length.length !== ndim) throw new LayoutError('ERR_LAYOUT_SHAPE', `${where}: a padding box must have ${ndim} dimensions`, { tensor: local.name, rank });
    checkInside(where, local, pad, undefined, rank);
    boxes.push(pad);
  }
  if (role === 'source' && local.padding.length > 0) throw invalid(`${where} declares padding; only destinations do (a source's other bytes are simply not sent)`, local.name, rank);
  const clash = boxesOverlap(boxes);
  if (clash) {
    const [a, b, range] = clash;
    throw new LayoutError('ERR_LAYOUT_OVERLAP', `${where}: ${what(a)} and ${what(b)} both cover ${formatRange(range)} of it; each byte of a local tensor belongs to one piece`, { tensor: local.name, rank, range });
  }
  if (role === 'destination') {
    const hole = findHole(local.shape, boxes);
    if (hole) {
      throw new LayoutError('ERR_LAYOUT_UNCOVERED', `${where}: ${formatRange(hole)} of it is neither a piece nor declared padding; declare what stays untouched as padding`, { tensor: local.name, rank, range: hole });
    }
  }
}

/** `piece`: the global tensor of a piece, undefined for padding. */
function checkInside(where: string, local: LocalTensor, box: Box, piece: string | undefined, rank: number): void {
  for (let i = 0; i < local.shape.length; i++) {
    if (box.start[i]! + box.length[i]! > local.shape[i]!) {
      const what = piece === undefined ? 'its padding' : `its piece of ${piece}`;
      throw new LayoutError('ERR_LAYOUT_BOUNDS', `${where}: ${what} at ${formatRange(box)} is outside its shape [${local.shape.join(', ')}]`, { tensor: local.name, rank, range: box });
    }
  }
}

/** Strides: multiples of the item size, and no two elements on one byte (a destination byte written twice). */
function checkStrides(where: string, local: LocalTensor, itemsize: number, rank: number): void {
  let s = itemsize;
  let contiguous = true;
  for (let i = local.shape.length - 1; i >= 0 && contiguous; i--) {
    contiguous = local.strides[i] === s;
    s *= local.shape[i]!;
  }
  if (contiguous && s <= SAFE) return;
  const dims = local.shape.map((n, i) => ({ n, s: local.strides[i]! })).filter((d) => d.n > 1).sort((a, b) => a.s - b.s);
  let extent = itemsize;
  for (const d of dims) {
    if (d.s % itemsize !== 0 || d.s < extent) {
      throw invalid(`${where} has strides [${local.strides.join(', ')}] that put two elements on one byte or are not multiples of ${itemsize}`, local.name, rank);
    }
    extent = d.s * (d.n - 1) + extent;
  }
  if (extent > SAFE) throw invalid(`${where} spans more than 2^53-1 bytes`, local.name, rank);
}
