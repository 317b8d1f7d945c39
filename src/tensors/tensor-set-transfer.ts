// How a TensorMap (or a Map of DeviceArrays / HostArrays) travels over a link: one 'tensor-set'
// record (wire.ts) with each allocation once, encoded and decoded by the handler of its own kind
// ('legacy-buffer', 'pool-buffer', 'host-buffer'), so that every rule of those kinds holds here
// too: a pool's fd goes once per link, a legacy handle maps once per process and a freed legacy
// allocation is announced GONE (the kind's commit), a memfd must be sealed, the working device is
// honoured. Nothing is copied on the sender.
//
// Leases: the message carries one lease, holding every allocation on the sender's side; the
// receiver ends it once every allocation it mapped for the message is unmapped (the map closed
// and every view of it gone).
import { DeviceBuffer, type SharedMemory } from '../cuda/buffer.js';
import { driver } from '../cuda/driver.js';
import { IpcError } from '../errors.js';
import { HostBuffer, wholeHostBuffer } from '../host/host-buffer.js';
import { DeviceArray } from '../arrays/device-array.js';
import { addon } from '../native/addon.js';
import { hostBufferTransfer } from '../link/transfers/host-transfer.js';
import { releaseHold, type LeaseHold, type ReceivedLease } from '../link/lifetimes/lease.js';
import { handlerForKind } from '../link/messages/handlers.js';
import { registerTransferHandler, type TransferEncoding, type TransferHandler } from '../link/transfers/transfer.js';
import type { Link } from '../link/connection/link.js';
import { HostArray } from '../arrays/host-array.js';
import { TensorMap, isTensorSetValue, receivedTensorMap, tensorMapContents, type TensorArray } from './tensor-map.js';
import {
  ALLOCATION_KINDS, AllocationKind, TENSOR_SET_KIND, decodeTensorTable, encodeTensorSet, encodeTensorTable, parseTensorSet,
  type AllocationEntry, type TensorLayout, type TensorSpec,
} from './wire.js';

/** Offset of the pool reference's flags in pool-buffer data (bit 0: the pool's fd is attached). */
const POOL_FLAGS_AT = 40;

/** What one allocation of a set to send is: device memory (its shared owner) or a host mapping. */
type Allocation = { device: SharedMemory; sample: DeviceBuffer } | { host: HostBuffer };

/** The allocations and tensor specs of a set to send, in first-use order. */
function gather(entries: Iterable<readonly [string, TensorArray]>): { allocations: Allocation[]; specs: TensorSpec[]; keys: unknown[] } {
  const index = new Map<unknown, number>();
  const allocations: Allocation[] = [];
  const specs: TensorSpec[] = [];
  for (const [name, array] of entries) {
    let key: unknown;
    let offset: number;
    if (array instanceof HostArray) {
      const b = array.buffer;
      if (b.closed) throw new IpcError('ERR_CLOSED', `link.send: tensor ${JSON.stringify(name)} is closed; send tensors before closing them`);
      key = `fd:${b.fd}`;  // views of one mapping share its fd
      offset = b.byteOffset;
      if (!index.has(key)) allocations.push({ host: b });
    } else {
      const b = array.buffer;
      if (b.closed) throw new IpcError('ERR_CLOSED', `link.send: tensor ${JSON.stringify(name)} is closed; send tensors before closing them`);
      const memory = b.memory;
      key = memory;
      offset = b.ownerOffset;
      if (!index.has(key)) allocations.push({ device: memory, sample: b });
    }
    let a = index.get(key);
    if (a === undefined) index.set(key, (a = allocations.length - 1));
    specs.push({ name, dtype: array.dtype, shape: array.shape, strides: array.strides, offset, allocation: a });
  }
  return { allocations, specs, keys: [...index.keys()] };
}

interface Encoded {
  entries: AllocationEntry[];
  fds: number[];
  holds: LeaseHold[];
  commits: Array<() => void>;
}

function releaseAll(e: Encoded): void {
  for (const h of e.holds) releaseHold(h);
  for (const fd of e.fds) {
    try {
      addon.close(fd);
    } catch {
      // already gone
    }
  }
}

/** The registered handler of `kind` (a replacement of yours included), else the built-in one. */
function handlerOf(kind: 'pool-buffer' | 'legacy-buffer' | 'host-buffer'): TransferHandler<object> {
  const h = handlerForKind(kind) ?? (kind === 'host-buffer' ? hostBufferTransfer : undefined);
  if (!h) throw new IpcError('ERR_NOT_TRANSFERABLE', `link.send: a tensor lives in a '${kind}' allocation, and no handler for that kind is registered in this process`);
  return h as TransferHandler<object>;
}

/**
 * Adds one encoding to the record: its data copied (the kinds' encoders reuse scratch buffers),
 * its fds owned by the record (closed after the send: `borrowed` ones are dup'ed), its hold, and
 * its commit (run once the message went out, as for the kind sent alone).
 */
function addEncoding(out: Encoded, kind: AllocationKind, enc: TransferEncoding, borrowed: boolean): Uint8Array {
  const data = Uint8Array.from(enc.data);
  if (enc.hold) out.holds.push(enc.hold);
  const fds = enc.fds ?? [];
  // A borrowed fd stays its owner's: the record sends (and then closes) a copy.
  for (const fd of fds) out.fds.push(borrowed ? addon.dup(fd) : fd);
  if (enc.onCommit) out.commits.push(enc.onCommit);
  out.entries.push({ kind, fdCount: fds.length, data });
  return data;
}

/**
 * Encodes one allocation entry with the handler of its kind ('host-buffer', 'pool-buffer',
 * 'legacy-buffer'), given a buffer over the whole allocation: every rule of the kind holds in a
 * set too (a memfd must be sealed, a pool's fd goes once per link, a freed legacy allocation is
 * announced GONE to the links it went on).
 */
function encodeAllocation(a: Allocation, link: Link, out: Encoded, poolsAttached: Set<string>): void {
  if ('host' in a) {
    // A HostBuffer over the whole mapping, only to encode it: the lease keeps the memory.
    const whole = wholeHostBuffer(a.host);
    try {
      const enc = handlerOf('host-buffer').encode(whole, link);
      // The handler lends the buffer's own fd for one send (closeFdsAfterSend unset).
      addEncoding(out, AllocationKind.Host, enc, !enc.closeFdsAfterSend);
    } finally {
      whole.close();
    }
    return;
  }
  const { device: memory, sample } = a;
  const owner = memory.owner;
  // A buffer over the whole allocation, only to encode it: the lease keeps the memory.
  const whole = new DeviceBuffer(memory, 0, owner.byteLength, undefined, undefined, sample.device);
  try {
    if (owner.kind === 'pool' || owner.kind === 'pool-import') {
      const enc = handlerOf('pool-buffer').encode(whole, link);
      const poolId = Buffer.from(enc.data.subarray(0, 16)).toString('hex');
      if ((enc.fds?.length ?? 0) > 0 && poolsAttached.has(poolId)) {
        // The pool's fd already goes with an earlier entry of this message: send it once (and
        // its commit, which records that this link has the pool, runs with that entry).
        for (const fd of enc.fds!) addon.close(fd);
        const data = addEncoding(out, AllocationKind.Pool, { data: enc.data, ...(enc.hold ? { hold: enc.hold } : {}) }, false);
        data[POOL_FLAGS_AT] = data[POOL_FLAGS_AT]! & ~1;
        return;
      }
      if ((enc.fds?.length ?? 0) > 0) poolsAttached.add(poolId);
      addEncoding(out, AllocationKind.Pool, enc, !enc.closeFdsAfterSend);
      return;
    }
    addEncoding(out, AllocationKind.Legacy, handlerOf('legacy-buffer').encode(whole, link), false);
  } finally {
    whole.close();
  }
}

const TABLE_CACHE_KEY = 'tensor-set.table';

/** The encoded table of a map you built, kept while neither the map nor its allocations change. */
function tableOf(map: TensorMap | Map<string, TensorArray>, gathered: ReturnType<typeof gather>): Uint8Array {
  if (!(map instanceof TensorMap)) return encodeTensorTable(gathered.specs, gathered.allocations.length);
  const c = tensorMapContents(map);
  if (c.kind !== 'built') throw new Error('unreachable');
  const hit = c.cache.get(TABLE_CACHE_KEY) as { version: number; keys: unknown[]; table: Uint8Array } | undefined;
  if (hit && hit.version === c.version && hit.keys.length === gathered.keys.length && hit.keys.every((k, i) => k === gathered.keys[i])) {
    return hit.table;
  }
  const table = encodeTensorTable(gathered.specs, gathered.allocations.length);
  c.cache.set(TABLE_CACHE_KEY, { version: c.version, keys: gathered.keys, table });
  return table;
}

export const tensorSetTransfer: TransferHandler<TensorMap | Map<string, TensorArray>> = {
  kind: TENSOR_SET_KIND,
  // Each allocation travels as its fd or handle: one machine only (PROTOCOL.md 1.1).
  transportHint: "Tensor sets cross machines over NCCL (PROTOCOL.md 8.3) where the NCCL layer is loaded; otherwise send each tensor's bytes in a HostBuffer",
  canTransfer: isTensorSetValue,
  encode(value, link) {
    let allocations: Allocation[];
    let table: Uint8Array;
    let count: number;
    const c = value instanceof TensorMap ? tensorMapContents(value) : undefined;
    if (c?.kind === 'remote') {
      throw new IpcError('ERR_INVALID_STATE', 'link.send: this TensorMap came over a TCP link and its bytes are still on its sender: `await map.fetch()` before sending it on');
    }
    if (c?.kind === 'received') {
      // Sent on as it came: the same allocations in the same order, so the same table.
      const r = c.received;
      allocations = r.allocations.map((b) => (b instanceof HostBuffer ? { host: b } : { device: b.memory, sample: b }));
      table = r.layout.table;
      count = r.layout.count;
    } else {
      const entries = c?.kind === 'built' ? c.entries : (value as Map<string, TensorArray>);
      const gathered = gather(entries.entries());
      allocations = gathered.allocations;
      table = tableOf(value, gathered);
      count = gathered.specs.length;
    }
    const out: Encoded = { entries: [], fds: [], holds: [], commits: [] };
    const poolsAttached = new Set<string>();
    try {
      for (const a of allocations) encodeAllocation(a, link, out, poolsAttached);
      const data = encodeTensorSet(out.entries, table, count);
      const holds = out.holds;
      let bytes = 0;
      for (const h of holds) bytes += h.bytes ?? 0;
      return {
        data,
        fds: out.fds,
        closeFdsAfterSend: true,
        ...(holds.length ? { hold: { release: () => { for (const h of holds) releaseHold(h); }, bytes } } : {}),
        ...(out.commits.length ? { onCommit: () => { for (const fn of out.commits) fn(); } } : {}),
      };
    } catch (e) {
      releaseAll(out);
      throw e;
    }
  },
  decode(data, fds, link, lease) {
    const parsed = parseTensorSet(data, fds.length);
    const sizes = parsed.allocations.map((a) => a.size);
    const layout = cachedLayout(link, parsed.table, parsed.tensorCount, sizes);
    // One lease for the message: it ends when the last of its allocations is released here.
    let open = parsed.allocations.length;
    const part: ReceivedLease | undefined = lease && {
      get id() { return lease.id; },
      get ended() { return lease.ended; },
      end() { if (--open === 0) lease.end(); },
    };
    const buffers: Array<DeviceBuffer | HostBuffer> = [];
    let fdAt = 0;
    try {
      for (const entry of parsed.allocations) {
        const kind = ALLOCATION_KINDS[entry.kind].kind;
        const handler = kind === 'host-buffer' ? hostBufferTransfer : handlerForKind(kind);
        if (!handler) throw new IpcError('ERR_NOT_TRANSFERABLE', `received a tensor set with a '${kind}' allocation, but no handler for it is registered in this process`);
        const mine = fds.slice(fdAt, fdAt + entry.fdCount);
        let buffer: unknown;
        try {
          buffer = handler.decode(entry.data, mine, link, part);
        } finally {
          // Taken fds are -1 in `mine`; the rest stay the link's to close if this throws.
          for (let k = 0; k < entry.fdCount; k++) fds[fdAt + k] = mine[k]!;
        }
        for (let k = 0; k < entry.fdCount; k++) fds[fdAt + k] = -1;
        fdAt += entry.fdCount;
        const b = buffer as DeviceBuffer | HostBuffer;
        buffers.push(b);
        if (b instanceof DeviceBuffer && b.kind === 'legacy-import') dropWhenReleased(b);
        if (b.byteLength !== entry.size) throw new IpcError('ERR_FRAME_INVALID', `a received tensor set's ${kind} allocation maps ${b.byteLength} bytes, not the ${entry.size} it announced`);
      }
    } catch (e) {
      for (const b of buffers) b.close();
      throw e;
    }
    return receivedTensorMap({ layout, allocations: buffers });
  },
};

/**
 * Closes a set's legacy mapping once the set let go of it, unless something else in this process
 * still uses it: left idle in the import cache, it would keep the sender's memory after the sender
 * freed it. (A repeated sync maps the next set before closing the previous one, so it opens none.)
 */
function dropWhenReleased(b: DeviceBuffer): void {
  const owner = b.memory.owner as { handle?: Uint8Array; device: DeviceBuffer['device'] };
  const handle = owner.handle;
  if (!handle) return;
  const device = owner.device;
  b.memory.afterRelease.push(() => {
    try {
      driver.legacyImportDrop(handle, device.primaryContext);
    } catch (e) {
      process.emitWarning(`closing a tensor set's IPC mapping failed: ${(e as Error).message}`, { code: 'CUDA_IPC_RELEASE_CALLBACK' });
    }
  });
}

// The last layout each link decoded: a repeated send of the same tensors brings the same table,
// which then needs only its extents checked against this message's allocations.
const lastLayout = new WeakMap<Link, TensorLayout>();

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.byteLength === b.byteLength && Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

function cachedLayout(link: Link, table: Uint8Array, count: number, sizes: readonly number[]): TensorLayout {
  const last = lastLayout.get(link);
  if (last && last.count === count && last.allocationCount === sizes.length && sameBytes(last.table, table)) {
    for (let i = 0; i < count; i++) {
      if (last.offsets[i]! + last.extents[i]! > sizes[last.allocations[i]!]!) {
        throw new IpcError('ERR_FRAME_INVALID', `a received tensor set is malformed: tensor ${JSON.stringify(last.names[i])} reaches past the end of its allocation`);
      }
    }
    return last;
  }
  const layout = decodeTensorTable(table, count, sizes);
  lastLayout.set(link, layout);
  return layout;
}

registerTransferHandler(tensorSetTransfer);
