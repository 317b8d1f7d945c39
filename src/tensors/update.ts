// updateInPlace: copies received tensors into your own, matched by name, with as few GPU
// operations as the driver allows: every pair that is one run of bytes on both sides in one
// copy_runs launch (or, on request, one cuMemcpyBatchAsync), the other pairs in one copy_strided
// launch, all on one stream. Names, dtypes and shapes are checked before anything is copied; what
// does not match is named.
import { driver, whenStreamDone } from '../cuda/driver.js';
import type { Device } from '../cuda/device.js';
import type { Stream } from '../cuda/stream.js';
import { IpcError } from '../errors.js';
import { HostBuffer } from '../host/host-buffer.js';
import { dtypeInfo, type DType } from '../ipc/dtype.js';
import { HostArray } from '../arrays/host-array.js';
import { forEachOffset } from '../ipc/array-meta.js';
import { queueDeviceCopies, type StridedCopy } from './kernels.js';
import { TensorMap, consumeRemote, tensorMapContents, type RemoteTensors, type TensorArray } from './tensor-map.js';
import { isCOrder, isDense } from './wire.js';
import { invalidArgValue } from '../arg-errors.js';

/** Options of updateInPlace(). */
export interface UpdateOptions {
  /** Stream to queue the copies on (a blocking stream of the parameters' device is made when omitted). */
  stream?: Stream;
  /**
   * true (default): every parameter must be received and every received tensor must be a
   * parameter. false: copy those that match and report the rest in `missing` / `unexpected`.
   * A dtype or shape mismatch fails either way (as torch's load_state_dict does).
   */
  strict?: boolean;
  /**
   * How the pairs that are one run of bytes are copied: 'kernel' (default) in one copy_runs launch
   * over a table of runs (reused, not uploaded again, while the same tensors are updated); 'batch'
   * in one cuMemcpyBatchAsync (one cuMemcpyDtoDAsync each on a driver older than 12.8).
   */
  method?: 'kernel' | 'batch';
}

/** What updateInPlace() copied, and how. */
export interface UpdateResult {
  /** Tensors copied. */
  copied: number;
  /** Bytes copied (each tensor's elements x itemsize). */
  bytes: number;
  /** Parameters the received map does not have (non-strict only). */
  missing: string[];
  /** Received tensors that are not parameters (non-strict only). */
  unexpected: string[];
  /** GPU operations queued (driver calls and kernel launches); 0 for host memory. */
  operations: number;
  /**
   * 'kernel': one copy_runs launch; 'batch': cuMemcpyBatchAsync; 'per-copy': one cuMemcpyDtoDAsync
   * per pair (a driver older than 12.8); 'host': host memory; 'nccl': a set that came over a TCP link,
   * received straight into the parameters (`operations` NCCL operations, one per chunk; chunks not
   * one run in the parameters go through a staging buffer).
   */
  method: 'kernel' | 'batch' | 'per-copy' | 'host' | 'nccl';
  /**
   * Where the call's time went, in microseconds: plan (matching names, checking, the pairs), launch
   * (the run table built and, where it changed, uploaded; the copies queued), sync (until the
   * stream passed them); and the run table's bytes uploaded (0 when the device's table was reused).
   */
  timings?: { plan: number; launch: number; sync: number; uploaded: number };
}

/** Named tensors: a TensorMap, or a Map of DeviceArrays / HostArrays. */
export type NamedTensors = TensorMap | ReadonlyMap<string, TensorArray>;

/** One tensor, wherever it lives: enough to copy it. */
interface Ref {
  dtype: DType;
  shape: readonly number[];
  strides: readonly number[];
  nbytes: number;
  extent: number;
  contiguous: boolean;
  host: boolean;
  /** Device address of the first element, or the host bytes [first element, + extent). */
  pointer?: bigint;
  bytes?: Uint8Array;
  device?: Device;
}

function refOfArray(a: TensorArray): Ref {
  const { itemsize } = dtypeInfo(a.dtype);
  const nbytes = a.size * itemsize;
  let last = 0;
  for (let d = 0; d < a.shape.length; d++) last += (a.shape[d]! - 1) * a.strides[d]!;
  const extent = a.size === 0 ? 0 : last + itemsize;
  const base = { dtype: a.dtype, shape: a.shape, strides: a.strides, nbytes, extent, contiguous: a.contiguous };
  if (a instanceof HostArray) return { ...base, host: true, bytes: a.buffer.bytes.subarray(0, extent) };
  return { ...base, host: false, pointer: a.buffer.devicePointer, device: a.buffer.device };
}

/** Looks tensors up by name without making views of a received map. */
interface Source {
  names(): Iterable<string>;
  has(name: string): boolean;
  ref(name: string): Ref | undefined;
}

function sourceOf(map: NamedTensors): Source {
  if (map instanceof TensorMap) {
    const c = tensorMapContents(map);
    if (c.kind === 'received') {
      const { layout, allocations } = c.received;
      return {
        names: () => layout.names,
        has: (n) => layout.index.has(n),
        ref(n) {
          const i = layout.index.get(n);
          if (i === undefined) return undefined;
          const whole = allocations[layout.allocations[i]!]!;
          const offset = layout.offsets[i]!;
          const base = {
            dtype: layout.dtypes[i]!, shape: layout.shapes[i]!, strides: layout.strides[i]!, nbytes: layout.nbytes[i]!,
            extent: layout.extents[i]!, contiguous: layout.contiguous[i] === 1,
          };
          return whole instanceof HostBuffer
            ? { ...base, host: true, bytes: whole.bytes.subarray(offset, offset + base.extent) }
            : { ...base, host: false, pointer: whole.devicePointer + BigInt(offset), device: whole.device };
        },
      };
    }
    if (c.kind === 'remote') return sourceOfRemote(c.remote);
    return sourceOfMap(c.entries);
  }
  return sourceOfMap(map);
}

/** A set whose bytes are still on the sender: its table only (no pointers). */
function sourceOfRemote(remote: RemoteTensors): Source {
  const { layout } = remote;
  return {
    names: () => layout.names,
    has: (n) => layout.index.has(n),
    ref(n) {
      const i = layout.index.get(n);
      if (i === undefined) return undefined;
      return {
        dtype: layout.dtypes[i]!, shape: layout.shapes[i]!, strides: layout.strides[i]!, nbytes: layout.nbytes[i]!,
        extent: layout.extents[i]!, contiguous: true, host: false, device: remote.device,
      };
    },
  };
}

function sourceOfMap(m: ReadonlyMap<string, TensorArray>): Source {
  return { names: () => m.keys(), has: (n) => m.has(n), ref: (n) => { const a = m.get(n); return a && refOfArray(a); } };
}

function list(names: readonly string[]): string {
  const shown = names.slice(0, 8).map((n) => JSON.stringify(n)).join(', ');
  return names.length > 8 ? `${shown} and ${names.length - 8} more` : shown;
}

/**
 * Copies each received tensor into the parameter of the same name. Resolves once the copies are
 * done (for device memory: once the stream passed them), so the received map can be closed then.
 * Throws ERR_TENSOR_MISMATCH, before copying anything, naming what does not match.
 */
export async function updateInPlace(params: NamedTensors, received: NamedTensors, options: UpdateOptions = {}): Promise<UpdateResult> {
  const started = performance.now();
  const strict = options.strict ?? true;
  const method = options.method ?? 'kernel';
  if (method !== 'kernel' && method !== 'batch') throw invalidArgValue(`updateInPlace: options.method must be 'kernel' or 'batch', got ${JSON.stringify(method)}`);
  const dstMap = params instanceof TensorMap ? new Map(params.entries()) as ReadonlyMap<string, TensorArray> : params;
  const src = sourceOf(received);
  const missing: string[] = [];
  const unexpected: string[] = [];
  const mismatched: string[] = [];
  const pairs: Array<{ name: string; dst: Ref; src: Ref }> = [];
  for (const [name, array] of dstMap) {
    const s = src.ref(name);
    if (!s) {
      missing.push(name);
      continue;
    }
    const d = refOfArray(array);
    if (d.dtype !== s.dtype) mismatched.push(`${JSON.stringify(name)}: dtype ${s.dtype} received, ${d.dtype} here`);
    else if (d.shape.length !== s.shape.length || d.shape.some((n, k) => n !== s.shape[k])) {
      mismatched.push(`${JSON.stringify(name)}: shape [${s.shape}] received, [${d.shape}] here`);
    } else pairs.push({ name, dst: d, src: s });
  }
  for (const name of src.names()) if (!dstMap.has(name)) unexpected.push(name);
  if (mismatched.length || (strict && (missing.length || unexpected.length))) {
    const parts: string[] = [];
    if (mismatched.length) parts.push(`${mismatched.length} mismatched (${mismatched.slice(0, 8).join('; ')}${mismatched.length > 8 ? '; ...' : ''})`);
    if (strict && missing.length) parts.push(`${missing.length} missing from what was received (${list(missing)})`);
    if (strict && unexpected.length) parts.push(`${unexpected.length} received that are not parameters (${list(unexpected)})`);
    throw new IpcError('ERR_TENSOR_MISMATCH',
      `updateInPlace: the received tensors do not match the parameters: ${parts.join('; ')}. Nothing was copied` +
      (mismatched.length ? '' : '; pass { strict: false } to copy the ones that match'));
  }
  let bytes = 0;
  for (const p of pairs) bytes += p.dst.nbytes;
  const result: UpdateResult = { copied: pairs.length, bytes, missing: strict ? [] : missing, unexpected: strict ? [] : unexpected, operations: 0, method: 'host' };
  const remote = received instanceof TensorMap ? tensorMapContents(received) : undefined;
  if (remote?.kind === 'remote') {
    // Over a TCP link: straight into the parameters where each is one run of bytes on the device
    // the bytes land on; otherwise into memory of this process first, then copied as any set.
    if (!remote.remote.fetchStarted && pairs.every((p) => !p.dst.host && p.dst.device === remote.remote.device && oneRun(p.dst, p.src) !== undefined)) {
      return { ...result, ...(await receiveStraight(received as TensorMap, remote.remote, pairs, started)) };
    }
    await (received as TensorMap).fetch();
    return updateInPlace(params, received, options);
  }
  if (pairs.length === 0) return result;
  const hostPairs = pairs.filter((p) => p.dst.host && p.src.host);
  if (hostPairs.length !== pairs.length) {
    if (pairs.some((p) => p.dst.host !== p.src.host)) {
      const p = pairs.find((x) => x.dst.host !== x.src.host)!;
      throw new IpcError('ERR_UNSUPPORTED', `updateInPlace copies device to device or host to host; a tensor here is in ${p.dst.host ? 'host' : 'device'} memory and received in ${p.src.host ? 'host' : 'device'} memory`);
    }
    return { ...result, ...(await copyOnDevice(pairs, options.stream, method, started)) };
  }
  for (const p of pairs) copyOnHost(p.dst, p.src);
  return result;
}

/** Receives a remote set straight into the parameters of `pairs` (the set's other tensors are dropped). */
async function receiveStraight(map: TensorMap, remote: RemoteTensors, pairs: ReadonlyArray<{ name: string; dst: Ref }>, started: number): Promise<Pick<UpdateResult, 'operations' | 'method' | 'timings'>> {
  const targets = new Array<bigint | undefined>(remote.layout.count);
  for (const p of pairs) targets[remote.layout.index.get(p.name)!] = p.dst.pointer;
  consumeRemote(map);
  const planned = performance.now();
  const r = await remote.receiveInto(targets);
  const us = (a: number, b: number) => Math.round((b - a) * 1000);
  return { operations: r.operations, method: 'nccl', timings: { plan: us(started, planned), launch: 0, sync: us(planned, performance.now()), uploaded: 0 } };
}

/** Both layouts the same and dense: one run of bytes. Both C-contiguous: one run too. */
function oneRun(dst: Ref, src: Ref): number | undefined {
  const itemsize = dtypeInfo(dst.dtype).itemsize;
  const cd = dst.contiguous || isCOrder(dst.shape, dst.strides, itemsize);
  const cs = src.contiguous || isCOrder(src.shape, src.strides, itemsize);
  if (cd && cs) return dst.nbytes;
  if (dst.strides.every((s, k) => s === src.strides[k]) && isDense(dst.shape, dst.strides, itemsize)) return dst.extent;
  return undefined;
}

function copyOnHost(dst: Ref, src: Ref): void {
  const run = oneRun(dst, src);
  if (run !== undefined) {
    dst.bytes!.set(src.bytes!.subarray(0, run));
    return;
  }
  const itemsize = dtypeInfo(dst.dtype).itemsize;
  const srcOffsets: number[] = [];
  forEachOffset(src.shape, src.strides, (at) => srcOffsets.push(at));
  const d = dst.bytes!;
  const s = src.bytes!;
  forEachOffset(dst.shape, dst.strides, (at, i) => d.set(s.subarray(srcOffsets[i]!, srcOffsets[i]! + itemsize), at));
}

async function copyOnDevice(pairs: ReadonlyArray<{ dst: Ref; src: Ref }>, stream: Stream | undefined, method: 'kernel' | 'batch',
  started: number): Promise<Pick<UpdateResult, 'operations' | 'method' | 'timings'>> {
  const device = pairs[0]!.dst.device!;
  if (pairs.some((p) => p.dst.device !== device)) {
    throw new IpcError('ERR_UNSUPPORTED', 'updateInPlace: the parameters live on several devices; update each device\'s parameters in its own call');
  }
  if (stream && stream.device !== device) {
    throw invalidArgValue(`updateInPlace: the stream belongs to device ${stream.device.ordinal}, the parameters to device ${device.ordinal}`);
  }
  const runs = pairs.map((p) => oneRun(p.dst, p.src));
  const n = runs.filter((r) => r !== undefined).length;
  const dsts = new BigUint64Array(n);
  const srcs = new BigUint64Array(n);
  const sizes = new BigUint64Array(n);
  const strided: StridedCopy[] = [];
  let k = 0;
  pairs.forEach((p, i) => {
    const run = runs[i];
    if (run !== undefined) {
      dsts[k] = p.dst.pointer!;
      srcs[k] = p.src.pointer!;
      sizes[k++] = BigInt(run);
    } else {
      strided.push({ dst: p.dst.pointer!, src: p.src.pointer!, itemsize: dtypeInfo(p.dst.dtype).itemsize, shape: p.dst.shape, dstStrides: p.dst.strides, srcStrides: p.src.strides });
    }
  });
  device.activate();
  // Without a stream: a blocking one, so that the copies come after work already queued on the
  // legacy default stream and before work queued there later.
  const own = stream ? undefined : driver.streamCreate(0);
  const handle = stream ? stream.handle : own!;
  const scratch: bigint[] = [];
  let done = false;
  let queued: ReturnType<typeof queueDeviceCopies> | undefined;
  const planned = performance.now();
  try {
    queued = queueDeviceCopies(device, handle, dsts, srcs, sizes, strided, scratch, method);
    const launched = performance.now();
    await whenStreamDone(handle);
    done = true;
    const us = (a: number, b: number) => Math.round((b - a) * 1000);
    return {
      operations: queued.operations, method: queued.method,
      timings: { plan: us(started, planned), launch: us(planned, launched), sync: us(launched, performance.now()), uploaded: queued.uploaded },
    };
  } finally {
    device.activate();
    // After a failure, copies already queued may still read the tables: let them finish.
    if (!done) driver.streamSynchronize(handle);
    queued?.release();
    for (const p of scratch) driver.memFree(p);
    if (own) driver.streamDestroy(own);
  }
}
