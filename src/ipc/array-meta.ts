// Array metadata: what a shared byte range holds. Strides are in bytes, as in NumPy and
// __cuda_array_interface__. They are kept strict: non-negative multiples of the itemsize, so an
// array never reaches before its start and every element is aligned to its own size.

import { ARG as ARG_CODE, at, checkArray, checkCount, checkKeys, checkPlainObject, describe, fail, type Field } from './checks.js';
import { dtypeInfo, isDType, DTYPES, type DType, type HostArrayTypes } from './dtype.js';
import { invalidArgValue, outOfRange } from '../arg-errors.js';
import { checkViewBytes, outOfMemoryError } from '../errors.js';

/** At most 32 dimensions, NumPy's own limit before 2.0 and the binary format's bound. */
export const MAX_NDIM = 32;

/** dtype, shape and strides (bytes) of an array laid out inside a shared byte range. */
export interface ArrayMeta {
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly strides: readonly number[];
}

/** Input for {@link arrayMeta}: strides default to C-contiguous. */
export interface ArrayMetaInit {
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly strides?: readonly number[];
}

const ARG: Field = { code: ARG_CODE, path: 'array' };

/** Validates `init` and returns a fresh ArrayMeta with strides filled in. Throws TypeError / RangeError (Node's argument error codes). */
export function arrayMeta(init: ArrayMetaInit): ArrayMeta {
  return checkArrayMeta(init, ARG);
}

/** Number of elements: the product of the shape (1 for a 0-d array). */
export function elementCount(shape: readonly number[]): number {
  const dims = checkShape(shape, at(ARG, 'shape'));
  return countElements(dims, at(ARG, 'shape'));
}

/** Byte strides of a C-contiguous (row-major) array. Zero-length dimensions count as 1, as in
 *  NumPy, so the strides stay meaningful. */
export function contiguousStrides(shape: readonly number[], itemsize: number): number[] {
  const dims = checkShape(shape, at(ARG, 'shape'));
  if (!Number.isSafeInteger(itemsize) || itemsize <= 0) {
    fail(at(ARG, 'itemsize'), `must be a positive integer, got ${describe(itemsize)}`);
  }
  return cStrides(dims, itemsize, at(ARG, 'shape'));
}

/** Whether the array is C-contiguous, with NumPy's rules: dimensions of length 1 may have any
 *  stride, and an array with no elements is contiguous. */
export function isCContiguous(meta: ArrayMeta): boolean {
  const m = checkArrayMeta(meta, ARG);
  if (m.shape.includes(0)) return true;
  let expected = dtypeInfo(m.dtype).itemsize as number;
  for (let i = m.shape.length - 1; i >= 0; i--) {
    const dim = m.shape[i]!;
    if (dim !== 1 && m.strides[i] !== expected) return false;
    expected *= dim;
  }
  return true;
}

/** Bytes from the array's start to the end of its furthest element (0 when it has no elements):
 *  the least byteLength a descriptor must describe to hold it. */
export function extentBytes(meta: ArrayMeta): number {
  const m = checkArrayMeta(meta, ARG);
  return extentOf(m, ARG);
}

/** The layout of a typed view over `byteLength` bytes (DeviceArray, HostArray). */
export interface ViewLayout {
  readonly meta: ArrayMeta;
  /** Number of elements. */
  readonly size: number;
  /** Bytes from the first element to the end of the last. */
  readonly extent: number;
  readonly contiguous: boolean;
}

/** Checks `init` for a view over `byteLength` bytes: RangeError ERR_OUT_OF_RANGE when they are too few. */
export function viewLayout(init: ArrayMetaInit, byteLength: number): ViewLayout {
  const meta = arrayMeta(init);
  const extent = extentBytes(meta);
  if (extent > byteLength) {
    throw outOfRange(`an array of shape [${meta.shape}] ${meta.dtype} with strides [${meta.strides}] needs ${extent} bytes, but the buffer has ${byteLength}`);
  }
  return { meta, size: elementCount(meta.shape), extent, contiguous: isCContiguous(meta) };
}

/** `values` as the bytes to write into a view of `size` elements of `meta` (TypeError when it does not fit). */
export function bytesToWrite<T extends DType>(values: HostArrayTypes[T], meta: ArrayMeta, size: number): Uint8Array {
  const info = dtypeInfo(meta.dtype);
  const src = values as ArrayBufferView;
  if (!(src instanceof info.hostArray) || (src as unknown as { length: number }).length !== size) {
    throw invalidArgValue(`write expects a ${info.hostArray.name} of ${size} elements for a ${meta.dtype} array of shape [${meta.shape}]`);
  }
  return new Uint8Array(src.buffer, src.byteOffset, src.byteLength);
}

/**
 * A new typed array of `size` elements for read(): ERR_VIEW_TOO_LARGE past what one typed array
 * holds here, ERR_OUT_OF_MEMORY when V8 cannot allocate it.
 */
export function newHostArray<A>(make: new (length: number) => A, size: number, itemsize: number, what: string): A {
  checkViewBytes(size * itemsize, what, 'read parts of it through arrays over views of its buffer');
  try {
    return new make(size);
  } catch (e) {
    throw outOfMemoryError(e, what, size * itemsize);
  }
}

/** Calls fn(byteOffset, cIndex) for every element, in C order. */
export function forEachOffset(shape: readonly number[], strides: readonly number[], fn: (byteOffset: number, index: number) => void): void {
  const nd = shape.length;
  let size = 1;
  for (const d of shape) size *= d;
  const idx = new Array<number>(nd).fill(0);
  let offset = 0;
  for (let i = 0; i < size; i++) {
    fn(offset, i);
    for (let d = nd - 1; d >= 0; d--) {
      idx[d]!++;
      offset += strides[d]!;
      if (idx[d]! < shape[d]!) break;
      offset -= strides[d]! * shape[d]!;
      idx[d] = 0;
    }
  }
}

// ---- internals shared with the descriptor codecs ------------------------------------------

/** Checks an untrusted array-metadata object (strides optional) and returns a normalised copy. */
export function checkArrayMeta(value: unknown, field: Field): ArrayMeta {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    fail(field, `must be an object with dtype, shape and optional strides, got ${describe(value)}`);
  }
  const obj = value as Partial<Record<keyof ArrayMetaInit, unknown>>;
  const dtype = checkDType(obj.dtype, at(field, 'dtype'));
  const shape = checkShape(obj.shape, at(field, 'shape'));
  const itemsize = dtypeInfo(dtype).itemsize;
  const strides =
    obj.strides === undefined
      ? cStrides(shape, itemsize, at(field, 'shape'))
      : checkStrides(obj.strides, shape.length, itemsize, at(field, 'strides'));
  const meta: ArrayMeta = { dtype, shape, strides };
  countElements(shape, at(field, 'shape'));
  extentOf(meta, field);
  return meta;
}

/** Like checkArrayMeta for the JSON form, which may also carry a redundant `typestr`. */
export function checkArrayMetaJson(value: unknown, field: Field): ArrayMeta {
  const obj = checkPlainObject(value, field);
  checkKeys(obj, ['dtype', 'shape'], ['strides', 'typestr'], field);
  const meta = checkArrayMeta(obj, field);
  if (obj.typestr !== undefined) {
    const expected = dtypeInfo(meta.dtype).typestr;
    if (obj.typestr !== expected) {
      fail(at(field, 'typestr'), `must be ${JSON.stringify(expected)} for dtype ${meta.dtype}, got ${describe(obj.typestr)}`);
    }
  }
  return meta;
}

export function checkDType(value: unknown, field: Field): DType {
  if (!isDType(value)) fail(field, `must be one of ${DTYPES.join(', ')}; got ${describe(value)}`);
  return value;
}

function checkShape(value: unknown, field: Field): number[] {
  const list = checkArray(value, MAX_NDIM, field);
  return list.map((dim, i) => checkCount(dim, at(field, i)));
}

function checkStrides(value: unknown, ndim: number, itemsize: number, field: Field): number[] {
  const list = checkArray(value, MAX_NDIM, field);
  if (list.length !== ndim) fail(field, `must have one entry per dimension (${ndim}), got ${list.length}`);
  return list.map((stride, i) => {
    const s = checkCount(stride, at(field, i), '; negative strides are not supported');
    if (s % itemsize !== 0) fail(at(field, i), `must be a multiple of the itemsize ${itemsize}, got ${s}`);
    return s;
  });
}

function cStrides(shape: readonly number[], itemsize: number, field: Field): number[] {
  const strides = new Array<number>(shape.length);
  let step = itemsize;
  for (let i = shape.length - 1; i >= 0; i--) {
    strides[i] = step;
    step *= Math.max(shape[i]!, 1);
    // Only the strides must be safe: the last product is never used as a stride.
    if (i > 0 && !Number.isSafeInteger(step)) fail(field, 'is too large: its contiguous strides exceed 2^53-1 bytes');
  }
  return strides;
}

function countElements(shape: readonly number[], field: Field): number {
  if (shape.includes(0)) return 0;
  let count = 1;
  for (const dim of shape) {
    count *= dim;
    if (!Number.isSafeInteger(count)) fail(field, 'has more than 2^53-1 elements');
  }
  return count;
}

function extentOf(meta: ArrayMeta, field: Field): number {
  if (meta.shape.includes(0)) return 0;
  let last = 0; // byte offset of the furthest element
  for (let i = 0; i < meta.shape.length; i++) {
    // Doubles round monotonically, so an unsafe true value never looks safe here.
    last += (meta.shape[i]! - 1) * meta.strides[i]!;
    if (!Number.isSafeInteger(last)) fail(field, 'reaches beyond 2^53-1 bytes');
  }
  const extent = last + dtypeInfo(meta.dtype).itemsize;
  if (!Number.isSafeInteger(extent)) fail(field, 'reaches beyond 2^53-1 bytes');
  return extent;
}

/** Extent of an already validated ArrayMeta (no re-validation). */
export function extentOfChecked(meta: ArrayMeta): number {
  return extentOf(meta, ARG);
}
