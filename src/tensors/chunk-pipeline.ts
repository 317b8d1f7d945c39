// Moving a packed stream's chunks over NCCL on one side (docs/PROTOCOL.md 8.3): one NCCL operation
// per chunk, straight from or into memory where the chunk's route says so, otherwise through one of
// two staging slots that a copy_runs launch fills (sending: gather) or empties (receiving: scatter)
// on a second stream, so that the copy of one chunk overlaps the transfer of the next. Everything
// is queued up front; the CPU only waits at the end.
//
//   send, staged chunk k (slot s = k % 2):  copy: wait free[s], gather k -> s, record full[s]
//                                            nccl: wait full[s], send s, record free[s]
//   recv, staged chunk k:                    nccl: wait free[s], recv -> s, record full[s]
//                                            copy: wait full[s], scatter s, record free[s]
//
// One ChunkMover per communicator: its transfers are queued one after another (the communicator's
// TransferOrder, link/nccl/nccl-comms.ts, starts each once the one before it was queued) and reuse the
// slots, events and run table.
import { DeviceBuffer } from '../cuda/buffer.js';
import type { Device } from '../cuda/device.js';
import { driver } from '../cuda/driver.js';
import { Event } from '../cuda/event.js';
import { Stream } from '../cuda/stream.js';
import { IpcError } from '../errors.js';
import type { NcclCommunicator } from '../nccl/communicator.js';
import { launchCopyRuns, planRuns, sameBytes } from './kernels.js';
import type { ChunkRoute } from './packed-stream.js';

/** What each chunk is on the communicator: a send to / receive from one rank, or a broadcast. */
export type ChunkOperation = { readonly op: 'send' | 'recv'; readonly peer: number } | { readonly op: 'broadcast'; readonly root: number };

/** The rows of every staged chunk of one transfer, in one table. */
interface TablePlan {
  data: Uint8Array;
  /** Per chunk (undefined for direct ones): first row, rows, copy_runs work items. */
  chunks: Array<{ row: number; runs: number; items: number } | undefined>;
}

const ROW_BYTES = 32;

export class ChunkMover {
  readonly device: Device;
  /** The stream NCCL's operations run on. */
  readonly ncclStream: Stream;
  /** The stream gathers and scatters run on. */
  readonly copyStream: Stream;
  #slots: DeviceBuffer[] = [];
  readonly #free: Event[];
  readonly #full: Event[];
  readonly #done: Event;
  /** The run table in device memory, and the bytes uploaded last (a repeated sync uploads nothing). */
  #table = { ptr: 0n, capacity: 0, data: new Uint8Array(0) };
  /** The last transfer's completion (close() waits for it). */
  #last: Promise<void> = Promise.resolve();
  #closed = false;

  /** `ncclStream`: the communicator's own stream (every NCCL operation of a communicator on one stream). */
  constructor(device: Device, ncclStream: Stream) {
    this.device = device;
    this.ncclStream = ncclStream;
    this.copyStream = Stream.create(device);
    this.#free = [Event.create(device), Event.create(device)];
    this.#full = [Event.create(device), Event.create(device)];
    this.#done = Event.create(device);
  }

  /**
   * Queues every chunk of one transfer (`routes`: this side's, from routeChunks); resolves once
   * they are queued, with `done`: resolves once the last byte was sent or received (and scattered).
   * One transfer at a time: the caller queues the next after this one resolved.
   */
  async queue(comm: NcclCommunicator, how: ChunkOperation, routes: readonly ChunkRoute[]): Promise<{ done: Promise<void> }> {
    if (this.#closed) throw new IpcError('ERR_CLOSED', 'the NCCL transfer was dropped: its link closed');
    const sending = how.op === 'send' || (how.op === 'broadcast' && comm.rank === how.root);
    let largest = 0;
    for (const r of routes) if (!r.direct && r.bytes > largest) largest = r.bytes;
    if (largest > 0) this.#ensureSlots(largest);
    const plan = this.#plan(routes, sending);
    this.#upload(plan.data);
    const options = { stream: this.ncclStream };
    for (let k = 0; k < routes.length; k++) {
      const route = routes[k]!;
      const staged = plan.chunks[k];
      const s = k % 2;
      let buffer: bigint;
      if (route.direct) {
        buffer = route.address;
      } else {
        buffer = this.#slots[s]!.devicePointer;
        if (sending) {
          this.copyStream.waitEvent(this.#free[s]!);
          this.#launch(staged!);
          this.#full[s]!.record(this.copyStream);
          this.ncclStream.waitEvent(this.#full[s]!);
        } else {
          this.ncclStream.waitEvent(this.#free[s]!);
        }
      }
      if (how.op === 'broadcast') await comm.broadcast(buffer, route.bytes, how.root, options);
      else if (how.op === 'send') await comm.send(buffer, route.bytes, how.peer, options);
      else await comm.recv(buffer, route.bytes, how.peer, options);
      if (!route.direct) {
        if (sending) {
          this.#free[s]!.record(this.ncclStream);
        } else {
          this.#full[s]!.record(this.ncclStream);
          this.copyStream.waitEvent(this.#full[s]!);
          this.#launch(staged!);
          this.#free[s]!.record(this.copyStream);
        }
      }
    }
    // Done when both streams passed this transfer's work.
    this.#done.record(this.copyStream);
    this.ncclStream.waitEvent(this.#done);
    const done = this.ncclStream.synchronize().then(() => {
      if (comm.closed) throw new IpcError('ERR_NCCL', 'the NCCL transfer was cut short: its communicator was aborted');
    });
    this.#last = done.catch(() => {});
    return { done };
  }

  /** The run table of the staged chunks: gathers (addresses -> slot) or scatters (slot -> addresses). */
  #plan(routes: readonly ChunkRoute[], gather: boolean): TablePlan {
    const parts: Uint8Array[] = [];
    const chunks: TablePlan['chunks'] = [];
    let rows = 0;
    routes.forEach((route, k) => {
      if (route.direct) {
        chunks.push(undefined);
        return;
      }
      const slot = this.#slots[k % 2]!.devicePointer;
      const n = route.copies.length;
      const here = new BigUint64Array(n);
      const there = new BigUint64Array(n);
      const sizes = new BigUint64Array(n);
      route.copies.forEach(([at, address, bytes], i) => {
        here[i] = address;
        there[i] = slot + BigInt(at);
        sizes[i] = BigInt(bytes);
      });
      const t = gather ? planRuns(there, here, sizes) : planRuns(here, there, sizes);
      chunks.push({ row: rows, runs: t.runs, items: t.chunks });
      parts.push(t.data);
      rows += t.runs;
    });
    const data = new Uint8Array(rows * ROW_BYTES);
    let at = 0;
    for (const p of parts) {
      data.set(p, at);
      at += p.byteLength;
    }
    return { data, chunks };
  }

  /** Two staging slots of at least `bytes` each (kept for the next transfer; larger ones replace them). */
  #ensureSlots(bytes: number): void {
    if (this.#slots.length === 2 && this.#slots[0]!.byteLength >= bytes) return;
    if (this.#slots.length) {
      // Work queued by the transfer before may still use them.
      driver.streamSynchronize(this.copyStream.handle);
      driver.streamSynchronize(this.ncclStream.handle);
      for (const b of this.#slots) b.close();
      this.#slots = [];
    }
    this.#slots = [DeviceBuffer.allocate(bytes, { device: this.device }), DeviceBuffer.allocate(bytes, { device: this.device })];
  }

  #upload(data: Uint8Array): void {
    const t = this.#table;
    if (data.byteLength === 0 || sameBytes(t.data, data)) return;
    this.device.activate();
    t.data = new Uint8Array(0);  // until the upload below went out: a failure leaves the table unknown
    if (t.capacity < data.byteLength) {
      // Launches still queued may read the old table: let them finish before it goes.
      if (t.ptr) {
        driver.streamSynchronize(this.copyStream.handle);
        driver.memFree(t.ptr);
        t.ptr = 0n;
        t.capacity = 0;
      }
      t.ptr = driver.memAlloc(data.byteLength);
      t.capacity = data.byteLength;
    }
    // On the copy stream: after every launch that read the previous table.
    driver.memcpyHtoDAsync(t.ptr, data, this.copyStream.handle);
    t.data = data.slice();
  }

  #launch(c: { row: number; runs: number; items: number }): void {
    launchCopyRuns(this.device, this.copyStream.handle, this.#table.ptr + BigInt(c.row * ROW_BYTES), c.runs, c.items);
  }

  /**
   * Frees the slots, events, table and streams once nothing queued can still use them. Call it
   * after the communicator was closed or aborted (an aborted NCCL operation ends its kernels).
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#last;
    try {
      await Promise.all([this.ncclStream.synchronize(), this.copyStream.synchronize()]);
    } finally {
      for (const s of this.#slots) s.close();
      this.#slots = [];
      if (this.#table.ptr) {
        this.device.activate();
        driver.memFree(this.#table.ptr);
        this.#table.ptr = 0n;
      }
      for (const e of [...this.#free, ...this.#full, this.#done]) e.close();
      this.copyStream.close();
    }
  }
}

