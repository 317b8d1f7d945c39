// Legacy CUDA IPC handles (cuIpcGetMemHandle): 64-byte bearer tokens for a whole allocation, the
// path that CuPy, Numba and PyTorch also speak. A descriptor carries the handle of the allocation
// plus the offset and length of the exported range, because the handle of an interior pointer is
// the handle of its allocation's base.
import { processAlive } from '../processes.js';
import { driver, PointerAttr, MemoryType } from '../cuda/driver.js';
import { Device, defaultDevice, importingDevice } from '../cuda/device.js';
import { DeviceBuffer, SharedMemory, type MemoryOwner } from '../cuda/buffer.js';
import type { ImportCacheStats } from '../native/driver-types.js';
import { CudaError, IpcError } from '../errors.js';
import {
  legacyHandleDescriptor, validateDescriptor, parseDescriptorJson, decodeDescriptor, encodeCheckedDescriptor,
  DESCRIPTOR_VERSION, type LegacyHandleDescriptor,
} from './descriptor.js';
import type { ArrayMetaInit } from './array-meta.js';
import { badNumber, outOfRange } from '../arg-errors.js';

/** Options of `buffer.ipcHandle()`. */
export interface IpcHandleOptions {
  /** dtype/shape/strides to describe the bytes as an array (for openIpcArray and Python). */
  array?: ArrayMetaInit;
}

declare module '../cuda/buffer.js' {
  interface DeviceBuffer {
    /** A descriptor that another process opens with openIpcHandle (or Python, from its JSON). */
    ipcHandle(options?: IpcHandleOptions): LegacyHandleDescriptor;
  }
}

const handleKey = (h: Uint8Array) => Buffer.from(h.buffer, h.byteOffset, h.byteLength).toString('latin1');

// Allocations this thread exported, by handle: an open in this thread becomes a view of them.
// Held strongly: each entry goes when its memory is released (which the leak backstop also does
// for a buffer that is never closed), and the memory is held anyway until then.
const localExports = new Map<string, SharedMemory>();
// The handle of each exported allocation, computed once.
const handleOfMemory = new WeakMap<SharedMemory, Uint8Array>();

/** Memory mapped from a legacy handle: what it was opened from, so that it can be shared onward unchanged. */
interface LegacyImportOwner extends MemoryOwner {
  readonly kind: 'legacy-import';
  readonly handle: Uint8Array;
  readonly pid: number;
}

function notExportable(why: string, cause?: unknown): IpcError {
  return new IpcError('ERR_NOT_EXPORTABLE', why, { cause });
}

/** Checks that `pointer` is plain device memory that cuIpcGetMemHandle accepts. */
function assertDeviceMemory(pointer: bigint): void {
  let type: number;
  try {
    type = driver.pointerGetAttributeInt(PointerAttr.MEMORY_TYPE, pointer);
  } catch (e) {
    throw notExportable(`0x${pointer.toString(16)} is not memory that CUDA knows: allocate it with DeviceBuffer.allocate`, e);
  }
  if (driver.pointerGetAttributeInt(PointerAttr.IS_MANAGED, pointer) !== 0) {
    throw notExportable('managed memory (cuMemAllocManaged) cannot be shared through CUDA IPC handles; ' +
      'allocate with DeviceBuffer.allocate or from an IPC pool instead');
  }
  if (type === MemoryType.HOST) {
    throw notExportable('pinned host memory (cuMemAllocHost) cannot be shared through CUDA IPC handles; ' +
      'share host memory with HostBuffer (memfd) instead');
  }
  if (driver.pointerGetAttributeU64(PointerAttr.MEMPOOL_HANDLE, pointer) !== 0n) {
    throw notExportable('memory from a memory pool has no legacy IPC handle; send the pool buffer over a link instead');
  }
}

function describe(handle: Uint8Array, offset: number, byteLength: number, device: Device, pid: number,
  array: ArrayMetaInit | undefined): LegacyHandleDescriptor {
  return legacyHandleDescriptor({ handle, offset, byteLength, deviceUuid: device.uuid, pid, ...(array ? { array } : {}) });
}

/**
 * A descriptor for `byteLength` bytes of device memory at `pointer`, which may come from any
 * library (PyTorch, CuPy, …) as long as it is plain cuMemAlloc-style device memory. The
 * descriptor names the GPU the memory lives on, as the driver reports it (`options.device` only
 * says which context to ask in).
 */
export function exportPointer(pointer: bigint, byteLength: number, options: IpcHandleOptions & { device?: Device } = {}): LegacyHandleDescriptor {
  (options.device ?? defaultDevice()).activate();
  assertDeviceMemory(pointer);
  const device = Device.get(driver.pointerGetAttributeInt(PointerAttr.DEVICE_ORDINAL, pointer));
  device.activate();
  const [base, size] = driver.memGetAddressRange(pointer);
  const offset = Number(pointer - base);
  if (offset + byteLength > size) {
    throw outOfRange(`${byteLength} bytes at 0x${pointer.toString(16)} run past the end of its allocation (${size - offset} bytes left)`);
  }
  const handle = driver.ipcGetMemHandle(base);
  driver.legacyExportRegister(handle, base);
  // Nobody tells this process when another library frees the memory: now and then, drop the
  // entries whose allocation is gone, so that the table holds live allocations only.
  if (driver.legacyCacheStats().exports >= sweepExportsAt) {
    driver.legacyExportSweep();
    sweepExportsAt = Math.max(EXPORT_SWEEP_MIN, 2 * driver.legacyCacheStats().exports);
  }
  return describe(handle, offset, byteLength, device, process.pid, options.array);
}

/** exportPointer sweeps the table of local exports once it holds this many entries (then twice what stayed). */
const EXPORT_SWEEP_MIN = 64;
let sweepExportsAt = EXPORT_SWEEP_MIN;

/**
 * @internal The peer that exported the allocation behind `handle` freed it (a GONE notice): its
 * idle mappings here are closed now, mappings in use at their last release. Returns how many it
 * closed now.
 */
export function forgetLegacyAllocation(handle: Uint8Array): number {
  return driver.legacyImportForget(handle);
}

DeviceBuffer.prototype.ipcHandle = function ipcHandle(this: DeviceBuffer, options: IpcHandleOptions = {}): LegacyHandleDescriptor {
  const { handle, pid } = handleOf(this);
  return describe(handle, this.ownerOffset, this.byteLength, this.residentDevice, pid, options.array);
};

/**
 * @internal What a link sends for a device buffer: its descriptor in binary form, built from
 * values that are valid by construction (the driver's handle, the buffer's own range), so without
 * the validation a user-supplied descriptor gets.
 */
export function legacyTransferBytes(buffer: DeviceBuffer): Uint8Array {
  const { handle, pid } = handleOf(buffer);
  return encodeCheckedDescriptor({
    kind: 'cuda-legacy-handle', version: DESCRIPTOR_VERSION, handle, offset: buffer.ownerOffset,
    byteLength: buffer.byteLength, deviceUuid: buffer.residentDevice.uuid, pid,
  });
}

/** The legacy handle of a buffer's allocation (made and registered once) and the exporting pid. */
function handleOf(buffer: DeviceBuffer): { handle: Uint8Array; pid: number } {
  const memory = buffer.memory;
  const owner = memory.owner;
  if (owner.kind === 'legacy-import') {
    // Re-sharing an import: the same handle works in any other process.
    const origin = owner as LegacyImportOwner;
    return { handle: origin.handle, pid: origin.pid };
  }
  if (owner.kind !== 'device') {
    throw notExportable(`a ${owner.kind} buffer has no legacy IPC handle; send it over a link (link.send) instead`);
  }
  let handle = handleOfMemory.get(memory);
  if (!handle) {
    buffer.device.activate();
    const h = driver.ipcGetMemHandle(owner.base, new Uint8Array(64));
    const key = handleKey(h);
    driver.legacyExportRegister(h, owner.base);
    localExports.set(key, memory);
    memory.beforeRelease.push(() => {
      localExports.delete(key);
      driver.legacyExportUnregister(h);
    });
    handleOfMemory.set(memory, h);
    handle = h;
  }
  return { handle, pid: process.pid };
}

/** Accepts a descriptor object, its JSON text, or its binary encoding, and validates it. */
export function toLegacyDescriptor(input: LegacyHandleDescriptor | string | Uint8Array): LegacyHandleDescriptor {
  return typeof input === 'string' ? parseDescriptorJson(input, 'cuda-legacy-handle')
    : input instanceof Uint8Array ? decodeDescriptor(input, 'cuda-legacy-handle')
    : validateDescriptor(input, 'cuda-legacy-handle');
}

/** Options of openIpcHandle(). */
export interface OpenIpcHandleOptions {
  /**
   * The device that will use the memory: it is mapped into that device's context, with peer
   * access where the memory lives on another GPU. Default: the working device (workingDevice()),
   * else the device the memory lives on.
   */
  device?: Device;
}

/**
 * Maps the memory a descriptor describes and returns a buffer over exactly that range. Each
 * allocation is mapped once per process (and using device) however often it is opened; close()
 * releases it. Throws ERR_PEER_UNREACHABLE where the using device cannot reach the memory's.
 */
export function openIpcHandle(input: LegacyHandleDescriptor | string | Uint8Array, options: OpenIpcHandleOptions = {}): DeviceBuffer {
  return openLegacyDescriptor(toLegacyDescriptor(input), options.device);
}

/** @internal openIpcHandle for a descriptor already validated (decodeDescriptor's output). */
export function openLegacyDescriptor(desc: LegacyHandleDescriptor, using?: Device): DeviceBuffer {
  const resident = Device.byUuid(desc.deviceUuid);
  const user = importingDevice(resident, using);

  const local = localExports.size > 0 ? localExports.get(handleKey(desc.handle)) : undefined;
  if (local && !local.released) {
    // This process's own allocation: the using device reaches it through peer access.
    user.enablePeerAccess(local.owner.device);
    return new DeviceBuffer(local, rangeIn(desc, local.owner.byteLength), desc.byteLength, undefined, undefined, user);
  }

  user.activate();
  const context = user.primaryContext;
  let base: bigint;
  let inProcess: boolean;
  let size: number;
  try {
    [base, inProcess, size] = driver.legacyImportAcquire(desc.handle, context);
  } catch (e) {
    if (e instanceof CudaError && (e.code === 'CUDA_ERROR_INVALID_VALUE' || e.code === 'CUDA_ERROR_INVALID_HANDLE')) {
      const why = desc.pid === process.pid ? 'this process exported it but has since freed the memory'
        : !processAlive(desc.pid) ? `the exporting process ${desc.pid} has exited, and its memory with it`
        : `the exporting process ${desc.pid} is alive, but the handle is not valid: the memory was freed, or the bytes are not a CUDA IPC handle`;
      throw new IpcError('ERR_HANDLE_STALE', `cannot open the IPC handle: ${why}. Ask the exporter for a fresh descriptor`, { cause: e });
    }
    throw e;
  }
  const release = inProcess ? () => {} : () => { driver.legacyImportRelease(desc.handle, context); };
  try {
    if (inProcess) {
      // Exported by this process (exportPointer): its own allocation, reached through peer access.
      user.enablePeerAccess(resident);
      user.activate();
      size = driver.memGetAddressRange(base)[1];
    }
    rangeIn(desc, size);
  } catch (e) {
    release();
    throw e;
  }
  // desc is this module's own copy (decoded or validated), so its handle needs no second copy.
  const owner: LegacyImportOwner = {
    kind: 'legacy-import', device: user, residentDevice: resident, base, byteLength: size, release, handle: desc.handle, pid: desc.pid,
  };
  return new DeviceBuffer(new SharedMemory(owner), desc.offset, desc.byteLength);
}

function rangeIn(desc: LegacyHandleDescriptor, allocationSize: number): number {
  if (desc.offset + desc.byteLength > allocationSize) {
    throw new IpcError('ERR_OUT_OF_RANGE',
      `the descriptor names ${desc.byteLength} bytes at offset ${desc.offset}, but the allocation holds only ${allocationSize} bytes; the descriptor does not match this handle`);
  }
  return desc.offset;
}

export type { ImportCacheStats };

/**
 * This process's legacy import cache (shared by all its threads), and its table of local exports
 * (exportPointer), from which allocations freed since are dropped first.
 */
export function legacyCacheStats(): ImportCacheStats {
  if (driver.legacyCacheStats().exports > 0) driver.legacyExportSweep();
  return driver.legacyCacheStats();
}

/**
 * Sets how many unused legacy mappings stay cached (default 16; least recently used closed
 * first). A cuda-ipc peer that frees an allocation it sent over a link says so (a GONE notice)
 * and its idle mapping here is closed at once; a mapping opened from elsewhere (a descriptor from
 * a file, a peer without notices) keeps its allocation's memory alive while it is cached, so 0
 * trades reopening cost for memory.
 */
export function configureImportCache(options: { idleLimit: number }): void {
  if (!Number.isSafeInteger(options.idleLimit) || options.idleLimit < 0 || options.idleLimit > 0xffffffff) {
    throw badNumber(options.idleLimit, `idleLimit must be a non-negative integer, got ${options.idleLimit}`);
  }
  driver.legacyCacheConfigure(options.idleLimit);
}
