// Binary encoding of optional array metadata, shared by the kinds that describe memory.
//
//   +0  u8        dtype wire code (dtype.ts); 0 = no array metadata
//   +1  u8        ndim, 0..32 (must be 0 when the dtype code is 0)
//   +2  6 bytes   reserved, zero
//   +8  ndim x u64  shape
//   ..  ndim x i64  strides in bytes (negative values are rejected)

import { MAX_NDIM, checkArrayMeta, type ArrayMeta } from '../array-meta.js';
import { fail } from '../checks.js';
import { dtypeFromWireCode, dtypeInfo } from '../dtype.js';
import type { WireReader, WireWriter } from '../wire.js';

export function arraySectionLength(meta: ArrayMeta | undefined): number {
  return 8 + 16 * (meta?.shape.length ?? 0);
}

export function encodeArraySection(meta: ArrayMeta | undefined, out: WireWriter): void {
  if (meta === undefined) {
    out.skip(8);
    return;
  }
  out.u8(dtypeInfo(meta.dtype).wireCode);
  out.u8(meta.shape.length);
  out.skip(6);
  for (const dim of meta.shape) out.u64(dim);
  for (const stride of meta.strides) out.i64(stride);
}

export function decodeArraySection(input: WireReader): ArrayMeta | undefined {
  const code = input.u8('array.dtype');
  const ndim = input.u8('array.ndim');
  input.zeros(6, 'array.reserved');
  if (code === 0) {
    if (ndim !== 0) fail(input.field('array.ndim'), `must be 0 when there is no array (dtype code 0), got ${ndim}`);
    return undefined;
  }
  const dtype = dtypeFromWireCode(code);
  if (dtype === undefined) fail(input.field('array.dtype'), `is not a known dtype code (got ${code})`);
  // Bound ndim before reading (or allocating) anything sized by it.
  if (ndim > MAX_NDIM) fail(input.field('array.ndim'), `must be at most ${MAX_NDIM}, got ${ndim}`);
  const shape: number[] = [];
  for (let i = 0; i < ndim; i++) shape.push(input.u64Safe(`array.shape[${i}]`));
  const strides: number[] = [];
  for (let i = 0; i < ndim; i++) {
    strides.push(input.i64NonNegativeSafe(`array.strides[${i}]`, '; negative strides are not supported'));
  }
  return checkArrayMeta({ dtype, shape, strides }, input.field('array'));
}
