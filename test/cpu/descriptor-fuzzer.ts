// Descriptor fuzzer shared by the fuzz test (few cases, every `npm test`) and
// scripts/fuzz-descriptors.mjs (a million cases on demand). Each case starts from a valid random
// descriptor, mutates its binary or JSON form, and feeds it to the decoder. The decoder must
// either return a descriptor that re-validates and round-trips (binary: re-encodes to exactly the
// input bytes), or throw an IpcError with a descriptor code. Anything else is a failure.
// Every case draws from its own PRNG seeded by (seed, case index), so one case reproduces alone.

import { isDeepStrictEqual } from 'node:util';
import { IpcError } from '../../src/errors.js';
import { DTYPES, dtypeInfo, type DType } from '../../src/ipc/dtype.js';
import * as realApi from '../../src/ipc/descriptor.js';
import type { Descriptor } from '../../src/ipc/descriptor.js';

/** The functions under test; injectable so the fuzzer's own failure detection can be tested. */
export type DescriptorApi = Pick<
  typeof realApi,
  'decodeDescriptor' | 'encodeDescriptor' | 'parseDescriptorJson' | 'descriptorToJson' | 'validateDescriptor'
>;

export interface FuzzOptions {
  readonly cases: number;
  readonly seed: number;
  /** Run cases [firstCase, firstCase + cases). */
  readonly firstCase?: number;
  readonly api?: DescriptorApi;
}

export interface FuzzStats {
  cases: number;
  binaryCases: number;
  jsonCases: number;
  decodedOk: number;
  rejected: Record<string, number>;
}

/** A case broke the contract: the message says how to reproduce it. */
export class FuzzFailure extends Error {
  override name = 'FuzzFailure';
}

const DESCRIPTOR_CODES: ReadonlySet<string> = new Set(realApi.DESCRIPTOR_ERROR_CODES);

// ---- PRNG --------------------------------------------------------------------------------

/** mulberry32: small, fast, good enough for fuzzing, and identical on every platform. */
export class Rng {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  u32(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }
  /** Uniform in [0, 1) with 53 random bits. */
  fraction(): number {
    return (this.u32() * 2 ** 21 + (this.u32() >>> 11)) / 2 ** 53;
  }
  /** Integer in [0, n), n up to 2^53. */
  below(n: number): number {
    return Math.floor(this.fraction() * n);
  }
  chance(p: number): boolean {
    return this.u32() / 2 ** 32 < p;
  }
  pick<T>(items: readonly T[]): T {
    return items[this.below(items.length)]!;
  }
  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = this.u32() & 0xff;
    return out;
  }
}

/** Seed of one case, mixed from the run seed and the case index (splitmix-style). */
export function caseSeed(seed: number, index: number): number {
  let z = (seed ^ Math.imul(index + 1, 0x9e3779b9)) >>> 0;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
  return (z ^ (z >>> 16)) >>> 0;
}

// ---- valid random descriptors ---------------------------------------------------------------

function randomUuid(rng: Rng): string {
  const h = Buffer.from(rng.bytes(16)).toString('hex');
  return `GPU-${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

function randomHandle(rng: Rng): Uint8Array {
  const mode = rng.below(10);
  if (mode === 0) return new Uint8Array(64);
  if (mode === 1) return new Uint8Array(64).fill(0xff);
  return rng.bytes(64);
}

function randomPid(rng: Rng): number {
  return rng.pick([1, 0x7fffffff, 1 + rng.below(4194304), 1 + rng.below(0x7fffffff)]);
}

interface RandomArray {
  dtype: DType;
  shape: number[];
  strides: number[];
  extent: number;
}

function randomArray(rng: Rng): RandomArray {
  const dtype = rng.pick(DTYPES);
  const itemsize = dtypeInfo(dtype).itemsize;
  const mode = rng.below(10);
  const ndim = mode === 0 ? rng.below(33) : mode === 1 ? 1 + rng.below(2) : rng.below(5);
  const shape: number[] = [];
  for (let i = 0; i < ndim; i++) {
    if (mode === 0) shape.push(rng.chance(0.8) ? 1 : 2);
    else if (mode === 1) shape.push(rng.below(2 ** 20));
    else shape.push(rng.chance(0.05) ? 0 : 1 + rng.below(8));
  }
  // C-contiguous strides, then optionally padded, permuted or broadcast.
  const strides = new Array<number>(ndim);
  let step = itemsize;
  for (let i = ndim - 1; i >= 0; i--) {
    // Padding only on few dimensions, so that strides stay far below 2^53.
    strides[i] = step * (ndim <= 6 && rng.chance(0.2) ? 1 + rng.below(3) : 1);
    step = strides[i]! * Math.max(shape[i]!, 1);
  }
  if (ndim > 1 && rng.chance(0.2)) {
    const i = rng.below(ndim);
    const j = rng.below(ndim);
    [strides[i], strides[j]] = [strides[j]!, strides[i]!];
  }
  if (ndim > 0 && rng.chance(0.1)) strides[rng.below(ndim)] = 0;
  const extent = shape.includes(0) ? 0 : shape.reduce((sum, dim, i) => sum + (dim - 1) * strides[i]!, itemsize);
  return { dtype, shape, strides, extent };
}

export function randomDescriptor(rng: Rng): Descriptor {
  const handle = randomHandle(rng);
  const deviceUuid = randomUuid(rng);
  const pid = randomPid(rng);
  if (rng.chance(0.25)) return realApi.ipcEventDescriptor({ handle, deviceUuid, pid });
  const array = rng.chance(0.8) ? randomArray(rng) : undefined;
  const extent = array?.extent ?? rng.below(2 ** 32);
  const slack = rng.pick([0, 0, rng.below(256), rng.below(2 ** 30), rng.below(2 ** 45)]);
  const byteLength = extent + slack;
  const offset = rng.below(Math.min(2 ** 46, Number.MAX_SAFE_INTEGER - byteLength) + 1);
  return realApi.legacyHandleDescriptor({
    handle,
    offset: rng.chance(0.5) ? offset - (offset % 256) : offset,
    byteLength,
    deviceUuid,
    pid,
    ...(array ? { array: { dtype: array.dtype, shape: array.shape, strides: array.strides } } : {}),
  });
}

// ---- binary mutations ------------------------------------------------------------------------

const EXTREME_U64 = [0n, 1n, 2n ** 31n, 2n ** 32n - 1n, 2n ** 53n - 1n, 2n ** 53n, 2n ** 63n - 1n, 2n ** 63n, 2n ** 64n - 1n];

function fixLength(bytes: Uint8Array): Uint8Array {
  if (bytes.length >= 12) new DataView(bytes.buffer, bytes.byteOffset).setUint32(8, bytes.length, true);
  return bytes;
}

function mutateBinary(rng: Rng, valid: Uint8Array): { input: Uint8Array; strategy: string } {
  let bytes: Uint8Array = new Uint8Array(valid);
  const strategy = rng.pick([
    'none',
    'bitflip',
    'bitflip',
    'byte',
    'byte',
    'truncate',
    'extend',
    'extend-fixed',
    'field',
    'field',
    'ndim-resize',
    'random',
    'random-header',
    'header',
  ]);
  const view = () => new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  switch (strategy) {
    case 'none':
      break;
    case 'bitflip':
      for (let n = 1 + rng.below(8); n > 0; n--) {
        // Bias towards the header and fixed fields, where most decisions are made.
        const i = rng.chance(0.5) ? rng.below(Math.min(bytes.length, 128)) : rng.below(bytes.length);
        bytes[i]! ^= 1 << rng.below(8);
      }
      break;
    case 'byte':
      for (let n = 1 + rng.below(3); n > 0; n--) {
        bytes[rng.below(bytes.length)] = rng.pick([0, 1, 0x7f, 0x80, 0xff, rng.below(256)]);
      }
      break;
    case 'truncate':
      bytes = bytes.slice(0, rng.below(bytes.length));
      if (rng.chance(0.5)) fixLength(bytes);
      break;
    case 'extend':
    case 'extend-fixed': {
      const extended = new Uint8Array(bytes.length + 1 + rng.below(64));
      extended.set(bytes);
      if (rng.chance(0.5)) extended.set(rng.bytes(extended.length - bytes.length), bytes.length);
      bytes = strategy === 'extend-fixed' ? fixLength(extended) : extended;
      break;
    }
    case 'field': {
      const v = view();
      const isLegacy = bytes.length >= 128;
      const offsets8 = isLegacy ? [96, 104, ...Array.from({ length: (bytes.length - 128) / 8 }, (_, i) => 128 + 8 * i)] : [];
      const choice = rng.below(4);
      if (choice === 0 && offsets8.length > 0) v.setBigUint64(rng.pick(offsets8), rng.pick(EXTREME_U64), true);
      else if (choice === 1) v.setUint32(isLegacy ? 112 : 96, rng.pick([0, 1, 0x7fffffff, 0x80000000, 0xffffffff]), true);
      else if (choice === 2 && isLegacy) bytes[120] = rng.pick([0, 1, 12, 15, 16, 0xff, rng.below(256)]);
      else if (isLegacy) bytes[121] = rng.pick([0, 1, 32, 33, 0xff, rng.below(256)]);
      else v.setUint32(100, rng.u32(), true);
      break;
    }
    case 'ndim-resize': {
      // A legacy header claiming k dimensions, resized and length-fixed to match, so decoding
      // gets as far as the shape and stride checks.
      if (bytes.length < 128) break;
      const k = rng.chance(0.9) ? rng.below(33) : 33 + rng.below(223);
      const resized = new Uint8Array(128 + 16 * Math.min(k, 40));
      resized.set(bytes.subarray(0, 128));
      resized[120] = resized[120] === 0 ? 1 + rng.below(12) : resized[120]!;
      resized[121] = k;
      const rv = new DataView(resized.buffer);
      for (let i = 0; i < Math.min(k, 40); i++) {
        rv.setBigUint64(128 + 8 * i, rng.chance(0.7) ? BigInt(rng.below(16)) : rng.pick(EXTREME_U64), true);
        rv.setBigUint64(128 + 8 * Math.min(k, 40) + 8 * i, rng.chance(0.7) ? BigInt(8 * rng.below(16)) : rng.pick(EXTREME_U64), true);
      }
      bytes = fixLength(resized);
      break;
    }
    case 'random':
      bytes = rng.bytes(rng.below(700));
      break;
    case 'random-header': {
      const random = rng.bytes(rng.chance(0.5) ? bytes.length : 16 + rng.below(700));
      random.set(bytes.subarray(0, 8));
      bytes = fixLength(random);
      if (rng.chance(0.5)) bytes.fill(0, 12, 16);
      break;
    }
    case 'header': {
      const v = view();
      const field = rng.below(3);
      if (field === 0) v.setUint16(4, rng.pick([0, 2, 0xffff, rng.below(0x10000)]), true);
      else if (field === 1) v.setUint16(6, rng.pick([0, 1, 2, 3, 4, 0xffff, rng.below(0x10000)]), true);
      else v.setUint32(8, rng.pick([0, 16, bytes.length - 1, bytes.length + 1, 0xffffffff]), true);
      break;
    }
  }
  return { input: bytes, strategy: `binary/${strategy}` };
}

// ---- JSON mutations --------------------------------------------------------------------------

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

const EVIL_VALUES: readonly unknown[] = [
  -1, -0, 0, 1, 1.5, 2 ** 31, 2 ** 32, 2 ** 53 - 1, 2 ** 53, 1e308, -1e308, Infinity, -Infinity, NaN,
  'NaN', '1', '', 'x'.repeat(300), null, true, false, [], {}, [1], [[1]], { a: 1 }, undefined,
  'float32', 'bfloat16', '<f4', '<V2', 'cuda-legacy-handle', 'cuda-ipc-event',
  '00'.repeat(64), 'GPU-00000000-0000-0000-0000-000000000000',
];

/** A fresh copy of an evil value: shared objects would be mutated by later cases, breaking
 *  reproducibility and even forming cycles. */
function evil(rng: Rng): unknown {
  const value = rng.pick(EVIL_VALUES);
  return typeof value === 'object' && value !== null ? structuredClone(value) : value;
}

const UNKNOWN_KEYS = ['extra', '__proto__', 'constructor', 'toString', '', 'Kind', 'handle ', 'order', 'typestr'];

/** Paths to every value in a JSON tree (the root excluded). */
function paths(value: Json, prefix: Array<string | number> = [], out: Array<Array<string | number>> = []) {
  if (Array.isArray(value)) value.forEach((v, i) => (out.push([...prefix, i]), paths(v, [...prefix, i], out)));
  else if (value !== null && typeof value === 'object') {
    for (const key of Object.keys(value)) out.push([...prefix, key]), paths(value[key]!, [...prefix, key], out);
  }
  return out;
}

function parentOf(root: Json, path: Array<string | number>): Record<string | number, unknown> {
  let node: unknown = root;
  for (const key of path.slice(0, -1)) node = (node as Record<string | number, unknown>)[key];
  return node as Record<string | number, unknown>;
}

function mutateHex(rng: Rng, text: string): string {
  const i = rng.below(Math.max(text.length, 1));
  switch (rng.below(6)) {
    case 0:
      return text.slice(0, -1 - rng.below(3));
    case 1:
      return text + rng.pick(['0', '00', 'g', ' ']);
    case 2:
      return text.slice(0, i) + text.charAt(i).toUpperCase() + text.slice(i + 1) + (/[a-f]/.test(text.charAt(i)) ? '' : 'A');
    case 3:
      return text.slice(0, i) + rng.pick(['g', 'x', ' ', '-', '\u00e9', '\u0000', 'G']) + text.slice(i + 1);
    case 4:
      return '0x' + text.slice(2);
    default:
      return text.toUpperCase();
  }
}

function mutateJsonTree(rng: Rng, root: { [key: string]: Json }): string {
  const all = paths(root);
  const strategy = rng.pick(['delete', 'add-key', 'replace', 'replace', 'hex', 'uuid', 'kind-version', 'array', 'array']);
  switch (strategy) {
    case 'delete': {
      const path = rng.pick(all);
      const parent = parentOf(root, path);
      const key = path[path.length - 1]!;
      if (Array.isArray(parent)) parent.splice(key as number, 1);
      else delete parent[key];
      break;
    }
    case 'add-key': {
      const array = root.array;
      const isObject = array !== null && typeof array === 'object' && !Array.isArray(array);
      const target = isObject && rng.chance(0.5) ? array : root;
      // defineProperty, so that '__proto__' becomes an own key as JSON.parse would make it.
      Object.defineProperty(target, rng.pick(UNKNOWN_KEYS), { value: evil(rng), enumerable: true, configurable: true, writable: true });
      break;
    }
    case 'replace': {
      const path = rng.pick(all);
      parentOf(root, path)[path[path.length - 1]!] = evil(rng);
      break;
    }
    case 'hex':
      root.handle = mutateHex(rng, String(root.handle));
      break;
    case 'uuid': {
      const uuid = String(root.deviceUuid);
      root.deviceUuid = rng.pick([
        uuid.toUpperCase(),
        uuid.replace('GPU-', 'gpu-'),
        uuid.slice(4),
        uuid.replace('-', ''),
        uuid + '0',
        uuid.slice(0, -1),
        mutateHex(rng, uuid),
        `GPU-${uuid.slice(4).replaceAll('-', '')}`,
      ]);
      break;
    }
    case 'kind-version':
      if (rng.chance(0.5)) root.kind = rng.pick(['cuda-pool-pointer', 'cuda-host-buffer', 'CUDA-LEGACY-HANDLE', '', 'hasOwnProperty', 'cuda-ipc-event', 'cuda-legacy-handle']);
      else root.version = rng.pick([0, 2, 3, 1.5, -1, '1', null, 2 ** 53, 65535]) as Json;
      break;
    case 'array': {
      // An earlier mutation may have replaced or removed the array: start a fresh one then.
      const current = root.array;
      const array = (current !== null && typeof current === 'object' && !Array.isArray(current)
        ? current
        : (root.array = { dtype: 'float32', shape: [2], strides: [4] })) as { [key: string]: Json };
      const shape = Array.isArray(array.shape) ? (array.shape as number[]) : [];
      const strides = Array.isArray(array.strides) ? (array.strides as number[]) : [];
      switch (rng.below(7)) {
        case 0:
          strides.push(4);
          break;
        case 1:
          array.shape = new Array(33 + rng.below(100)).fill(1);
          array.strides = new Array((array.shape as number[]).length).fill(8);
          break;
        case 2:
          if (shape.length) shape[rng.below(shape.length)] = rng.pick([-1, 2 ** 52, 2 ** 40, 1e20]);
          else array.shape = [rng.pick([2 ** 53, 3, -2])], delete array.strides;
          break;
        case 3:
          if (strides.length) strides[rng.below(strides.length)] = rng.pick([-4, 3, 1, 2 ** 52, 2 ** 53]);
          break;
        case 4:
          if (shape.length) shape[rng.below(shape.length)]! += 1 + rng.below(1000);
          else shape.push(1 + rng.below(10));
          break;
        case 5:
          array.dtype = rng.pick([...DTYPES, 'float128', 'complex64', 'Float32']);
          break;
        default:
          array.typestr = rng.pick(['<f4', '<f8', '|i1', '<i1', '<V2', '<u2', 'f4', '']);
      }
      break;
    }
  }
  return `json/${strategy}`;
}

function mutateJsonText(rng: Rng, text: string): string {
  const i = rng.below(text.length + 1);
  switch (rng.below(5)) {
    case 0:
      return text.slice(0, i);
    case 1:
      return text.slice(0, i) + text.slice(i + 1 + rng.below(8));
    case 2:
      return text.slice(0, i) + rng.pick([...'{}[]",:0123456789-+.eE \\ntruefalsenul', '\u2028', '\ud800', 'NaN', 'Infinity', '1e999']) + text.slice(i);
    case 3: {
      const j = rng.below(text.length + 1);
      return text.slice(0, i) + text.slice(Math.min(i, j), Math.max(i, j)) + text.slice(i);
    }
    default:
      return rng.pick(['[]', 'null', '1', '"x"', '', ' ', '{}', '{"kind":"cuda-legacy-handle"}', '['.repeat(5000), '{"a":'.repeat(3000)]);
  }
}

function mutateJson(rng: Rng, valid: Descriptor): { input: unknown; strategy: string } {
  const tree = JSON.parse(JSON.stringify(realApi.descriptorToJson(valid))) as { [key: string]: Json };
  const roll = rng.below(10);
  if (roll === 0) return { input: rng.chance(0.5) ? tree : JSON.stringify(tree), strategy: 'json/none' };
  if (roll === 1) return { input: mutateJsonText(rng, JSON.stringify(tree)), strategy: 'json/text' };
  if (roll === 2) return { input: evil(rng), strategy: 'json/not-an-object' };
  let strategy = mutateJsonTree(rng, tree);
  if (rng.chance(0.2)) strategy += '+' + mutateJsonTree(rng, tree).slice(5);
  // Objects can hold NaN, undefined and -0; text cannot, so send both forms.
  return { input: rng.chance(0.5) ? tree : JSON.stringify(tree), strategy };
}

// ---- the contract ----------------------------------------------------------------------------

function describeInput(input: unknown): string {
  if (input instanceof Uint8Array) return `bytes ${Buffer.from(input).toString('hex')}`;
  if (typeof input === 'string') return `text ${JSON.stringify(input.slice(0, 2000))}`;
  try {
    return `object ${JSON.stringify(input)?.slice(0, 2000)}`;
  } catch {
    return `value ${String(input)}`;
  }
}

function checkAccepted(api: DescriptorApi, desc: Descriptor, input: unknown): void {
  if (!isDeepStrictEqual(api.validateDescriptor(desc), desc)) throw new Error('the result does not re-validate to itself');
  const bytes = api.encodeDescriptor(desc);
  if (!isDeepStrictEqual(api.decodeDescriptor(bytes), desc)) throw new Error('binary round trip changed the descriptor');
  if (input instanceof Uint8Array && !isDeepStrictEqual(new Uint8Array(bytes), new Uint8Array(input))) {
    throw new Error('accepted bytes are not canonical: re-encoding gives different bytes');
  }
  const text = JSON.stringify(api.descriptorToJson(desc));
  if (!isDeepStrictEqual(api.parseDescriptorJson(text), desc)) throw new Error('JSON round trip changed the descriptor');
}

export function runDescriptorFuzz(options: FuzzOptions): FuzzStats {
  const api = options.api ?? realApi;
  const first = options.firstCase ?? 0;
  const stats: FuzzStats = { cases: 0, binaryCases: 0, jsonCases: 0, decodedOk: 0, rejected: {} };
  for (let index = first; index < first + options.cases; index++) {
    const rng = new Rng(caseSeed(options.seed, index));
    const valid = randomDescriptor(rng);
    const binary = rng.chance(0.5);
    const { input, strategy } = binary ? mutateBinary(rng, realApi.encodeDescriptor(valid)) : mutateJson(rng, valid);
    let decoded: Descriptor;
    try {
      decoded = binary ? api.decodeDescriptor(input as Uint8Array) : api.parseDescriptorJson(input);
    } catch (error) {
      if (error instanceof IpcError && DESCRIPTOR_CODES.has(error.code) && error.message.length > 0) {
        stats.rejected[error.code] = (stats.rejected[error.code] ?? 0) + 1;
        stats.cases++;
        binary ? stats.binaryCases++ : stats.jsonCases++;
        continue;
      }
      throw new FuzzFailure(
        `case ${index} (seed ${options.seed}, ${strategy}) threw ${error instanceof Error ? `${error.name}: ${error.message}` : String(error)}` +
          `\n  input: ${describeInput(input)}\n  reproduce: node scripts/fuzz-descriptors.mjs --seed ${options.seed} --first ${index} --cases 1`,
        { cause: error },
      );
    }
    try {
      checkAccepted(api, decoded, input);
    } catch (error) {
      throw new FuzzFailure(
        `case ${index} (seed ${options.seed}, ${strategy}) was accepted but ${error instanceof Error ? error.message : String(error)}` +
          `\n  input: ${describeInput(input)}\n  reproduce: node scripts/fuzz-descriptors.mjs --seed ${options.seed} --first ${index} --cases 1`,
        { cause: error },
      );
    }
    stats.decodedOk++;
    stats.cases++;
    binary ? stats.binaryCases++ : stats.jsonCases++;
  }
  return stats;
}
