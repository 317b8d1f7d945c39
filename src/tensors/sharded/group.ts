// A sharded sync group (docs/PROTOCOL.md 9.3): ranks that hold sources and need destinations,
// joined to one hub over links; each sync moves every byte of the plan once, point to point
// (copies on one node, NCCL between nodes). ShardGroup.host() listens and runs the hub beside its
// own rank; ShardGroup.join() connects. The group follows the hub's epochs: a plan, the serve links
// and mappings it needs, 'planned', then 'ready'; syncs run in the ready epoch; a lost rank fails
// every pending sync (ERR_SHARD_PEER_LOST) until a replacement joins and the hub re-plans.
import { randomBytes } from 'node:crypto';
import { IpcError } from '../../errors.js';
import type { Device } from '../../cuda/device.js';
import { Stream } from '../../cuda/stream.js';
import { invalidArgType, invalidArgValue, received } from '../../arg-errors.js';
import { connect, listen, type Listener } from '../../link/connect/listener.js';
import type { TcpListener } from '../../link/connect/tcp-listener.js';
import type { Link } from '../../link/connection/link.js';
import { NcclCommunicator } from '../../nccl/communicator.js';
import { loadNccl, type NcclLibrary } from '../../nccl/library.js';
import { asNcclUniqueId } from '../../nccl/unique-id.js';
import { HostArray } from '../../arrays/host-array.js';
import type { TensorArray } from '../tensor-map.js';
import { decodeLayout, encodeLayout } from './layout-wire.js';
import type { RankLayout } from './layout.js';
import { planSharded, type ShardPlan } from './plan.js';
import { parseShardMessage, remoteCode, trySend, type FromHub, type JoinMessage, type PlanMessage, type ReadyMessage } from './group-wire.js';
import { ShardHub } from './hub.js';
import { Epoch, shardError, type RankMemory, type ShardFailureDetail, type ShardSyncResult } from './group-epoch.js';
import { DEFAULT_SHARD_CHUNK_BYTES, type ExecutorFactory, type NcclRunMover, type RunCopier } from './execute-types.js';
import { hostRunCopier } from './host-copy.js';
import { deviceRunCopier } from './device-copy.js';
import { loadTensorKernels } from '../kernels.js';
import { ncclRunMover } from './nccl-runs.js';

export type { ShardSyncResult, ShardFailureDetail } from './group-epoch.js';

/** What every rank gives. */
export interface ShardGroupOptions {
  /** This rank's layout (LayoutBuilder). */
  readonly layout: RankLayout;
  /** Memories of `layout.sources`, in order: all HostArray, or all DeviceArray on the layout's gpu. */
  readonly sources?: readonly TensorArray[];
  /** Memories of `layout.destinations`, in order (the same kind as the sources). */
  readonly destinations?: readonly TensorArray[];
  /** The token of a tcp:// or tls:// hub. */
  readonly token?: string | Uint8Array;
  /** The Unix link name this rank serves its sources on (default: one derived from the process and rank). */
  readonly serve?: string;
  /** Gives up waiting for the first ready epoch after this many ms (default 120000): ERR_TIMEOUT. */
  readonly timeout?: number;
  /** Data paths (tests pass fakes); the host copier, device copier and NCCL mover by default. */
  readonly executors?: Partial<ExecutorFactory>;
  /** The NCCL library for the group's communicator (default: loadNccl()). */
  readonly ncclLibrary?: NcclLibrary;
}

/** ShardGroup.host's options: where to listen and how many ranks the group has. */
export interface ShardHostOptions extends ShardGroupOptions {
  /** A Unix link name, or tcp://HOST:PORT (port 0: any; `group.address` says which). */
  readonly listen: string;
  /** Ranks in the group, this one included. */
  readonly size: number;
  /** Bytes of an NCCL chunk (default 64 MiB). */
  readonly chunkBytes?: number;
}

/** ShardGroup.join's options. */
export interface ShardJoinOptions extends ShardGroupOptions {
  /** The hub's address: its Unix link name or tcp://HOST:PORT. */
  readonly connect: string;
}

/** Where a rank of a group stands: waiting for the group, planning an epoch, ready to sync, failed (until a re-plan), closed. */
export type ShardGroupState = 'waiting' | 'planning' | 'ready' | 'failed' | 'closed';

const DEFAULT_TIMEOUT_MS = 120_000;

/**
 * One rank of a sharded sync group. `await ShardGroup.host(...)` on one rank (it listens, resolves
 * once listening), `await ShardGroup.join(...)` on the others (resolves once the group is ready);
 * then `await group.sync()` on every rank, as often as the weights change.
 */
export class ShardGroup {
  readonly rank: number;
  #layout: RankLayout;
  #sources: readonly TensorArray[];
  #destinations: readonly TensorArray[];
  #memory: RankMemory;
  readonly #executors: ExecutorFactory;
  readonly #library: NcclLibrary | undefined;
  readonly #serveName: string | null;
  #serveListener: Listener | undefined;
  #control: Link | undefined;
  #hub: ShardHub | undefined;
  #listener: Listener | TcpListener | undefined;
  #address = '';
  #state: ShardGroupState = 'waiting';
  #epoch: Epoch | undefined;
  #epochNumber = 0;
  #hubRank: number | undefined;
  #version = 0;
  #failure: IpcError | undefined;
  #syncing = false;
  #waiters: Array<{ resolve: () => void; reject: (e: unknown) => void }> = [];
  #parked: Array<{ link: Link; epoch: number; rank: number }> = [];
  #relayout: { resolve: () => void; reject: (e: unknown) => void } | undefined;
  /** A plan that came while this rank's layout was changing (it planned the old one): kept for a refused relayout. */
  #stalePlan: PlanMessage | undefined;
  #copier: RunCopier | undefined;
  #mover: NcclRunMover | undefined;

  private constructor(options: ShardGroupOptions) {
    this.#layout = options.layout;
    this.rank = options.layout.rank;
    this.#sources = options.sources ?? [];
    this.#destinations = options.destinations ?? [];
    this.#memory = memoryOf(this.#layout, this.#sources, this.#destinations);
    const given = options.executors ?? {};
    // The default device copier loads the copy kernels when it is made (at the group's setup, below), not in a first sync.
    const deviceCopier = (d: Device): RunCopier => {
      loadTensorKernels(d);
      return deviceRunCopier(d);
    };
    this.#executors = { host: given.host ?? hostRunCopier, device: given.device ?? deviceCopier, nccl: given.nccl ?? ncclRunMover };
    this.#library = options.ncclLibrary;
    this.#serveName = this.#layout.sources.length > 0 ? options.serve ?? `shard-${process.pid}-${this.rank}-${randomBytes(4).toString('hex')}` : null;
  }

  /** Listens on `options.listen`, runs the hub and this rank; resolves once listening. */
  static async host(options: ShardHostOptions): Promise<ShardGroup> {
    checkCommon(options);
    if (!Number.isInteger(options.size) || options.size < 1) throw new IpcError('ERR_SHARD_PROTOCOL', `ShardGroup.host: size must be the number of ranks, an integer >= 1 (got ${options.size})`);
    const g = new ShardGroup(options);
    let listener: Listener | TcpListener;
    try {
      g.#startServe();
      const url = /^[a-z]+:\/\//.test(options.listen);
      listener = url ? await listen(options.listen as `tcp://${string}`, { ...(options.token !== undefined && { token: options.token }) }) : listen(options.listen);
    } catch (e) {
      await g.close();
      throw e;
    }
    g.#listener = listener;
    g.#address = 'url' in listener ? listener.url : options.listen;
    g.#hubRank = g.rank;
    const library = options.ncclLibrary;
    g.#hub = new ShardHub({
      size: options.size, rank: g.rank, chunkBytes: options.chunkBytes ?? DEFAULT_SHARD_CHUNK_BYTES,
      deliver: (m) => g.#fromHub(m),
      ncclId: async () => (library ?? await loadNccl()).uniqueId(),
    });
    (listener as Listener).on('connection', (link: Link) => g.#hub?.add(link));
    g.#hub.joinSelf(g.#joinMessage());
    return g;
  }

  /** Connects to the hub at `options.connect` and joins; resolves once the group is ready (or rejects: refused, timeout). */
  static async join(options: ShardJoinOptions): Promise<ShardGroup> {
    checkCommon(options);
    const g = new ShardGroup(options);
    const timeout = options.timeout ?? DEFAULT_TIMEOUT_MS;
    try {
      g.#startServe();
      const link = await connect(options.connect, { timeout, ...(options.token !== undefined && { token: options.token }) });
      g.#control = link;
      g.#address = options.connect;
      link.on('message', (v: unknown) => {
        try {
          const m = parseShardMessage(v);
          if (m.shard !== 'refused' && m.shard !== 'plan' && m.shard !== 'ready' && m.shard !== 'failed' && m.shard !== 'lost') {
            throw new IpcError('ERR_SHARD_PROTOCOL', `the hub sent '${m.shard}', which members or serve links send`);
          }
          g.#fromHub(m);
        } catch (e) {
          g.#failAll(e instanceof IpcError ? e : new IpcError('ERR_SHARD_PROTOCOL', String(e)), true);
          link.close();
        }
      });
      link.on('close', () => {
        if (g.#state === 'closed') return;
        g.#failAll(shardError('ERR_SHARD_PEER_LOST', `rank ${g.rank} lost its link to the hub (rank ${g.#hubRank ?? 'unknown'}, ${options.connect}); the group is gone for this rank`, g.#hubRank === undefined ? [] : [g.#hubRank]), true);
      });
      trySend(link, g.#joinMessage());
      await g.ready({ timeout });
      return g;
    } catch (e) {
      await g.close();
      throw e;
    }
  }

  /** The hub's address (host: what it listens on, with the bound port; join: what it connected to). */
  get address(): string { return this.#address; }
  /** This rank's version: the syncs that completed here. */
  get version(): number { return this.#version; }
  /** The hub's epoch this rank follows (0 before the first plan). */
  get epoch(): number { return this.#epochNumber; }
  /** This rank's plan in the current epoch (its own pairs). */
  get plan(): ShardPlan | undefined { return this.#epoch?.init.plan; }
  /** 'waiting' (for the group), 'planning', 'ready', 'failed' (until a re-plan), 'closed'. */
  get state(): ShardGroupState { return this.#state; }
  /** The error syncs fail with in state 'failed'. */
  get failure(): IpcError | undefined { return this.#failure; }
  /** The ranks the hub sees joined (hub only). */
  get ranks(): number[] | undefined { return this.#hub?.ranks; }

  /** Resolves once the current epoch is ready; rejects when it failed, or after `timeout` ms (ERR_TIMEOUT). */
  ready(options: { timeout?: number } = {}): Promise<void> {
    if (this.#state === 'ready') return Promise.resolve();
    if (this.#state === 'failed' || this.#state === 'closed') return Promise.reject(this.#failure ?? new IpcError('ERR_CLOSED', 'this ShardGroup was closed'));
    return new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const w = {
        resolve: () => { clearTimeout(timer); resolve(); },
        reject: (e: unknown) => { clearTimeout(timer); reject(e); },
      };
      this.#waiters.push(w);
      if (options.timeout !== undefined) {
        timer = setTimeout(() => {
          this.#waiters = this.#waiters.filter((x) => x !== w);
          const e = shardError('ERR_TIMEOUT', `rank ${this.rank}: the group was not ready within ${options.timeout} ms (state ${this.#state}, epoch ${this.#epochNumber})`, []);
          e.detail.version = this.#version;
          reject(e);
        }, options.timeout);
      }
    });
  }

  /**
   * Moves this version's bytes: resolves once this rank's destinations hold every byte of it and
   * every destination this rank serves took its bytes. `stream`: where this rank's sources were
   * last written (a Stream of their device); the sync waits for it, without blocking the event
   * loop, instead of synchronising the whole device. Rejects with ERR_SHARD_PEER_LOST (a rank
   * lost), ERR_TIMEOUT (detail.waitingFor), the version unchanged.
   * @throws TypeError ERR_INVALID_ARG_TYPE for a `stream` that is not a Stream; ERR_INVALID_ARG_VALUE
   * for one of another device, or on a rank whose memory is not device memory.
   */
  async sync(options: { timeout?: number; stream?: Stream } = {}): Promise<ShardSyncResult> {
    const { stream } = options;
    if (stream !== undefined) {
      if (!(stream instanceof Stream)) throw invalidArgType(`sync: options.stream must be a Stream (where the sources were written). ${received(stream)}`);
      const memory = this.#memory;
      if (memory.kind !== 'device') throw invalidArgValue(`sync: options.stream is for device memory; rank ${this.rank} holds ${memory.kind === 'host' ? 'host memory' : 'no tensors'}`);
      if (stream.device.ordinal !== memory.device.ordinal) throw invalidArgValue(`sync: options.stream is on GPU ${stream.device.ordinal}; rank ${this.rank}'s tensors are on GPU ${memory.device.ordinal}`);
    }
    if (this.#syncing) throw new IpcError('ERR_INVALID_STATE', `rank ${this.rank}: a sync is already running; await it before the next`);
    this.#syncing = true;
    try {
      const start = Date.now();
      if (this.#state !== 'ready') await this.ready(options.timeout === undefined ? {} : { timeout: options.timeout });
      const epoch = this.#epoch!;
      const left = options.timeout === undefined ? undefined : Math.max(1, options.timeout - (Date.now() - start));
      const r = await epoch.sync(this.#version + 1, left, stream);
      this.#version = r.version;
      return r;
    } catch (e) {
      const detail = (e as { detail?: ShardFailureDetail }).detail;
      if (detail) detail.version = this.#version;
      throw e;
    } finally {
      this.#syncing = false;
    }
  }

  /** Changes this rank's layout and memories (or, with none given, the same again) and waits for the re-plan. */
  async relayout(layout: RankLayout = this.#layout, sources: readonly TensorArray[] = layout === this.#layout ? this.#sources : [], destinations: readonly TensorArray[] = layout === this.#layout ? this.#destinations : [], options: { timeout?: number } = {}): Promise<void> {
    if (this.#state === 'closed') throw new IpcError('ERR_CLOSED', 'this ShardGroup was closed');
    if (layout.rank !== this.rank) throw new IpcError('ERR_SHARD_PROTOCOL', `relayout: the layout is rank ${layout.rank}'s; this group member is rank ${this.rank}`);
    if (layout.sources.length > 0 && this.#serveName === null) throw new IpcError('ERR_SHARD_PROTOCOL', `relayout: rank ${this.rank} joined without sources, so it serves none; join again to add sources`);
    const memory = memoryOf(layout, sources, destinations);
    const old = { layout: this.#layout, sources: this.#sources, destinations: this.#destinations, memory: this.#memory };
    this.#layout = layout; this.#sources = sources; this.#destinations = destinations; this.#memory = memory;
    const done = new Promise<void>((resolve, reject) => { this.#relayout = { resolve, reject }; });
    try {
      if (this.#hub) this.#hub.joinSelf(this.#joinMessage());
      else trySend(this.#control!, this.#joinMessage());
    } catch (e) {
      this.#relayout = undefined;
      this.#layout = old.layout; this.#sources = old.sources; this.#destinations = old.destinations; this.#memory = old.memory;
      throw e;
    }
    let timer: NodeJS.Timeout | undefined;
    const timeout = options.timeout ?? DEFAULT_TIMEOUT_MS;
    try {
      await Promise.race([done, new Promise<never>((_, reject) => { timer = setTimeout(() => reject(shardError('ERR_TIMEOUT', `relayout of rank ${this.rank}: no re-plan within ${timeout} ms`, [])), timeout); })]);
    } catch (e) {
      const refused = (e as IpcError).code?.startsWith('ERR_LAYOUT_');
      if (refused) { this.#layout = old.layout; this.#sources = old.sources; this.#destinations = old.destinations; this.#memory = old.memory; }
      const stale = this.#stalePlan;
      if (refused && stale && stale.epoch === this.#epochNumber) void this.#onPlan(stale); // the epoch planned with the old layout goes on
      throw e;
    } finally {
      clearTimeout(timer);
      this.#relayout = undefined;
    }
  }

  /** Leaves the group (the hub tells the others this rank is lost); the hub's close ends the group. */
  async close(): Promise<void> {
    if (this.#state === 'closed') return;
    this.#state = 'closed';
    const e = new IpcError('ERR_CLOSED', `rank ${this.rank} closed its ShardGroup`);
    for (const w of this.#waiters.splice(0)) w.reject(e);
    this.#relayout?.reject(e);
    this.#control?.close();
    this.#hub?.close();
    this.#listener?.close();
    this.#serveListener?.close();
    for (const p of this.#parked.splice(0)) p.link.close();
    const epoch = this.#epoch;
    this.#epoch = undefined;
    await epoch?.close();
    await this.#copier?.close();
    await this.#mover?.close();
  }

  #joinMessage(): JoinMessage {
    return { shard: 'join', rank: this.rank, layout: encodeLayout(this.#layout), serve: this.#layout.sources.length > 0 ? this.#serveName : null };
  }

  #startServe(): void {
    if (this.#serveName === null) return;
    const l = listen(this.#serveName);
    this.#serveListener = l;
    l.on('connection', (link: Link) => {
      const first = (v: unknown): void => {
        try {
          const m = parseShardMessage(v);
          if (m.shard !== 'hello') throw new IpcError('ERR_SHARD_PROTOCOL', `a serve link began with '${m.shard}', not 'hello'`);
          if (m.epoch < this.#epochNumber) { link.close(); return; }
          if (m.epoch > this.#epochNumber || !this.#epoch) { this.#parked.push({ link, epoch: m.epoch, rank: m.rank }); return; }
          this.#epoch.attach(link, m.rank);
        } catch {
          link.close();
        }
      };
      link.once('message', first);
      link.on('close', () => { this.#parked = this.#parked.filter((p) => p.link !== link); });
    });
  }

  #fromHub(m: FromHub): void {
    if (this.#state === 'closed') return;
    switch (m.shard) {
      case 'refused': {
        const e = new IpcError(remoteCode(m.code), `the hub refused rank ${this.rank}'s join: ${m.message}`);
        if (this.#relayout) { this.#relayout.reject(e); return; }
        this.#failAll(e, true);
        return;
      }
      case 'plan': void this.#onPlan(m); return;
      case 'ready': void this.#onReady(m); return;
      case 'failed': {
        if (m.epoch !== this.#epochNumber) return;
        const e = shardError(m.code === 'ERR_SHARD_PLAN' ? 'ERR_SHARD_PLAN' : 'ERR_SHARD_PROTOCOL', m.message, m.ranks);
        this.#fail(e);
        return;
      }
      case 'lost': {
        if (m.rank === this.rank) return;
        if (this.#state === 'waiting' || this.#state === 'planning') {
          // No sync can be pending before the epoch is ready: drop the epoch and wait for the
          // replacement (the hub re-plans when it joins); join() and ready() keep waiting.
          const epoch = this.#epoch;
          this.#epoch = undefined;
          this.#state = 'waiting';
          void epoch?.close();
          return;
        }
        const e = shardError('ERR_SHARD_PEER_LOST', `rank ${m.rank} was lost: ${m.reason}`, [m.rank]);
        if (this.#epoch) this.#epoch.fail(e); else this.#fail(e);
        return;
      }
    }
  }

  async #onPlan(m: PlanMessage): Promise<void> {
    this.#stalePlan = undefined;
    const previous = this.#epoch;
    this.#epoch = undefined;
    this.#epochNumber = m.epoch;
    if (m.hub !== undefined) this.#hubRank = m.hub;
    this.#state = 'planning';
    this.#failure = undefined;
    await previous?.close();
    if ((this.#state as ShardGroupState) === 'closed' || this.#epochNumber !== m.epoch) return;
    let epoch: Epoch | undefined;
    try {
      const layouts = m.layouts.map((b) => decodeLayout(b));
      const byRank = new Map(layouts.map((l) => [l.rank, l]));
      const i = layouts.findIndex((l) => l.rank === this.rank);
      if (i < 0) throw new IpcError('ERR_SHARD_PROTOCOL', `the hub's plan of epoch ${m.epoch} has no layout of rank ${this.rank}`);
      if (Buffer.compare(m.layouts[i]!, encodeLayout(this.#layout)) !== 0) {
        // The plan of a layout this rank is replacing (relayout): the hub re-plans once it takes the new one.
        this.#stalePlan = m;
        return;
      }
      const plan = planSharded(layouts, { rank: this.rank });
      const layout = this.#layout;
      epoch = new Epoch({
        rank: this.rank, epoch: m.epoch, layout, layouts: byRank, plan, chunkBytes: m.chunkBytes,
        serve: new Map(layouts.map((l, i) => [l.rank, m.serve[i] ?? null])),
        sources: this.#sources, destinations: this.#destinations, memory: this.#memory,
        copier: () => (this.#copier ??= this.#memory.kind === 'device' ? this.#executors.device(this.#memory.device) : this.#executors.host()),
        mover: () => {
          if (this.#memory.kind !== 'device') throw new IpcError('ERR_SHARD_MEMORY', `rank ${this.rank} has NCCL pairs but host memory; NCCL moves device memory (DeviceArray)`);
          return (this.#mover ??= this.#executors.nccl(this.#memory.device));
        },
        onFail: (e) => { if (this.#epoch === epoch) this.#fail(e); },
      });
      this.#epoch = epoch;
      // A destination's copier (and its kernels) now, while the group sets up: a first sync then only builds its table.
      if (this.#memory.kind === 'device' && plan.pairs.some((p) => p.dst === this.rank && p.path !== 'nccl')) this.#copier ??= this.#executors.device(this.#memory.device);
      if (epoch.nccl && this.#memory.kind !== 'device') throw new IpcError('ERR_SHARD_MEMORY', `rank ${this.rank} has NCCL pairs (another node) but its memories are host memory; NCCL moves device memory: give DeviceArrays, or put the ranks on one node`);
      for (const p of this.#parked.filter((x) => x.epoch === m.epoch)) epoch.attach(p.link, p.rank);
      for (const p of this.#parked.filter((x) => x.epoch < m.epoch)) p.link.close();
      this.#parked = this.#parked.filter((x) => x.epoch > m.epoch);
      await epoch.connectSources(30_000);
      if (this.#epoch !== epoch) return;
      const planned = { shard: 'planned' as const, epoch: m.epoch, fingerprint: plan.fingerprint, nccl: epoch.nccl };
      if (this.#hub) this.#hub.plannedSelf(planned, this.rank); else if (this.#control) trySend(this.#control, planned);
    } catch (e) {
      if (this.#epochNumber !== m.epoch || (epoch && this.#epoch !== epoch)) return; // superseded: a new plan, or the epoch dropped
      const err = e instanceof IpcError ? e : new IpcError('ERR_SHARD_PROTOCOL', String(e));
      if (this.#epoch) this.#epoch.fail(err as IpcError & { detail?: ShardFailureDetail });
      this.#fail(err);
    }
  }

  async #onReady(m: ReadyMessage): Promise<void> {
    const epoch = this.#epoch;
    if (!epoch || m.epoch !== this.#epochNumber || this.#state !== 'planning') return;
    try {
      if (m.nccl && m.nccl.ranks.includes(this.rank)) {
        if (this.#memory.kind !== 'device') throw new IpcError('ERR_SHARD_MEMORY', `rank ${this.rank} is in the NCCL communicator but has no device memory`);
        epoch.ncclRanks = m.nccl.ranks;
        epoch.comm = await NcclCommunicator.init({
          uniqueId: asNcclUniqueId(m.nccl.id), nranks: m.nccl.ranks.length, rank: m.nccl.ranks.indexOf(this.rank), device: this.#memory.device,
          timeout: 60_000, ...(this.#library && { library: this.#library }),
        });
        if (this.#epoch !== epoch || epoch.failure) { await epoch.comm.abort(); return; }
      }
    } catch (e) {
      epoch.fail(shardError('ERR_SHARD_PLAN', `rank ${this.rank} could not make epoch ${m.epoch}'s NCCL communicator: ${(e as Error).message}`, m.nccl?.ranks ?? [], e));
      return;
    }
    if (epoch.failure) return;
    this.#state = 'ready';
    this.#relayout?.resolve();
    for (const w of this.#waiters.splice(0)) w.resolve();
  }

  /** The current epoch failed: syncs fail at once until a re-plan. */
  #fail(e: IpcError): void {
    if (this.#state === 'closed') return;
    if (this.#state === 'failed' && this.#failure) return;
    this.#state = 'failed';
    this.#failure = e;
    for (const w of this.#waiters.splice(0)) w.reject(e);
    this.#relayout?.reject(e);
  }

  /** The group is gone for this rank (hub lost, refused): fail and stay failed. */
  #failAll(e: IpcError, final: boolean): void {
    this.#epoch?.fail(e as IpcError & { detail?: ShardFailureDetail });
    this.#fail(e);
    if (final) this.#failure = e;
  }
}

function checkCommon(o: ShardGroupOptions): void {
  if (!o || typeof o !== 'object' || !o.layout) throw new IpcError('ERR_SHARD_PROTOCOL', 'ShardGroup: options.layout (a RankLayout) is required');
  const s = o.sources ?? []; const d = o.destinations ?? [];
  if (s.length !== o.layout.sources.length || d.length !== o.layout.destinations.length) {
    throw new IpcError('ERR_SHARD_MEMORY', `ShardGroup: rank ${o.layout.rank}'s layout has ${o.layout.sources.length} sources and ${o.layout.destinations.length} destinations but ${s.length} and ${d.length} memories were given; give one per local tensor, in layout order`);
  }
}

/** The kind of a rank's memories: all host, or all device on the layout's GPU; each one as its layout says. */
function memoryOf(layout: RankLayout, sources: readonly TensorArray[], destinations: readonly TensorArray[]): RankMemory {
  let kind: RankMemory = { kind: 'none' };
  const all: Array<[TensorArray, RankLayout['sources'][number]]> = [
    ...sources.map((a, i) => [a, layout.sources[i]!] as [TensorArray, RankLayout['sources'][number]]),
    ...destinations.map((a, i) => [a, layout.destinations[i]!] as [TensorArray, RankLayout['sources'][number]]),
  ];
  if (sources.length !== layout.sources.length || destinations.length !== layout.destinations.length) {
    throw new IpcError('ERR_SHARD_MEMORY', `rank ${layout.rank}: give one memory per local tensor of the layout (${layout.sources.length} sources, ${layout.destinations.length} destinations; got ${sources.length} and ${destinations.length})`);
  }
  for (const [a, local] of all) {
    if (!a || a.dtype !== local.dtype || a.shape.length !== local.shape.length || a.shape.some((n, i) => n !== local.shape[i] || a.strides[i] !== local.strides[i])) {
      throw new IpcError('ERR_SHARD_MEMORY', `rank ${layout.rank}: the memory of ${local.name} is not ${local.dtype} [${local.shape.join(', ')}] with strides [${local.strides.join(', ')}] as the layout says`);
    }
    const host = a instanceof HostArray;
    if (!host && a.buffer.device.ordinal !== layout.gpu) {
      throw new IpcError('ERR_SHARD_MEMORY', `rank ${layout.rank}: ${local.name} is on device ${a.buffer.device.ordinal}, but the layout's gpu is ${layout.gpu}`);
    }
    const k: RankMemory = host ? { kind: 'host' } : { kind: 'device', device: a.buffer.device as Device };
    if (kind.kind !== 'none' && kind.kind !== k.kind) {
      throw new IpcError('ERR_SHARD_MEMORY', `rank ${layout.rank} mixes host and device memory (${local.name} is ${k.kind}); a rank's memories are all HostArray or all DeviceArray on its GPU`);
    }
    kind = k;
  }
  return kind;
}
