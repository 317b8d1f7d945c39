// Device buffers: a range of device memory with host copies, fills, device copies and sub-views.
// Several DeviceBuffer objects (a buffer and its views) can share one MemoryOwner, which is
// released when the last of them closes.
import { driver, whenStreamDone } from './driver.js';
import { Device, defaultDevice } from './device.js';
import { Stream, streamHandle } from './stream.js';
import { IpcError, checkViewBytes, outOfMemoryError } from '../errors.js';
import { raceWait, type WaitOptions } from '../abort.js';
import { trackLeak, untrackLeak, type LeakToken } from '../leak.js';
import { noteChange, reportDeviceMemory, type DeviceMemoryStats } from '../observe/hooks.js';
import { invalidArgValue, outOfRange, badNumber } from '../arg-errors.js';

export type { DeviceMemoryStats };

/**
 * Where a DeviceBuffer's memory comes from: allocated here, mapped from a legacy handle, a pool
 * allocation, or a pool buffer imported from another process.
 */
export type MemoryKind = 'device' | 'legacy-import' | 'pool' | 'pool-import';

/** What owns a range of device memory: allocated here, or mapped from another process. */
export interface MemoryOwner {
  readonly kind: MemoryKind;
  /** The device whose context allocated or mapped the memory (released there). */
  readonly device: Device;
  /** The device whose memory holds the bytes, when not `device` (memory imported for a peer GPU). */
  readonly residentDevice?: Device;
  readonly base: bigint;
  readonly byteLength: number;
  /**
   * Frees or unmaps the memory; called once, when the last buffer over it closes. `forced`: by
   * close({ force }), while peers may still map it (so it must not be reused).
   */
  release(forced?: boolean): void;
}

/** Every SharedMemory not yet released in this thread, for stats(). */
const liveMemory = new Set<SharedMemory>();

/**
 * Device memory of this thread: allocations, what peers lease, what only leases keep alive,
 * imports.
 */
export function deviceMemoryStats(): DeviceMemoryStats {
  const s: DeviceMemoryStats = { allocations: 0, allocatedBytes: 0, leased: 0, leasedBytes: 0, heldBytes: 0, imports: 0, importedBytes: 0 };
  for (const m of liveMemory) {
    const bytes = m.owner.byteLength;
    if (m.owner.kind === 'legacy-import' || m.owner.kind === 'pool-import') {
      s.imports++;
      s.importedBytes += bytes;
      continue;
    }
    s.allocations++;
    s.allocatedBytes += bytes;
    if (m.leases > 0) {
      s.leased++;
      s.leasedBytes += bytes;
      if (m.refs === m.leases) s.heldBytes += bytes;
    }
  }
  return s;
}
reportDeviceMemory(deviceMemoryStats); // the status record's device figures

/**
 * Reference count over a MemoryOwner. Open DeviceBuffers (a buffer and its views) and leases (a
 * peer that was sent the memory and has not released it) each hold one reference; the memory is
 * released when the last goes.
 */
export class SharedMemory {
  refs = 0;
  /** Peers currently holding this memory through a link. */
  leases = 0;
  released = false;
  #forced = false;
  // Made on first use: most memory never has a hook of either kind.
  #beforeRelease: Array<() => void> | undefined;
  #afterRelease: Array<() => void> | undefined;
  #whenReleased: Promise<void> | undefined;
  #resolveReleased: (() => void) | undefined;

  constructor(readonly owner: MemoryOwner) {
    liveMemory.add(this);
    noteChange(); // for `cuda-ipc status`
  }

  /** Run just before the memory is freed or unmapped (e.g. unregister a local export). */
  get beforeRelease(): Array<() => void> { return (this.#beforeRelease ??= []); }
  /** Run just after (e.g. tell the exporting peer that this process no longer maps it). */
  get afterRelease(): Array<() => void> { return (this.#afterRelease ??= []); }

  acquire(): void {
    this.refs++;
    // While peers lease it, whether only their leases keep it (status's heldBytes) just changed.
    if (this.leases > 0) noteChange();
  }

  drop(): void {
    if (--this.refs > 0 || this.released) {
      if (this.leases > 0 && !this.released) noteChange();
      return;
    }
    this.#release();
  }

  /** A reference held for a peer; the returned function ends it (idempotent). */
  lease(): () => void {
    this.refs++;
    this.leases++;
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      this.leases--;
      this.drop();
    };
  }

  /** Frees the memory now, whatever still references it (see DeviceBuffer.close({ force })). */
  forceRelease(): void {
    if (this.released) return;
    this.refs = 0;
    this.#forced = true;
    this.#release();
  }

  /** Resolves once the memory has been freed or unmapped. */
  whenReleased(): Promise<void> {
    if (this.released) return Promise.resolve();
    this.#whenReleased ??= new Promise<void>((resolve) => { this.#resolveReleased = resolve; });
    return this.#whenReleased;
  }

  #release(): void {
    this.released = true;
    liveMemory.delete(this);
    noteChange();
    try {
      const before = this.#beforeRelease;
      if (before) for (const hook of before.splice(0)) hook();
      this.owner.device.activate();
      this.owner.release(this.#forced);
    } finally {
      const after = this.#afterRelease;
      if (after) for (const hook of after.splice(0)) hook();
      this.#resolveReleased?.();
    }
  }
}

/** Host memory a copy reads from or writes to: any typed array, DataView, Buffer or ArrayBuffer. */
export type HostView = ArrayBufferView | ArrayBuffer;

/** Where in the buffer a copy starts. */
export interface CopyOptions {
  /** Byte offset inside this buffer. */
  offset?: number;
}

/** Options of `writeAsync` / `readAsync`: where in the buffer, and on which stream. */
export interface AsyncCopyOptions extends CopyOptions {
  /** Stream to queue the copy on (the legacy default stream when omitted). */
  stream?: Stream;
}

function byteLengthOf(v: HostView): number {
  return v instanceof ArrayBuffer ? v.byteLength : v.byteLength;
}

function checkCount(n: number, what: string): void {
  if (!Number.isSafeInteger(n) || n < 0) throw badNumber(n, `${what} must be a non-negative integer, got ${n}`);
}

// Hooks run when one particular buffer is closed (not its memory): how a received buffer's lease
// can end before an import that other messages share goes (link/device-transfers.ts).
const closeHooks = new WeakMap<DeviceBuffer, Array<() => void>>();

/** Runs `hook` once, when `buffer` is closed (at once if it already is). */
export function onBufferClose(buffer: DeviceBuffer, hook: () => void): void {
  if (buffer.closed) {
    hook();
    return;
  }
  const hooks = closeHooks.get(buffer);
  if (hooks) hooks.push(hook);
  else closeHooks.set(buffer, [hook]);
}

/**
 * Device memory: allocated here (`DeviceBuffer.allocate`, `pool.allocate`) or mapped from another
 * process (received over a link, `openIpcHandle`). Pointers are bigints; close() (or `using`)
 * frees or unmaps it, once no peer leases it.
 */
export class DeviceBuffer {
  /**
   * The device using this buffer: its pointer is valid in that device's context, and kernels on
   * it run there. For memory imported from another process, the importing process's working
   * device (see residentDevice for where the bytes are).
   */
  readonly device: Device;
  readonly byteLength: number;
  /** Offset of this buffer inside its owner's memory. */
  readonly ownerOffset: number;
  readonly #memory: SharedMemory;
  readonly #parent: DeviceBuffer | undefined;
  #pointer: bigint;
  readonly #leak: LeakToken;

  /** @internal Use DeviceBuffer.allocate, buffer.view, or the IPC open functions. */
  constructor(memory: SharedMemory, offset: number, byteLength: number, parent?: DeviceBuffer, origin?: string, device?: Device) {
    this.#memory = memory;
    this.device = device ?? parent?.device ?? memory.owner.device;
    this.ownerOffset = offset;
    this.byteLength = byteLength;
    this.#pointer = offset === 0 ? memory.owner.base : memory.owner.base + BigInt(offset);
    this.#parent = parent;
    memory.acquire();
    this.#leak = trackLeak(this, 'A DeviceBuffer', memory, origin, byteLength);
  }

  /**
   * Allocates `bytes` of device memory (cuMemAlloc) in the device's primary context (default: the
   * working device, else device 0).
   * @throws CudaError CUDA_ERROR_OUT_OF_MEMORY (its message names the size) when the device has not
   * that much free; RangeError ERR_OUT_OF_RANGE for a size that is not a positive safe integer.
   */
  static allocate(bytes: number, options: { device?: Device } = {}): DeviceBuffer {
    checkCount(bytes, 'bytes');
    if (bytes === 0) throw outOfRange('cannot allocate 0 bytes; ask for at least 1');
    const device = options.device ?? defaultDevice();
    device.activate();
    let base: bigint;
    try {
      base = driver.memAlloc(bytes);
    } catch (e) {
      throw outOfMemoryError(e, `DeviceBuffer.allocate on device ${device.ordinal}`, bytes);
    }
    const owner: MemoryOwner = { kind: 'device', device, base, byteLength: bytes, release: () => driver.memFree(base) };
    return new DeviceBuffer(new SharedMemory(owner), 0, bytes);
  }

  /** The device whose memory holds the bytes: `device` itself, unless it was imported for a peer GPU. */
  get residentDevice(): Device { return this.#memory.owner.residentDevice ?? this.#memory.owner.device; }

  /** How the memory came to be here: allocated, imported through a legacy handle, or a pool. */
  get kind(): MemoryKind { return this.#memory.owner.kind; }

  /** True when the memory was mapped from another process (imported), not allocated here. */
  get isMapped(): boolean {
    const k = this.#memory.owner.kind;
    return k === 'legacy-import' || k === 'pool-import';
  }

  /** @internal The shared owner, for the IPC modules. */
  get memory(): SharedMemory {
    this.#assertOpen();
    return this.#memory;
  }

  /** The parent buffer of a view (kept alive by the view). */
  get parent(): DeviceBuffer | undefined { return this.#parent; }

  /** The device address of the first byte. Throws once closed. */
  get devicePointer(): bigint {
    this.#assertOpen();
    return this.#pointer;
  }

  get closed(): boolean { return this.#pointer === 0n || this.#memory.released; }

  #assertOpen(): void {
    // A forced close elsewhere frees the memory under every view of it.
    if (this.#pointer === 0n || this.#memory.released) {
      throw new IpcError('ERR_CLOSED', `this ${this.kind} buffer of ${this.byteLength} bytes was closed; keep it open while you use it`);
    }
  }

  #range(offset: number, length: number, what: string): bigint {
    this.#assertOpen();
    checkCount(offset, 'offset');
    if (offset + length > this.byteLength) {
      throw outOfRange(`${what} of ${length} bytes at offset ${offset} does not fit in a buffer of ${this.byteLength} bytes`);
    }
    this.device.activate();
    return offset === 0 ? this.#pointer : this.#pointer + BigInt(offset);
  }

  /** A host array for read() of every byte: typed errors where one cannot be made. */
  #copyOfAll(): Uint8Array {
    this.#assertOpen();
    checkViewBytes(this.byteLength, 'DeviceBuffer.read()', 'read into arrays of your own in pieces with read(dst, offset)');
    try {
      return new Uint8Array(this.byteLength);
    } catch (e) {
      throw outOfMemoryError(e, 'DeviceBuffer.read()', this.byteLength);
    }
  }

  /** Copies host bytes into the buffer at `offset`; returns once they are in device memory. */
  write(source: HostView, offset = 0): void {
    driver.memcpyHtoD(this.#range(offset, byteLengthOf(source), 'a write'), source);
    // cuMemcpyHtoD from pageable memory returns once the bytes are staged, before the DMA lands:
    // another process reading right after would see old data (seen on the GPU machine).
    driver.streamSynchronize(0n);
  }

  /** A new Uint8Array holding a copy of every byte. */
  read(): Uint8Array;
  /** Fills `destination` (as many bytes as it holds) from `offset` of the buffer. */
  read(destination: HostView, offset?: number): void;
  /**
   * Copies from the buffer at `offset` into `destination` (blocking); with no argument, returns a
   * copy of all bytes.
   * @throws IpcError ERR_VIEW_TOO_LARGE (no argument) for a buffer larger than one typed array can
   * be (`buffer.constants.MAX_LENGTH`, 4 GiB on Node 20): read it in pieces with read(dst, offset);
   * ERR_CLOSED once closed. RangeError ERR_OUT_OF_RANGE for a range outside the buffer.
   */
  read(destination?: HostView, offset = 0): Uint8Array | void {
    const dst = destination ?? this.#copyOfAll();
    driver.memcpyDtoH(dst, this.#range(offset, byteLengthOf(dst), 'a read'));
    if (!destination) return dst as Uint8Array;
  }

  /** Queues a host-to-device copy; resolves once it has finished. `source` must not change until then. */
  writeAsync(source: HostView, options: AsyncCopyOptions = {}): Promise<void> {
    const ptr = this.#range(options.offset ?? 0, byteLengthOf(source), 'a write');
    const s = streamHandle(options.stream);
    driver.memcpyHtoDAsync(ptr, source, s);
    return whenStreamDone(s, source);
  }

  /** Queues a device-to-host copy; resolves once `destination` holds the bytes. */
  readAsync(destination: HostView, options: AsyncCopyOptions = {}): Promise<void> {
    const ptr = this.#range(options.offset ?? 0, byteLengthOf(destination), 'a read');
    const s = streamHandle(options.stream);
    driver.memcpyDtoHAsync(destination, ptr, s);
    return whenStreamDone(s, destination);
  }

  /** Sets every byte to `value` (0..255) and returns once done; with a stream, only queues it there. */
  fill(value: number, options: { stream?: Stream } = {}): void {
    if (!Number.isInteger(value) || value < 0 || value > 255) {
      throw badNumber(value, `fill value must be a byte (0..255), got ${value}; use fillUint32 for 32-bit words`);
    }
    const ptr = this.#range(0, this.byteLength, 'a fill');
    if (options.stream) driver.memsetD8Async(ptr, value, this.byteLength, options.stream.handle);
    else {
      driver.memsetD8(ptr, value, this.byteLength);
      driver.streamSynchronize(0n); // cuMemset* returns before the memory is set
    }
  }

  /** Sets every 32-bit word to `value`; the length and address must be multiples of 4. */
  fillUint32(value: number, options: { stream?: Stream } = {}): void {
    if (!Number.isInteger(value) || value < 0 || value > 0xffffffff) {
      throw badNumber(value, `fillUint32 value must be in 0..2^32-1, got ${value}`);
    }
    if (this.byteLength % 4 !== 0 || this.ownerOffset % 4 !== 0) {
      throw invalidArgValue(`fillUint32 needs a 4-byte aligned buffer whose length is a multiple of 4 (length ${this.byteLength}, offset ${this.ownerOffset})`);
    }
    const ptr = this.#range(0, this.byteLength, 'a fill');
    if (options.stream) driver.memsetD32Async(ptr, value, this.byteLength / 4, options.stream.handle);
    else {
      driver.memsetD32(ptr, value, this.byteLength / 4);
      driver.streamSynchronize(0n);
    }
  }

  /** Device-to-device copy from `source` into this buffer; returns once done, or with a stream only queues it. */
  copyFrom(source: DeviceBuffer, options: { sourceOffset?: number; offset?: number; byteLength?: number; stream?: Stream } = {}): void {
    const srcOffset = options.sourceOffset ?? 0;
    const length = options.byteLength ?? Math.min(source.byteLength - srcOffset, this.byteLength - (options.offset ?? 0));
    checkCount(length, 'byteLength');
    const src = source.#range(srcOffset, length, 'a copy source');
    const dst = this.#range(options.offset ?? 0, length, 'a copy destination');
    if (options.stream) driver.memcpyDtoDAsync(dst, src, length, options.stream.handle);
    else {
      driver.memcpyDtoD(dst, src, length);
      driver.streamSynchronize(0n); // device-to-device copies are asynchronous to the host
    }
  }

  /** A buffer over `length` bytes at `offset` of this one; it keeps this buffer's memory alive. */
  view(offset: number, length = this.byteLength - offset): DeviceBuffer {
    checkCount(length, 'length');
    this.#range(offset, length, 'a view');
    return new DeviceBuffer(this.#memory, this.ownerOffset + offset, length, this, undefined, this.device);
  }

  /** Number of peers that were sent this memory and still map it. */
  get leases(): number { return this.#memory.leases; }

  /** Resolves once the memory itself is freed: after close() of every buffer over it and the end
   * of every lease. `options`: give up waiting on a signal (AbortError) or after a timeout (ERR_TIMEOUT). */
  released(options?: WaitOptions): Promise<void> { return raceWait(this.#memory.whenReleased(), options, 'DeviceBuffer.released'); }

  /**
   * Releases this buffer. The memory goes when its last buffer or view is closed and every peer
   * it was sent to has released it. `force` frees it now instead: peers that still map it may
   * then read freed memory, or memory reused for other data, without any error. Idempotent.
   */
  close(options?: { force?: boolean }): void {
    if (this.#pointer === 0n) return;
    this.#pointer = 0n;
    untrackLeak(this.#leak);
    const hooks = closeHooks.get(this);
    if (hooks) {
      closeHooks.delete(this);
      for (const hook of hooks) hook();
    }
    if (options?.force && !this.#memory.released) {
      if (this.#memory.leases > 0) {
        process.emitWarning(`force-closing a ${this.kind} buffer of ${this.#memory.owner.byteLength} bytes that ${this.#memory.leases} peer(s) still map: ` +
          'they may read freed or reused memory', { code: 'CUDA_IPC_FORCED_CLOSE' });
      }
      this.#memory.forceRelease();
      return;
    }
    this.#memory.drop();
  }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void { this.close(); }
}
