// How a TensorMap (or a Map of DeviceArrays) crosses a TCP link (PROTOCOL.md 8.3, 'nccl-tensor-set'):
// the record carries the table, the bytes follow over the link's NCCL communicator as one packed
// stream in chunks (packed-stream.ts, moved by chunk-pipeline.ts). The receiver gets the map at
// once and receives its bytes when it is used: `updateInPlace(params, map)` straight into the
// parameters, `map.fetch()` into one allocation of its own. The sender's memory stays leased until
// the receiver has the bytes.
import type { SharedMemory } from '../cuda/buffer.js';
import { DeviceBuffer } from '../cuda/buffer.js';
import type { Device } from '../cuda/device.js';
import { IpcError } from '../errors.js';
import { DeviceArray } from '../arrays/device-array.js';
import { dtypeInfo } from '../ipc/dtype.js';
import type { ReceivedLease } from '../link/lifetimes/lease.js';
import type { Link } from '../link/connection/link.js';
import { beginOutgoing, incomingComm, ncclEncoding, type LinkComm } from '../link/nccl/nccl-comms.js';
import { registerTransferHandler, type TransferHandler } from '../link/transfers/transfer.js';
import { countTraffic, type TrafficLink } from '../observe/hooks.js';
import { ChunkMover, type ChunkOperation } from './chunk-pipeline.js';
import { HostArray } from '../arrays/host-array.js';
import { NCCL_TENSOR_SET_KIND, decodeNcclTensorSet, decodePackedTable, encodeNcclTensorSet, encodePackedTable, type NcclTensorSetRecord } from './nccl-wire.js';
import { DEFAULT_CHUNK_BYTES, MIN_CHUNK_BYTES, PACK_ALIGN, packOffsets, routeChunks, type ChunkRoute } from './packed-stream.js';
import { TensorMap, isTensorSetValue, remoteTensorMap, tensorMapContents, type RemoteTensors, type TensorArray } from './tensor-map.js';
import type { TensorLayout } from './wire.js';

/** What sending one set takes, kept per TensorMap while it does not change. */
interface SendPlan {
  readonly device: Device;
  readonly table: Uint8Array;
  readonly count: number;
  readonly packedLength: number;
  readonly chunkBytes: number;
  readonly routes: ChunkRoute[];
  /** The allocations the tensors live in (each leased once per send). */
  readonly memories: SharedMemory[];
  readonly pointers: bigint[];
}

/** The chunk size for a stream of `length` bytes: the default, or less for a short stream. */
function chunkBytesFor(length: number): number {
  const fit = Math.ceil(length / PACK_ALIGN) * PACK_ALIGN;
  return Math.min(DEFAULT_CHUNK_BYTES, Math.max(MIN_CHUNK_BYTES, fit));
}

function planSend(entries: Iterable<readonly [string, TensorArray]>): SendPlan {
  let device: Device | undefined;
  const specs: Array<{ name: string; dtype: DeviceArray['dtype']; shape: readonly number[]; nbytes: number; address: bigint; allocation: SharedMemory }> = [];
  for (const [name, array] of entries) {
    if (array instanceof HostArray) {
      throw new IpcError('ERR_NOT_TRANSFERABLE', `link.send: tensor ${JSON.stringify(name)} is in host memory; a tensor set crosses a TCP link over NCCL, device memory only (send host tensors in a HostBuffer, which is copied)`);
    }
    const b = array.buffer;
    if (b.closed) throw new IpcError('ERR_CLOSED', `link.send: tensor ${JSON.stringify(name)} is closed; send tensors before closing them`);
    if (!array.contiguous) throw new IpcError('ERR_NOT_TRANSFERABLE', `link.send: tensor ${JSON.stringify(name)} is strided; a tensor set crosses a TCP link as C-contiguous tensors (send a contiguous copy)`);
    if (array.size === 0) throw new IpcError('ERR_NOT_TRANSFERABLE', `link.send: tensor ${JSON.stringify(name)} has no elements; tensor sets carry tensors of at least one element`);
    device ??= b.device;
    if (b.device !== device) {
      throw new IpcError('ERR_NOT_TRANSFERABLE', `link.send: the tensors live on several devices (${device.ordinal} and ${b.device.ordinal}); over a TCP link send one set per device`);
    }
    specs.push({ name, dtype: array.dtype, shape: array.shape, nbytes: array.size * dtypeInfo(array.dtype).itemsize, address: b.devicePointer, allocation: b.memory });
  }
  if (!device) throw new IpcError('ERR_NOT_TRANSFERABLE', 'link.send: an empty tensor set has nothing to send');
  const { offsets, length } = packOffsets(specs);
  const chunkBytes = chunkBytesFor(length);
  const table = encodePackedTable(specs.map((t, i) => ({ name: t.name, dtype: t.dtype, shape: t.shape, offset: offsets[i]! })));
  const routes = routeChunks(specs.map((t, i) => ({ offset: offsets[i]!, nbytes: t.nbytes, address: t.address })), length, chunkBytes);
  return {
    device, table, count: specs.length, packedLength: length, chunkBytes, routes,
    memories: [...new Set(specs.map((t) => t.allocation))], pointers: specs.map((t) => t.address),
  };
}

const PLAN_CACHE_KEY = 'nccl-tensor-set.plan';

/** The plan of `value`; for a TensorMap you built, kept while neither it nor its arrays changed. */
function planOf(value: TensorMap | Map<string, TensorArray>): SendPlan {
  const c = value instanceof TensorMap ? tensorMapContents(value) : undefined;
  if (c?.kind === 'remote') throw new IpcError('ERR_INVALID_STATE', 'link.send: this TensorMap came over a TCP link and its bytes are still on its sender: `await map.fetch()` before sending it on');
  if (c?.kind === 'received') {
    // Sent on as it came: one device allocation (a fetched set) or mapped allocations.
    const { layout, allocations } = c.received;
    const entries = layout.names.map((name, i) => {
      const whole = allocations[layout.allocations[i]!]!;
      if (!(whole instanceof DeviceBuffer)) throw new IpcError('ERR_NOT_TRANSFERABLE', `link.send: tensor ${JSON.stringify(name)} is in host memory; a tensor set crosses a TCP link over NCCL, device memory only`);
      return [name, new DeviceArray(whole.view(layout.offsets[i]!, layout.extents[i]!), { dtype: layout.dtypes[i]!, shape: layout.shapes[i]!, strides: layout.strides[i]! })] as const;
    });
    try {
      return planSend(entries);
    } finally {
      for (const [, a] of entries) a.buffer.close();
    }
  }
  if (c?.kind !== 'built') return planSend((value as Map<string, TensorArray>).entries());
  const hit = c.cache.get(PLAN_CACHE_KEY) as { version: number; plan: SendPlan } | undefined;
  if (hit && hit.version === c.version && samePointers(hit.plan, c.entries)) return hit.plan;
  const plan = planSend(c.entries.entries());
  c.cache.set(PLAN_CACHE_KEY, { version: c.version, plan });
  return plan;
}

function samePointers(plan: SendPlan, entries: ReadonlyMap<string, TensorArray>): boolean {
  let i = 0;
  for (const a of entries.values()) {
    if (a instanceof HostArray || a.buffer.closed || a.buffer.devicePointer !== plan.pointers[i++]) return false;
  }
  return i === plan.pointers.length;
}

/** The chunk mover of a communicator (its staging slots, copy stream and run table), made on first use. */
function moverOf(comm: LinkComm): ChunkMover {
  let m = comm.extras.get('chunks') as ChunkMover | undefined;
  if (!m) comm.extras.set('chunks', (m = new ChunkMover(comm.device, comm.stream)));
  return m;
}

/** Queues `routes` on `comm` in `sequence`'s turn; resolves once done (rejects with why not). */
function moveChunks(comm: LinkComm, sequence: number, how: ChunkOperation, routes: readonly ChunkRoute[], count: (bytes: number) => void): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    comm.submit(sequence, async (c) => {
      const q = await moverOf(comm).queue(c, how, routes);
      q.done.then(() => {
        let bytes = 0;
        for (const r of routes) bytes += r.bytes;
        count(bytes);
        resolve();
      }, reject);
      return q;
    }, reject);
  });
}

/** A received set's bytes, still on the sender until used (RemoteTensors for the TensorMap). */
class RemoteSet implements RemoteTensors {
  readonly layout: TensorLayout;
  readonly device: Device;
  readonly #comm: LinkComm;
  readonly #record: NcclTensorSetRecord;
  readonly #lease: ReceivedLease | undefined;
  readonly #link: TrafficLink;
  #started = false;
  #failed: IpcError | undefined;
  /** The set received into memory of its own (fetch, or forced by a later transfer). */
  #fetched: Promise<DeviceBuffer> | undefined;

  constructor(comm: LinkComm, record: NcclTensorSetRecord, lease: ReceivedLease | undefined, link: Link) {
    this.layout = record.layout;
    this.device = comm.device;
    this.#comm = comm;
    this.#record = record;
    this.#lease = lease;
    this.#link = link as TrafficLink;
    comm.defer(record.sequence, () => void this.fetch().catch(() => {}), (e) => this.#fail(e));
  }

  get fetchStarted(): boolean {
    return this.#fetched !== undefined;
  }

  fetch(): Promise<DeviceBuffer> {
    if (this.#fetched) return this.#fetched;
    this.#fetched = (async () => {
      this.#start();
      let buffer: DeviceBuffer;
      try {
        buffer = DeviceBuffer.allocate(this.#record.packedLength, { device: this.device });
      } catch (e) {
        const error = new IpcError('ERR_NCCL', `could not allocate ${this.#record.packedLength} bytes on device ${this.device.ordinal} to receive a tensor set over NCCL: ${(e as Error).message}`, { cause: e });
        this.#comm.abort(error, 1);
        this.#end();
        throw error;
      }
      const base = buffer.devicePointer;
      const routes = routeChunks([{ offset: 0, nbytes: this.#record.packedLength, address: base }], this.#record.packedLength, this.#record.chunkBytes);
      try {
        await this.#move(routes);
      } catch (e) {
        buffer.close();
        throw e;
      }
      return buffer;
    })();
    return this.#fetched;
  }

  async receiveInto(targets: ReadonlyArray<bigint | undefined>): Promise<{ operations: number; staged: number }> {
    if (this.#fetched) throw new IpcError('ERR_INVALID_STATE', 'this set is being received into memory of its own already; update from it once fetch() resolved');
    this.#start();
    const routes = routeChunks(this.#placements((i) => targets[i]), this.#record.packedLength, this.#record.chunkBytes);
    await this.#move(routes);
    return { operations: routes.length, staged: routes.filter((r) => !r.direct).length };
  }

  drop(): void {
    if (this.#fetched) {
      // Received (or being received) into memory of its own, which nobody will use.
      this.#fetched.then((b) => b.close(), () => {});
      return;
    }
    if (this.#started) return;
    this.#start();
    const routes = routeChunks(this.#placements(() => undefined), this.#record.packedLength, this.#record.chunkBytes);
    this.#move(routes).catch(() => {});
  }

  #placements(address: (i: number) => bigint | undefined) {
    const { layout } = this;
    return layout.names.map((_, i) => ({ offset: layout.offsets[i]!, nbytes: layout.nbytes[i]!, address: address(i) }));
  }

  #start(): void {
    if (this.#failed) throw this.#failed;
    if (this.#started) throw new IpcError('ERR_INVALID_STATE', 'this set is being received already');
    this.#started = true;
  }

  async #move(routes: readonly ChunkRoute[]): Promise<void> {
    try {
      await moveChunks(this.#comm, this.#record.sequence, this.#comm.broadcast ? { op: 'broadcast', root: 0 } : { op: 'recv', peer: 0 }, routes,
        (bytes) => countTraffic(this.#link, 'ncclReceived', bytes));
    } finally {
      this.#end();
    }
  }

  #fail(error: IpcError): void {
    this.#failed ??= error;
    this.#end();
  }

  /** The sender may have its memory back: the bytes are here, or will never come. */
  #end(): void {
    this.#lease?.end();
  }
}

/** The last table each link decoded: a repeated sync sends the same one. */
const lastTable = new WeakMap<Link, TensorLayout>();

function cachedDecode(link: Link): (table: Uint8Array, count: number, packedLength: number) => TensorLayout {
  return (table, count, packedLength) => {
    const last = lastTable.get(link);
    if (last && last.count === count && Buffer.compare(last.table, table) === 0) {
      // Same table: only its end against this stream's length is new.
      const end = last.offsets[count - 1]! + last.nbytes[count - 1]!;
      if (end === packedLength) return last;
    }
    const layout = decodePackedTable(table, count, packedLength);
    lastTable.set(link, layout);
    return layout;
  };
}

export const ncclTensorSetTransfer: TransferHandler<TensorMap | Map<string, TensorArray>> = {
  kind: NCCL_TENSOR_SET_KIND,
  transports: ['tcp'],
  canTransfer: isTensorSetValue,
  encode(value, link) {
    const l = link as Link;
    const plan = planOf(value);
    const out = beginOutgoing(l, plan.device);
    const data = encodeNcclTensorSet({ comm: out.reference, sequence: out.sequence }, plan.table, plan.count, plan.packedLength, plan.chunkBytes);
    const releases = plan.memories.map((m) => m.lease());
    const comm = out.comm;
    const how: ChunkOperation = comm.broadcast ? { op: 'broadcast', root: 0 } : { op: 'send', peer: 1 };
    // The memory goes back once the peer has it and NCCL is done reading it (sent, or aborted with the link).
    return ncclEncoding(out, data, plan.packedLength, () => { for (const r of releases) r(); }, async (c) => {
      const q = await moverOf(comm).queue(c, how, plan.routes);
      q.done.then(() => countTraffic(l as TrafficLink, 'ncclSent', plan.packedLength), () => {});
      return q;
    });
  },
  decode(data, fds, link, lease) {
    const l = link as Link;
    if (fds.length !== 0) throw new IpcError('ERR_DESCRIPTOR_INVALID', 'received an nccl-tensor-set record with fds');
    const record = decodeNcclTensorSet(data, cachedDecode(l));
    const comm = incomingComm(l, record.comm, record.sequence);
    return remoteTensorMap(new RemoteSet(comm, record, lease, l));
  },
};

registerTransferHandler(ncclTensorSetTransfer);
