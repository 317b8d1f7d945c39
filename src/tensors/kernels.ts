// The tensor layer's own kernels (kernels/tensors.cu, shipped as kernels/tensors.ptx) and the
// device copies of an in-place update: contiguous pairs in one cuMemcpyBatchAsync (CUDA 12.8+;
// one cuMemcpyDtoDAsync each on older drivers), the rest in copy_strided launches.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { driver } from '../cuda/driver.js';
import type { Device } from '../cuda/device.js';
import { Module, type Kernel } from '../cuda/module.js';
import { arg, kernelArgLayout, packKernelArgs, type KernelParam } from '../cuda/kernel-args.js';
import { IpcError } from '../errors.js';
import { addon } from '../native.js';

/** The PTX file of these kernels, relative to the package root. */
export const TENSORS_PTX_FILE = 'kernels/tensors.ptx';

export const TENSOR_KERNELS: ReadonlyArray<{ name: 'copy_strided'; params: readonly KernelParam[]; description: string }> = [
  {
    name: 'copy_strided',
    params: [{ name: 'ops', type: 'ptr' }, { name: 'op_count', type: 'u32' }],
    description: 'ops[blockIdx.y] (a StridedCopy of 224 bytes, see kernels/tensors.cu): copies count elements between two byte-strided layouts',
  },
];

/** The native functions of native/copy.cc. */
interface CopyAddon {
  memcpyBatchAsync(dsts: BigUint64Array, srcs: BigUint64Array, sizes: BigUint64Array, stream: bigint): void;
  hasMemcpyBatch(): boolean;
  hostArrayBuffer(address: bigint, length: number): ArrayBuffer;
}
export const copyAddon = addon as unknown as CopyAddon;

export const MAX_STRIDED_DIMS = 8;
const OP_BYTES = 224;
/** blockIdx.y is at most 65535. */
const OPS_PER_LAUNCH = 65535;

/** A copy between two layouts of the same shape that one run of bytes cannot do. */
export interface StridedCopy {
  readonly dst: bigint;
  readonly src: bigint;
  readonly itemsize: number;
  readonly shape: readonly number[];
  readonly dstStrides: readonly number[];
  readonly srcStrides: readonly number[];
}

/**
 * The same copy over fewer dimensions: dimensions of length 1 dropped, and neighbours merged
 * where both layouts step through them as one. Throws ERR_UNSUPPORTED beyond 8 dimensions left.
 */
export function simplifyStrided(shape: readonly number[], dst: readonly number[], src: readonly number[]): { shape: number[]; dst: number[]; src: number[] } {
  const out = { shape: [] as number[], dst: [] as number[], src: [] as number[] };
  for (let d = 0; d < shape.length; d++) {
    if (shape[d] === 1) continue;
    const k = out.shape.length - 1;
    // Merge into the previous kept dimension when stepping one there equals a full run here.
    if (k >= 0 && out.dst[k] === dst[d]! * shape[d]! && out.src[k] === src[d]! * shape[d]!) {
      out.shape[k] = out.shape[k]! * shape[d]!;
      out.dst[k] = dst[d]!;
      out.src[k] = src[d]!;
      continue;
    }
    out.shape.push(shape[d]!);
    out.dst.push(dst[d]!);
    out.src.push(src[d]!);
  }
  if (out.shape.length === 0) {
    out.shape.push(1);
    out.dst.push(0);
    out.src.push(0);
  }
  if (out.shape.length > MAX_STRIDED_DIMS) {
    throw new IpcError('ERR_UNSUPPORTED', `a strided copy over ${out.shape.length} dimensions (after merging) is more than the ${MAX_STRIDED_DIMS} the copy kernel takes`);
  }
  return out;
}

/** The op table copy_strided reads (see StridedCopy in kernels/tensors.cu). */
export function encodeStridedOps(ops: readonly StridedCopy[]): Uint8Array {
  const out = new Uint8Array(OP_BYTES * ops.length);
  const v = new DataView(out.buffer);
  ops.forEach((op, k) => {
    const s = simplifyStrided(op.shape, op.dstStrides, op.srcStrides);
    const at = OP_BYTES * k;
    let count = 1;
    for (const n of s.shape) count *= n;
    v.setBigUint64(at, op.dst, true);
    v.setBigUint64(at + 8, op.src, true);
    v.setBigUint64(at + 16, BigInt(count), true);
    v.setUint32(at + 24, op.itemsize, true);
    v.setUint32(at + 28, s.shape.length, true);
    s.shape.forEach((n, d) => {
      v.setBigUint64(at + 32 + 8 * d, BigInt(n), true);
      v.setBigUint64(at + 96 + 8 * d, BigInt(s.dst[d]!), true);
      v.setBigUint64(at + 160 + 8 * d, BigInt(s.src[d]!), true);
    });
  });
  return out;
}

const modules = new Map<Device, Kernel>();

function copyStridedKernel(device: Device): Kernel {
  let k = modules.get(device);
  if (!k) {
    const ptx = readFileSync(fileURLToPath(new URL(`../../../${TENSORS_PTX_FILE}`, import.meta.url)));
    k = Module.load(ptx, device).getFunction('copy_strided', TENSOR_KERNELS[0]!.params);
    modules.set(device, k);
  }
  return k;
}

export interface QueuedCopies {
  /** Driver calls and kernel launches queued. */
  operations: number;
  /** 'batch': cuMemcpyBatchAsync; 'per-copy': one cuMemcpyDtoDAsync per pair (a driver older than 12.8). */
  method: 'batch' | 'per-copy';
}

/**
 * Queues the copies on `stream` (a raw handle, not the legacy default stream): runs of bytes
 * (dsts[i] <- srcs[i], sizes[i] bytes) and strided copies. The device's context must be current.
 * Device memory the copies read (the op tables) is added to `scratch` as soon as it is allocated:
 * free it once the stream has passed the copies, also when this throws.
 */
export function queueDeviceCopies(device: Device, stream: bigint, dsts: BigUint64Array, srcs: BigUint64Array, sizes: BigUint64Array,
  strided: readonly StridedCopy[], scratch: bigint[]): QueuedCopies {
  const out: QueuedCopies = { operations: 0, method: 'batch' };
  if (dsts.length > 0) {
    if (copyAddon.hasMemcpyBatch()) {
      copyAddon.memcpyBatchAsync(dsts, srcs, sizes, stream);
      out.operations++;
    } else {
      out.method = 'per-copy';
      for (let i = 0; i < dsts.length; i++) driver.memcpyDtoDAsync(dsts[i]!, srcs[i]!, Number(sizes[i]!), stream);
      out.operations += dsts.length;
    }
  }
  for (let first = 0; first < strided.length; first += OPS_PER_LAUNCH) {
    const ops = strided.slice(first, first + OPS_PER_LAUNCH);
    const table = encodeStridedOps(ops);
    const ptr = driver.memAlloc(table.byteLength);
    scratch.push(ptr);
    driver.memcpyHtoDAsync(ptr, table, stream);
    const kernel = copyStridedKernel(device);
    let most = 1;
    for (const op of ops) {
      let n = 1;
      for (const d of op.shape) n *= d;
      most = Math.max(most, n);
    }
    const args = [arg.ptr(ptr), arg.u32(ops.length)];
    const grid = Math.max(1, Math.min(Math.ceil(most / 256), device.multiprocessors * 8));
    driver.launchKernel(kernel.handle, grid, ops.length, 1, 256, 1, 1, 0, stream, packKernelArgs(args),
      Uint32Array.from(kernelArgLayout(args.map((a) => a.type)).offsets));
    out.operations++;
  }
  return out;
}
