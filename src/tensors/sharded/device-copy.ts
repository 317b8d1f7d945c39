// The device copier of a sharded sync (PROTOCOL.md 9.3): a destination's 'local' and 'ipc' runs
// of one sync in ONE copy_runs launch on a stream of its own, each block of a strided run a row of
// the table. Every run is checked against the extents of the memories it touches before anything
// is queued, so a wrong plan or a short memory is a typed error, never a write outside a tensor.
// The table is built and uploaded once per batch: the same CopyBatch again (or one of the same plan
// pairs and memories: sameBatch) costs one launch.
import type { Device } from '../../cuda/device.js';
import { driver } from '../../cuda/driver.js';
import { Stream } from '../../cuda/stream.js';
import { IpcError } from '../../errors.js';
import { CHUNK_BYTES, launchCopyRuns } from '../kernels.js';
import type { CopyBatch, RunCopier, RunMemory } from './execute-types.js';
import { checkRunBounds, CopyRunsTableBuilder, sameBatch, streamBytes, toAddress } from './pair-stream.js';

type DeviceMemory = Extract<RunMemory, { kind: 'device' }>;

/** A batch's table: rows, work items, where it lives on the device. */
interface Prepared { batch: CopyBatch; runs: number; chunks: number; bytes: number }

/** The device memories of `memories`, or a typed error naming the first host one. */
export function deviceMemories(memories: readonly RunMemory[], what: string): DeviceMemory[] {
  return memories.map((m, i) => {
    if (m?.kind !== 'device') {
      throw new IpcError('ERR_UNSUPPORTED', `${what} #${i} is ${m?.kind === 'host' ? 'host memory' : 'not a RunMemory'}, in a batch for the device copier: a rank's memories are all on its GPU or all on the host (use the host copier)`);
    }
    return m;
  });
}

/**
 * Checks `batch` (paths 'local'/'ipc' only, device memories, every run inside its memories) and
 * returns the copy_runs table of all its runs (each block of a strided run a row) and the bytes
 * they move. Throws before anything is queued.
 */
export function batchTable(batch: CopyBatch, chunkBytes = CHUNK_BYTES): { data: Uint8Array; runs: number; chunks: number; bytes: number } {
  const destinations = deviceMemories(batch.destinations, 'destination tensor');
  const dst = destinations.map((m) => toAddress(m.pointer));
  const table = new CopyRunsTableBuilder(chunkBytes);
  let bytes = 0;
  for (const { pair, sources } of batch.pairs) {
    const what = `the ${pair.path} runs of rank ${pair.src} -> rank ${pair.dst}`;
    if (pair.path !== 'local' && pair.path !== 'ipc') {
      throw new IpcError('ERR_UNSUPPORTED', `${what}: the device copier copies 'local' and 'ipc' pairs; an '${pair.path}' pair goes to the NCCL mover`);
    }
    const from = deviceMemories(sources, `source tensor (rank ${pair.src})`);
    checkRunBounds(pair.runs, 'src', from.map((m) => m.extent), what);
    checkRunBounds(pair.runs, 'dst', destinations.map((m) => m.extent), what);
    table.addRuns(pair.runs, from.map((m) => toAddress(m.pointer)), dst);
    bytes += streamBytes(pair.runs);
  }
  return { ...table.finish(), bytes };
}

class DeviceRunCopier implements RunCopier {
  readonly #device: Device;
  #stream: Stream | undefined;
  /** The table in device memory and the batch it was made for. */
  #table = { ptr: 0n, capacity: 0 };
  #prepared: Prepared | undefined;
  /** The last copy (the next one waits for it: they share the stream and the table). */
  #tail: Promise<void> = Promise.resolve();
  #closed = false;

  constructor(device: Device) {
    this.#device = device;
  }

  copy(batch: CopyBatch): Promise<void> {
    if (this.#closed) return Promise.reject(new IpcError('ERR_CLOSED', 'the device copier was closed: create a new one'));
    const run = this.#tail.then(() => this.#copy(batch));
    this.#tail = run.catch(() => {});
    return run;
  }

  async #copy(batch: CopyBatch): Promise<void> {
    if (this.#closed) throw new IpcError('ERR_CLOSED', 'the device copier was closed: create a new one');
    const device = this.#device;
    let p = this.#prepared;
    if (!p || !sameBatch(p.batch, batch)) {
      this.#prepared = undefined;
      const table = batchTable(batch);
      if (table.runs === 0) {
        this.#prepared = { batch, runs: 0, chunks: 0, bytes: 0 };
        return;
      }
      device.activate();
      this.#stream ??= Stream.create(device);
      const t = this.#table;
      if (t.capacity < table.data.byteLength) {
        // The copy before this one finished (copies run one at a time): its table can go.
        if (t.ptr) driver.memFree(t.ptr);
        t.ptr = 0n;
        t.capacity = 0;
        t.ptr = driver.memAlloc(table.data.byteLength);
        t.capacity = table.data.byteLength;
      }
      driver.memcpyHtoDAsync(t.ptr, table.data, this.#stream.handle);
      p = { batch, runs: table.runs, chunks: table.chunks, bytes: table.bytes };
    }
    if (p.runs === 0) return;
    const stream = this.#stream!;
    device.activate();
    launchCopyRuns(device, stream.handle, this.#table.ptr, p.runs, p.chunks);
    // Reused only once it was uploaded and launched: a failure above leaves nothing to trust.
    this.#prepared = p;
    await stream.synchronize();
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#tail;
    if (this.#stream) {
      await this.#stream.synchronize().catch(() => {});
      this.#stream.close();
      this.#stream = undefined;
    }
    if (this.#table.ptr) {
      this.#device.activate();
      driver.memFree(this.#table.ptr);
      this.#table = { ptr: 0n, capacity: 0 };
    }
    this.#prepared = undefined;
  }
}

/**
 * The device copier on `device` (the destination rank's GPU; sources on another GPU are reached
 * through the peer mappings their RunMemory pointers already are).
 */
export function deviceRunCopier(device: Device): RunCopier {
  return new DeviceRunCopier(device);
}
