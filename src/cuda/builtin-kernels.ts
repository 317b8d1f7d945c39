// The table of built-in kernels in kernels/builtin.ptx: entry names, parameter names and types.
// Pure data for the launch layer (no native calls); test/cpu/kernels-ptx.test.ts checks it
// against the PTX's .entry declarations so the two cannot drift. Also host-side references of
// what the pattern and checksum kernels compute, for tests that check results on the host.

import { IpcError } from '../errors.js';
import type { KernelParam } from './kernel-args.js';
import { invalidArgValue, badNumber } from '../arg-errors.js';

/** Element types that the fill/verify/scale kernels come in; the suffix of their names. */
export const PATTERN_ELEMENT_TYPES = ['i32', 'u32', 'i64', 'u64', 'f32', 'f64'] as const;
/** Element types of the built-in fill/verify/scale kernels. */
export type PatternElementType = (typeof PATTERN_ELEMENT_TYPES)[number];

/** Entry names of the built-in kernels (kernels/builtin.ptx). */
export type BuiltinKernelName =
  | `fill_pattern_${PatternElementType}`
  | `verify_pattern_${PatternElementType}`
  | `scale_${PatternElementType}`
  | 'checksum_bytes'
  | 'spin'
  | 'spin_then_write_u32';

export interface BuiltinKernel {
  /** The PTX entry name (extern "C", unmangled). */
  readonly name: BuiltinKernelName;
  /** The PTX file that holds it, relative to the package root. */
  readonly ptxFile: string;
  /** Parameters in order; pack arguments of exactly these types. */
  readonly params: readonly KernelParam[];
  /** What it does, including what the caller must prepare. */
  readonly description: string;
}

/** The PTX file of the built-in kernels, relative to the package root. */
export const BUILTIN_PTX_FILE = 'kernels/builtin.ptx';

/** Initial value for verify_pattern's first_mismatch; it stays so when nothing mismatched. */
export const NO_MISMATCH_INDEX = 0xffff_ffff_ffff_ffffn;

function patternKernels(type: PatternElementType): BuiltinKernel[] {
  return [
    {
      name: `fill_pattern_${type}`,
      ptxFile: BUILTIN_PTX_FILE,
      params: [
        { name: 'out', type: 'ptr' },
        { name: 'n', type: 'u64' },
        { name: 'a', type },
        { name: 'b', type },
      ],
      description: `out[i] = a + i*b for i < n (${type}; see expectedPatternValue)`,
    },
    {
      name: `verify_pattern_${type}`,
      ptxFile: BUILTIN_PTX_FILE,
      params: [
        { name: 'in', type: 'ptr' },
        { name: 'n', type: 'u64' },
        { name: 'a', type },
        { name: 'b', type },
        { name: 'mismatch_count', type: 'ptr' },
        { name: 'first_mismatch', type: 'ptr' },
      ],
      description:
        `adds the count of i < n where in[i] differs from a + i*b (${type}, floats compared bitwise) to the u64 at ` +
        'mismatch_count (zero it first); lowers the u64 at first_mismatch (0 to skip; set it to NO_MISMATCH_INDEX first) ' +
        'to the smallest mismatching index',
    },
    {
      name: `scale_${type}`,
      ptxFile: BUILTIN_PTX_FILE,
      params: [
        { name: 'x', type: 'ptr' },
        { name: 'n', type: 'u64' },
        { name: 's', type },
      ],
      description: `x[i] *= s for i < n (${type}; integers wrap)`,
    },
  ];
}

/** Every built-in kernel, in the order of kernels/builtin.cu. */
export const BUILTIN_KERNELS: readonly BuiltinKernel[] = Object.freeze([
  ...PATTERN_ELEMENT_TYPES.flatMap(patternKernels),
  {
    name: 'checksum_bytes',
    ptxFile: BUILTIN_PTX_FILE,
    params: [
      { name: 'data', type: 'ptr' },
      { name: 'n', type: 'u64' },
      { name: 'sums', type: 'ptr' },
    ],
    description:
      'adds the sum of the n bytes at data to the u64 sums[0] and the sum of data[i]*(i+1) to sums[1], both mod 2^64 ' +
      '(zero both first; see referenceChecksum)',
  },
  {
    name: 'spin',
    ptxFile: BUILTIN_PTX_FILE,
    params: [{ name: 'ns', type: 'u64' }],
    description: 'busy-waits ns nanoseconds of the GPU global timer; launch one thread',
  },
  {
    name: 'spin_then_write_u32',
    ptxFile: BUILTIN_PTX_FILE,
    params: [
      { name: 'flag', type: 'ptr' },
      { name: 'value', type: 'u32' },
      { name: 'ns', type: 'u64' },
    ],
    description: 'busy-waits ns nanoseconds, then stores the u32 value at flag with a system-wide fence; launch one thread',
  },
] satisfies BuiltinKernel[]);

const KERNELS_BY_NAME: ReadonlyMap<string, BuiltinKernel> = new Map(BUILTIN_KERNELS.map((k) => [k.name, k]));

/** Looks a built-in kernel up by name; throws a TypeError (ERR_INVALID_ARG_VALUE) for an unknown name. */
export function getBuiltinKernel(name: BuiltinKernelName): BuiltinKernel {
  const kernel = KERNELS_BY_NAME.get(name);
  if (kernel === undefined) {
    throw invalidArgValue(`no built-in kernel is named ${JSON.stringify(name)}; the built-in kernels are ${[...KERNELS_BY_NAME.keys()].join(', ')}`,
    );
  }
  return kernel;
}

/** Location of a kernel PTX file in the installed package (this module is dist/src/cuda/). */
export function builtinPtxUrl(ptxFile: string = BUILTIN_PTX_FILE): URL {
  return new URL(`../../../${ptxFile}`, import.meta.url);
}

// ---- host references ----------------------------------------------------------------------------

const INTEGER_BITS: Readonly<Record<'i32' | 'u32' | 'i64' | 'u64', { bits: number; signed: boolean }>> = {
  i32: { bits: 32, signed: true },
  u32: { bits: 32, signed: false },
  i64: { bits: 64, signed: true },
  u64: { bits: 64, signed: false },
};

/**
 * The value fill_pattern_<type> writes at index i, given the same a and b (after packing, so
 * f32 a and b are taken at float32 precision). Integers: a + i*b modulo 2^bits; f32 and f64:
 * round(a + round(round(i) * b)) with no fused multiply-add. `index` must be a safe integer.
 */
export function expectedPatternValue(type: 'i32' | 'u32', a: number, b: number, index: number): number;
export function expectedPatternValue(type: 'i64' | 'u64', a: bigint, b: bigint, index: number): bigint;
export function expectedPatternValue(type: 'f32' | 'f64', a: number, b: number, index: number): number;
export function expectedPatternValue(
  type: PatternElementType,
  a: number | bigint,
  b: number | bigint,
  index: number,
): number | bigint;
export function expectedPatternValue(
  type: PatternElementType,
  a: number | bigint,
  b: number | bigint,
  index: number,
): number | bigint {
  if (!Number.isSafeInteger(index) || index < 0) {
    throw badNumber(index, `pattern index must be a non-negative safe integer, got ${String(index)}`);
  }
  if (type === 'f32') {
    const f = Math.fround;
    return f(f(Number(a)) + f(f(index) * f(Number(b))));
  }
  if (type === 'f64') return Number(a) + index * Number(b);
  const { bits, signed } = INTEGER_BITS[type];
  const wrapped = BigInt(a) + BigInt(index) * BigInt(b);
  const value = signed ? BigInt.asIntN(bits, wrapped) : BigInt.asUintN(bits, wrapped);
  return bits === 64 ? value : Number(value);
}

/** What checksum_bytes adds into sums[0] and sums[1] for these bytes (from zeroed sums). */
export function referenceChecksum(bytes: Uint8Array): { byteSum: bigint; weightedSum: bigint } {
  // Accumulate in numbers while exact (below 2^53), folding into bigints now and then: fast and exact.
  let byteSum = 0n;
  let weightedSum = 0n;
  const chunk = 1 << 16;
  for (let start = 0; start < bytes.length; start += chunk) {
    const end = Math.min(bytes.length, start + chunk);
    let chunkSum = 0;
    let chunkWeighted = 0; // sum of byte * (offset in chunk), < 255 * 2^32: exact
    for (let i = start; i < end; i++) {
      const byte = bytes[i]!;
      chunkSum += byte;
      chunkWeighted += byte * (i - start);
    }
    byteSum += BigInt(chunkSum);
    // sum of byte * (i + 1) = sum of byte * (i - start) + (start + 1) * sum of byte
    weightedSum += BigInt(chunkWeighted) + BigInt(start + 1) * BigInt(chunkSum);
  }
  return { byteSum: BigInt.asUintN(64, byteSum), weightedSum: BigInt.asUintN(64, weightedSum) };
}
