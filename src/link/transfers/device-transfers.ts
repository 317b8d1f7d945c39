// How device memory, pools and events travel over links. Each is leased to the peer: the sender's
// memory, pool or event stays alive past its close() until the peer releases it or dies.
//  - Pool buffers: the pool's fd goes once per link (in the first message that needs it); after
//    that each buffer is 64 bytes of export data plus its size and range.
//  - Other device buffers: their legacy-handle descriptor (binary form).
//  - IPC pools: the fd once per link, then the pool's id.
//  - Interprocess events: their event-handle descriptor.
// Devices travel as UUIDs, never ordinals (CUDA_VISIBLE_DEVICES renumbers). Received memory is
// mapped for the link's working device (linkWorkingDevice), with peer access where it lives on
// another GPU; events are opened on the device they belong to.
import { closeSync } from 'node:fs';
import { DeviceBuffer, onBufferClose, type SharedMemory } from '../../cuda/buffer.js';
import { Device, importingDevice } from '../../cuda/device.js';
import { Event } from '../../cuda/event.js';
import { IpcPool, exportPoolBuffer } from '../../ipc/pool.js';
import { openIpcEvent } from '../../ipc/event.js';
import { forgetLegacyAllocation, legacyTransferBytes, openLegacyDescriptor } from '../../ipc/legacy.js';
import { encodeDescriptor, decodeDescriptor } from '../../ipc/descriptor.js';
import { deviceUuidFromBytes } from '../../ipc/device-uuid.js';
import { IpcError } from '../../errors.js';
import { readU64, writeU64 } from '../transport/frame.js';
import { registerTransferHandler, type TransferEncoding } from './transfer.js';
import { linkWorkingDevice } from '../connection/working-device.js';
import type { Link } from '../connection/link.js';
import type { LeaseHold, ReceivedLease } from '../lifetimes/lease.js';
import { announceGone, registerGoneHandler } from '../lifetimes/gone.js';

// Pool reference, shared by pool and pool-buffer messages (little-endian, zero padding):
//   0  16  pool id
//  16  16  device UUID
//  32   8  pool maxSize
//  40   4  flags (bit 0: the pool's fd is attached)
//  44   4  reserved
const POOL_REF_BYTES = 48;
// Pool buffer: a pool reference, then
//  48  64  export data of the allocation
// 112   8  allocation size
// 120   8  offset of the range in the allocation
// 128   8  length of the range
const POOL_BUFFER_BYTES = 136;
const FD_ATTACHED = 1;

// encode()'s data is copied into the frame before the next encode: one scratch per layout.
const poolBufferScratch = new Uint8Array(POOL_BUFFER_BYTES);
const poolBufferView = new DataView(poolBufferScratch.buffer);
const poolRefScratch = new Uint8Array(POOL_REF_BYTES);
const poolRefView = new DataView(poolRefScratch.buffer);

const poolsSent = new WeakMap<Link, Set<string>>();
const poolsReceived = new WeakMap<Link, Map<string, IpcPool>>();

/**
 * Writes a pool reference (every byte of bytes[0, 48)); attaches the pool's fd unless this link
 * already carried it.
 */
function writePoolRef(view: DataView, bytes: Uint8Array, pool: IpcPool, link: Link, makeHold: () => LeaseHold): TransferEncoding {
  bytes.set(pool.idBytes, 0);
  bytes.set(pool.device.uuidBytes, 16);
  writeU64(view, 32, pool.maxSize);
  view.setUint32(44, 0, true);
  if (poolsSent.get(link)?.has(pool.id)) {
    view.setUint32(40, 0, true);
    return { data: bytes, hold: makeHold() };
  }
  view.setUint32(40, FD_ATTACHED, true);
  const fd = pool.exportFd();
  // The hold last: nothing after it can throw, so a failed encode never strands one.
  return {
    data: bytes, fds: [fd], closeFdsAfterSend: true, hold: makeHold(),
    // Only a message that really went out makes the peer know the pool.
    onCommit: () => {
      let sent = poolsSent.get(link);
      if (!sent) poolsSent.set(link, (sent = new Set()));
      sent.add(pool.id);
      // Once destroyed here, the peer may drop its import (PROTOCOL.md 3.2); a later reference
      // on this link (a new import of the same pool) carries the fd again.
      pool.afterDestroy.push(() => {
        sent!.delete(pool.id);
        announceGone(link, 'ipc-pool', pool.idBytes);
      });
    },
  };
}

/** A lease on a buffer's memory: the memory outlives the sender's close() until the peer lets go. */
function leaseMemory(buffer: DeviceBuffer): LeaseHold {
  return { release: buffer.memory.lease(), bytes: buffer.byteLength };
}

// The leases of the received buffers open over one import. A pool import is shared by every
// message that names the same allocation, so several leases can share one mapping.
const openLeases = new WeakMap<SharedMemory, Set<ReceivedLease>>();

/**
 * Ends the sender's lease once nothing here needs it: while the import is mapped, one lease on it
 * stays open (the sender's memory must outlive the mapping); the others end as soon as the buffer
 * that came with them is closed. Otherwise a receiver that maps each sync's set before closing the
 * previous one (so that the import stays) would keep the lease of every sync until it let go.
 */
function endLeaseOnRelease(buffer: DeviceBuffer, lease: ReceivedLease | undefined): DeviceBuffer {
  if (!lease) return buffer;
  const memory = buffer.memory;
  let leases = openLeases.get(memory);
  if (!leases) {
    const mine = new Set<ReceivedLease>();
    leases = mine;
    openLeases.set(memory, mine);
    memory.afterRelease.push(() => {
      openLeases.delete(memory);
      for (const l of mine) l.end();
      mine.clear();
    });
  }
  const shared = leases;
  shared.add(lease);
  onBufferClose(buffer, () => {
    // Another lease still in force keeps the sender's memory for the mapping; this one can go.
    if (!shared.has(lease)) return;
    for (const other of shared) {
      if (other !== lease && !other.ended) {
        shared.delete(lease);
        lease.end();
        return;
      }
    }
  });
  return buffer;
}

function frameError(what: string): IpcError {
  return new IpcError('ERR_FRAME_INVALID', `a received ${what} is malformed`);
}

// The last pool id decoded: most messages name the same pool as the one before.
const lastIdBytes = new Uint8Array(16);
let lastId = '';

/** The hex id of the pool whose 16 id bytes start `data`. */
function poolId(data: Uint8Array): string {
  let same = lastId !== '';
  for (let i = 0; same && i < 16; i++) same = data[i] === lastIdBytes[i];
  if (!same) {
    lastIdBytes.set(data.subarray(0, 16));
    lastId = Buffer.from(data.buffer, data.byteOffset, 16).toString('hex');
  }
  return lastId;
}

/** The pool a reference names: imported from the attached fd, or one this link brought before. */
function readPoolRef(data: Uint8Array, view: DataView, fds: number[], link: Link): IpcPool {
  const id = poolId(data);
  const flags = view.getUint32(40, true);
  if ((flags & ~FD_ATTACHED) !== 0 || view.getUint32(44, true) !== 0) throw frameError('pool reference');
  let received = poolsReceived.get(link);
  if (!received) {
    const map = new Map<string, IpcPool>();
    poolsReceived.set(link, (received = map));
    // The link going away ends only the bookkeeping: buffers already imported stay mapped, and
    // each pool is destroyed after its last buffer closes.
    link.onClose(() => { for (const p of map.values()) p.close(); map.clear(); });
  }
  const known = received.get(id);
  if (flags & FD_ATTACHED) {
    if (fds.length !== 1) throw frameError('pool reference (fd count)');
    const fd = fds[0]!;
    if (known) {
      // A peer may send the fd again (e.g. it re-sent a pool it received); keep the first import.
      fds[0] = -1;
      closeSync(fd);
      return known;
    }
    const most = link.limits.importedPools;
    if (received.size >= most) {
      throw new IpcError('ERR_LIMIT_REACHED', `the peer sent a ${most + 1}th IPC pool on this link, more than it may make this process import (importedPools ${most}); the message was dropped`, { limit: 'importedPools' });
    }
    // Until importFromFd owns the fd, a throw leaves it in fds for the link to close.
    const device = Device.byUuid(deviceUuidFromBytes(data.subarray(16, 32)));
    const accessFor = importingDevice(device, linkWorkingDevice(link));
    const maxSize = readU64(view, 32);
    if (maxSize < 0) throw frameError('pool reference (maxSize)');
    fds[0] = -1;
    const pool = IpcPool.importFromFd(fd, device, id, maxSize, { accessFor });
    received.set(id, pool);
    return pool;
  }
  if (fds.length !== 0) throw frameError('pool reference (unexpected fd)');
  if (!known) throw new IpcError('ERR_FRAME_INVALID', 'a pool buffer names a pool this link never received; messages arrived out of order or from another link');
  return known;
}

/** What a TCP link's sender is told instead (PROTOCOL.md 1.1): these kinds pass fds or same-machine handles. */
const DEVICE_MEMORY_HINT = 'Device memory crosses machines over NCCL (PROTOCOL.md 8) where the NCCL layer is loaded; otherwise copy its bytes into a HostBuffer, which a TCP link carries as a copy';

function isPoolBuffer(value: unknown): value is DeviceBuffer {
  return value instanceof DeviceBuffer && (value.kind === 'pool' || value.kind === 'pool-import');
}

registerTransferHandler<DeviceBuffer>({
  kind: 'pool-buffer',
  transportHint: DEVICE_MEMORY_HINT,
  canTransfer: isPoolBuffer,
  encode(buffer, link) {
    const { pool, exportData, allocationSize } = exportPoolBuffer(buffer);
    const bytes = poolBufferScratch;
    const view = poolBufferView;
    bytes.set(exportData, 48);
    writeU64(view, 112, allocationSize);
    writeU64(view, 120, buffer.ownerOffset);
    writeU64(view, 128, buffer.byteLength);
    return writePoolRef(view, bytes, pool, link, () => leaseMemory(buffer));
  },
  decode(data, fds, link, lease) {
    if (data.byteLength !== POOL_BUFFER_BYTES) throw frameError('pool buffer');
    const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
    const pool = readPoolRef(data, view, fds, link);
    const size = readU64(view, 112);
    const offset = readU64(view, 120);
    const length = readU64(view, 128);
    // importBuffer range-checks these (-1: not a safe integer) and copies the export data it keeps.
    return endLeaseOnRelease(pool.importBuffer(data.subarray(48, 112), size, offset, length, { device: linkWorkingDevice(link) }), lease);
  },
});

registerTransferHandler<IpcPool>({
  kind: 'ipc-pool',
  transportHint: "A pool is this machine's (it travels as its fd): send buffers, not pools, to another machine",
  canTransfer: (v): v is IpcPool => v instanceof IpcPool,
  encode(pool, link) {
    return writePoolRef(poolRefView, poolRefScratch, pool, link, () => ({ release: pool.hold() }));
  },
  decode(data, fds, link, lease) {
    if (data.byteLength !== POOL_REF_BYTES) throw frameError('pool');
    const pool = readPoolRef(data, new DataView(data.buffer, data.byteOffset, data.byteLength), fds, link);
    if (lease) pool.afterDestroy.push(() => lease.end());
    return pool;
  },
});

/** The links each allocation of this process was sent on by legacy handle, told when it is freed. */
const legacySentOn = new WeakMap<SharedMemory, Set<Link>>();

/** Tells `link` that the allocation behind `handle` is gone once `memory` is freed (PROTOCOL.md 3.2). */
function announceLegacyGone(memory: SharedMemory, link: Link, handle: Uint8Array): void {
  let links = legacySentOn.get(memory);
  if (!links) {
    const set = (links = new Set());
    legacySentOn.set(memory, set);
    const key = handle.slice();
    memory.afterRelease.push(() => {
      for (const l of set) announceGone(l, 'legacy-buffer', key);
      set.clear();
    });
  }
  if (links.has(link)) return;
  const set = links;
  set.add(link);
  link.onClose(() => set.delete(link));
}

registerTransferHandler<DeviceBuffer>({
  kind: 'legacy-buffer',
  transportHint: DEVICE_MEMORY_HINT,
  canTransfer: (v): v is DeviceBuffer => v instanceof DeviceBuffer && (v.kind === 'device' || v.kind === 'legacy-import'),
  encode: (buffer, link) => {
    const data = legacyTransferBytes(buffer);
    // Only this process's own allocations: an import sent onward lives on with its exporter. What
    // the commit needs is taken now: the buffer may be closed by then (a tensor set encodes a
    // buffer of its own over the allocation and closes it at once).
    const memory = buffer.memory;
    const handle = data.slice(16, 80);
    const onCommit = buffer.kind === 'device' ? () => announceLegacyGone(memory, link, handle) : undefined;
    return { data, hold: leaseMemory(buffer), ...(onCommit ? { onCommit } : {}) };
  },
  decode: (data, _fds, link, lease) =>
    endLeaseOnRelease(openLegacyDescriptor(decodeDescriptor(data, 'cuda-legacy-handle'), linkWorkingDevice(link)), lease),
});

registerTransferHandler<Event>({
  kind: 'ipc-event',
  transportHint: 'An interprocess event orders GPU work on one machine; to another machine, send a message once the work is done (after stream.synchronize())',
  canTransfer: (v): v is Event => v instanceof Event,
  encode: (event) => ({ data: encodeDescriptor(event.ipcHandle()), hold: { release: event.hold() } }),
  decode: (data, _fds, _link, lease) => {
    const event = openIpcEvent(decodeDescriptor(data, 'cuda-ipc-event'));
    if (lease) event.afterDestroy.push(() => lease.end());
    return event;
  },
});

// What this process keeps of memory its peers freed goes when they say so (PROTOCOL.md 3.2).
registerGoneHandler('legacy-buffer', (key) => {
  if (key.byteLength !== 64) return;
  try {
    forgetLegacyAllocation(key);
  } catch (e) {
    // No driver here: nothing was ever mapped. Anything else is worth a warning.
    if ((e as { code?: string }).code !== 'CUDA_DRIVER_NOT_FOUND') throw e;
  }
});
registerGoneHandler('ipc-pool', (key, link) => {
  if (key.byteLength !== 16) return;
  const map = poolsReceived.get(link as Link);
  const id = Buffer.from(key.buffer, key.byteOffset, 16).toString('hex');
  const pool = map?.get(id);
  if (!pool) return;
  map!.delete(id);
  pool.close();  // destroyed once its last buffer here is closed
});
