// Element types of shared arrays: their sizes, the host typed arrays that hold their values, the
// NumPy / __cuda_array_interface__ typestr that Python consumers read, and the one-byte code
// used on the binary wire. Device memory is little-endian, so every typestr is '<' (or '|' for
// one-byte types, as NumPy spells them).

import { IpcError } from '../errors.js';
import { invalidArgValue } from '../arg-errors.js';

/** Element types a descriptor can describe. */
export type DType =
  | 'int8'
  | 'int16'
  | 'int32'
  | 'int64'
  | 'uint8'
  | 'uint16'
  | 'uint32'
  | 'uint64'
  | 'float16'
  | 'bfloat16'
  | 'float32'
  | 'float64'
  | 'bool'
  | 'float8_e4m3fn'
  | 'float8_e5m2';

/** The typed array that holds one dtype's values on the host. float16 and bfloat16 have no
 *  native typed array on Node 20, so their raw bit patterns live in a Uint16Array; convert with
 *  the helpers in src/half-float.ts. bool is one byte per element (0 or 1), the float8 formats
 *  (PyTorch's float8_e4m3fn and float8_e5m2, safetensors' F8_E4M3 and F8_E5M2) raw bytes. */
export interface HostArrayTypes {
  int8: Int8Array;
  int16: Int16Array;
  int32: Int32Array;
  int64: BigInt64Array;
  uint8: Uint8Array;
  uint16: Uint16Array;
  uint32: Uint32Array;
  uint64: BigUint64Array;
  float16: Uint16Array;
  bfloat16: Uint16Array;
  float32: Float32Array;
  float64: Float64Array;
  bool: Uint8Array;
  float8_e4m3fn: Uint8Array;
  float8_e5m2: Uint8Array;
}

/** A typed-array constructor (Float32Array, BigInt64Array, ...) as the dtype table names it. */
export interface HostArrayConstructor<A> {
  new (length: number): A;
  new (buffer: ArrayBuffer | SharedArrayBuffer, byteOffset?: number, length?: number): A;
  readonly BYTES_PER_ELEMENT: number;
}

/** What dtypeInfo() tells about a dtype: size, NumPy typestr, the host typed array that holds it. */
export interface DTypeInfo<T extends DType = DType> {
  readonly name: T;
  /** Bytes per element. */
  readonly itemsize: 1 | 2 | 4 | 8;
  /** NumPy array-interface typestr. bfloat16 has none in NumPy: it is '<V2' (opaque 2 bytes),
   *  the string PyTorch and ml_dtypes use. Numba cannot open '<V2' arrays natively; view them
   *  as '<u2' or use PyTorch. */
  readonly typestr: string;
  /** Host typed-array constructor for this dtype's values (raw bits for float16/bfloat16). */
  readonly hostArray: HostArrayConstructor<HostArrayTypes[T]>;
  /** Code of this dtype in the binary descriptor format (0 means "no array"). Never renumber. */
  readonly wireCode: number;
}

type DTypeTable = { readonly [T in DType]: DTypeInfo<T> };

const DTYPE_TABLE: DTypeTable = {
  int8: { name: 'int8', itemsize: 1, typestr: '|i1', hostArray: Int8Array, wireCode: 1 },
  int16: { name: 'int16', itemsize: 2, typestr: '<i2', hostArray: Int16Array, wireCode: 2 },
  int32: { name: 'int32', itemsize: 4, typestr: '<i4', hostArray: Int32Array, wireCode: 3 },
  int64: { name: 'int64', itemsize: 8, typestr: '<i8', hostArray: BigInt64Array, wireCode: 4 },
  uint8: { name: 'uint8', itemsize: 1, typestr: '|u1', hostArray: Uint8Array, wireCode: 5 },
  uint16: { name: 'uint16', itemsize: 2, typestr: '<u2', hostArray: Uint16Array, wireCode: 6 },
  uint32: { name: 'uint32', itemsize: 4, typestr: '<u4', hostArray: Uint32Array, wireCode: 7 },
  uint64: { name: 'uint64', itemsize: 8, typestr: '<u8', hostArray: BigUint64Array, wireCode: 8 },
  float16: { name: 'float16', itemsize: 2, typestr: '<f2', hostArray: Uint16Array, wireCode: 9 },
  bfloat16: { name: 'bfloat16', itemsize: 2, typestr: '<V2', hostArray: Uint16Array, wireCode: 10 },
  float32: { name: 'float32', itemsize: 4, typestr: '<f4', hostArray: Float32Array, wireCode: 11 },
  float64: { name: 'float64', itemsize: 8, typestr: '<f8', hostArray: Float64Array, wireCode: 12 },
  // One byte each; the float8 formats have no NumPy typestr ('|V1', opaque), like bfloat16.
  bool: { name: 'bool', itemsize: 1, typestr: '|b1', hostArray: Uint8Array, wireCode: 13 },
  float8_e4m3fn: { name: 'float8_e4m3fn', itemsize: 1, typestr: '|V1', hostArray: Uint8Array, wireCode: 14 },
  float8_e5m2: { name: 'float8_e5m2', itemsize: 1, typestr: '|V1', hostArray: Uint8Array, wireCode: 15 },
};

/** Every dtype, in wire-code order. */
export const DTYPES: readonly DType[] = Object.freeze(
  (Object.keys(DTYPE_TABLE) as DType[]).sort((a, b) => DTYPE_TABLE[a].wireCode - DTYPE_TABLE[b].wireCode),
);

const BY_WIRE_CODE: ReadonlyMap<number, DType> = new Map(DTYPES.map((d) => [DTYPE_TABLE[d].wireCode, d]));

export function isDType(value: unknown): value is DType {
  return typeof value === 'string' && Object.prototype.hasOwnProperty.call(DTYPE_TABLE, value);
}

/** Facts about one dtype. Throws a TypeError (ERR_INVALID_ARG_VALUE) for a name that is not a DType. */
export function dtypeInfo<T extends DType>(dtype: T): DTypeInfo<T> {
  if (!isDType(dtype)) {
    throw invalidArgValue(`unknown dtype ${describeName(dtype)}; use one of: ${DTYPES.join(', ')}`);
  }
  return DTYPE_TABLE[dtype] as DTypeInfo<T>;
}

/** The dtype with this binary wire code, or undefined. */
export function dtypeFromWireCode(code: number): DType | undefined {
  return BY_WIRE_CODE.get(code);
}

/**
 * The dtype whose values a typed array naturally holds: Float32Array -> 'float32',
 * BigInt64Array -> 'int64', Uint8Array (and Buffer, Uint8ClampedArray) -> 'uint8'. A Uint16Array
 * maps to 'uint16': float16/bfloat16 bits cannot be told apart from integers, so name them
 * explicitly. Throws a TypeError (ERR_INVALID_ARG_VALUE) for a DataView or anything else.
 */
export function dtypeOfTypedArray(array: ArrayBufferView): DType {
  // Order matters only for subclasses (Buffer extends Uint8Array).
  if (array instanceof Float32Array) return 'float32';
  if (array instanceof Float64Array) return 'float64';
  if (array instanceof Int8Array) return 'int8';
  if (array instanceof Int16Array) return 'int16';
  if (array instanceof Int32Array) return 'int32';
  if (array instanceof BigInt64Array) return 'int64';
  if (array instanceof Uint8Array || array instanceof Uint8ClampedArray) return 'uint8';
  if (array instanceof Uint16Array) return 'uint16';
  if (array instanceof Uint32Array) return 'uint32';
  if (array instanceof BigUint64Array) return 'uint64';
  // Float16Array exists on newer runtimes only (Node 24+ behind or without a flag).
  const float16Array = (globalThis as { Float16Array?: abstract new (...args: never[]) => unknown }).Float16Array;
  if (float16Array !== undefined && array instanceof float16Array) return 'float16';
  throw invalidArgValue(`cannot infer a dtype from ${array?.constructor?.name ?? typeof array}; pass a typed array or name the dtype`,
  );
}

function describeName(value: unknown): string {
  return typeof value === 'string' ? JSON.stringify(value.slice(0, 40)) : typeof value;
}
