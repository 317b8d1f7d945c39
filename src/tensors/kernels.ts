// The tensor layer's own kernels (kernels/tensors.cu, compiled to kernels/tensors.ptx) and the
// device copies of an in-place update: contiguous pairs in one copy_runs launch (a table of runs in
// device memory, kept per device and uploaded only when it changed), or on request in one
// cuMemcpyBatchAsync (CUDA 12.8+; one cuMemcpyDtoDAsync each on older drivers); the rest in
// copy_strided launches. python/cuda_ipc/tensors/kernels.py is the Python side of the same table.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { driver } from '../cuda/driver.js';
import type { Device } from '../cuda/device.js';
import { Module, type Kernel } from '../cuda/module.js';
import { arg, kernelArgLayout, packKernelArgs, type KernelParam } from '../cuda/kernel-args.js';
import { IpcError } from '../errors.js';
import { addon } from '../native/addon.js';
import { invalidArgValue } from '../arg-errors.js';

/**
 * The PTX file of these kernels, relative to the package root: the Python package's copy of
 * kernels/tensors.ptx (scripts/gen-ptx.sh writes both; a test checks they agree). The Python
 * package must carry its own (`pip install ./python`), so the npm package ships that one only.
 */
export const TENSORS_PTX_FILE = 'python/cuda_ipc/tensors.ptx';

export const TENSOR_KERNELS: ReadonlyArray<{ name: 'copy_runs' | 'copy_strided'; params: readonly KernelParam[]; description: string }> = [
  {
    name: 'copy_runs',
    params: [{ name: 'runs', type: 'ptr' }, { name: 'run_count', type: 'u32' }, { name: 'chunk_count', type: 'u64' }, { name: 'chunk_bytes', type: 'u64' }],
    description: 'runs (CopyRun rows of 32 bytes: dst, src, bytes, first chunk): chunk_count chunks of chunk_bytes taken in tiles of up to 16 grid-stride, 16-byte loads where aligned',
  },
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

/** Bytes per chunk of a run (a multiple of 16: every chunk starts as aligned as its run). */
export const CHUNK_BYTES = 64 * 1024;
/** Threads per block, and blocks per SM at most, of a copy_runs launch. */
export const RUN_BLOCK_THREADS = 256;
export const RUN_BLOCKS_PER_SM = 4;
const ROW_BYTES = 32;

/** The copy_runs table of some runs of bytes. */
export interface RunTable {
  /** The rows (struct CopyRun in kernels/tensors.cu), 32 bytes each. */
  readonly data: Uint8Array;
  /** Rows: runs after splitting, zero-length runs left out. */
  readonly runs: number;
  /** Chunks over all rows: the launch's work items. */
  readonly chunks: number;
}

/**
 * The copy_runs table for dsts[i] <- srcs[i], sizes[i] bytes. A run whose two addresses share a
 * misalignment (the same address mod 16, not 0) is split: its head up to the next 16-byte boundary
 * in a row of its own, so that the rest is copied with 16-byte loads. Zero-byte runs are left out.
 */
export function planRuns(dsts: BigUint64Array, srcs: BigUint64Array, sizes: BigUint64Array, chunkBytes = CHUNK_BYTES): RunTable {
  if (!Number.isSafeInteger(chunkBytes) || chunkBytes <= 0 || chunkBytes % 16 !== 0) {
    throw invalidArgValue(`chunkBytes must be a positive multiple of 16, got ${chunkBytes}`);
  }
  const out = new Uint8Array(ROW_BYTES * 2 * dsts.length);
  const v = new DataView(out.buffer);
  const chunk = BigInt(chunkBytes);
  let rows = 0;
  let chunks = 0n;
  const row = (d: bigint, s: bigint, n: bigint) => {
    const at = ROW_BYTES * rows++;
    v.setBigUint64(at, d, true);
    v.setBigUint64(at + 8, s, true);
    v.setBigUint64(at + 16, n, true);
    v.setBigUint64(at + 24, chunks, true);
    chunks += (n + chunk - 1n) / chunk;
  };
  for (let i = 0; i < dsts.length; i++) {
    let d = dsts[i]!;
    let s = srcs[i]!;
    let n = sizes[i]!;
    if (n === 0n) continue;
    const mis = d & 15n;
    if (mis !== 0n && mis === (s & 15n)) {
      const head = 16n - mis < n ? 16n - mis : n;
      row(d, s, head);
      d += head;
      s += head;
      n -= head;
      if (n === 0n) continue;
    }
    row(d, s, n);
  }
  return { data: out.subarray(0, ROW_BYTES * rows), runs: rows, chunks: Number(chunks) };
}

/** Blocks of a copy_runs launch: enough to fill every SM, never more than there are chunks. */
export function runGrid(chunks: number, multiprocessors: number): number {
  return Math.max(1, Math.min(chunks, multiprocessors * RUN_BLOCKS_PER_SM));
}

const modules = new Map<Device, Module>();
const kernels = new Map<string, Kernel>();

function tensorKernel(device: Device, name: 'copy_runs' | 'copy_strided'): Kernel {
  const key = `${device.ordinal}:${name}`;
  let k = kernels.get(key);
  if (!k) {
    let m = modules.get(device);
    if (!m) {
      const ptx = readFileSync(fileURLToPath(new URL(`../../../${TENSORS_PTX_FILE}`, import.meta.url)));
      m = Module.load(ptx, device);
      modules.set(device, m);
    }
    k = m.getFunction(name, TENSOR_KERNELS.find((t) => t.name === name)!.params);
    kernels.set(key, k);
  }
  return k;
}

/**
 * Loads the tensor kernels' module on `device` now (it is loaded once per process and device):
 * the sharded copier does it when it is made, while a group sets up, so that a first sync does
 * not wait for the driver to load (and on a first run JIT-compile) the PTX.
 */
export function loadTensorKernels(device: Device): void {
  tensorKernel(device, 'copy_runs');
}

/**
 * The run table last uploaded per device, kept for the life of the process (32 bytes per run: a
 * few hundred KiB for the largest models), so that a repeated update of the same tensors uploads
 * nothing. `busy` while a launch that reads it may still run: a concurrent update uploads its own.
 */
interface DeviceTable { ptr: bigint; capacity: number; data: Uint8Array; busy: boolean }
const tables = new Map<Device, DeviceTable>();

/** Whether two run tables hold the same bytes (a repeated transfer uploads nothing). */
export function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.byteLength === b.byteLength && Buffer.compare(a, b) === 0;
}

export interface QueuedCopies {
  /** Driver calls and kernel launches queued. */
  operations: number;
  /** 'kernel': one copy_runs launch; 'batch': cuMemcpyBatchAsync; 'per-copy': one cuMemcpyDtoDAsync per pair (a driver older than 12.8). */
  method: 'kernel' | 'batch' | 'per-copy';
  /** Bytes of run table uploaded (0 when the device's table was reused). */
  uploaded: number;
  /** Call once the stream passed the copies (also when a later step threw): the device's table is free again. */
  release(): void;
}

/**
 * Queues the copies on `stream` (a raw handle, not the legacy default stream): runs of bytes
 * (dsts[i] <- srcs[i], sizes[i] bytes) and strided copies. The device's context must be current.
 * Device memory the copies read (the op tables) is added to `scratch` as soon as it is allocated:
 * free it once the stream has passed the copies, also when this throws.
 */
export function queueDeviceCopies(device: Device, stream: bigint, dsts: BigUint64Array, srcs: BigUint64Array, sizes: BigUint64Array,
  strided: readonly StridedCopy[], scratch: bigint[], method: 'kernel' | 'batch' = 'kernel'): QueuedCopies {
  const out: QueuedCopies = { operations: 0, method, uploaded: 0, release: () => {} };
  const plan = method === 'kernel' ? planRuns(dsts, srcs, sizes) : undefined;
  if (plan && plan.runs > 0) {
    let table = tables.get(device);
    let own = false;
    if (!table || table.busy) {
      // The first update on this device, or one running beside another: a table of its own.
      own = !!table;
      table = { ptr: 0n, capacity: 0, data: new Uint8Array(0), busy: false };
      if (!own) tables.set(device, table);
    }
    if (!sameBytes(table.data, plan.data)) {
      table.data = new Uint8Array(0);  // until the upload below went out: a failure leaves it unknown
      if (table.capacity < plan.data.byteLength) {
        if (table.ptr) driver.memFree(table.ptr);
        table.ptr = 0n;
        table.capacity = 0;
        const capacity = Math.max(4096, plan.data.byteLength);
        table.ptr = driver.memAlloc(capacity);
        table.capacity = capacity;
        if (own) scratch.push(table.ptr);
      }
      driver.memcpyHtoDAsync(table.ptr, plan.data, stream);
      table.data = plan.data.slice();
      out.uploaded = plan.data.byteLength;
    }
    const t = table;
    t.busy = true;
    if (!own) out.release = () => { t.busy = false; };
    try {
      launchCopyRuns(device, stream, t.ptr, plan.runs, plan.chunks);
    } catch (e) {
      // Nothing reads it: the rows may be uploaded again by the next update.
      t.busy = false;
      t.data = new Uint8Array(0);
      throw e;
    }
    out.operations++;
  } else if (!plan && dsts.length > 0) {
    if (copyAddon.hasMemcpyBatch()) {
      copyAddon.memcpyBatchAsync(dsts, srcs, sizes, stream);
      out.operations++;
    } else {
      out.method = 'per-copy';
      for (let i = 0; i < dsts.length; i++) driver.memcpyDtoDAsync(dsts[i]!, srcs[i]!, Number(sizes[i]!), stream);
      out.operations += dsts.length;
    }
  }
  try {
    queueStrided(device, stream, strided, scratch, out);
  } catch (e) {
    // The caller synchronizes the stream before anything else can run: the table is free then.
    out.release();
    throw e;
  }
  return out;
}

/**
 * Launches copy_runs over `runs` rows of a run table already in device memory at `table` (rows
 * made by planRuns, their first-chunk column counted from 0 at this row): the chunk pipeline of an
 * NCCL transfer (src/nccl) gathers and scatters each chunk with one launch over its own rows.
 */
export function launchCopyRuns(device: Device, stream: bigint, table: bigint, runs: number, chunks: number): void {
  if (runs === 0) return;
  const args = [arg.ptr(table), arg.u32(runs), arg.u64(BigInt(chunks)), arg.u64(BigInt(CHUNK_BYTES))];
  driver.launchKernel(tensorKernel(device, 'copy_runs').handle, runGrid(chunks, device.multiprocessors), 1, 1, RUN_BLOCK_THREADS, 1, 1, 0, stream,
    packKernelArgs(args), Uint32Array.from(kernelArgLayout(args.map((a) => a.type)).offsets));
}

function queueStrided(device: Device, stream: bigint, strided: readonly StridedCopy[], scratch: bigint[], out: QueuedCopies): void {
  for (let first = 0; first < strided.length; first += OPS_PER_LAUNCH) {
    const ops = strided.slice(first, first + OPS_PER_LAUNCH);
    const table = encodeStridedOps(ops);
    const ptr = driver.memAlloc(table.byteLength);
    scratch.push(ptr);
    driver.memcpyHtoDAsync(ptr, table, stream);
    const kernel = tensorKernel(device, 'copy_strided');
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
}
