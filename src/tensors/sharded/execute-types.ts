// The data paths of a sharded sync, as the group (group.ts) calls them: a copier for the runs a
// destination takes from sources on its node (paths 'local' and 'ipc'), and a mover for the
// runs that go over NCCL. The group decides when; these decide how. Design: docs/PROTOCOL.md 9.3.
import type { Device } from '../../cuda/device.js';
import type { NcclCommunicator } from '../../nccl/communicator.js';
import type { PlanPair } from './plan.js';

/** One local tensor's memory as a data path sees it: its first element and the bytes it spans. */
export type RunMemory =
  | { readonly kind: 'device'; readonly device: Device; readonly pointer: bigint; readonly extent: number }
  | { readonly kind: 'host'; readonly bytes: Uint8Array };

/** What a destination copies in one sync from the sources of its node. */
export interface CopyBatch {
  /** Each pair (this rank its `dst`), with its source rank's source tensors as mapped here (by run srcTensor). */
  readonly pairs: ReadonlyArray<{ readonly pair: PlanPair; readonly sources: readonly RunMemory[] }>;
  /** This rank's destination tensors (by run dstTensor). */
  readonly destinations: readonly RunMemory[];
}

/** Copies the 'local' and 'ipc' runs of a destination. */
export interface RunCopier {
  /**
   * Copies every run of `batch` and resolves once all of them landed: device memory in one
   * launch (the same batch object again reuses its table). Rejects with an IpcError.
   */
  copy(batch: CopyBatch): Promise<void>;
  /** Frees what the copier holds once nothing queued uses it. */
  close(): Promise<void>;
}

/** The NCCL pairs of one rank in one sync (pairs as the plan gives them, in plan order). */
export interface NcclPairs {
  /** Pairs this rank is the `src` of. */
  readonly sends: readonly PlanPair[];
  /** Pairs this rank is the `dst` of. */
  readonly recvs: readonly PlanPair[];
}

/** A pair's chunk size in bytes: one for every pair, or each pair's (the same number at both of its ranks). */
export type ChunkSize = number | ((pair: PlanPair) => number);

/** Moves one rank's NCCL runs of a sync: rounds of grouped sends and receives (PROTOCOL.md 9.3). */
export interface NcclRunMover {
  /**
   * Queues every round and resolves once this rank's last byte was sent and received (and
   * scattered). `commRank` maps a group rank to its rank in `comm`; `chunkBytes` is every pair's
   * chunk, or each pair's (the group gives ncclChunkBytes: a rank's round then stays within the
   * plan's chunk). Resolves with the staging bytes it used (each slot one round's staged chunks).
   */
  move(comm: NcclCommunicator, commRank: (rank: number) => number, pairs: NcclPairs,
    sources: readonly RunMemory[], destinations: readonly RunMemory[], chunkBytes: ChunkSize): Promise<{ staging: number }>;
  /** Frees staging, tables, streams and events once nothing queued uses them. */
  close(): Promise<void>;
}

/** Default bytes of a pair's NCCL chunk (the hub's plan message may say otherwise). */
export const DEFAULT_SHARD_CHUNK_BYTES = 64 << 20;

/** Where the group gets its data paths (tests may give fakes). A rank's memories are all host or all on its GPU. */
export type ExecutorFactory = {
  /** The host copier (plain memory copies). */
  host(): RunCopier;
  /** The device copier: copy_runs launches on `device`. */
  device(device: Device): RunCopier;
  /** The NCCL mover on `device`. */
  nccl(device: Device): NcclRunMover;
};
