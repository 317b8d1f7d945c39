// A rank's layout on the wire ('CISL', version 1; docs/PROTOCOL.md section 9): little-endian,
// reserved and padding bytes zero, one encoding per layout (decoding is canonical: it succeeds
// only when re-encoding gives the same bytes), bounded before anything is allocated. Python's
// python/cuda_ipc/tensors/sharded/layout_wire.py reads and writes the same bytes.
import { createHash } from 'node:crypto';
import { dtypeFromWireCode, dtypeInfo } from '../../ipc/dtype.js';
import { LayoutError } from './errors.js';
import { MAX_NAME_BYTES, MAX_NDIM, MAX_NODE_BYTES, contiguousStrides, markValid, validateLayout, type GlobalTensor, type LocalTensor, type RankLayout } from './layout.js';
import { layoutOfCompact, validateCompact, type CompactLayout } from './compact.js';

export const LAYOUT_MAGIC = 'CISL';
export const LAYOUT_VERSION = 1;
/** The largest layout record either side writes or reads. */
export const MAX_LAYOUT_BYTES = 64 * 1024 * 1024;
const HEADER = 32;
const FLAG_STRIDES = 1;
const encodedBytes = new WeakMap<RankLayout, Uint8Array>();

const pad8 = (n: number): number => (n + 7) & ~7;

function bad(why: string): LayoutError {
  return new LayoutError('ERR_LAYOUT_INVALID', `layout record: ${why}`);
}

class Writer {
  buf: Buffer;
  pos = 0;
  constructor(size: number) { this.buf = Buffer.alloc(size); }
  u8(v: number): void { this.buf[this.pos++] = v; }
  u16(v: number): void { this.buf.writeUInt16LE(v, this.pos); this.pos += 2; }
  u32(v: number): void { this.buf.writeUInt32LE(v, this.pos); this.pos += 4; }
  u64(v: number): void { this.buf.writeUInt32LE(v % 0x100000000, this.pos); this.buf.writeUInt32LE(Math.floor(v / 0x100000000), this.pos + 4); this.pos += 8; }
  bytes(b: Uint8Array): void { this.buf.set(b, this.pos); this.pos = pad8(this.pos + b.length); }
}

function isContiguous(local: LocalTensor): boolean {
  const c = contiguousStrides(local.shape, dtypeInfo(local.dtype).itemsize);
  return c.every((s, i) => s === local.strides[i]);
}

/** The layout's record (checks it first: validateLayout). */
export function encodeLayout(layout: RankLayout): Uint8Array {
  const cached = encodedBytes.get(layout);
  if (cached) return cached;
  validateLayout(layout);
  const node = Buffer.from(layout.node, 'utf8');
  const index = new Map(layout.tensors.map((t, i) => [t.name, i]));
  let size = HEADER + pad8(node.length);
  const names = layout.tensors.map((t) => Buffer.from(t.name, 'utf8'));
  layout.tensors.forEach((t, i) => { size += 8 + 8 * t.shape.length + pad8(names[i]!.length); });
  const locals = [...layout.sources, ...layout.destinations];
  const localNames = locals.map((l) => Buffer.from(l.name, 'utf8'));
  locals.forEach((l, i) => {
    const n = l.shape.length;
    size += 16 + 8 * n * (isContiguous(l) ? 1 : 2) + pad8(localNames[i]!.length) + l.pieces.length * (8 + 24 * n) + l.padding.length * 16 * n;
  });
  if (size > MAX_LAYOUT_BYTES) throw bad(`rank ${layout.rank}'s layout takes ${size} bytes, more than ${MAX_LAYOUT_BYTES}`);
  const w = new Writer(size);
  w.buf.write(LAYOUT_MAGIC, 0, 'latin1'); w.pos = 4;
  w.u16(LAYOUT_VERSION); w.u16(node.length); w.u32(size); w.u32(layout.rank); w.u32(layout.gpu);
  w.u32(layout.tensors.length); w.u32(layout.sources.length); w.u32(layout.destinations.length);
  w.bytes(node);
  layout.tensors.forEach((t, i) => {
    w.u8(dtypeInfo(t.dtype).wireCode); w.u8(t.shape.length); w.u16(names[i]!.length); w.u32(0);
    for (const d of t.shape) w.u64(d);
    w.bytes(names[i]!);
  });
  locals.forEach((l, i) => {
    const strided = !isContiguous(l);
    w.u8(dtypeInfo(l.dtype).wireCode); w.u8(l.shape.length); w.u8(strided ? FLAG_STRIDES : 0); w.u8(0);
    w.u16(localNames[i]!.length); w.u16(0); w.u32(l.pieces.length); w.u32(l.padding.length);
    for (const d of l.shape) w.u64(d);
    if (strided) for (const s of l.strides) w.u64(s);
    w.bytes(localNames[i]!);
    for (const p of l.pieces) {
      w.u32(index.get(p.tensor)!); w.u32(0);
      for (const v of p.start) w.u64(v);
      for (const v of p.length) w.u64(v);
      for (const v of p.at) w.u64(v);
    }
    for (const b of l.padding) {
      for (const v of b.start) w.u64(v);
      for (const v of b.length) w.u64(v);
    }
  });
  if (w.pos !== size) throw new Error(`encodeLayout: wrote ${w.pos} of ${size} bytes`);
  const out = new Uint8Array(w.buf.buffer, w.buf.byteOffset, size);
  encodedBytes.set(layout, out);
  return out;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * Reads a record. Messages name the entry being read (kind, index, piece) plus a fixed suffix, put
 * together only when something is wrong: no string is built per field while decoding.
 */
class Reader {
  pos = 0;
  kind = '';
  entry = -1;
  piece = -1;
  ascii = true;
  /** The id of the name text() read last (-1: not interned). */
  id = -1;
  readonly view: DataView;
  constructor(readonly buf: Buffer) { this.view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength); }
  /** `suffix` after the entry being read, e.g. "local tensor 3's piece 0's start". */
  where(suffix: string): string {
    const head = this.entry < 0 ? '' : `${this.kind} ${this.entry}${this.piece >= 0 ? `'s piece ${this.piece}` : ''}`;
    return head ? (suffix ? `${head}'s ${suffix}` : head) : suffix;
  }
  need(n: number, what: string): void { if (this.pos + n > this.buf.length) throw bad(`${this.where(what)} runs past the record's ${this.buf.length} bytes`); }
  u8(): number { return this.buf[this.pos++]!; }
  u16(): number { const v = this.view.getUint16(this.pos, true); this.pos += 2; return v; }
  u32(): number { const v = this.view.getUint32(this.pos, true); this.pos += 4; return v; }
  zero(n: number, what: string): void {
    for (let i = 0; i < n; i++) if (this.buf[this.pos + i] !== 0) throw bad(`${this.where(what)} must be zero`);
    this.pos += n;
  }
  /** `n` u64 values into `out` from `o` (the caller made room). */
  u64s(n: number, what: string, out: Float64Array, o: number): void {
    this.need(8 * n, what);
    const v = this.view;
    let pos = this.pos;
    for (let i = 0; i < n; i++) {
      const hi = v.getUint32(pos + 4, true);
      if (hi > 0x1fffff) throw bad(`${this.where(what)} has a value above 2^53-1`);
      out[o + i] = hi * 0x100000000 + v.getUint32(pos, true);
      pos += 8;
    }
    this.pos = pos;
  }
  text(n: number, what: string): string {
    this.need(pad8(n), what);
    const buf = this.buf;
    let s: string | undefined;
    let h = 0x811c9dc5 ^ n;
    for (let i = this.pos; i < this.pos + n; i++) {
      const b = buf[i]!;
      if (b >= 0x80) { h = -1; break; }
      h = Math.imul(h ^ b, 0x01000193);
    }
    this.id = -1;
    if (h !== -1) {
      const x = internAscii(buf, this.pos, n, h);
      s = x.s;
      this.id = x.id;
    } else try { s = utf8.decode(buf.subarray(this.pos, this.pos + n)); this.ascii = false; } catch { throw bad(`${this.where(what)} is not valid UTF-8`); }
    this.pos += n;
    for (let i = 0; i < pad8(n) - n; i++) if (buf[this.pos + i] !== 0) throw bad(`the padding after ${this.where(what)} must be zero`);
    this.pos += pad8(n) - n;
    return s;
  }
}

/**
 * ASCII names seen in records, by a hash of their bytes: a group's records repeat the same names
 * (every rank of a model names its tensors alike), and one string per name decodes faster and
 * leaves less to collect than a string per record. Bounded: cleared past a million names or 16 Mi characters.
 */
interface Name { readonly s: string; readonly id: number }
const names = new Map<number, Name | Name[]>();
let nameCount = 0;
let nameChars = 0;
const NAMES_MAX = 1 << 20;
const NAME_CHARS_MAX = 16 << 20;

/** The interned string of ASCII bytes `buf[pos, pos + n)` (hash `h`) and its id (unique while interned). */
function internAscii(buf: Buffer, pos: number, n: number, h: number): Name {
  const same = (x: Name): boolean => {
    const s = x.s;
    if (s.length !== n) return false;
    for (let i = 0; i < n; i++) if (s.charCodeAt(i) !== buf[pos + i]) return false;
    return true;
  };
  const found = names.get(h);
  if (found !== undefined && !Array.isArray(found) && same(found)) return found;
  if (Array.isArray(found)) for (const x of found) if (same(x)) return x;
  if (nameCount >= NAMES_MAX || nameChars >= NAME_CHARS_MAX) { names.clear(); nameCount = 0; nameChars = 0; }
  nameChars += n;
  const x: Name = { s: buf.toString('latin1', pos, pos + n), id: nameCount++ };
  if (found === undefined) names.set(h, x);
  else if (Array.isArray(found)) found.push(x);
  else names.set(h, [found, x]);
  return x;
}

function dtypeOf(code: number, r: Reader): GlobalTensor['dtype'] {
  const d = dtypeFromWireCode(code);
  if (!d) throw bad(`${r.where('')} has unknown dtype code ${code}`);
  return d;
}

/**
 * Global tables recently decoded, by their bytes: records that list the same global tensors (every
 * FSDP rank's) share one table instead of decoding it again. A few, of bounded size.
 */
const tables: Array<{ bytes: Buffer; count: number; ascii: boolean; tensors: readonly GlobalTensor[] }> = [];
const TABLES = 8;
const TABLE_MAX_BYTES = 4 << 20;

function readTable(r: Reader, g: number): readonly GlobalTensor[] {
  const from = r.pos;
  for (const t of tables) {
    if (t.count === g && from + t.bytes.length <= r.buf.length && r.buf.compare(t.bytes, 0, t.bytes.length, from, from + t.bytes.length) === 0) {
      r.pos = from + t.bytes.length;
      if (!t.ascii) r.ascii = false;
      return t.tensors;
    }
  }
  const wasAscii = r.ascii;
  r.ascii = true;
  const tensors: GlobalTensor[] = [];
  for (let i = 0; i < g; i++) {
    r.kind = 'global tensor'; r.entry = i; r.piece = -1;
    r.need(8, '');
    const dtype = dtypeOf(r.u8(), r);
    const ndim = r.u8();
    const nameLength = r.u16();
    r.zero(4, 'reserved bytes');
    if (ndim > MAX_NDIM) throw bad(`global tensor ${i} has ${ndim} dimensions; at most ${MAX_NDIM}`);
    if (nameLength < 1 || nameLength > MAX_NAME_BYTES) throw bad(`global tensor ${i}'s name has ${nameLength} bytes; 1..${MAX_NAME_BYTES}`);
    const shape = new Float64Array(ndim);
    r.u64s(ndim, 'shape', shape, 0);
    tensors.push({ name: r.text(nameLength, 'name'), dtype, shape: Array.from(shape) });
  }
  const ascii = r.ascii;
  r.ascii = wasAscii && ascii;
  if (r.pos - from <= TABLE_MAX_BYTES) {
    if (tables.length >= TABLES) tables.shift();
    tables.push({ bytes: Buffer.from(r.buf.subarray(from, r.pos)), count: g, ascii, tensors });
  }
  return tensors;
}

/**
 * Chunks that decoded layouts' numbers and record copies are cut from: a group's records are
 * decoded together and live together, and a few large allocations cost less than two per record.
 */
const CHUNK = 4 << 20;
let numChunk = new Float64Array(0);
let numUsed = 0;
let byteChunk = new Uint8Array(0);
let byteUsed = 0;

/** A copy of `bytes` (from a chunk when small). */
function copyOf(bytes: Uint8Array): Uint8Array {
  const n = bytes.length;
  if (n > CHUNK / 4) return new Uint8Array(bytes);
  if (byteUsed + n > byteChunk.length) { byteChunk = new Uint8Array(Buffer.allocUnsafeSlow(CHUNK).buffer, 0, CHUNK); byteUsed = 0; }
  const out = byteChunk.subarray(byteUsed, byteUsed + n);
  out.set(bytes);
  byteUsed = pad8(byteUsed + n);
  return out;
}

/** A growable Float64Array of a layout's numbers (room from a chunk first). */
class Numbers {
  a: Float64Array;
  n = 0;
  readonly chunked: boolean;
  constructor(capacity: number) {
    this.chunked = capacity <= CHUNK / 32;
    if (!this.chunked) { this.a = new Float64Array(capacity); return; }
    if (numUsed + capacity > numChunk.length) { numChunk = new Float64Array(CHUNK / 8); numUsed = 0; }
    this.a = numChunk.subarray(numUsed, numUsed + capacity);
  }
  /** Room for `k` more; returns where they go. */
  take(k: number): number {
    if (this.n + k > this.a.length) {
      const b = new Float64Array(Math.max(this.a.length * 2, this.n + k));
      b.set(this.a.subarray(0, this.n));
      this.a = b;
    }
    const at = this.n;
    this.n += k;
    return at;
  }
  /** The numbers, kept (their part of the chunk is not handed out again). */
  done(): Float64Array {
    if (this.chunked && this.a.buffer === numChunk.buffer) numUsed += this.n;
    return this.a.subarray(0, this.n);
  }
}

/**
 * A layout from its record: every field checked (ERR_LAYOUT_INVALID for a malformed record), then
 * the layout itself (validateLayout's checks: its own LayoutError codes). The layout's local
 * tensors are built as objects only when read (the planner reads the compact form: compact.ts).
 */
export function decodeLayout(bytes: Uint8Array): RankLayout {
  if (bytes.length < HEADER) throw bad(`${bytes.length} bytes are shorter than the ${HEADER}-byte header`);
  if (bytes.length > MAX_LAYOUT_BYTES) throw bad(`${bytes.length} bytes are more than ${MAX_LAYOUT_BYTES}`);
  const copy = copyOf(bytes);
  const r = new Reader(Buffer.from(copy.buffer, copy.byteOffset, copy.byteLength));
  if (r.buf.toString('latin1', 0, 4) !== LAYOUT_MAGIC) throw bad(`the magic is not '${LAYOUT_MAGIC}'`);
  r.pos = 4;
  const version = r.u16();
  if (version !== LAYOUT_VERSION) throw bad(`version ${version}; this side reads version ${LAYOUT_VERSION}`);
  const nodeLength = r.u16();
  const total = r.u32();
  if (total !== bytes.length) throw bad(`the header says ${total} bytes, the record has ${bytes.length}`);
  const rank = r.u32();
  const gpu = r.u32();
  const g = r.u32();
  const s = r.u32();
  const d = r.u32();
  if (nodeLength < 1 || nodeLength > MAX_NODE_BYTES) throw bad(`the node id has ${nodeLength} bytes; 1..${MAX_NODE_BYTES}`);
  // Every entry takes at least 16 bytes: counts beyond that cannot be (checked before allocating).
  if ((g + s + d) * 16 > bytes.length) throw bad(`${g} tensors and ${s + d} local tensors cannot fit in ${bytes.length} bytes`);
  const node = r.text(nodeLength, 'the node id');
  r.entry = -1;
  const tensors = readTable(r, g);
  const L = s + d;
  const lName: string[] = new Array(L);
  const lId = new Int32Array(L);
  const lDtype: GlobalTensor['dtype'][] = new Array(L);
  const lNdim = new Uint8Array(L);
  const lShape = new Uint32Array(L);
  const lStrides = new Uint32Array(L);
  const lPieces = new Uint32Array(L + 1);
  const lPadding = new Uint32Array(L + 1);
  // Numbers: at most one per 8 bytes of the rest of the record, plus contiguous strides (no more than the shapes).
  const nums = new Numbers(((bytes.length - r.pos) >> 3) + 4 * L);
  let pTensor = new Uint32Array(Math.max(16, L));
  let pAt = new Uint32Array(pTensor.length);
  let padAt = new Uint32Array(16);
  let pieces = 0;
  let pads = 0;
  for (let i = 0; i < L; i++) {
    r.kind = 'local tensor'; r.entry = i; r.piece = -1;
    r.need(16, '');
    const dtype = dtypeOf(r.u8(), r);
    const ndim = r.u8();
    const flags = r.u8();
    r.zero(1, 'reserved byte');
    const nameLength = r.u16();
    r.zero(2, 'reserved bytes');
    const pieceCount = r.u32();
    const paddingCount = r.u32();
    if (ndim > MAX_NDIM) throw bad(`${r.where('')} has ${ndim} dimensions; at most ${MAX_NDIM}`);
    if (flags > FLAG_STRIDES) throw bad(`${r.where('')} has unknown flags ${flags}`);
    if (nameLength < 1 || nameLength > MAX_NAME_BYTES) throw bad(`${r.where('')}'s name has ${nameLength} bytes; 1..${MAX_NAME_BYTES}`);
    if ((pieceCount * (8 + 24 * ndim) + paddingCount * 16 * ndim) > bytes.length - r.pos) throw bad(`${r.where('')}'s ${pieceCount} pieces and ${paddingCount} padding boxes run past the record`);
    lNdim[i] = ndim;
    lDtype[i] = dtype;
    const sh = nums.take(2 * ndim);
    lShape[i] = sh;
    lStrides[i] = sh + ndim;
    r.u64s(ndim, 'shape', nums.a, sh);
    const itemsize = dtypeInfo(dtype).itemsize;
    let contiguous = true;
    {
      const a = nums.a;
      let stride = itemsize;
      if (flags & FLAG_STRIDES) r.u64s(ndim, 'strides', a, sh + ndim);
      for (let k = ndim - 1; k >= 0; k--) {
        if (flags & FLAG_STRIDES) contiguous &&= a[sh + ndim + k] === stride;
        else a[sh + ndim + k] = stride;
        stride *= a[sh + k]!;
      }
    }
    lName[i] = r.text(nameLength, 'name');
    lId[i] = r.id;
    if (pieces + pieceCount > pTensor.length) {
      const grow = (x: Uint32Array<ArrayBuffer>): Uint32Array<ArrayBuffer> => { const y = new Uint32Array(Math.max(x.length * 2, pieces + pieceCount)); y.set(x); return y; };
      pTensor = grow(pTensor);
      pAt = grow(pAt);
    }
    lPieces[i] = pieces;
    for (let k = 0; k < pieceCount; k++) {
      r.piece = k;
      r.need(8, '');
      const t = r.u32();
      r.zero(4, 'reserved bytes');
      if (t >= g) throw bad(`${r.where('')}'s piece ${k} names tensor ${t} of ${g}`);
      const o = nums.take(3 * ndim);
      r.u64s(ndim, 'start', nums.a, o);
      r.u64s(ndim, 'length', nums.a, o + ndim);
      r.u64s(ndim, 'at', nums.a, o + 2 * ndim);
      pTensor[pieces] = t;
      pAt[pieces++] = o;
    }
    r.piece = -1;
    if (pads + paddingCount > padAt.length) { const y = new Uint32Array(Math.max(padAt.length * 2, pads + paddingCount)); y.set(padAt); padAt = y; }
    lPadding[i] = pads;
    for (let k = 0; k < paddingCount; k++) {
      const o = nums.take(2 * ndim);
      r.u64s(ndim, `padding ${k}`, nums.a, o);
      r.u64s(ndim, `padding ${k}`, nums.a, o + ndim);
      padAt[pads++] = o;
    }
    if (flags & FLAG_STRIDES && contiguous) throw bad(`${r.where('')} flags explicit strides that are the C-contiguous ones; leave the flag clear`);
  }
  lPieces[L] = pieces;
  lPadding[L] = pads;
  if (r.pos !== bytes.length) throw bad(`${bytes.length - r.pos} bytes follow the last local tensor`);
  const compact: CompactLayout = {
    rank, node, gpu, tensors, sourceCount: s, localCount: L, lName, lId, lDtype, lNdim, lShape, lStrides, lPieces, lPadding,
    pTensor: pTensor.subarray(0, pieces), pAt: pAt.subarray(0, pieces), padAt: padAt.subarray(0, pads), nums: nums.done(),
    ascii: r.ascii,
  };
  const layout = layoutOfCompact(compact);
  validateCompact(compact, layout);
  markValid(layout);
  encodedBytes.set(layout, copy);
  return layout;
}

/**
 * The fingerprint of a group's layouts: SHA-256 (hex) of 'CISP', u32 version 1, u32 layout count,
 * then per layout in rank order its record's u32 length and bytes. Equal fingerprints, equal plans;
 * a rank whose layout changed changes it, and the group re-plans.
 */
export function layoutFingerprint(layouts: readonly RankLayout[]): string {
  const sorted = [...layouts].sort((a, b) => a.rank - b.rank);
  const h = createHash('sha256');
  const head = Buffer.alloc(12);
  head.write('CISP', 0, 'latin1');
  head.writeUInt32LE(1, 4);
  head.writeUInt32LE(sorted.length, 8);
  h.update(head);
  for (const l of sorted) {
    const b = encodeLayout(l);
    const n = Buffer.alloc(4);
    n.writeUInt32LE(b.length);
    h.update(n);
    h.update(b);
  }
  return h.digest('hex');
}
