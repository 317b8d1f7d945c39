// The NCCL mover of a sharded sync (PROTOCOL.md 9.3): each pair's byte stream (its runs in plan
// order, packed) cut into chunks; round k is ONE comm.group() holding this rank's send or receive
// of chunk k of every pair it is in, so no order of pairs can deadlock. A chunk that is one range
// of a local tensor goes straight from or into it; the others go through staging slots (each one
// round's staged chunks): gathered by copy_runs before the send, scattered after the receive, on a
// copy stream beside NCCL's. With the group's chunk per pair (ncclChunkBytes: the plan's chunk over
// the busier rank's streams) a round of a rank stages at most one chunk, so the two slots of the
// default stay within issue 37's two chunks per rank. Two slots double buffer, so that round k+1's
// gather and round k's scatter overlap the transfers:
//
//   copy stream:  gather 0 | gather 1 | wait sent[0], scatter 0 | gather 2 | wait sent[1], scatter 1 ...
//                 (gather k records ready[k%2]; it follows scatter k-2 of the same slot in this order)
//   NCCL stream:  wait ready[0], round 0, record sent[0] | wait ready[1], round 1, record sent[1] ...
//
// One slot (options.slots = 1) halves the staging: gather k+1 follows scatter k, so the transfers
// wait for the copies between rounds (on NCCL's network path that cost nothing measurable).
//
// Everything is queued up front; the CPU waits once at the end.
import { invalidArgValue } from '../../arg-errors.js';
import { DeviceBuffer } from '../../cuda/buffer.js';
import type { Device } from '../../cuda/device.js';
import { driver } from '../../cuda/driver.js';
import { Event } from '../../cuda/event.js';
import { Stream } from '../../cuda/stream.js';
import { IpcError } from '../../errors.js';
import type { NcclCommunicator, NcclOperation } from '../../nccl/communicator.js';
import { CHUNK_BYTES, launchCopyRuns, sameBytes } from '../kernels.js';
import { deviceMemories } from './device-copy.js';
import type { ChunkSize, NcclPairs, NcclRunMover, RunMemory } from './execute-types.js';
import type { PlanPair } from './plan.js';
import { checkRunBounds, copyRunsTable, pairChunks, planRounds, roundAddresses, sameMemories, toAddress, type CopyRows, type PairChunk, type RoundEntry } from './pair-stream.js';

const ROW_BYTES = 32;

/** Rows of one launch in the run table: first row, rows, copy_runs work items. */
interface Launch { row: number; runs: number; items: number }

/** One stream of this rank: a pair it sends or receives, its peer in the communicator, its chunks. */
interface PairStream { pair: PlanPair; send: boolean; peer: number; chunks: PairChunk[] }

/** What a move queues, kept while the same pairs, memories and chunk size come again. */
interface Prepared {
  key: {
    comm: NcclCommunicator; chunkBytes: ChunkSize; peers: string; pairs: readonly PlanPair[]; sends: number;
    sources: readonly RunMemory[]; destinations: readonly RunMemory[];
  };
  streams: PairStream[];
  rounds: RoundEntry[][];
  /** Per round, per entry: the address NCCL sends from or receives into. */
  buffers: bigint[][];
  slotBytes: number;
  /** Per round: the gather and the scatter launch (undefined: nothing to copy). */
  gathers: Array<Launch | undefined>;
  scatters: Array<Launch | undefined>;
  table: Uint8Array;
  /** The addresses of the slots the table points into. */
  slots: readonly bigint[];
}

/** Options of ncclRunMover. */
export interface NcclRunMoverOptions {
  /** Staging slots, each one round's staged chunks: 2 (default) overlaps the copies with the transfers, 1 halves the memory. */
  slots?: 1 | 2;
}

class DeviceNcclRunMover implements NcclRunMover {
  readonly #device: Device;
  readonly #slotCount: 1 | 2;
  #ncclStream: Stream | undefined;
  #copyStream: Stream | undefined;
  #ready: Event[] = [];
  #sent: Event[] = [];
  #done: Event | undefined;
  #slots: DeviceBuffer[] = [];
  #table = { ptr: 0n, capacity: 0, data: new Uint8Array(0) };
  #prepared: Prepared | undefined;
  #tail: Promise<unknown> = Promise.resolve();
  #closed = false;

  constructor(device: Device, slots: 1 | 2) {
    this.#device = device;
    this.#slotCount = slots;
  }

  move(comm: NcclCommunicator, commRank: (rank: number) => number, pairs: NcclPairs, sources: readonly RunMemory[],
    destinations: readonly RunMemory[], chunkBytes: ChunkSize): Promise<{ staging: number }> {
    if (this.#closed) return Promise.reject(new IpcError('ERR_CLOSED', 'the NCCL mover was closed: create a new one'));
    const run = this.#tail.then(() => this.#move(comm, commRank, pairs, sources, destinations, chunkBytes));
    this.#tail = run.catch(() => {});
    return run;
  }

  async #move(comm: NcclCommunicator, commRank: (rank: number) => number, pairs: NcclPairs, sources: readonly RunMemory[],
    destinations: readonly RunMemory[], chunkBytes: ChunkSize): Promise<{ staging: number }> {
    if (this.#closed) throw new IpcError('ERR_CLOSED', 'the NCCL mover was closed: create a new one');
    if (comm.closed) throw new IpcError('ERR_NCCL', 'the NCCL runs cannot move: the communicator was closed or aborted');
    const p = this.#prepare(comm, commRank, pairs, sources, destinations, chunkBytes);
    if (p.rounds.length === 0) return { staging: 0 };
    const device = this.#device;
    device.activate();
    const ncclStream = (this.#ncclStream ??= Stream.create(device));
    const staged = p.slotBytes > 0;
    const copyStream = staged ? (this.#copyStream ??= Stream.create(device)) : undefined;
    if (staged && this.#ready.length === 0) {
      this.#ready = [Event.create(device), Event.create(device)];
      this.#sent = [Event.create(device), Event.create(device)];
      this.#done = Event.create(device);
    }
    if (staged) this.#upload(p.table, copyStream!);
    const usesSlot = (k: number): boolean => p.rounds[k]!.some((e) => e.slotOffset >= 0);
    const gather = (k: number): void => {
      if (!usesSlot(k)) return;
      const g = p.gathers[k];
      if (g) this.#launch(copyStream!, g);
      this.#ready[k % this.#slotCount]!.record(copyStream!);
    };
    gather(0);
    const options = { stream: ncclStream };
    const slots = this.#slotCount;
    for (let k = 0; k < p.rounds.length; k++) {
      const s = k % slots;
      const round = p.rounds[k]!;
      if (usesSlot(k)) ncclStream.waitEvent(this.#ready[s]!);
      const ops: NcclOperation[] = round.map((e, i) => {
        const stream = p.streams[e.stream]!;
        return { op: stream.send ? 'send' : 'recv', buffer: p.buffers[k]![i]!, bytes: e.chunk.bytes, peer: stream.peer };
      });
      await comm.group(ops, options);
      if (usesSlot(k)) this.#sent[s]!.record(ncclStream);
      // Two slots: before scatter k on the copy stream, so that it overlaps round k; after scatter
      // k-1, so that slot (k+1)%2 is free again. One slot: after scatter k, which freed it.
      if (k + 1 < p.rounds.length && slots === 2) gather(k + 1);
      if (usesSlot(k)) {
        copyStream!.waitEvent(this.#sent[s]!);
        const sc = p.scatters[k];
        if (sc) this.#launch(copyStream!, sc);
      }
      if (k + 1 < p.rounds.length && slots === 1) gather(k + 1);
    }
    if (staged) {
      this.#done!.record(copyStream!);
      ncclStream.waitEvent(this.#done!);
    }
    await ncclStream.synchronize();
    if (comm.closed) throw new IpcError('ERR_NCCL', 'the NCCL runs were cut short: the communicator was aborted');
    // What this move staged through: its slots' share (slots kept from a larger move may be bigger).
    return { staging: this.#slotCount * p.slotBytes };
  }

  /** Checks the pairs and memories, cuts the streams, lays out rounds, slots and the run table. */
  #prepare(comm: NcclCommunicator, commRank: (rank: number) => number, pairs: NcclPairs, sources: readonly RunMemory[],
    destinations: readonly RunMemory[], chunkBytes: ChunkSize): Prepared {
    const peers = [...pairs.sends.map((p) => commRank(p.dst)), ...pairs.recvs.map((p) => commRank(p.src))];
    // The same plan pairs (objects: a re-plan makes new ones), peers and memories: what was laid out holds.
    const key: Prepared['key'] = { comm, chunkBytes, peers: peers.join(','), pairs: [...pairs.sends, ...pairs.recvs], sends: pairs.sends.length, sources, destinations };
    const last = this.#prepared;
    if (last && sameKey(last.key, key) && sameSlots(last.slots, this.#slots)) return last;
    this.#prepared = undefined;
    const streams: PairStream[] = [];
    const add = (pair: PlanPair, send: boolean): void => {
      const what = `the nccl runs of rank ${pair.src} -> rank ${pair.dst}`;
      if (pair.path !== 'nccl') throw new IpcError('ERR_UNSUPPORTED', `${what}: the NCCL mover moves 'nccl' pairs; a '${pair.path}' pair goes to the device copier`);
      const memories = deviceMemories(send ? sources : destinations, send ? 'source tensor' : 'destination tensor');
      checkRunBounds(pair.runs, send ? 'src' : 'dst', memories.map((m) => m.extent), what);
      const peer = commRank(send ? pair.dst : pair.src);
      if (!Number.isSafeInteger(peer) || peer < 0 || peer >= comm.nranks || peer === comm.rank) {
        throw new IpcError('ERR_OUT_OF_RANGE', `${what}: rank ${send ? pair.dst : pair.src} maps to communicator rank ${peer}, not a peer of rank ${comm.rank} among ${comm.nranks}`);
      }
      streams.push({ pair, send, peer, chunks: pairChunks(pair.runs, send ? 'src' : 'dst', typeof chunkBytes === 'number' ? chunkBytes : chunkBytes(pair)) });
    };
    for (const pair of pairs.sends) add(pair, true);
    for (const pair of pairs.recvs) add(pair, false);
    const { rounds, slotBytes } = planRounds(streams.map((s) => s.chunks));
    if (slotBytes > 0) this.#ensureSlots(slotBytes);
    const slots = this.#slots.map((b) => b.devicePointer);
    const parts: Uint8Array[] = [];
    let rows = 0;
    const table = (copies: CopyRows): Launch | undefined => {
      const t = copyRunsTable(copies, CHUNK_BYTES);
      if (t.runs === 0) return undefined;
      parts.push(t.data);
      const launch = { row: rows, runs: t.runs, items: t.chunks };
      rows += t.runs;
      return launch;
    };
    const gathers: Array<Launch | undefined> = [];
    const scatters: Array<Launch | undefined> = [];
    const buffers: bigint[][] = [];
    const send = streams.map((s) => s.send);
    const srcAt = sources.map((m) => (m.kind === 'device' ? toAddress(m.pointer) : 0));
    const dstAt = destinations.map((m) => (m.kind === 'device' ? toAddress(m.pointer) : 0));
    const address = (out: boolean, t: number): number => (out ? srcAt : dstAt)[t]!;
    rounds.forEach((round, k) => {
      const r = roundAddresses(round, send, address, toAddress(slots[k % this.#slotCount] ?? 0n));
      buffers.push(r.buffers.map((b) => BigInt(b)));
      gathers.push(table(r.gather));
      scatters.push(table(r.scatter));
    });
    const data = new Uint8Array(rows * ROW_BYTES);
    let at = 0;
    for (const part of parts) {
      data.set(part, at);
      at += part.byteLength;
    }
    const prepared: Prepared = { key, streams, rounds, buffers, slotBytes, gathers, scatters, table: data, slots };
    this.#prepared = prepared;
    return prepared;
  }

  /** The slots, of at least `bytes` each, kept for later moves (larger ones replace them). */
  #ensureSlots(bytes: number): void {
    if (this.#slots.length === this.#slotCount && this.#slots[0]!.byteLength >= bytes) return;
    if (this.#slots.length) {
      // Moves run one at a time and wait for their streams: nothing queued reads them now.
      for (const s of [this.#copyStream, this.#ncclStream]) if (s) driver.streamSynchronize(s.handle);
      for (const b of this.#slots) b.close();
      this.#slots = [];
    }
    this.#slots = Array.from({ length: this.#slotCount }, () => DeviceBuffer.allocate(bytes, { device: this.#device }));
  }

  #upload(data: Uint8Array, stream: Stream): void {
    const t = this.#table;
    if (data.byteLength === 0 || sameBytes(t.data, data)) return;
    t.data = new Uint8Array(0);  // until the upload went out: a failure leaves the table unknown
    if (t.capacity < data.byteLength) {
      if (t.ptr) {
        driver.streamSynchronize(stream.handle);
        driver.memFree(t.ptr);
        t.ptr = 0n;
        t.capacity = 0;
      }
      t.ptr = driver.memAlloc(data.byteLength);
      t.capacity = data.byteLength;
    }
    // On the copy stream: after every launch that read the previous table.
    driver.memcpyHtoDAsync(t.ptr, data, stream.handle);
    t.data = data.slice();
  }

  #launch(stream: Stream, l: Launch): void {
    this.#device.activate();
    launchCopyRuns(this.#device, stream.handle, this.#table.ptr + BigInt(l.row * ROW_BYTES), l.runs, l.items);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#tail;
    const streams = [this.#ncclStream, this.#copyStream].filter((s): s is Stream => s !== undefined);
    try {
      await Promise.all(streams.map((s) => s.synchronize().catch(() => {})));
    } finally {
      for (const b of this.#slots) b.close();
      this.#slots = [];
      if (this.#table.ptr) {
        this.#device.activate();
        driver.memFree(this.#table.ptr);
        this.#table = { ptr: 0n, capacity: 0, data: new Uint8Array(0) };
      }
      for (const e of [...this.#ready, ...this.#sent, ...(this.#done ? [this.#done] : [])]) e.close();
      this.#ready = [];
      this.#sent = [];
      this.#done = undefined;
      for (const s of streams) s.close();
      this.#ncclStream = undefined;
      this.#copyStream = undefined;
      this.#prepared = undefined;
    }
  }
}

function sameKey(a: Prepared['key'], b: Prepared['key']): boolean {
  return a.comm === b.comm && a.chunkBytes === b.chunkBytes && a.peers === b.peers && a.sends === b.sends &&
    a.pairs.length === b.pairs.length && a.pairs.every((p, i) => p === b.pairs[i]) &&
    sameMemories(a.sources, b.sources) && sameMemories(a.destinations, b.destinations);
}

function sameSlots(a: readonly bigint[], b: readonly DeviceBuffer[]): boolean {
  return a.length === b.length && a.every((p, i) => p === b[i]!.devicePointer);
}

/** The NCCL mover on `device` (the rank's GPU, the communicator's device). */
export function ncclRunMover(device: Device, options: NcclRunMoverOptions = {}): NcclRunMover {
  const slots = options.slots ?? 2;
  if (slots !== 1 && slots !== 2) throw invalidArgValue(`ncclRunMover: options.slots is 1 or 2 (staging slots); got ${String(slots)}`);
  return new DeviceNcclRunMover(device, slots);
}
