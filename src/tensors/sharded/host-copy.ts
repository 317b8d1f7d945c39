// The host data path of a sharded sync: a destination's 'local' and 'ipc' runs copied with plain
// memory copies (host memory: the rank's own HostArrays, and its node's sources mapped here as
// memfd host buffers from their tensor sets). Strided runs copy block by block.
import { IpcError } from '../../errors.js';
import { RUN_FIELDS } from './runs.js';
import type { CopyBatch, RunCopier, RunMemory } from './execute-types.js';

function hostBytes(m: RunMemory | undefined, what: string): Uint8Array {
  if (!m) throw new IpcError('ERR_OUT_OF_RANGE', `host copy: ${what} is missing; a run names a local tensor the batch does not have`);
  if (m.kind !== 'host') throw new IpcError('ERR_SHARD_MEMORY', `host copy: ${what} is device memory; the host copier copies host memory only (use the device copier)`);
  return m.bytes;
}

/** Copies every run of `batch` (synchronously). Checks each run against both memories' bounds first. */
export function copyHostRuns(batch: CopyBatch): void {
  const dsts = batch.destinations.map((m, i) => hostBytes(m, `destination ${i}`));
  for (const { pair, sources } of batch.pairs) {
    const srcs = sources.map((m, i) => hostBytes(m, `source ${i} of rank ${pair.src}`));
    const r = pair.runs;
    // Bounds of every run before any byte is written: a bad table writes nothing.
    for (let i = 0; i < r.length; i += RUN_FIELDS) {
      const s = srcs[r[i]!];
      const d = dsts[r[i + 1]!];
      const last = r[i + 5]! - 1;
      if (!s || !d || r[i + 2]! + last * r[i + 6]! + r[i + 4]! > s.byteLength || r[i + 3]! + last * r[i + 7]! + r[i + 4]! > d.byteLength) {
        throw new IpcError('ERR_OUT_OF_RANGE', `host copy: run ${i / RUN_FIELDS} of the pair ${pair.src} -> ${pair.dst} reaches past its local tensors; the plan does not match the memories given`);
      }
    }
    for (let i = 0; i < r.length; i += RUN_FIELDS) {
      const s = srcs[r[i]!]!;
      const d = dsts[r[i + 1]!]!;
      const so = r[i + 2]!; const dOff = r[i + 3]!; const n = r[i + 4]!; const count = r[i + 5]!; const ss = r[i + 6]!; const ds = r[i + 7]!;
      for (let c = 0; c < count; c++) d.set(s.subarray(so + c * ss, so + c * ss + n), dOff + c * ds);
    }
  }
}

/** The host RunCopier: plain copies, nothing held between syncs. */
export function hostRunCopier(): RunCopier {
  let closed = false;
  return {
    copy(batch: CopyBatch): Promise<void> {
      if (closed) return Promise.reject(new IpcError('ERR_CLOSED', 'host copy: this copier was closed'));
      try {
        copyHostRuns(batch);
        return Promise.resolve();
      } catch (e) {
        return Promise.reject(e);
      }
    },
    close(): Promise<void> {
      closed = true;
      return Promise.resolve();
    },
  };
}
