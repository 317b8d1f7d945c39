// The project's own kernels (kernels/builtin.cu, shipped as PTX): fill and verify patterns, scale,
// checksum bytes, and spin for a while. Loaded once per device per thread.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Device } from './device.js';
import { DeviceBuffer } from './buffer.js';
import { Stream } from './stream.js';
import { Module, type Kernel } from './module.js';
import { arg, type KernelArg } from './kernel-args.js';
import { BUILTIN_KERNELS, NO_MISMATCH_INDEX, builtinPtxUrl, type BuiltinKernelName, type PatternElementType } from './builtin-kernels.js';
import { IpcError } from '../errors.js';
import { invalidArgValue, outOfRange } from '../arg-errors.js';

export type { PatternElementType } from './builtin-kernels.js';

type Scalar<T extends PatternElementType> = T extends 'i64' | 'u64' ? bigint : number;

const ITEMSIZE: Record<PatternElementType, number> = { i32: 4, u32: 4, i64: 8, u64: 8, f32: 4, f64: 8 };

function scalarArg(type: PatternElementType, v: number | bigint): KernelArg {
  switch (type) {
    case 'i32': return arg.i32(v as number);
    case 'u32': return arg.u32(v as number);
    case 'i64': return arg.i64(v as bigint);
    case 'u64': return arg.u64(v as bigint);
    case 'f32': return arg.f32(v as number);
    case 'f64': return arg.f64(v as number);
  }
}

/** What verifyPattern found: how many elements differ, and the first that does. */
export interface PatternCheck {
  mismatches: bigint;
  /** Index of the first mismatching element, or null when all match. */
  firstMismatch: bigint | null;
}

/**
 * The built-in kernels of one device (`BuiltinKernels.for(device)`): fill and verify patterns,
 * scale, checksum and spin, each queued on a stream.
 */
export class BuiltinKernels {
  static #byDevice = new Map<Device, BuiltinKernels>();
  readonly device: Device;
  readonly #module: Module;

  private constructor(device: Device) {
    this.device = device;
    this.#module = Module.load(readFileSync(fileURLToPath(builtinPtxUrl())), device);
  }

  /** The built-in kernels loaded on `device` (loaded on first use, kept for the thread's life). */
  static for(device: Device = Device.get(0)): BuiltinKernels {
    let k = BuiltinKernels.#byDevice.get(device);
    if (!k) BuiltinKernels.#byDevice.set(device, (k = new BuiltinKernels(device)));
    return k;
  }

  /** One built-in kernel by its entry name, to launch it yourself. */
  kernel(name: BuiltinKernelName): Kernel {
    const spec = BUILTIN_KERNELS.find((k) => k.name === name)!;
    return this.#module.getFunction(name, spec.params);
  }

  #grid(n: number): number {
    return Math.max(1, Math.min(Math.ceil(n / 256), this.device.multiprocessors * 16));
  }

  #count(buffer: DeviceBuffer, type: PatternElementType): number {
    if (buffer.byteLength % ITEMSIZE[type] !== 0) {
      throw invalidArgValue(`a buffer of ${buffer.byteLength} bytes is not a whole number of ${type} elements`);
    }
    return buffer.byteLength / ITEMSIZE[type];
  }

  /** Queues out[i] = a + i*b over every element of `buffer`. */
  fillPattern<T extends PatternElementType>(buffer: DeviceBuffer, type: T, a: Scalar<T>, b: Scalar<T>, stream?: Stream): void {
    const n = this.#count(buffer, type);
    this.kernel(`fill_pattern_${type}`).launch({ grid: this.#grid(n), block: 256, stream },
      [arg.ptr(buffer), arg.u64(BigInt(n)), scalarArg(type, a), scalarArg(type, b)]);
  }

  /** Counts elements that differ from a + i*b (floats compared bit for bit). */
  async verifyPattern<T extends PatternElementType>(buffer: DeviceBuffer, type: T, a: Scalar<T>, b: Scalar<T>, stream?: Stream): Promise<PatternCheck> {
    const n = this.#count(buffer, type);
    using result = DeviceBuffer.allocate(16, { device: this.device });
    const init = new BigUint64Array([0n, NO_MISMATCH_INDEX]);
    await result.writeAsync(init, { stream });
    this.kernel(`verify_pattern_${type}`).launch({ grid: this.#grid(n), block: 256, stream },
      [arg.ptr(buffer), arg.u64(BigInt(n)), scalarArg(type, a), scalarArg(type, b), arg.ptr(result), arg.ptr(result.devicePointer + 8n)]);
    const out = new BigUint64Array(2);
    await result.readAsync(out, { stream });
    return { mismatches: out[0]!, firstMismatch: out[1] === NO_MISMATCH_INDEX ? null : out[1]! };
  }

  /** Queues x[i] *= s over every element. */
  scale<T extends PatternElementType>(buffer: DeviceBuffer, type: T, s: Scalar<T>, stream?: Stream): void {
    const n = this.#count(buffer, type);
    this.kernel(`scale_${type}`).launch({ grid: this.#grid(n), block: 256, stream }, [arg.ptr(buffer), arg.u64(BigInt(n)), scalarArg(type, s)]);
  }

  /** Sum of bytes and sum of byte*(i+1), both mod 2^64 (see kernels/builtin.cu). */
  async checksum(buffer: DeviceBuffer, stream?: Stream): Promise<{ byteSum: bigint; weightedSum: bigint }> {
    using sums = DeviceBuffer.allocate(16, { device: this.device });
    await sums.writeAsync(new BigUint64Array(2), { stream });
    this.kernel('checksum_bytes').launch({ grid: this.#grid(buffer.byteLength / 16), block: 256, stream },
      [arg.ptr(buffer), arg.u64(BigInt(buffer.byteLength)), arg.ptr(sums)]);
    const out = new BigUint64Array(2);
    await sums.readAsync(out, { stream });
    return { byteSum: out[0]!, weightedSum: out[1]! };
  }

  /** Queues a kernel that runs for at least `ns` nanoseconds. */
  spin(ns: number | bigint, stream?: Stream): void {
    this.kernel('spin').launch({ grid: 1, block: 1, stream }, [arg.u64(BigInt(ns))]);
  }

  /** Queues a kernel that runs for at least `ns`, then writes `value` to the u32 at `offset` of `target`. */
  spinThenWrite(target: DeviceBuffer, offset: number, value: number, ns: number | bigint, stream?: Stream): void {
    if (offset % 4 !== 0 || offset + 4 > target.byteLength) throw outOfRange(`offset ${offset} is not an aligned u32 inside ${target.byteLength} bytes`);
    this.kernel('spin_then_write_u32').launch({ grid: 1, block: 1, stream },
      [arg.ptr(target.devicePointer + BigInt(offset)), arg.u32(value), arg.u64(BigInt(ns))]);
  }
}
