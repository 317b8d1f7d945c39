// A pool buffer's export data, public, and pools imported from a bare fd: what another IPC-pool
// implementation (cuda.core's DeviceMemoryResource with ipc_enabled=True, C code, ...) needs to
// open Node's pool buffers, and what Node needs to open theirs.
//
// cuda.core (Python), opening a Node pool buffer given the pool's fd and this export:
//   mr = DeviceMemoryResource.from_allocation_handle(device, fd)
//   buf = Buffer.from_ipc_descriptor(mr, IPCBufferDescriptor._init(export_data, allocation_size), stream=...)
//   (the data starts `offset` bytes into buf). Over a cuda-ipc link the Python package does this.
// Node, opening a cuda.core buffer given mr.allocation_handle's fd and buf.ipc_descriptor:
//   const pool = importIpcPool(fd, { device, id: mr.uuid.hex });
//   const b = pool.importBuffer(descriptorPayload, descriptor.size);
import { randomBytes } from 'node:crypto';
import { Device } from '../cuda/device.js';
import type { DeviceBuffer } from '../cuda/buffer.js';
import { IpcError } from '../errors.js';
import { addon } from '../native/addon.js';
import { IpcPool, exportPoolBuffer } from './pool.js';
import { invalidArgValue, badNumber } from '../arg-errors.js';

/** Everything another process needs, besides the pool's fd, to map a pool buffer. */
export interface PoolBufferExport {
  /** The pool's id (32 hex digits), the same in every process that imported it. */
  readonly poolId: string;
  readonly deviceUuid: string;
  /** 64 bytes (CUmemPoolPtrExportData) of the buffer's whole allocation; a copy. */
  readonly exportData: Uint8Array;
  /** Bytes in the allocation (cuda.core's IPCBufferDescriptor.size). */
  readonly allocationSize: number;
  /** Where this buffer's bytes start in the allocation, and how many there are. */
  readonly offset: number;
  readonly length: number;
}

/**
 * The export data of a buffer from an IPC pool (allocated here, or imported from a peer). Give it,
 * with the pool's fd (`pool.exportFd()`, a new fd the caller closes), to the other process.
 */
export function poolBufferExport(buffer: DeviceBuffer): PoolBufferExport {
  const { pool, exportData, allocationSize } = exportPoolBuffer(buffer);
  return {
    poolId: pool.id, deviceUuid: pool.device.uuid, exportData: new Uint8Array(exportData), allocationSize,
    offset: buffer.ownerOffset, length: buffer.byteLength,
  };
}

/** Options of importIpcPool(): which device and pool id an imported pool fd stands for. */
export interface ImportIpcPoolOptions {
  /** The pool's device (default: the one named by deviceUuid, else device 0). */
  device?: Device;
  deviceUuid?: string;
  /** The pool's id as 32 hex digits (cuda.core: `mr.uuid.hex`); default random. */
  id?: string;
  /** The pool's maximum size if known (informational). */
  maxSize?: number;
}

/**
 * Imports a memory pool exported as a POSIX fd by another process (e.g. cuda.core's
 * `mr.allocation_handle`). The fd is duplicated: the caller keeps (and closes) its own. Then map
 * its buffers with `pool.importBuffer(exportData, allocationSize)`.
 */
export function importIpcPool(fd: number, options: ImportIpcPoolOptions = {}): IpcPool {
  if (!Number.isInteger(fd) || fd < 0) throw badNumber(fd, `importIpcPool: fd must be an open file descriptor, got ${fd}`);
  const id = options.id ?? randomBytes(16).toString('hex');
  if (!/^[0-9a-f]{32}$/.test(id)) throw invalidArgValue(`importIpcPool: id must be 32 lower-case hex digits (a UUID without dashes), got ${JSON.stringify(id)}`);
  const device = options.device ?? (options.deviceUuid !== undefined ? Device.byUuid(options.deviceUuid) : Device.get(0));
  return IpcPool.importFromFd(addon.dup(fd), device, id, options.maxSize ?? 0);
}
