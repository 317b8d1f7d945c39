// IPC memory pools (cuMemPoolCreate with POSIX file descriptors). The pool's fd is the capability:
// only a process given it can map the pool's memory. After that, each buffer travels as 64 bytes
// of export data, and importing it costs well under a microsecond.
import { randomBytes } from 'node:crypto';
import { closeSync, fstatSync } from 'node:fs';
import { driver, Flags, HandleType } from '../cuda/driver.js';
import { Device, assertPeerReachable, importingDevice } from '../cuda/device.js';
import { DeviceBuffer, SharedMemory, type MemoryOwner } from '../cuda/buffer.js';
import { Stream, streamHandle } from '../cuda/stream.js';
import { CudaError, IpcError, fdLimitError, outOfMemoryError } from '../errors.js';
import { trackLeak, untrackLeak, type LeakToken } from '../leak.js';
import { addon } from '../native/addon.js';
import { BlockStash } from './block-stash.js';
import { PreparedExports } from './prepared-exports.js';
import { invalidArgValue, badNumber } from '../arg-errors.js';

/** Options of `device.createIpcPool()` / IpcPool.create(). */
export interface IpcPoolOptions {
  /** Upper bound of the pool's reserved memory in bytes (0: the driver's default). */
  maxSize?: number;
  /** Bytes the pool keeps reserved after frees instead of returning them (default: all of them). */
  releaseThreshold?: bigint;
  /**
   * Released blocks kept, with their export data, for the next allocate() of the same size on
   * the default stream (block-stash.ts; default 8; 0: free every block as it is released).
   */
  recycleBlocks?: number;
  /** Bytes those blocks may hold in all; larger blocks are never kept (default 256 MiB). */
  recycleBytes?: number;
  /**
   * Make each new allocation's export data on the addon's worker thread right away, so that its
   * first send finds it ready (prepared-exports.ts; default true).
   */
  prepareExports?: boolean;
}

const RECYCLE_BLOCKS = 8;
const RECYCLE_BYTES = 256 << 20;

// This thread's prepared exports (the addon runs one export thread per JS thread, made on first use).
let prepared: PreparedExports | undefined;
let preparingFailed = false;
function preparedExports(): PreparedExports {
  return (prepared ??= new PreparedExports({ start: (t) => driver.exportWorkerStart(t), post: (s) => driver.exportWorkerPost(s) }));
}

/** How this thread's pool sends got their export data (tests, the benchmark). */
export interface PoolExportStats {
  /** Made by the worker thread ahead of the send. */
  prepared: number;
  /** Made on the send path (no request, taken back before the worker started, or failed). */
  inline: number;
  /** Kept from an earlier send of the same allocation (re-sends, recycled blocks). */
  kept: number;
}
const exportStats: PoolExportStats = { prepared: 0, inline: 0, kept: 0 };
/** @internal A copy of the counts so far. */
export function poolExportStats(): PoolExportStats {
  return { ...exportStats };
}

declare module '../cuda/device.js' {
  interface Device {
    /** A memory pool whose buffers can be sent to other processes over links. */
    createIpcPool(options?: IpcPoolOptions): IpcPool;
  }
}

// Exported pool handles are fds of the NVIDIA control device (/dev/nvidiactl, character device
// major 195, as seen on driver 580). Anything else is refused before it reaches the driver, which
// answers CUDA_ERROR_UNKNOWN for, say, /dev/null.
const NVIDIA_CHAR_MAJOR = 195;

function assertPoolFd(fd: number): void {
  let st;
  try {
    st = fstatSync(fd);
  } catch (e) {
    throw invalidArgValue(`fd ${fd} is not an open file descriptor`, { cause: e });
  }
  const major = Math.floor(st.rdev / 256) & 0xfff;
  if (!st.isCharacterDevice() || major !== NVIDIA_CHAR_MAJOR) {
    const what = st.isFile() ? 'a regular file' : st.isCharacterDevice() ? `character device ${major}:${st.rdev & 0xff}` : st.isSocket() ? 'a socket' : st.isFIFO() ? 'a pipe' : 'not a device';
    throw invalidArgValue(`fd ${fd} is not a CUDA memory pool handle (it is ${what}); pass the fd a pool's owner exported`);
  }
}

const byExport = (data: Uint8Array) => Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString('latin1');

/** Memory that a pool buffer lives in: an allocation here, or a pointer imported from a peer. */
interface PoolMemoryOwner extends MemoryOwner {
  readonly kind: 'pool' | 'pool-import';
  readonly pool: IpcPool;
  /** For imports: the export data it was imported from (as a latin1 string: a key anyway, and no
   *  typed array per import), so that it can be sent on unchanged. */
  readonly exportKey?: string;
  /** For allocations: their export data, once a send asked for it (kept: a buffer is often re-sent). */
  exportData?: Uint8Array;
}

// For the owners below, which are not the pool's own code: a buffer over the pool went away.
let dropPoolUser: (pool: IpcPool) => void;
let forgetPointerImport: (pool: IpcPool, key: string) => void;
let releaseAllocation: (pool: IpcPool, block: PoolAllocation, forced: boolean) => void;

// The memory owners of pool buffers, as classes rather than closures: one object per allocation.
class PoolAllocation implements PoolMemoryOwner {
  readonly kind = 'pool' as const;
  exportData?: Uint8Array;
  /** The request for its export data on the worker thread (prepared-exports.ts), or -1. */
  exportSlot = -1;
  constructor(readonly pool: IpcPool, readonly device: Device, readonly base: bigint, readonly byteLength: number) {}
  /** The last buffer over it closed and every lease ended: back to the pool's stash, or freed. */
  release(forced?: boolean): void {
    releaseAllocation(this.pool, this, forced === true);
  }
  /** Ends the request for its export data, keeping the data when `keep` and the worker made it. */
  settleExport(keep: boolean): void {
    const slot = this.exportSlot;
    if (slot < 0) return;
    this.exportSlot = -1;
    const out = keep && !this.exportData ? new Uint8Array(64) : undefined;
    if (preparedExports().take(slot, out) && out) this.exportData = out;
  }
}

/** One buffer of an imported pool, mapped in this process (Python: _PointerImport, ipc/pool.py). */
class PointerImport implements PoolMemoryOwner {
  readonly kind = 'pool-import' as const;
  constructor(
    readonly pool: IpcPool,
    readonly device: Device,
    readonly residentDevice: Device,
    readonly base: bigint,
    readonly byteLength: number,
    readonly exportKey: string,
  ) {}
  release(): void {
    forgetPointerImport(this.pool, this.exportKey);
    driver.memFree(this.base);
    dropPoolUser(this.pool);
  }
}

/**
 * An IPC memory pool (cuMemPoolCreate with POSIX fds): its buffers travel over links as 64 bytes
 * each once the pool's fd went to the peer. Made by `device.createIpcPool()`, or imported from
 * another process.
 */
export class IpcPool {
  /** The device whose memory the pool's allocations live on. */
  readonly device: Device;
  /** Random id naming this pool across processes (the same on both sides of an import). */
  readonly id: string;
  /** The id as 16 bytes, as links send it. */
  readonly idBytes: Uint8Array;
  /** True for a pool imported from another process: it maps memory, it cannot allocate. */
  readonly imported: boolean;
  readonly maxSize: number;
  // The device whose context makes this pool's driver calls: the owner's device, or for an import
  // the first device it was imported for (no context is created on a GPU nobody here uses).
  readonly #home: Device;
  // Devices granted access to an imported pool (cuMemPoolSetAccess); an imported pool starts
  // with none, not even the one it lives on. Own pools: devices other than their own.
  readonly #access = new Set<Device>();
  #handle: bigint;
  // The pool's shareable fd: exported at creation, or the one an import came from (so that its
  // buffers can be sent on). Links send duplicates.
  #fd: number;
  #closeRequested = false;
  /** Allocations and imports alive, stashed blocks included: the pool is destroyed at 0 once closed. */
  #users = 0;
  readonly #stash: BlockStash<PoolAllocation>;
  readonly #prepare: boolean;
  // Imported pointers by export bytes: a second import of one buffer must share the first mapping,
  // or freeing either would unmap both.
  readonly #imports = new Map<string, SharedMemory>();
  /** What a leak warning says about where an imported buffer came from (made once). */
  #importOrigin: string | undefined;
  readonly #leak: LeakToken;

  private constructor(device: Device, handle: bigint, id: string, imported: boolean, maxSize: number, fd: number, home: Device, options: IpcPoolOptions = {}) {
    this.device = device;
    this.#stash = new BlockStash(options.recycleBlocks ?? RECYCLE_BLOCKS, options.recycleBytes ?? RECYCLE_BYTES);
    this.#prepare = options.prepareExports ?? true;
    this.#home = home;
    this.#handle = handle;
    this.#fd = fd;
    this.id = id;
    this.idBytes = Uint8Array.from(Buffer.from(id, 'hex'));
    this.imported = imported;
    this.maxSize = maxSize;
    this.#leak = trackLeak(this, `An ${imported ? 'imported ' : ''}IpcPool`, () => {
      home.activate();
      driver.memPoolDestroy(handle);
      if (fd >= 0) closeSync(fd);
    });
  }

  /** Creates a pool on `device` (the same as `device.createIpcPool(options)`). */
  static create(device: Device, options: IpcPoolOptions = {}): IpcPool {
    const maxSize = options.maxSize ?? 0;
    if (!Number.isSafeInteger(maxSize) || maxSize < 0) {
      throw badNumber(maxSize, `maxSize must be a non-negative integer number of bytes, got ${maxSize}`);
    }
    for (const key of ['recycleBlocks', 'recycleBytes'] as const) {
      const v = options[key];
      if (v !== undefined && !(Number.isSafeInteger(v) && v >= 0)) {
        throw badNumber(v, `${key} must be a non-negative integer, got ${v}`);
      }
    }
    const caps = device.capabilities;
    if (!caps.memoryPools || !caps.posixFdPoolHandles) {
      throw new IpcError('ERR_UNSUPPORTED',
        `device ${device.ordinal} (${device.name}) has no ${caps.memoryPools ? 'POSIX-fd pool handles' : 'memory pools'}; ` +
        'share memory with legacy handles (buffer.ipcHandle()) instead');
    }
    device.activate();
    const handle = driver.memPoolCreate(device.ordinal, HandleType.POSIX_FD, maxSize);
    let fd = -1;
    try {
      // Keep freed memory reserved: returning it to the driver on every sync costs far more than
      // the handoff itself.
      driver.memPoolSetReleaseThreshold(handle, options.releaseThreshold ?? 0xffffffffffffffffn);
      // The driver refuses to export pointers of a pool that has not been exported (measured on
      // driver 580: CUDA_ERROR_INVALID_VALUE), so export once now and hand out duplicates.
      fd = driver.memPoolExportToFd(handle);
    } catch (e) {
      driver.memPoolDestroy(handle);
      throw e;
    }
    return new IpcPool(device, handle, randomBytes(16).toString('hex'), false, maxSize, fd, device, options);
  }

  /**
   * Imports a pool living on `device` from the fd a peer sent, with access for `accessFor` (default:
   * `device`; another GPU needs peer access to it). Takes ownership of the fd (closed with the pool).
   */
  static importFromFd(fd: number, device: Device, id: string, maxSize: number, options: { accessFor?: Device } = {}): IpcPool {
    const user = options.accessFor ?? device;
    try {
      assertPoolFd(fd);
      assertPeerReachable(user, device);
      user.activate();
    } catch (e) {
      closeSync(fd);
      throw e;
    }
    let handle: bigint;
    try {
      handle = driver.memPoolImportFromFd(fd);
    } catch (e) {
      closeSync(fd);
      if (e instanceof CudaError) {
        throw new IpcError('ERR_HANDLE_STALE', `the driver refused fd ${fd} as a memory pool handle (${e.code}): its pool was destroyed, or it belongs to another driver instance`, { cause: e });
      }
      throw e;
    }
    try {
      driver.memPoolSetAccess(handle, user.ordinal, Flags.ACCESS_READWRITE);
    } catch (e) {
      driver.memPoolDestroy(handle);
      closeSync(fd);
      throw e;
    }
    const pool = new IpcPool(device, handle, id, true, maxSize, fd, user);
    pool.#access.add(user);
    return pool;
  }

  /**
   * Lets kernels and copies on `device` use this pool's memory (cuMemPoolSetAccess, read and
   * write). Imports through links do it for the importing process's working device; call it for
   * any other device this process uses the pool's buffers on. Idempotent. Throws
   * ERR_PEER_UNREACHABLE where `device` cannot reach the device the pool lives on.
   */
  grantAccess(device: Device): void {
    const pool = this.handle;
    if ((!this.imported && device === this.device) || this.#access.has(device)) return;
    assertPeerReachable(device, this.device);
    this.#home.activate();
    driver.memPoolSetAccess(pool, device.ordinal, Flags.ACCESS_READWRITE);
    this.#access.add(device);
  }

  /** Whether buffers of this pool can be used on `device` in this process. */
  accessibleFrom(device: Device): boolean {
    return (!this.imported && device === this.device) || this.#access.has(device);
  }

  get handle(): bigint {
    if (this.#handle === 0n || this.#closeRequested) {
      throw new IpcError('ERR_CLOSED', `this ${this.imported ? 'imported ' : ''}pool was closed`);
    }
    return this.#handle;
  }

  get closed(): boolean { return this.#closeRequested; }

  /**
   * A buffer of `bytes` from the pool, allocated in stream order (the legacy default stream when
   * none is given): work queued on that stream may use it at once. On the default stream it may be
   * a released block of the same size (block-stash.ts), with its old contents.
   * @throws CudaError CUDA_ERROR_OUT_OF_MEMORY (its message names the size) when the device (or
   * the pool's maxSize) has not that much; RangeError ERR_OUT_OF_RANGE for a size that is not a
   * positive safe integer; IpcError ERR_IMPORTED_POOL on a pool another process made.
   */
  allocate(bytes: number, options?: { stream?: Stream }): DeviceBuffer {
    if (this.imported) {
      throw new IpcError('ERR_IMPORTED_POOL',
        'an imported pool cannot allocate: only the process that created it can. Allocate from a pool of your own (device.createIpcPool())');
    }
    if (!Number.isSafeInteger(bytes) || bytes <= 0) {
      throw badNumber(bytes, `bytes must be a positive integer, got ${bytes}`);
    }
    const pool = this.handle;
    const stream = streamHandle(options?.stream);
    const kept = stream === 0n ? this.#stash.take(bytes) : undefined;
    if (kept) return new DeviceBuffer(new SharedMemory(kept), 0, bytes);
    this.device.activate();
    let base: bigint;
    try {
      base = driver.memAllocFromPoolAsync(bytes, pool, stream);
    } catch (e) {
      // Stashed blocks are memory the pool could otherwise hand out: give them back, try again.
      const what = `pool.allocate on device ${this.device.ordinal}`;
      if (!(e instanceof CudaError && e.code === 'CUDA_ERROR_OUT_OF_MEMORY') || this.#stash.count === 0) throw outOfMemoryError(e, what, bytes);
      this.#freeBlocks(this.#stash.drain());
      try {
        base = driver.memAllocFromPoolAsync(bytes, pool, stream);
      } catch (again) {
        throw outOfMemoryError(again, what, bytes);
      }
    }
    this.#users++;
    const owner = new PoolAllocation(this, this.device, base, bytes);
    if (this.#prepare && !preparingFailed) {
      try {
        owner.exportSlot = preparedExports().prepare(base, this.device.primaryContext);
      } catch (e) {
        // Sends export inline instead (and report what the driver says then).
        preparingFailed = true;
        process.emitWarning(`pool exports are not prepared ahead: ${String((e as Error)?.message ?? e)}`, { code: 'CUDA_IPC_PREPARED_EXPORTS' });
      }
    }
    return new DeviceBuffer(new SharedMemory(owner), 0, bytes);
  }

  /** Released blocks kept for reuse (allocate() on the default stream takes them first). */
  get recycled(): { blocks: number; bytes: number } {
    return { blocks: this.#stash.count, bytes: this.#stash.bytes };
  }

  #releaseAllocation(block: PoolAllocation, forced: boolean): void {
    // Before the memory can go: the worker must not be exporting it, now or later.
    block.settleExport(!forced);
    // A forced close frees at once (peers may still map it: it must not be handed out again).
    this.#freeBlocks(forced || this.#closeRequested ? [block] : this.#stash.put(block));
  }

  /** Frees blocks in stream order on the default stream (their device's context is current). */
  #freeBlocks(blocks: PoolAllocation[]): void {
    for (const b of blocks) {
      driver.memFreeAsync(b.base, 0n);
      this.#dropUser();
    }
  }

  /**
   * A new fd for this pool, owned by the caller (links send it and close it). Works after close()
   * while buffers of the pool live: a peer needs the pool to map a buffer sent from it.
   */
  exportFd(): number {
    if (this.#handle === 0n) throw new IpcError('ERR_CLOSED', `this ${this.imported ? 'imported ' : ''}pool was destroyed`);
    try {
      return addon.dup(this.#fd);
    } catch (e) {
      throw fdLimitError(e, 'IpcPool.exportFd');
    }
  }

  /**
   * Maps a buffer a peer exported from this (imported) pool; repeated imports share one mapping.
   * The buffer is for `options.device` (default: the working device, else the device the pool
   * lives on), which is granted access to the pool first.
   */
  importBuffer(exportData: Uint8Array, byteLength: number, offset = 0, length = byteLength - offset, options?: { device?: Device }): DeviceBuffer {
    const pool = this.handle;
    if (exportData.byteLength !== 64) throw invalidArgValue(`pool export data is 64 bytes, got ${exportData.byteLength}`);
    if (!Number.isSafeInteger(byteLength) || byteLength <= 0 || offset < 0 || length < 0 || offset + length > byteLength) {
      throw new IpcError('ERR_OUT_OF_RANGE', `a range of ${length} bytes at ${offset} does not fit a pool buffer of ${byteLength} bytes`);
    }
    const user = importingDevice(this.device, options?.device);
    this.grantAccess(user);
    const key = byExport(exportData);
    let memory = this.#imports.get(key);
    if (!memory || memory.released) {
      user.activate();
      let base: bigint;
      try {
        base = driver.memPoolImportPointer(pool, exportData);
      } catch (e) {
        if (e instanceof CudaError && e.code === 'CUDA_ERROR_INVALID_VALUE') {
          throw new IpcError('ERR_HANDLE_STALE',
            'the pool buffer could not be imported: the export data is not from this pool, or the owner freed the buffer', { cause: e });
        }
        throw e;
      }
      this.#users++;
      // One mapping per process, whichever device imported it first; the pool's access list says
      // which devices may use it.
      memory = new SharedMemory(new PointerImport(this, user, this.device, base, byteLength, key));
      this.#imports.set(key, memory);
    }
    this.#importOrigin ??= `by importing from pool ${this.id}, e.g. out of a link message`;
    return new DeviceBuffer(memory, offset, length, undefined, this.#importOrigin, user);
  }

  /**
   * Returns reserved but unused memory to the device until at most `bytes` stay reserved; frees
   * the stashed blocks first (and waits for the default stream, where their frees are ordered).
   */
  trimTo(bytes = 0): void {
    if (this.imported) throw new IpcError('ERR_IMPORTED_POOL', 'only the pool\'s owner can trim it');
    const pool = this.handle;
    this.device.activate();
    if (this.#stash.count > 0) {
      this.#freeBlocks(this.#stash.drain());
      driver.streamSynchronize(0n);
    }
    driver.memPoolTrimTo(pool, bytes);
  }

  /** Keeps the pool alive past close() until the returned function runs (a peer's lease). */
  hold(): () => void {
    this.handle; // throws once closed
    this.#users++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.#dropUser();
    };
  }

  /** Run once the pool is destroyed (e.g. tell the peer it came from that it is no longer used). */
  readonly afterDestroy: Array<() => void> = [];

  /** Number of live buffers allocated from or imported through this pool (stashed blocks not counted). */
  get liveBuffers(): number { return this.#users - this.#stash.count; }

  #dropUser(): void {
    if (--this.#users === 0 && this.#closeRequested) this.#destroy();
  }

  #destroy(): void {
    const h = this.#handle;
    if (h === 0n) return;
    this.#handle = 0n;
    this.#home.activate();
    try {
      driver.memPoolDestroy(h);
      if (this.#fd >= 0) closeSync(this.#fd);
      this.#fd = -1;
    } finally {
      for (const hook of this.afterDestroy.splice(0)) hook();
    }
  }

  /** Closes the pool; it is destroyed once its last buffer is closed. Idempotent. */
  close(): void {
    if (this.#closeRequested) return;
    this.#closeRequested = true;
    untrackLeak(this.#leak);
    if (this.#stash.count > 0) {
      this.device.activate();
      this.#freeBlocks(this.#stash.drain());  // the last one may destroy the pool
    }
    if (this.#users === 0) this.#destroy();
  }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void { this.close(); }

  static {
    dropPoolUser = (pool) => pool.#dropUser();
    releaseAllocation = (pool, block, forced) => pool.#releaseAllocation(block, forced);
    forgetPointerImport = (pool, key) => { pool.#imports.delete(key); };
  }
}

Device.prototype.createIpcPool = function createIpcPool(this: Device, options?: IpcPoolOptions): IpcPool {
  return IpcPool.create(this, options);
};

/** The pool a buffer's memory belongs to, if it came from one. */
export function poolOf(buffer: DeviceBuffer): IpcPool | undefined {
  const owner = buffer.memory.owner as Partial<PoolMemoryOwner>;
  return owner.kind === 'pool' || owner.kind === 'pool-import' ? owner.pool : undefined;
}

/**
 * The 64-byte export data of a pool buffer's allocation. A buffer imported from a peer's pool
 * is sent on with the export data it came with (the receiver imports the same pool).
 */
export function exportPoolBuffer(buffer: DeviceBuffer): { pool: IpcPool; exportData: Uint8Array; allocationSize: number } {
  const owner = buffer.memory.owner as PoolMemoryOwner;
  if (owner.kind === 'pool-import') return { pool: owner.pool, exportData: Buffer.from(owner.exportKey!, 'latin1'), allocationSize: owner.byteLength };
  if (owner.kind !== 'pool') throw new IpcError('ERR_NOT_TRANSFERABLE', `a ${owner.kind} buffer is not from an IPC pool`);
  const allocation = owner as PoolAllocation;
  // Kept from an earlier send, made by the worker thread since the allocation, or made now.
  let exportData = allocation.exportData;
  if (exportData) exportStats.kept++;
  else {
    allocation.settleExport(true);
    exportData = allocation.exportData;
    if (exportData) exportStats.prepared++;
    else {
      exportStats.inline++;
      buffer.device.activate();
      exportData = allocation.exportData = driver.memPoolExportPointer(owner.base, new Uint8Array(64));
    }
  }
  return { pool: owner.pool, exportData, allocationSize: owner.byteLength };
}
