// Typed kernel arguments and their packing into the one byte buffer that cuLaunchKernel takes
// through CU_LAUNCH_PARAM_BUFFER_POINTER. The layout follows the CUDA ABI: each argument at an
// offset aligned to its natural alignment, the total padded to the largest alignment, padding
// zeroed, values little-endian.

import { float16BitsFromNumber, bfloat16BitsFromNumber } from '../half-float.js';
import { IpcError } from '../errors.js';
import { invalidArgValue, invalidArgType } from '../arg-errors.js';

/** Integer argument types carried as JavaScript numbers. */
export type SmallIntegerArgType = 'i8' | 'u8' | 'i16' | 'u16' | 'i32' | 'u32';
/** 64-bit integer argument types, carried as bigint so no value loses precision. */
export type BigIntegerArgType = 'i64' | 'u64';
/** Floating-point argument types; any number is legal, NaN and infinities included. */
export type FloatArgType = 'f16' | 'bf16' | 'f32' | 'f64';
/** The type of a kernel argument: a device pointer, an integer or a float of a given width. */
export type KernelArgType = 'ptr' | SmallIntegerArgType | BigIntegerArgType | FloatArgType;

/** Anything that carries a device pointer, such as a DeviceBuffer. */
export interface DevicePointerLike {
  readonly devicePointer: bigint;
}

/** A checked kernel argument, made by the `arg` builders. */
export type KernelArg =
  | { readonly type: 'ptr'; readonly value: bigint | DevicePointerLike }
  | { readonly type: SmallIntegerArgType; readonly value: number }
  | { readonly type: BigIntegerArgType; readonly value: bigint }
  | { readonly type: FloatArgType; readonly value: number };

/** Size in bytes of each argument type; in the CUDA ABI each is also its alignment. */
export const KERNEL_ARG_SIZE: Readonly<Record<KernelArgType, number>> = {
  ptr: 8,
  i8: 1,
  u8: 1,
  i16: 2,
  u16: 2,
  i32: 4,
  u32: 4,
  i64: 8,
  u64: 8,
  f16: 2,
  bf16: 2,
  f32: 4,
  f64: 8,
};

const SMALL_INTEGER_RANGE: Readonly<Record<SmallIntegerArgType, readonly [number, number]>> = {
  i8: [-0x80, 0x7f],
  u8: [0, 0xff],
  i16: [-0x8000, 0x7fff],
  u16: [0, 0xffff],
  i32: [-0x8000_0000, 0x7fff_ffff],
  u32: [0, 0xffff_ffff],
};

const BIG_INTEGER_RANGE: Readonly<Record<BigIntegerArgType | 'ptr', readonly [bigint, bigint]>> = {
  i64: [-(1n << 63n), (1n << 63n) - 1n],
  u64: [0n, (1n << 64n) - 1n],
  ptr: [0n, (1n << 64n) - 1n],
};

function isKernelArgType(type: unknown): type is KernelArgType {
  return typeof type === 'string' && Object.hasOwn(KERNEL_ARG_SIZE, type);
}

function describeValue(value: unknown): string {
  if (typeof value === 'bigint') return `${value}n`;
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number') return Object.is(value, -0) ? '-0' : String(value);
  if (value === null) return 'null';
  if (typeof value === 'object') return 'an object';
  return String(value);
}

function hasDevicePointer(value: unknown): value is DevicePointerLike {
  return typeof value === 'object' && value !== null && 'devicePointer' in value;
}

/**
 * Checks one value against its type. Returns the pointer or value to write, or a sentence that
 * says what is wrong with it (the callers add where the value came from).
 */
function checkValue(type: KernelArgType, value: unknown): { ok: number | bigint } | { problem: string } {
  switch (type) {
    case 'ptr': {
      const pointer = hasDevicePointer(value) ? value.devicePointer : value;
      if (typeof pointer !== 'bigint') {
        return {
          problem: `a device pointer must be a bigint or an object with a bigint devicePointer, got ${describeValue(pointer)}`,
        };
      }
      const [min, max] = BIG_INTEGER_RANGE.ptr;
      if (pointer < min || pointer > max) {
        return { problem: `device pointer ${pointer}n is outside 0..2^64-1` };
      }
      return { ok: pointer };
    }
    case 'i64':
    case 'u64': {
      if (typeof value !== 'bigint') {
        return {
          problem: `${type} values must be bigint (write ${typeof value === 'number' && Number.isSafeInteger(value) ? `${value}n` : 'e.g. 5n'}), got ${describeValue(value)}`,
        };
      }
      const [min, max] = BIG_INTEGER_RANGE[type];
      if (value < min || value > max) {
        return { problem: `${value}n is outside the ${type} range ${min}..${max}` };
      }
      return { ok: value };
    }
    case 'f16':
    case 'bf16':
    case 'f32':
    case 'f64':
      if (typeof value !== 'number') {
        return { problem: `${type} values must be numbers, got ${describeValue(value)}` };
      }
      return { ok: value };
    default: {
      if (typeof value !== 'number' || !Number.isInteger(value)) {
        return { problem: `${type} values must be integer numbers, got ${describeValue(value)}` };
      }
      const [min, max] = SMALL_INTEGER_RANGE[type];
      if (value < min || value > max) {
        return { problem: `${value} is outside the ${type} range ${min}..${max}` };
      }
      return { ok: value };
    }
  }
}

function checkedArg<T extends KernelArg>(type: T['type'], value: unknown): T {
  const checked = checkValue(type, value);
  if ('problem' in checked) {
    throw invalidArgValue(`arg.${type}(): ${checked.problem}`);
  }
  return { type, value: checked.ok } as T;
}

/** Builders for typed kernel arguments; each checks its value at once. */
export const arg = {
  /** A device pointer: a bigint, or an object with `devicePointer` (read now). */
  ptr: (pointer: bigint | DevicePointerLike): KernelArg => checkedArg('ptr', pointer),
  /** A signed 8-bit integer. */
  i8: (value: number): KernelArg => checkedArg('i8', value),
  /** An unsigned 8-bit integer. */
  u8: (value: number): KernelArg => checkedArg('u8', value),
  /** A signed 16-bit integer. */
  i16: (value: number): KernelArg => checkedArg('i16', value),
  /** An unsigned 16-bit integer. */
  u16: (value: number): KernelArg => checkedArg('u16', value),
  /** A signed 32-bit integer. */
  i32: (value: number): KernelArg => checkedArg('i32', value),
  /** An unsigned 32-bit integer. */
  u32: (value: number): KernelArg => checkedArg('u32', value),
  /** A signed 64-bit integer. */
  i64: (value: bigint): KernelArg => checkedArg('i64', value),
  /** An unsigned 64-bit integer. */
  u64: (value: bigint): KernelArg => checkedArg('u64', value),
  /** Half precision, rounded to nearest, ties to even. */
  f16: (value: number): KernelArg => checkedArg('f16', value),
  /** bfloat16, rounded to nearest, ties to even. */
  bf16: (value: number): KernelArg => checkedArg('bf16', value),
  /** Single precision, rounded to nearest, ties to even (as Math.fround). */
  f32: (value: number): KernelArg => checkedArg('f32', value),
  /** Double precision. */
  f64: (value: number): KernelArg => checkedArg('f64', value),
} as const;

/** Where each argument sits in the packed buffer, and the buffer's padded size. */
export interface KernelArgLayout {
  readonly offsets: readonly number[];
  readonly size: number;
}

function alignUp(offset: number, alignment: number): number {
  return Math.ceil(offset / alignment) * alignment;
}

/** Computes the CUDA ABI layout of a parameter list of the given types. */
export function kernelArgLayout(types: readonly KernelArgType[]): KernelArgLayout {
  const offsets: number[] = [];
  let end = 0;
  let largestAlignment = 1;
  types.forEach((type, index) => {
    if (!isKernelArgType(type)) {
      throw invalidArgValue(`kernel argument ${index}: unknown type ${describeValue(type)}; use one of ${Object.keys(KERNEL_ARG_SIZE).join(', ')}`,
      );
    }
    const size = KERNEL_ARG_SIZE[type];
    const offset = alignUp(end, size);
    offsets.push(offset);
    end = offset + size;
    largestAlignment = Math.max(largestAlignment, size);
  });
  return { offsets, size: alignUp(end, largestAlignment) };
}

/**
 * Packs arguments into one byte buffer in the CUDA ABI layout; a launch passes a pointer to each
 * argument inside it (the offsets of kernelArgLayout). Throws a TypeError (ERR_INVALID_ARG_VALUE),
 * naming the argument's index, type and value, for any value that its type cannot hold exactly
 * (floats excepted: they round, and NaN and infinities are legal).
 */
export function packKernelArgs(args: readonly KernelArg[]): Uint8Array {
  if (!Array.isArray(args)) {
    throw invalidArgType(`kernel arguments must be an array of KernelArg, got ${describeValue(args)}`);
  }
  args.forEach((item, index) => {
    if (typeof item !== 'object' || item === null || !isKernelArgType(item.type)) {
      throw invalidArgValue(`kernel argument ${index} must be a typed argument such as arg.u64(5n) or { type: 'u64', value: 5n }, got ${describeValue(item)}${typeof item === 'object' && item !== null ? ` with type ${describeValue((item as { type?: unknown }).type)}` : ''}`,
      );
    }
  });
  const layout = kernelArgLayout(args.map((item) => item.type));
  const bytes = new Uint8Array(layout.size);
  const view = new DataView(bytes.buffer);
  args.forEach((item, index) => {
    const checked = checkValue(item.type, item.value);
    if ('problem' in checked) {
      throw invalidArgValue(`kernel argument ${index} (${item.type}, value ${describeValue(hasDevicePointer(item.value) ? item.value.devicePointer : item.value)}): ${checked.problem}`,
      );
    }
    writeValue(view, layout.offsets[index]!, item.type, checked.ok);
  });
  return bytes;
}

function writeValue(view: DataView, offset: number, type: KernelArgType, value: number | bigint): void {
  const littleEndian = true;
  switch (type) {
    case 'ptr':
    case 'u64':
      view.setBigUint64(offset, value as bigint, littleEndian);
      return;
    case 'i64':
      view.setBigInt64(offset, value as bigint, littleEndian);
      return;
    case 'i8':
      view.setInt8(offset, value as number);
      return;
    case 'u8':
      view.setUint8(offset, value as number);
      return;
    case 'i16':
      view.setInt16(offset, value as number, littleEndian);
      return;
    case 'u16':
      view.setUint16(offset, value as number, littleEndian);
      return;
    case 'i32':
      view.setInt32(offset, value as number, littleEndian);
      return;
    case 'u32':
      view.setUint32(offset, value as number, littleEndian);
      return;
    case 'f16':
      view.setUint16(offset, float16BitsFromNumber(value as number), littleEndian);
      return;
    case 'bf16':
      view.setUint16(offset, bfloat16BitsFromNumber(value as number), littleEndian);
      return;
    case 'f32':
      view.setFloat32(offset, value as number, littleEndian);
      return;
    case 'f64':
      view.setFloat64(offset, value as number, littleEndian);
      return;
  }
}

/** A kernel parameter as declared: its name (for messages) and type. */
export interface KernelParam {
  readonly name: string;
  readonly type: KernelArgType;
}

/**
 * Checks that arguments match a kernel's declared parameters in count and type; throws
 * a TypeError (ERR_INVALID_ARG_VALUE) listing the expected signature otherwise. Values are checked by packKernelArgs.
 */
export function checkKernelArgs(
  kernel: { readonly name: string; readonly params: readonly KernelParam[] },
  args: readonly KernelArg[],
): void {
  const signature = `${kernel.name}(${kernel.params.map((p) => `${p.type} ${p.name}`).join(', ')})`;
  if (!Array.isArray(args) || args.length !== kernel.params.length) {
    throw invalidArgValue(`kernel ${signature} takes ${kernel.params.length} argument${kernel.params.length === 1 ? '' : 's'}, got ${Array.isArray(args) ? args.length : describeValue(args)}; pass one typed argument per parameter`,
    );
  }
  kernel.params.forEach((param, index) => {
    const given = (args[index] as { type?: unknown } | null | undefined)?.type;
    if (given !== param.type) {
      throw invalidArgValue(`kernel ${signature}: argument ${index} (${param.name}) must be ${param.type}, got ${describeValue(given)}; build it with arg.${param.type}(...)`,
      );
    }
  });
}
