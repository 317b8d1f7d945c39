// The 'tensor-set' record (docs/PROTOCOL.md section 4.2): many named tensors in one link message.
// Each allocation the tensors live in crosses once, as the record data of its own kind (a legacy
// handle, a pool buffer, a memfd); each tensor is a row of a column table: its allocation, byte
// offset, dtype, shape, strides when it is not C-contiguous, and its name, front-coded against the
// previous one (state dict names share long prefixes). Everything is little-endian with zero
// padding; the receiver checks every count, offset and length before it maps anything, and a
// table that lies fails the message with ERR_FRAME_INVALID.
//
// This module is pure (no links, no CUDA): encode and decode of the bytes only.
import { IpcError } from '../errors.js';
import { MAX_NDIM } from '../ipc/array-meta.js';
import { dtypeFromWireCode, dtypeInfo, type DType } from '../ipc/dtype.js';
import { invalidArgValue } from '../arg-errors.js';

export const TENSOR_SET_KIND = 'tensor-set';
export const TENSOR_SET_VERSION = 1;
/** 'CITS' (43 49 54 53) read as a little-endian u32. */
const MAGIC = 0x53544943;
export const SET_HEADER_BYTES = 32;
const ENTRY_HEADER_BYTES = 8;
/** Bytes of one tensor's fixed columns: u64 offset, u32 allocation, u16 shared, u16 suffix, u8 dtype, u8 ndim, u8 flags. */
const ROW_BYTES = 19;
const FLAG_STRIDES = 1;
const MAX_NAME_BYTES = 0xffff;

/** How an allocation travels, each as the record data of that kind (section 4.1). */
export const AllocationKind = { Legacy: 1, Pool: 2, Host: 3 } as const;
export type AllocationKind = (typeof AllocationKind)[keyof typeof AllocationKind];

/** The record kind whose data an allocation entry carries, and that data's exact size. */
export const ALLOCATION_KINDS: Readonly<Record<AllocationKind, { kind: string; dataBytes: number }>> = {
  1: { kind: 'legacy-buffer', dataBytes: 128 },
  2: { kind: 'pool-buffer', dataBytes: 136 },
  3: { kind: 'host-buffer', dataBytes: 24 },
};

/** One allocation of a tensor set: the data of its record kind, naming the whole allocation. */
export interface AllocationEntry {
  readonly kind: AllocationKind;
  /** fds this entry carries (taken in entry order from the record's fds). */
  readonly fdCount: number;
  readonly data: Uint8Array;
}

/** A parsed allocation entry: `data` points into the received record (valid during decode only). */
export interface ReceivedAllocation extends AllocationEntry {
  /** Bytes of the allocation, as the entry states them. */
  readonly size: number;
}

/** One tensor to encode. */
export interface TensorSpec {
  readonly name: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
  /** Byte strides (non-negative multiples of the itemsize). */
  readonly strides: readonly number[];
  /** Byte offset of the first element in its allocation. */
  readonly offset: number;
  /** Index of its allocation in the set. */
  readonly allocation: number;
}

/** The decoded tensor table of a set: one entry per tensor, in the sender's order. */
export interface TensorLayout {
  readonly count: number;
  readonly names: readonly string[];
  readonly index: ReadonlyMap<string, number>;
  readonly dtypes: readonly DType[];
  readonly shapes: ReadonlyArray<readonly number[]>;
  /** Byte strides, filled in for C-contiguous tensors too. */
  readonly strides: ReadonlyArray<readonly number[]>;
  /** 1 where the tensor is C-contiguous (its bytes are [offset, offset + nbytes)). */
  readonly contiguous: Uint8Array;
  readonly offsets: Float64Array;
  /** Bytes from the first element to the end of the last. */
  readonly extents: Float64Array;
  /** Elements x itemsize. */
  readonly nbytes: Float64Array;
  readonly allocations: Uint32Array;
  readonly allocationCount: number;
  /** The encoded table (an own copy): equal bytes mean an equal layout. */
  readonly table: Uint8Array;
}

function malformed(why: string): IpcError {
  return new IpcError('ERR_FRAME_INVALID', `a received tensor set is malformed: ${why}`);
}

const pad8 = (n: number): number => (n + 7) & ~7;

/** u64 little-endian as a number, or -1 when it is not a safe integer. */
function readU64(v: DataView, at: number): number {
  const high = v.getUint32(at + 4, true);
  return high >= 0x20_0000 ? -1 : high * 0x1_0000_0000 + v.getUint32(at, true);
}
function writeU64(v: DataView, at: number, n: number): void {
  v.setUint32(at, n % 0x1_0000_0000, true);
  v.setUint32(at + 4, Math.floor(n / 0x1_0000_0000), true);
}

/** C-contiguous byte strides of a shape whose dimensions are all non-zero. */
export function cStrides(shape: readonly number[], itemsize: number): number[] {
  const out = new Array<number>(shape.length);
  let step = itemsize;
  for (let i = shape.length - 1; i >= 0; i--) {
    out[i] = step;
    step *= shape[i]!;
  }
  return out;
}

function sameNumbers(a: readonly number[], b: readonly number[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function describeName(name: string): string {
  return JSON.stringify(name.length > 80 ? name.slice(0, 80) + '...' : name);
}

const utf8 = new TextEncoder();
const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * Encodes the tensor table of `specs` (the part of a tensor set that a repeated send of the same
 * tensors repeats byte for byte). Throws ERR_INVALID_ARG naming the first tensor it cannot carry.
 */
export function encodeTensorTable(specs: readonly TensorSpec[], allocationCount: number): Uint8Array {
  const count = specs.length;
  const names: Uint8Array[] = new Array(count);
  const seen = new Set<string>();
  let dims = 0;
  let strided = 0;
  let suffixBytes = 0;
  const stridedFlags = new Uint8Array(count);
  for (let i = 0; i < count; i++) {
    const s = specs[i]!;
    const bad = (why: string): never => { throw invalidArgValue(`tensor ${describeName(s.name)} ${why}`); };
    if (typeof s.name !== 'string' || s.name.length === 0) throw invalidArgValue(`tensor #${i} needs a non-empty name`);
    if (seen.has(s.name)) bad('appears twice; tensor names must be unique');
    seen.add(s.name);
    const bytes = utf8.encode(s.name);
    if (bytes.length > MAX_NAME_BYTES) bad(`has a name of ${bytes.length} UTF-8 bytes; at most ${MAX_NAME_BYTES} fit`);
    names[i] = bytes;
    const { itemsize } = dtypeInfo(s.dtype);
    if (s.shape.length > MAX_NDIM) bad(`has ${s.shape.length} dimensions; at most ${MAX_NDIM} fit`);
    if (s.strides.length !== s.shape.length) bad('has strides that do not match its shape');
    let elements = 1;
    for (const d of s.shape) {
      if (!Number.isSafeInteger(d) || d < 0) bad(`has a bad shape [${s.shape}]`);
      elements *= d;
    }
    if (elements === 0) bad(`has no elements (shape [${s.shape}]); send its shape as plain data instead`);
    if (!Number.isSafeInteger(s.offset) || s.offset < 0 || s.offset % itemsize !== 0) bad(`has offset ${s.offset}, not a multiple of its ${itemsize}-byte elements`);
    if (!Number.isSafeInteger(s.allocation) || s.allocation < 0 || s.allocation >= allocationCount) bad(`names allocation ${s.allocation} of ${allocationCount}`);
    dims += s.shape.length;
    if (!sameNumbers(s.strides, cStrides(s.shape, itemsize))) {
      stridedFlags[i] = 1;
      strided += s.shape.length;
    }
  }
  // Names: the bytes shared with the previous name, then the rest.
  const shared = new Uint16Array(count);
  for (let i = 1; i < count; i++) {
    const a = names[i - 1]!;
    const b = names[i]!;
    const n = Math.min(a.length, b.length);
    let k = 0;
    while (k < n && a[k] === b[k]) k++;
    shared[i] = k;
  }
  for (let i = 0; i < count; i++) suffixBytes += names[i]!.length - shared[i]!;

  const headEnd = pad8(ROW_BYTES * count);
  const shapeAt = headEnd;
  const stridesAt = shapeAt + 8 * dims;
  const namesAt = stridesAt + 8 * strided;
  const total = namesAt + pad8(suffixBytes);
  const out = new Uint8Array(total);
  const v = new DataView(out.buffer);
  let shapeCursor = shapeAt;
  let strideCursor = stridesAt;
  let nameCursor = namesAt;
  for (let i = 0; i < count; i++) {
    const s = specs[i]!;
    writeU64(v, 8 * i, s.offset);
    v.setUint32(8 * count + 4 * i, s.allocation, true);
    v.setUint16(12 * count + 2 * i, shared[i]!, true);
    v.setUint16(14 * count + 2 * i, names[i]!.length - shared[i]!, true);
    out[16 * count + i] = dtypeInfo(s.dtype).wireCode;
    out[17 * count + i] = s.shape.length;
    out[18 * count + i] = stridedFlags[i]! ? FLAG_STRIDES : 0;
    for (const d of s.shape) { writeU64(v, shapeCursor, d); shapeCursor += 8; }
    if (stridedFlags[i]) for (const st of s.strides) { writeU64(v, strideCursor, st); strideCursor += 8; }
    out.set(names[i]!.subarray(shared[i]!), nameCursor);
    nameCursor += names[i]!.length - shared[i]!;
  }
  return out;
}

/** The whole record data: header, allocation entries, then the encoded table. */
export function encodeTensorSet(allocations: readonly AllocationEntry[], table: Uint8Array, tensorCount: number): Uint8Array {
  let length = SET_HEADER_BYTES + table.byteLength;
  for (const a of allocations) length += ENTRY_HEADER_BYTES + a.data.byteLength;
  const out = new Uint8Array(length);
  const v = new DataView(out.buffer);
  v.setUint32(0, MAGIC, true);
  v.setUint16(4, TENSOR_SET_VERSION, true);
  v.setUint32(8, allocations.length, true);
  v.setUint32(12, tensorCount, true);
  v.setUint32(16, table.byteLength, true);
  let at = SET_HEADER_BYTES;
  for (const a of allocations) {
    const expected = ALLOCATION_KINDS[a.kind];
    if (!expected || a.data.byteLength !== expected.dataBytes) throw invalidArgValue(`an allocation entry of kind ${a.kind} has ${a.data.byteLength} bytes of data`);
    out[at] = a.kind;
    out[at + 1] = a.fdCount;
    v.setUint32(at + 4, a.data.byteLength, true);
    out.set(a.data, at + ENTRY_HEADER_BYTES);
    at += ENTRY_HEADER_BYTES + a.data.byteLength;
  }
  out.set(table, at);
  return out;
}

/** The allocation's size as its entry states it; the entry must describe the whole allocation. */
function allocationSize(kind: AllocationKind, data: Uint8Array, i: number): number {
  const v = new DataView(data.buffer, data.byteOffset, data.byteLength);
  let size: number;
  let offset: number;
  let length: number;
  if (kind === AllocationKind.Legacy) {
    // A cuda-legacy-handle descriptor (decoded in full, canonically, by its handler): offset at
    // 96, byteLength at 104, dtype code at 120 (tensor sets carry the dtypes in the table).
    offset = readU64(v, 96);
    size = length = readU64(v, 104);
    if (data[120] !== 0) throw malformed(`allocation ${i} carries array metadata; the table describes the tensors`);
  } else if (kind === AllocationKind.Pool) {
    size = readU64(v, 112);
    offset = readU64(v, 120);
    length = readU64(v, 128);
  } else {
    size = readU64(v, 0);
    offset = readU64(v, 8);
    length = readU64(v, 16);
  }
  if (size <= 0 || offset !== 0 || length !== size) throw malformed(`allocation ${i} does not describe one whole allocation (size ${size}, range ${offset}+${length})`);
  return size;
}

/** Parses the header and allocation entries of a received record (the table is decoded apart). */
export function parseTensorSet(data: Uint8Array, fdCount: number): { allocations: ReceivedAllocation[]; table: Uint8Array; tensorCount: number } {
  if (data.byteLength < SET_HEADER_BYTES) throw malformed(`${data.byteLength} bytes are too few for its header`);
  const v = new DataView(data.buffer, data.byteOffset, data.byteLength);
  if (v.getUint32(0, true) !== MAGIC) throw malformed('bad magic');
  const version = v.getUint16(4, true);
  if (version !== TENSOR_SET_VERSION) throw malformed(`version ${version} (this process reads version ${TENSOR_SET_VERSION}); update both sides to the same cuda-ipc`);
  if (v.getUint16(6, true) !== 0 || v.getUint32(20, true) !== 0 || v.getUint32(24, true) !== 0 || v.getUint32(28, true) !== 0) throw malformed('reserved header bytes are not zero');
  const allocationCount = v.getUint32(8, true);
  const tensorCount = v.getUint32(12, true);
  const tableLength = v.getUint32(16, true);
  if ((allocationCount === 0) !== (tensorCount === 0)) throw malformed(`${allocationCount} allocations for ${tensorCount} tensors`);
  const allocations: ReceivedAllocation[] = [];
  let at = SET_HEADER_BYTES;
  let fds = 0;
  for (let i = 0; i < allocationCount; i++) {
    if (at + ENTRY_HEADER_BYTES > data.byteLength) throw malformed(`allocation ${i} runs past the end`);
    const kind = data[at]! as AllocationKind;
    const entryFds = data[at + 1]!;
    const dataLength = v.getUint32(at + 4, true);
    const spec = ALLOCATION_KINDS[kind];
    if (!spec) throw malformed(`allocation ${i} has unknown kind ${kind}`);
    if (v.getUint16(at + 2, true) !== 0) throw malformed(`allocation ${i} has non-zero reserved bytes`);
    if (dataLength !== spec.dataBytes) throw malformed(`allocation ${i} (${spec.kind}) has ${dataLength} bytes of data, not ${spec.dataBytes}`);
    if (at + ENTRY_HEADER_BYTES + dataLength > data.byteLength) throw malformed(`allocation ${i} runs past the end`);
    const body = data.subarray(at + ENTRY_HEADER_BYTES, at + ENTRY_HEADER_BYTES + dataLength);
    // The fds an entry may carry: a host buffer its memfd, a pool buffer its pool's fd exactly
    // when its pool reference says one is attached, a legacy handle none.
    const expectedFds = kind === AllocationKind.Host ? 1 : kind === AllocationKind.Pool ? (body[40]! & 1) : 0;
    if (entryFds !== expectedFds) throw malformed(`allocation ${i} (${spec.kind}) claims ${entryFds} fds where it must carry ${expectedFds}`);
    allocations.push({ kind, fdCount: entryFds, data: body, size: allocationSize(kind, body, i) });
    fds += entryFds;
    at += ENTRY_HEADER_BYTES + dataLength;
  }
  if (fds !== fdCount) throw malformed(`its allocations claim ${fds} fds but the record has ${fdCount}`);
  if (at + tableLength !== data.byteLength) throw malformed(`the table of ${tableLength} bytes does not end the record (${data.byteLength - at} bytes left)`);
  return { allocations, table: data.subarray(at), tensorCount };
}

/**
 * Decodes and checks a tensor table against the sizes of its allocations: every tensor inside
 * its allocation, aligned, with a known dtype, non-zero shape, canonical strides and a unique
 * valid name; every allocation used; padding zero; nothing left over.
 */
export function decodeTensorTable(table: Uint8Array, count: number, allocationSizes: readonly number[]): TensorLayout {
  const allocationCount = allocationSizes.length;
  const headEnd = pad8(ROW_BYTES * count);
  if (headEnd > table.byteLength) throw malformed(`a table of ${table.byteLength} bytes cannot hold ${count} tensors`);
  const v = new DataView(table.buffer, table.byteOffset, table.byteLength);
  for (let i = ROW_BYTES * count; i < headEnd; i++) if (table[i] !== 0) throw malformed('padding bytes are not zero');
  let dims = 0;
  let strided = 0;
  let suffixBytes = 0;
  for (let i = 0; i < count; i++) {
    const ndim = table[17 * count + i]!;
    const flags = table[18 * count + i]!;
    if (ndim > MAX_NDIM) throw malformed(`tensor #${i} has ${ndim} dimensions (at most ${MAX_NDIM})`);
    if ((flags & ~FLAG_STRIDES) !== 0) throw malformed(`tensor #${i} has unknown flags ${flags}`);
    dims += ndim;
    if (flags & FLAG_STRIDES) strided += ndim;
    suffixBytes += v.getUint16(14 * count + 2 * i, true);
  }
  const shapeAt = headEnd;
  const stridesAt = shapeAt + 8 * dims;
  const namesAt = stridesAt + 8 * strided;
  const total = namesAt + pad8(suffixBytes);
  if (total !== table.byteLength) throw malformed(`its table should hold ${total} bytes for what it announces, not ${table.byteLength}`);
  for (let i = namesAt + suffixBytes; i < total; i++) if (table[i] !== 0) throw malformed('padding bytes are not zero');

  const names: string[] = new Array(count);
  const index = new Map<string, number>();
  const dtypes: DType[] = new Array(count);
  const shapes: number[][] = new Array(count);
  const strides: number[][] = new Array(count);
  const contiguous = new Uint8Array(count);
  const offsets = new Float64Array(count);
  const extents = new Float64Array(count);
  const nbytes = new Float64Array(count);
  const allocations = new Uint32Array(count);
  const used = new Uint8Array(allocationCount);
  let shapeCursor = shapeAt;
  let strideCursor = stridesAt;
  let nameCursor = namesAt;
  let previous = new Uint8Array(0);
  for (let i = 0; i < count; i++) {
    // The name first, so that every later complaint can name the tensor.
    const sharedBytes = v.getUint16(12 * count + 2 * i, true);
    const suffixLength = v.getUint16(14 * count + 2 * i, true);
    if (sharedBytes > previous.length) throw malformed(`tensor #${i} shares ${sharedBytes} name bytes with a previous name of ${previous.length}`);
    const suffix = table.subarray(nameCursor, nameCursor + suffixLength);
    nameCursor += suffixLength;
    if (sharedBytes < previous.length && suffixLength > 0 && previous[sharedBytes] === suffix[0]) {
      throw malformed(`tensor #${i} shares fewer name bytes with the previous name than it could (front coding must share the longest common prefix)`);
    }
    const nameBytes = new Uint8Array(sharedBytes + suffixLength);
    nameBytes.set(previous.subarray(0, sharedBytes));
    nameBytes.set(suffix, sharedBytes);
    if (nameBytes.length === 0) throw malformed(`tensor #${i} has an empty name`);
    let name: string;
    try {
      name = strictUtf8.decode(nameBytes);
    } catch {
      throw malformed(`tensor #${i} has a name that is not UTF-8`);
    }
    if (index.has(name)) throw malformed(`tensor ${describeName(name)} appears twice`);
    index.set(name, i);
    names[i] = name;
    previous = nameBytes;
    const bad = (why: string): never => { throw malformed(`tensor ${describeName(name)} ${why}`); };

    const dtype = dtypeFromWireCode(table[16 * count + i]!);
    if (dtype === undefined) bad(`has unknown dtype code ${table[16 * count + i]}`);
    dtypes[i] = dtype!;
    const itemsize = dtypeInfo(dtype!).itemsize;
    const allocation = v.getUint32(8 * count + 4 * i, true);
    if (allocation >= allocationCount) bad(`names allocation ${allocation} of ${allocationCount}`);
    allocations[i] = allocation;
    used[allocation] = 1;
    const offset = readU64(v, 8 * i);
    if (offset < 0 || offset % itemsize !== 0) bad(`starts at offset ${offset}, not a multiple of its ${itemsize}-byte elements`);
    offsets[i] = offset;

    const ndim = table[17 * count + i]!;
    const shape = new Array<number>(ndim);
    let elements = 1;
    for (let d = 0; d < ndim; d++) {
      const dim = readU64(v, shapeCursor);
      shapeCursor += 8;
      if (dim <= 0) bad(`has dimension ${d} of ${dim === 0 ? 0 : 'more than 2^53-1'} elements (tensors with no elements do not travel in sets)`);
      shape[d] = dim;
      elements *= dim;
      if (!Number.isSafeInteger(elements * itemsize)) bad('holds more than 2^53-1 bytes');
    }
    shapes[i] = shape;
    const c = cStrides(shape, itemsize);
    let st = c;
    if (table[18 * count + i]! & FLAG_STRIDES) {
      st = new Array<number>(ndim);
      for (let d = 0; d < ndim; d++) {
        const s = readU64(v, strideCursor);
        strideCursor += 8;
        if (s < 0 || s % itemsize !== 0) bad(`has stride ${s} in dimension ${d}, not a non-negative multiple of ${itemsize}`);
        st[d] = s;
      }
      if (sameNumbers(st, c)) bad('carries explicit strides equal to the C-contiguous ones (they must be left out)');
    } else {
      contiguous[i] = 1;
    }
    strides[i] = st;
    let last = 0;
    for (let d = 0; d < ndim; d++) last += (shape[d]! - 1) * st[d]!;
    const extent = last + itemsize;
    if (!Number.isSafeInteger(extent) || offset + extent > allocationSizes[allocation]!) {
      bad(`reaches byte ${offset + extent} of its allocation, which holds ${allocationSizes[allocation]}`);
    }
    extents[i] = extent;
    nbytes[i] = elements * itemsize;
    // Strides equal to C order for a shape with ones may still be contiguous in NumPy's sense.
    if (!contiguous[i] && nbytes[i] === extent && isCOrder(shape, st, itemsize)) contiguous[i] = 1;
  }
  for (let a = 0; a < allocationCount; a++) if (!used[a]) throw malformed(`allocation ${a} holds no tensor`);
  return {
    count, names, index, dtypes, shapes, strides, contiguous, offsets, extents, nbytes, allocations, allocationCount,
    table: table.slice(),
  };
}

/** C-contiguous with NumPy's rule: dimensions of length 1 may have any stride. */
export function isCOrder(shape: readonly number[], strides: readonly number[], itemsize: number): boolean {
  let expected = itemsize;
  for (let d = shape.length - 1; d >= 0; d--) {
    if (shape[d] !== 1 && strides[d] !== expected) return false;
    expected *= shape[d]!;
  }
  return true;
}

/**
 * Whether the elements fill [0, extent) exactly, each byte once (a permutation of a C-contiguous
 * layout, e.g. a transposed matrix): then two tensors with the same shape and strides can be
 * copied as one run of bytes.
 */
export function isDense(shape: readonly number[], strides: readonly number[], itemsize: number): boolean {
  const dims = shape.map((n, d) => ({ n, s: strides[d]! })).filter((x) => x.n !== 1).sort((a, b) => a.s - b.s);
  let expected = itemsize;
  for (const { n, s } of dims) {
    if (s !== expected) return false;
    expected *= n;
  }
  return true;
}
