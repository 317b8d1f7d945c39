// One epoch of a sync group at one rank (docs/PROTOCOL.md 9.3): its pairs, the serve links to the
// sources it maps (their tensor sets) and from the destinations it serves, the NCCL communicator,
// and the syncs: 'go' to each destination served, one go from each source mapped, one copy of all
// 'local' and 'ipc' runs, 'done' back, the NCCL rounds beside. A failure (a link dropped, a peer
// lost, a timeout) rejects what waits and makes every later sync of the epoch fail at once.
import { IpcError } from '../../errors.js';
import type { Device } from '../../cuda/device.js';
import type { Stream } from '../../cuda/stream.js';
import { connect } from '../../link/connect/listener.js';
import { setLinkWorkingDevice } from '../../link/connection/working-device.js';
import type { Link } from '../../link/connection/link.js';
import type { NcclCommunicator } from '../../nccl/communicator.js';
import { HostArray } from '../../arrays/host-array.js';
import { TensorMap, type TensorArray } from '../tensor-map.js';
import { parseShardMessage, trySend, type OnServe } from './group-wire.js';
import type { CopyBatch, NcclRunMover, RunCopier, RunMemory } from './execute-types.js';
import type { PlanPair, PlanPath, ShardPlan } from './plan.js';
import type { RankLayout } from './layout.js';
import { RUN_FIELDS } from './runs.js';
import { ncclChunkBytes } from './pair-stream.js';
import { dtypeInfo } from '../../ipc/dtype.js';

/** What a sync did. */
export interface ShardSyncResult {
  /** This rank's version after the sync. */
  readonly version: number;
  /** Bytes this rank's sources gave (all its pairs as the source) and its destinations took. */
  readonly sent: number;
  readonly received: number;
  /** Bytes of this rank's pairs by path (a 'local' pair once). */
  readonly paths: { readonly local: number; readonly ipc: number; readonly nccl: number };
  /** Staging bytes the NCCL mover used (0 without NCCL pairs). */
  readonly staging: number;
  /** Milliseconds: waiting for sources' go, copying, NCCL, the whole sync. */
  readonly timings: { readonly waitMs: number; readonly copyMs: number; readonly ncclMs: number; readonly totalMs: number };
}

/** A rank's memories: all host, all on one device, or none (a rank with no tensors). */
export type RankMemory = { readonly kind: 'host' } | { readonly kind: 'device'; readonly device: Device } | { readonly kind: 'none' };

/** The memory a data path sees for `array`. */
export function runMemory(array: TensorArray): RunMemory {
  if (array instanceof HostArray) return { kind: 'host', bytes: array.buffer.bytes.subarray(0, array.extent) };
  const extent = array.size === 0 ? 0 : array.strides.reduce((e, s, i) => e + (array.shape[i]! - 1) * s, dtypeInfo(array.dtype).itemsize);
  return { kind: 'device', device: array.buffer.device, pointer: array.buffer.devicePointer, extent };
}

/** A FIFO of one peer's go (or done) versions, matched by order on its link. */
class PeerQueue {
  readonly #arrived: number[] = [];
  #waiter: { resolve: (v: number) => void; reject: (e: unknown) => void } | undefined;
  #failure: IpcError | undefined;
  waiting = false;
  constructor(readonly rank: number) {}
  push(version: number): void {
    if (this.#waiter) { const w = this.#waiter; this.#waiter = undefined; this.waiting = false; w.resolve(version); } else this.#arrived.push(version);
  }
  next(): Promise<number> {
    if (this.#failure) return Promise.reject(this.#failure);
    if (this.#arrived.length > 0) return Promise.resolve(this.#arrived.shift()!);
    this.waiting = true;
    return new Promise((resolve, reject) => { this.#waiter = { resolve, reject }; });
  }
  fail(e: IpcError): void {
    this.#failure ??= e;
    const w = this.#waiter;
    this.#waiter = undefined;
    w?.reject(e);
  }
}

interface ServePeer { readonly rank: number; readonly link: Link; readonly queue: PeerQueue; tensors?: TensorMap }

/** What an epoch is given by its group. */
export interface EpochInit {
  readonly rank: number;
  readonly epoch: number;
  readonly layout: RankLayout;
  /** Every rank's layout, by rank. */
  readonly layouts: ReadonlyMap<number, RankLayout>;
  /** This rank's pairs (planSharded(layouts, { rank })). */
  readonly plan: ShardPlan;
  /** Serve names by rank. */
  readonly serve: ReadonlyMap<number, string | null>;
  readonly chunkBytes: number;
  readonly sources: readonly TensorArray[];
  readonly destinations: readonly TensorArray[];
  readonly memory: RankMemory;
  /** The copier for 'local' and 'ipc' runs (made lazily by the group). */
  readonly copier: () => RunCopier;
  /** The NCCL mover (made lazily by the group). */
  readonly mover: () => NcclRunMover;
  /** Told once the epoch failed (the group fails its state). */
  readonly onFail: (e: IpcError) => void;
}

/** The error a failed sync gives: code, the ranks in question, what may be half-written, the version kept. */
export function shardError(code: 'ERR_SHARD_PEER_LOST' | 'ERR_TIMEOUT' | 'ERR_SHARD_PLAN' | 'ERR_SHARD_PROTOCOL' | 'ERR_SHARD_COPY', message: string, ranks: readonly number[], cause?: unknown): IpcError & { detail: ShardFailureDetail } {
  const e = new IpcError(code, message, cause === undefined ? undefined : { cause }) as IpcError & { detail: ShardFailureDetail };
  e.detail = { ranks: [...ranks].sort((a, b) => a - b), halfWritten: [], version: 0 };
  if (code === 'ERR_TIMEOUT') e.detail.waitingFor = e.detail.ranks;
  return e;
}

/** detail of a failed sync. */
export interface ShardFailureDetail {
  /** The ranks lost (or, for ERR_TIMEOUT, still waited for). */
  ranks: number[];
  /** This rank's destination tensors whose runs of the failed sync may be partly written. */
  halfWritten: string[];
  /** This rank's version, unchanged by the failed sync. */
  version: number;
  /** ERR_TIMEOUT: the ranks the sync still waited for. */
  waitingFor?: number[];
}

/**
 * How long a rank whose NCCL transfers failed waits for the hub's verdict before it blames its NCCL
 * peers. NCCL's error names no rank; the hub learns a death from the dead rank's control link and
 * tells every rank which one it was ('lost'), usually within milliseconds.
 */
export const NCCL_VERDICT_MS = 2_000;

export class Epoch {
  readonly init: EpochInit;
  /** Sources this rank maps (its 'ipc' pairs as the destination), by rank. */
  readonly #from = new Map<number, ServePeer>();
  /** Destinations this rank serves (its 'ipc' pairs as the source), by rank. */
  readonly #to = new Map<number, ServePeer>();
  readonly #pairs: { local: PlanPair[]; ipcIn: PlanPair[]; ipcOut: PlanPair[]; ncclSend: PlanPair[]; ncclRecv: PlanPair[] };
  #failure: IpcError | undefined;
  /** Settles once the epoch failed (fail()). */
  readonly #failed: Promise<void>;
  #markFailed!: () => void;
  #closed = false;
  /** Destination tensors the copy, and the NCCL receives, are writing now. */
  readonly #copying = new Set<string>();
  readonly #receiving = new Set<string>();
  #batch: CopyBatch | undefined;
  /** Each NCCL pair's chunk (the same at both of its ranks). */
  readonly #chunkOf: (pair: PlanPair) => number;
  comm: NcclCommunicator | undefined;
  ncclRanks: readonly number[] = [];

  constructor(init: EpochInit) {
    this.init = init;
    const me = init.rank;
    const by = (path: PlanPath, side: 'src' | 'dst', other?: boolean): PlanPair[] => init.plan.pairs.filter((p) => p.path === path && p[side] === me && (other === undefined || (p.src !== p.dst) === other));
    this.#pairs = { local: by('local', 'dst'), ipcIn: by('ipc', 'dst'), ipcOut: by('ipc', 'src'), ncclSend: by('nccl', 'src'), ncclRecv: by('nccl', 'dst') };
    this.#failed = new Promise((resolve) => { this.#markFailed = resolve; });
    this.#chunkOf = ncclChunkBytes(init.plan.pairs, init.chunkBytes);
  }

  get failure(): IpcError | undefined { return this.#failure; }
  /** Whether this rank has NCCL pairs. */
  get nccl(): boolean { return this.#pairs.ncclSend.length + this.#pairs.ncclRecv.length > 0; }
  /** Ranks this rank serves over 'ipc'. */
  get serves(): number[] { return this.#pairs.ipcOut.map((p) => p.dst); }

  /** Connects to each source rank it maps and takes its tensor set. */
  async connectSources(timeoutMs: number): Promise<void> {
    const { epoch, rank } = this.init;
    await Promise.all(this.#pairs.ipcIn.map(async (pair) => {
      const name = this.init.serve.get(pair.src);
      if (!name) throw shardError('ERR_SHARD_PROTOCOL', `rank ${pair.src} has sources rank ${rank} needs over 'ipc' but gave no serve name in its join`, [pair.src]);
      const link = await connect(name, { timeout: timeoutMs });
      if (this.#closed) { link.close(); return; }
      // The sources' allocations are mapped for this rank's GPU, where the copier's kernel reads
      // them (through peer access when they live on another GPU), not for the GPU they live on.
      if (this.init.memory.kind === 'device') setLinkWorkingDevice(link, this.init.memory.device);
      const peer: ServePeer = { rank: pair.src, link, queue: new PeerQueue(pair.src) };
      this.#from.set(pair.src, peer);
      const got = new Promise<void>((resolve, reject) => {
        link.on('message', (value: unknown) => {
          let m: OnServe;
          try {
            const parsed = parseShardMessage(value);
            if (parsed.shard !== 'sources' && parsed.shard !== 'go') throw new IpcError('ERR_SHARD_PROTOCOL', `a source sent '${parsed.shard}' on a serve link`);
            if (parsed.epoch !== epoch) throw new IpcError('ERR_SHARD_PROTOCOL', `a source sent epoch ${parsed.epoch} on a link of epoch ${epoch}`);
            m = parsed;
          } catch (e) {
            if ((value as { tensors?: unknown })?.tensors instanceof TensorMap) (value as { tensors: TensorMap }).tensors.close();
            link.close();
            this.fail(shardError('ERR_SHARD_PROTOCOL', (e as Error).message, [pair.src]));
            reject(e);
            return;
          }
          if (m.shard === 'sources') {
            if (peer.tensors) { m.tensors.close(); return; }
            peer.tensors = m.tensors;
            if (this.#closed) m.tensors.close();
            resolve();
          } else {
            peer.queue.push(m.version);
          }
        });
        link.on('close', () => {
          const e = shardError('ERR_SHARD_PEER_LOST', `rank ${pair.src}'s serve link to rank ${rank} dropped (epoch ${epoch})`, [pair.src]);
          reject(e);
          this.fail(e);
        });
      });
      trySend(link, { shard: 'hello', epoch, rank });
      await got;
    }));
  }

  /** A destination connected to this rank's serve name for this epoch: send it the sources. */
  attach(link: Link, dst: number): void {
    const { epoch, rank } = this.init;
    if (!this.#pairs.ipcOut.some((p) => p.dst === dst) || this.#to.has(dst) || this.#closed) {
      link.close();
      return;
    }
    const peer: ServePeer = { rank: dst, link, queue: new PeerQueue(dst) };
    this.#to.set(dst, peer);
    link.on('message', (value: unknown) => {
      try {
        const m = parseShardMessage(value);
        if (m.shard !== 'done' || m.epoch !== epoch) throw new IpcError('ERR_SHARD_PROTOCOL', `rank ${dst} sent '${m.shard}' (epoch ${String((m as { epoch?: number }).epoch)}) where 'done' of epoch ${epoch} belongs`);
        peer.queue.push(m.version);
      } catch (e) {
        link.close();
        this.fail(shardError('ERR_SHARD_PROTOCOL', (e as Error).message, [dst]));
      }
    });
    link.on('close', () => this.fail(shardError('ERR_SHARD_PEER_LOST', `rank ${dst}'s serve link from rank ${rank} dropped (epoch ${epoch})`, [dst])));
    const names = this.init.layout.sources.map((s) => s.name);
    trySend(link, { shard: 'sources', epoch, rank, tensors: new TensorMap(names.map((n, i) => [n, this.init.sources[i]!] as const)) });
  }

  /** Fails the epoch (once): everything waiting rejects with `e`; links to the ranks named are dropped. */
  fail(e: IpcError & { detail?: ShardFailureDetail }): void {
    if (this.#failure || this.#closed) return;
    if (e.detail) e.detail.halfWritten = [...new Set([...this.#copying, ...this.#receiving])].sort();
    this.#failure = e;
    this.#markFailed();
    for (const p of [...this.#from.values(), ...this.#to.values()]) p.queue.fail(e);
    const lost = new Set(e.detail?.ranks ?? []);
    for (const [r, p] of this.#from) if (lost.has(r)) { p.link.close(); p.tensors?.close(); p.tensors = undefined; }
    for (const [r, p] of this.#to) if (lost.has(r)) p.link.close();
    if (this.comm) this.comm.abort().catch(() => {});
    this.init.onFail(e);
  }

  /** Ends the epoch: links closed, mappings dropped, the communicator ended. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const e = this.#failure ?? shardError('ERR_SHARD_PEER_LOST', `epoch ${this.init.epoch} ended (the group re-planned or closed) while a sync waited`, []);
    for (const p of [...this.#from.values(), ...this.#to.values()]) {
      p.queue.fail(e);
      p.link.close();
      p.tensors?.close();
      p.tensors = undefined;
    }
    const comm = this.comm;
    this.comm = undefined;
    if (comm) await (this.#failure ? comm.abort() : comm.close({ timeout: 10_000 }).catch(() => comm.abort())).catch(() => {});
  }

  /** One sync of this epoch at version `version`. */
  async sync(version: number, timeoutMs: number | undefined, stream?: Stream): Promise<ShardSyncResult> {
    if (this.#failure) throw this.#failure;
    const t0 = performance.now();
    let waitMs = 0; let copyMs = 0; let ncclMs = 0; let staging = 0;
    const { memory } = this.init;
    // The sources' memory must hold this version before a peer reads it: the stream that wrote it
    // (waited for without blocking the event loop), else everything queued on the device.
    if (memory.kind === 'device' && this.init.plan.pairs.some((p) => p.src === this.init.rank)) {
      if (stream) await stream.synchronize(); else memory.device.synchronize();
    }
    const work: Array<Promise<unknown>> = [];
    for (const peer of this.#to.values()) {
      trySend(peer.link, { shard: 'go', epoch: this.init.epoch, version });
      work.push(peer.queue.next());
    }
    if (this.#pairs.ipcIn.length + this.#pairs.local.length > 0) {
      work.push((async () => {
        await Promise.all([...this.#from.values()].map((p) => p.queue.next()));
        waitMs = performance.now() - t0;
        const t1 = performance.now();
        const batch = this.#copyBatch();
        this.#mark(this.#copying, batch.pairs.map((p) => p.pair));
        await this.init.copier().copy(batch).catch((e: unknown) => {
          const err = shardError('ERR_SHARD_COPY', `rank ${this.init.rank}'s copy of version ${version} failed: ${(e as Error).message}`, [], e);
          this.fail(err);
          // Its sources wait for its 'done': their serve links dropped, they fail now, not at their timeout.
          for (const p of this.#from.values()) p.link.close();
          throw err;
        });
        if (!this.#failure) this.#copying.clear();
        copyMs = performance.now() - t1;
        for (const p of this.#from.values()) trySend(p.link, { shard: 'done', epoch: this.init.epoch, version });
      })());
    }
    if (this.nccl) {
      work.push((async () => {
        const comm = this.comm;
        if (!comm) throw shardError('ERR_SHARD_PLAN', `rank ${this.init.rank} has NCCL pairs but no communicator in epoch ${this.init.epoch}`, []);
        const t1 = performance.now();
        this.#mark(this.#receiving, this.#pairs.ncclRecv);
        const r = await this.init.mover().move(comm, (rank) => this.ncclRanks.indexOf(rank), { sends: this.#pairs.ncclSend, recvs: this.#pairs.ncclRecv },
          this.init.sources.map(runMemory), this.init.destinations.map(runMemory), this.#chunkOf)
          .catch(async (e: unknown) => { throw await this.#ncclFailure(version, e); });
        if (!this.#failure) this.#receiving.clear();
        staging = r.staging;
        ncclMs = performance.now() - t1;
      })());
    }
    let timer: NodeJS.Timeout | undefined;
    const failed = new Promise<never>((_, reject) => {
      if (timeoutMs !== undefined) {
        timer = setTimeout(() => {
          const waiting = [...this.#to.values(), ...this.#from.values()].filter((p) => p.queue.waiting).map((p) => p.rank);
          if (this.nccl) waiting.push(...this.ncclRanks.filter((r) => r !== this.init.rank && this.#ncclPeers().has(r)));
          const ranks = [...new Set(waiting)];
          const e = shardError('ERR_TIMEOUT', `sync of version ${version} at rank ${this.init.rank} timed out after ${timeoutMs} ms waiting for ranks ${ranks.join(', ') || '(none: the local copy)'}; the group must re-plan (relayout) before it syncs again`, ranks);
          this.fail(e);
          reject(e);
        }, timeoutMs);
      }
    });
    try {
      await Promise.race([Promise.all(work), failed]);
    } catch (e) {
      const err = this.#failure ?? (e instanceof IpcError ? e : shardError('ERR_SHARD_PROTOCOL', String(e), [], e));
      if (!this.#failure) this.fail(err);
      throw this.#failure ?? err;
    } finally {
      clearTimeout(timer);
    }
    if (this.#failure) throw this.#failure;
    const bytes = (list: PlanPair[]): number => list.reduce((n, p) => n + p.bytes, 0);
    const mine = this.init.plan.pairs;
    return {
      version,
      sent: bytes(mine.filter((p) => p.src === this.init.rank)),
      received: bytes(mine.filter((p) => p.dst === this.init.rank)),
      paths: { local: bytes(this.#pairs.local), ipc: bytes([...this.#pairs.ipcIn, ...this.#pairs.ipcOut]), nccl: bytes([...this.#pairs.ncclSend, ...this.#pairs.ncclRecv]) },
      staging,
      timings: { waitMs, copyMs, ncclMs, totalMs: performance.now() - t0 },
    };
  }

  /**
   * The error of a sync whose NCCL transfers failed: the hub's verdict (the lost rank) where it comes
   * within NCCL_VERDICT_MS, else ERR_SHARD_PEER_LOST naming this rank's NCCL peers (one of them, or
   * the network to it, is gone), NCCL's error as the cause.
   */
  async #ncclFailure(version: number, e: unknown): Promise<IpcError> {
    if (!this.#failure) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([this.#failed, new Promise<void>((resolve) => { timer = setTimeout(resolve, NCCL_VERDICT_MS); })]);
      clearTimeout(timer);
    }
    if (this.#failure) return this.#failure;
    const peers = [...this.#ncclPeers()].sort((a, b) => a - b);
    return shardError('ERR_SHARD_PEER_LOST', `sync of version ${version} at rank ${this.init.rank}: its NCCL transfers failed (${(e as Error).message}); one of its NCCL peers (ranks ${peers.join(', ')}) or the network to it is gone, and the hub named none within ${NCCL_VERDICT_MS} ms`, peers, e);
  }

  #ncclPeers(): Set<number> {
    return new Set([...this.#pairs.ncclSend.map((p) => p.dst), ...this.#pairs.ncclRecv.map((p) => p.src)]);
  }

  /** The copy batch of this epoch (one object, so a device copier reuses its table). */
  #copyBatch(): CopyBatch {
    if (this.#batch) return this.#batch;
    const own = this.init.sources.map(runMemory);
    const pairs = [...this.#pairs.local, ...this.#pairs.ipcIn].map((pair) => {
      if (pair.src === this.init.rank) return { pair, sources: own };
      const peer = this.#from.get(pair.src);
      const layout = this.init.layouts.get(pair.src);
      if (!peer?.tensors || !layout) throw shardError('ERR_SHARD_PEER_LOST', `rank ${pair.src}'s sources are not mapped here`, [pair.src]);
      const tensors = peer.tensors;
      return { pair, sources: layout.sources.map((local) => {
        const a = tensors.get(local.name);
        if (!a || a.dtype !== local.dtype || a.shape.length !== local.shape.length || a.shape.some((n, i) => n !== local.shape[i] || a.strides[i] !== local.strides[i])) {
          throw shardError('ERR_SHARD_PROTOCOL', `rank ${pair.src} sent a source ${local.name} that is not what its layout says (${local.dtype} [${local.shape.join(', ')}])`, [pair.src]);
        }
        return runMemory(a);
      }) };
    });
    this.#batch = { pairs, destinations: this.init.destinations.map(runMemory) };
    return this.#batch;
  }

  #mark(set: Set<string>, pairs: readonly PlanPair[]): void {
    const names = this.init.layout.destinations;
    for (const p of pairs) for (let i = 1; i < p.runs.length; i += RUN_FIELDS) set.add(names[p.runs[i]!]!.name);
  }
}
