// loadSafetensors: a checkpoint (one .safetensors file, several shards, or a
// model.safetensors.index.json naming them) read once into ONE allocation, returned as a TensorMap
// of views into it. On a device the allocation comes from an IPC pool, so the map sent to N
// workers costs each of them one pool import, and no copy anywhere. The data goes file -> pinned
// staging -> device in chunks, double-buffered: the file read of one chunk overlaps the copy of
// the one before. With { memory: 'host' } the files are read straight into one HostBuffer.
import { dirname, isAbsolute, join, normalize, sep } from 'node:path';
import { openRegularFileHandle, readRegularFileAsync } from '../safe-files.js';
import { driver, whenStreamDone } from '../cuda/driver.js';
import { Device, defaultDevice } from '../cuda/device.js';
import type { DeviceBuffer } from '../cuda/buffer.js';
import { IpcError, MAX_VIEW_BYTES } from '../errors.js';
import { HostBuffer } from '../host/host-buffer.js';
import { DeviceArray } from '../arrays/device-array.js';
import type { IpcPool } from '../ipc/pool.js';
import '../ipc/pool.js';
import { addon } from '../native/addon.js';
import { HostArray } from '../arrays/host-array.js';
import { copyAddon } from './kernels.js';
import { readSafetensorsHeader, type SafetensorsHeader } from './safetensors.js';
import { dtypeInfo } from '../ipc/dtype.js';
import { TensorMap, setTensorMapMetadata } from './tensor-map.js';
import { invalidArgValue, outOfRange } from '../arg-errors.js';

/** Options of loadSafetensors(). */
export interface LoadSafetensorsOptions {
  /** Where the tensors go: 'device' (default) or 'host' (one HostBuffer, no GPU needed). */
  memory?: 'device' | 'host';
  /** The device (default: the working device, else device 0). */
  device?: Device;
  /** Allocate from this IPC pool (default: a pool of its own, destroyed once the tensors are closed). */
  pool?: IpcPool;
  /** Bytes of each of the two pinned staging buffers (default 64 MiB). */
  stagingBytes?: number;
}

/** Each file's data section starts on this boundary in the allocation. */
const FILE_ALIGN = 256;
const DEFAULT_STAGING = 64 << 20;
/** Host loads read into views of at most this many bytes (one typed array each). */
const HOST_READ_BYTES = 2 ** 30;

/**
 * Where a file's tensors go in the allocation, relative to the file's base there. The format packs
 * tensors back to back without aligning them; in memory each starts at a multiple of its element
 * size, moved up from its place in the file by as little as that takes. Tensors moved by the same
 * amount form one run, read from the file in one piece (for an aligned file: one run, the whole
 * data section).
 */
interface Placement {
  /** Offset of each tensor (header order) from the file's base in the allocation. */
  readonly offsets: number[];
  /** [from, to) of the data section, going to from + shift. */
  readonly runs: Array<{ from: number; to: number; shift: number }>;
  /** Bytes the file takes in the allocation. */
  readonly bytes: number;
}

function placeTensors(h: SafetensorsHeader): Placement {
  const order = h.tensors.map((t, i) => ({ t, i })).sort((a, b) => a.t.begin - b.t.begin || a.t.end - b.t.end);
  const offsets = new Array<number>(h.tensors.length);
  const runs: Placement['runs'] = [];
  let shift = 0;
  for (const { t, i } of order) {
    const itemsize = dtypeInfo(t.dtype).itemsize;
    if (t.end > t.begin) shift += (itemsize - ((t.begin + shift) % itemsize)) % itemsize;
    offsets[i] = t.begin + shift;
    const last = runs[runs.length - 1];
    if (last && last.shift === shift) last.to = t.end;
    else if (t.end > t.begin) runs.push({ from: t.begin, to: t.end, shift });
  }
  return { offsets, runs, bytes: h.dataBytes + shift };
}

function invalid(path: string, why: string, cause?: unknown): IpcError {
  return new IpcError('ERR_SAFETENSORS_INVALID', `${path}: ${why}`, cause !== undefined ? { cause } : undefined);
}

/**
 * Why a file could not be opened, said once: Node's message ("ENOENT: no such file or directory,
 * open '/path'") repeats the code and the path the caller already names.
 */
function fsReason(e: unknown): string {
  const err = e as { code?: string; message?: string };
  if (err.code === 'ENOENT') return 'does not exist (ENOENT)';
  if (err.code === 'EACCES' || err.code === 'EPERM') return `may not be read by this user (${err.code})`;
  const m = /^[A-Z0-9_]+: (.*?), \w+ '.*'$/s.exec(err.message ?? '');
  return `cannot be read: ${m ? m[1] : err.message} (${err.code})`;
}

/** The largest model.safetensors.index.json read (real ones are well under a megabyte). */
const MAX_INDEX_BYTES = 64 * 2 ** 20;

/** The shard files an index names (in first-use order) and which file each tensor must be in. */
async function readIndex(path: string): Promise<{ files: string[]; weightMap: Map<string, string> }> {
  // Regular files only, bounded: a FIFO or /dev/zero named here must not hang or grow this process.
  // A file that cannot be read fails with its own error (ENOENT, ERR_FILE_UNSAFE), not as "not JSON".
  const text = (await readRegularFileAsync(path, MAX_INDEX_BYTES, 'the index')).toString('utf8');
  let root: unknown;
  try {
    root = JSON.parse(text);
  } catch (e) {
    throw invalid(path, `the index is not JSON (${(e as Error).message})`);
  }
  const wm = (root as { weight_map?: unknown })?.weight_map;
  if (typeof wm !== 'object' || wm === null || Array.isArray(wm)) throw invalid(path, 'the index has no "weight_map" object');
  const dir = dirname(path);
  const weightMap = new Map<string, string>();
  const files: string[] = [];
  for (const [name, file] of Object.entries(wm as Record<string, unknown>)) {
    if (typeof file !== 'string' || file.length === 0 || isAbsolute(file) || normalize(file).split(sep).includes('..')) {
      throw invalid(path, `weight_map entry ${JSON.stringify(name)} names ${JSON.stringify(file)}, not a file beside the index`);
    }
    const full = join(dir, file);
    if (!files.includes(full)) files.push(full);
    weightMap.set(name, full);
  }
  return { files, weightMap };
}

/** Into host memory (`memory: 'host'`): a map of HostArrays over one HostBuffer. */
export async function loadSafetensors(source: string | readonly string[], options: LoadSafetensorsOptions & { memory: 'host' }): Promise<TensorMap<HostArray>>;
/** Into device memory (the default): a map of DeviceArrays over one pool allocation. */
export async function loadSafetensors(source: string | readonly string[], options?: LoadSafetensorsOptions): Promise<TensorMap<DeviceArray>>;
/**
 * Loads a safetensors checkpoint: a file, several shard files, or a model.safetensors.index.json
 * (shards are found beside it). Every header is checked before anything is allocated or read.
 * Tensor names must be unique across the files. Each tensor starts at a multiple of its element
 * size in the allocation, also where the file packs it at an odd offset (the format does not align
 * tensors, and the reference writer packs them back to back).
 *
 * @throws IpcError ERR_SAFETENSORS_INVALID naming the file and the tensor for a file that breaks
 * the format, an index that is not JSON or does not match its shards, or an index naming a shard
 * that cannot be opened (the message names the index, the shard and the cause once); the fs error
 * (ENOENT, EACCES, ...) for a file or index named directly that cannot be opened;
 * ERR_FILE_UNSAFE for a file (named, or a shard of an index) that is not a regular file (a
 * directory, FIFO or device) or an index larger than 64 MiB.
 * @throws IpcError ERR_OUT_OF_MEMORY (host) / CudaError CUDA_ERROR_OUT_OF_MEMORY (device) when the
 * checkpoint does not fit.
 */
export async function loadSafetensors(source: string | readonly string[], options: LoadSafetensorsOptions = {}): Promise<TensorMap<DeviceArray> | TensorMap<HostArray>> {
  const memory = options.memory ?? 'device';
  if (memory !== 'device' && memory !== 'host') throw invalidArgValue(`memory must be 'device' or 'host', got ${JSON.stringify(memory)}`);
  let files: string[];
  let weightMap: Map<string, string> | undefined;
  if (typeof source === 'string' && source.endsWith('.json')) ({ files, weightMap } = await readIndex(source));
  else files = typeof source === 'string' ? [source] : [...source];
  if (files.length === 0) throw invalidArgValue('loadSafetensors needs at least one file');
  const headers: SafetensorsHeader[] = [];
  for (const f of files) {
    try {
      headers.push(await readSafetensorsHeader(f));
    } catch (e) {
      // A system error (it has a syscall) on a shard the index named: the index is what is wrong.
      if (!weightMap || typeof (e as { syscall?: unknown })?.syscall !== 'string') throw e;
      throw invalid(source as string, `the index names the shard ${f}, which ${fsReason(e)}`, e);
    }
  }

  // Names unique across shards, and where an index names their shard, in that shard.
  const seen = new Map<string, string>();
  for (const h of headers) {
    for (const t of h.tensors) {
      const other = seen.get(t.name);
      if (other) throw invalid(h.path, `tensor ${JSON.stringify(t.name)} is also in ${other}`);
      seen.set(t.name, h.path);
      if (weightMap && weightMap.get(t.name) !== h.path) {
        throw invalid(h.path, `tensor ${JSON.stringify(t.name)} is ${weightMap.has(t.name) ? `listed in the index under ${weightMap.get(t.name)}` : 'not in the index\'s weight_map'}`);
      }
    }
  }
  if (weightMap) for (const [name, file] of weightMap) if (!seen.has(name)) throw invalid(file, `tensor ${JSON.stringify(name)} of the index's weight_map is not in this file`);

  const bases: number[] = [];
  const placements = headers.map(placeTensors);
  let total = 0;
  for (const p of placements) {
    total = Math.ceil(total / FILE_ALIGN) * FILE_ALIGN;
    bases.push(total);
    total += p.bytes;
  }
  const metadata: Record<string, string> = {};
  for (const h of headers) for (const [k, v] of Object.entries(h.metadata)) if (!(k in metadata)) metadata[k] = v;

  const layout: Layout = { headers, placements, bases, total };
  const map = memory === 'host' ? await loadIntoHost(layout) : await loadIntoDevice(layout, options);
  setTensorMapMetadata(map, metadata);
  return map;
}

/** Reads exactly `length` bytes of `path` at `position` into `into`. */
async function readExact(fh: import('node:fs/promises').FileHandle, path: string, into: Uint8Array, position: number): Promise<void> {
  let done = 0;
  while (done < into.byteLength) {
    const { bytesRead } = await fh.read(into, done, into.byteLength - done, position + done);
    if (bytesRead === 0) throw invalid(path, `the file ended at byte ${position + done}, before the data its header announces (it changed while loading?)`);
    done += bytesRead;
  }
}

/** The checked headers, where each file's tensors go, and the allocation they all go into. */
interface Layout {
  readonly headers: SafetensorsHeader[];
  readonly placements: Placement[];
  /** Where each file starts in the allocation. */
  readonly bases: number[];
  readonly total: number;
}

async function loadIntoHost(layout: Layout): Promise<TensorMap<HostArray>> {
  const { headers, placements, bases } = layout;
  const whole = HostBuffer.allocate(Math.max(layout.total, 1));
  try {
    for (let f = 0; f < headers.length; f++) {
      const h = headers[f]!;
      if (h.dataBytes === 0) continue;
      const fh = await openRegularFileHandle(h.path, 'the safetensors file');
      try {
        for (const run of placements[f]!.runs) {
          // Pieces of a view each: the allocation may be larger than one typed array can be.
          for (let at = run.from; at < run.to; at += HOST_READ_BYTES) {
            using piece = whole.view(bases[f]! + at + run.shift, Math.min(HOST_READ_BYTES, run.to - at));
            await readExact(fh, h.path, piece.bytes, h.dataOffset + at);
          }
        }
      } finally {
        await fh.close();
      }
    }
    // A HostBuffer view has at least one byte: a tensor without elements gets one it never reads.
    return viewsOf(layout, (offset, length) => whole.view(Math.min(offset, whole.byteLength - 1), Math.max(length, 1)),
      (b, meta) => new HostArray(b as HostBuffer, meta));
  } finally {
    whole.close();  // the views keep the memory
  }
}

async function loadIntoDevice(layout: Layout, options: LoadSafetensorsOptions): Promise<TensorMap<DeviceArray>> {
  const device = options.device ?? options.pool?.device ?? defaultDevice();
  const ownPool = options.pool ? undefined : device.createIpcPool();
  let whole: DeviceBuffer;
  try {
    whole = (options.pool ?? ownPool!).allocate(Math.max(layout.total, 1));
  } finally {
    ownPool?.close();  // destroyed once the last buffer of it is closed
  }
  try {
    await copyFilesToDevice(layout, whole, device, options.stagingBytes ?? DEFAULT_STAGING);
    return viewsOf(layout, (offset, length) => whole.view(offset, length), (b, meta) => new DeviceArray(b as DeviceBuffer, meta));
  } finally {
    whole.close();  // the views keep the memory
  }
}

/** file -> pinned staging (two halves) -> device, the read of one chunk overlapping the copy of the last. */
async function copyFilesToDevice(layout: Layout, whole: DeviceBuffer, device: Device, chunk: number): Promise<void> {
  const { headers, placements, bases } = layout;
  if (!Number.isSafeInteger(chunk) || chunk < 4096 || 2 * chunk > MAX_VIEW_BYTES) {
    throw outOfRange(`stagingBytes must be an integer in 4096..${MAX_VIEW_BYTES / 2} (its two halves are one typed array), got ${chunk}`);
  }
  device.activate();
  const pinned = driver.memAllocHost(2 * chunk);
  let staging: ArrayBuffer | undefined;
  let stream = 0n;
  const busy: Array<Promise<void> | undefined> = [undefined, undefined];
  try {
    staging = copyAddon.hostArrayBuffer(pinned, 2 * chunk);
    const halves = [new Uint8Array(staging, 0, chunk), new Uint8Array(staging, chunk, chunk)];
    // Blocking: ordered after the pool allocation, which was made on the legacy default stream.
    stream = driver.streamCreate(0);
    const base = whole.devicePointer;
    let k = 0;
    for (let f = 0; f < headers.length; f++) {
      const h = headers[f]!;
      if (h.dataBytes === 0) continue;
      const fh = await openRegularFileHandle(h.path, 'the safetensors file');
      try {
        for (const run of placements[f]!.runs) {
          for (let at = run.from; at < run.to; at += chunk) {
            const n = Math.min(chunk, run.to - at);
            await busy[k];  // the copy out of this half has finished
            const half = halves[k]!.subarray(0, n);
            await readExact(fh, h.path, half, h.dataOffset + at);
            device.activate();
            driver.memcpyHtoDAsync(base + BigInt(bases[f]! + at + run.shift), half, stream);
            busy[k] = whenStreamDone(stream);
            k ^= 1;
          }
        }
      } finally {
        await fh.close();
      }
    }
  } finally {
    // Copies still in flight read the staging memory: let them finish before it goes.
    if (stream !== 0n) await whenStreamDone(stream);
    if (staging) addon.detachArrayBuffer(staging);
    device.activate();
    if (stream !== 0n) driver.streamDestroy(stream);
    driver.memFreeHost(pinned);
  }
}

function viewsOf<B, A extends DeviceArray | HostArray>(layout: Layout, view: (offset: number, length: number) => B,
  make: (buffer: B, meta: { dtype: A['dtype']; shape: readonly number[] }) => A): TensorMap<A> {
  const map = new TensorMap<A>();
  try {
    layout.headers.forEach((h, f) => {
      h.tensors.forEach((t, i) => {
        const b = view(layout.bases[f]! + layout.placements[f]!.offsets[i]!, t.end - t.begin);
        try {
          map.set(t.name, make(b, { dtype: t.dtype, shape: t.shape }));
        } catch (e) {
          (b as { close(): void }).close();
          throw e;
        }
      });
    });
    return map;
  } catch (e) {
    map.close();
    throw e;
  }
}
