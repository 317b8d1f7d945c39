// The hub: the process that creates a channel. It owns the memory (control block, slots,
// doorbells), hands the channel to peers over links (attach.ts), opens ends in its own process,
// and watches its peers: when a peer's link closes, it repairs the control block in its place
// (its slots come back, work-sharing messages it held are delivered again, its fences are raised
// once its process is gone).
import { waitScope, type WaitOptions } from '../abort.js';
import { IpcError } from '../errors.js';
import type { Link } from '../link/index.js';
import { HostBuffer } from '../host/index.js';
import type { DeviceBuffer } from '../cuda/buffer.js';
import { Device } from '../cuda/device.js';
import { IpcPool } from '../ipc/pool.js';
import { P, PState, PRole, PFLAG_HUB_LOCAL, checkParams, computeLayout, writeHeader, type HubLayout } from './layout.js';
import { Block } from './block.js';
import { Doorbells } from './doorbells.js';
import type { Ring } from './slot-ring.js';
import { Recoveries, repairFencesWhenGone } from './recovery.js';
import { processAlive } from '../processes.js';
import { channelStats } from './endpoint.js';
import { offer, roleNumber } from './attach.js';
import { ChannelProducer } from './producer.js';
import { ChannelConsumer } from './consumer.js';
import { blockOf } from './internal.js';
import { ChannelPart } from './part.js';
import {
  checkRole, checkWait, closedError, type ChannelMemory, type ChannelOptions, type ChannelRole, type ChannelShape, type ChannelStats,
  type ChannelWaitOptions, type SlotBuffer, type SlotBufferFor,
} from './options.js';
import { invalidArgValue, invalidArgType, badNumber } from '../arg-errors.js';

const DEFAULT_META_BYTES = 256;

/**
 * For createChannel and pipeline: an end in this process whose closing (or end()) closes its hub
 * too, for a hub made only for it. Not on the class: it is no part of the public API.
 */
export let openOwnedEnd: <B extends SlotBuffer, Meta>(hub: ChannelHub<B, Meta>, role: ChannelRole, options: ChannelWaitOptions) => ChannelProducer<B, Meta> | ChannelConsumer<B, Meta>;
/** How long opening an end here spins for the publish lock (a broadcast consumer needs it). */
const LOCAL_ACTIVATE_MS = 50;

/** Options of `hub.attach(link, options)`: the role the process at the other end of the link gets;
 * `signal` / `timeout` give up waiting for the peer's acceptChannel (AbortError / ERR_TIMEOUT). */
export interface AttachOptions extends WaitOptions {
  role: ChannelRole;
}

/**
 * The process that creates a channel: `ChannelHub.create(options)`. Open this process's ends with
 * producer() / consumer(), and attach other processes with attach(link, { role }) (they call
 * acceptChannel(link)). Closing the hub closes the ends it opened and stops watching its peers;
 * peers keep working on the memory they mapped. createChannel() does all of it for one to one.
 * `B` is the slot type (HostBuffer or DeviceBuffer, from `memory`), `Meta` the type of the
 * messages' metadata (`ChannelHub.create<Meta>(...)`; not checked at run time).
 */
export class ChannelHub<B extends SlotBuffer = SlotBuffer, Meta = unknown> extends ChannelPart implements ChannelShape, Disposable {
  readonly #block: Block;
  readonly #ring: Ring;
  readonly #recoveries: Recoveries;
  readonly #peers = new Map<number, { link: Link; unhook: () => void }>();
  readonly #locals = new Set<ChannelProducer<B, Meta> | ChannelConsumer<B, Meta>>();
  #closed = false;
  #released = false;

  private constructor(block: Block) {
    super(block);
    this.#block = block;
    blockOf.set(this, block);
    this.#ring = block.ring(0);
    this.#recoveries = new Recoveries(this.#ring);
  }

  /** Device slots (`memory: { device }` or `{ pool }`): DeviceBuffer slots. */
  static create<Meta = unknown>(options: ChannelOptions & { memory: { pool: IpcPool } | { device: Device } }): ChannelHub<DeviceBuffer, Meta>;
  /** Host slots (`memory: 'host'` or left out): HostBuffer slots. */
  static create<Meta = unknown>(options: ChannelOptions & { memory?: 'host' }): ChannelHub<HostBuffer, Meta>;
  /** Slots of the kind `memory` says at run time. */
  static create<Meta = unknown>(options: ChannelOptions): ChannelHub<SlotBuffer, Meta>;
  /**
   * Creates a channel: allocates its slots, control block and doorbells in this process. The
   * slot type follows `memory`: DeviceBuffer for `{ device }` / `{ pool }`, else HostBuffer.
   *
   * @throws TypeError ERR_INVALID_ARG_VALUE for a bad `topology` or `memory` (ERR_INVALID_ARG_TYPE
   * for a `memory` of the wrong type); RangeError ERR_OUT_OF_RANGE for `slots`, `slotBytes`,
   * `metaBytes`, `maxPeers`, `producers` or `consumers` out of range.
   * @throws IpcError ERR_OUT_OF_MEMORY (host) or CudaError CUDA_ERROR_OUT_OF_MEMORY (device) when
   * the slots do not fit; ERR_IMPORTED_POOL for a pool another process made; ERR_FD_LIMIT when no
   * file descriptor is left.
   */
  static create<M extends ChannelMemory | undefined = undefined, Meta = unknown>(options: ChannelOptions & { memory?: M }): ChannelHub<any, Meta> {
    const topology = options.topology ?? 'queue';
    if (topology !== 'queue' && topology !== 'broadcast') {
      throw invalidArgValue(`topology must be 'queue' or 'broadcast'; got ${String(topology)}`);
    }
    const { device, pool } = checkMemory(options.memory);
    const maxPeers = options.maxPeers ?? 15;
    const params = {
      slotCount: options.slots,
      slotBytes: options.slotBytes,
      metaBytes: options.metaBytes ?? DEFAULT_META_BYTES,
      maxParticipants: maxPeers + 1,
      device: device !== undefined,
      broadcast: topology === 'broadcast',
    };
    checkParams(params);
    const expectProducers = options.producers ?? 1;
    const expectConsumers = options.consumers ?? 1;
    for (const [v, what] of [[expectProducers, 'producers'], [expectConsumers, 'consumers']] as const) {
      if (!Number.isSafeInteger(v) || v < 1 || v > maxPeers) {
        throw badNumber(v, `${what} must be an integer in 1..${maxPeers} (maxPeers); got ${String(v)}`);
      }
    }
    const layout: HubLayout = { ...computeLayout(params), expectProducers, expectConsumers };
    const made: Array<{ close(): void }> = [];
    let parts: ConstructorParameters<typeof Block>[0];
    try {
      const control = HostBuffer.allocate(layout.totalBytes);
      made.push(control);
      const view = new DataView(control.bytes.buffer, control.bytes.byteOffset, control.bytes.byteLength);
      writeHeader(view, layout, expectProducers, expectConsumers);
      // The hub is participant 0: a member that neither produces nor consumes.
      const p0 = layout.participantsOffset;
      view.setUint32(p0 + P.role, PRole.Hub, true);
      view.setUint32(p0 + P.pid, process.pid, true);
      view.setUint32(p0 + P.generation, 1, true);
      view.setUint32(p0 + P.state, PState.Alive, true);
      const bells = Doorbells.create(layout.maxParticipants);
      made.push(bells);
      const total = layout.slotCount * layout.slotBytes;
      let slotsHost: HostBuffer | undefined;
      let slotsDevice: DeviceBuffer | undefined;
      let ownPool: IpcPool | undefined;
      if (!device) {
        slotsHost = HostBuffer.allocate(total);
        made.push(slotsHost);
      } else {
        let from = pool;
        if (!from) {
          ownPool = device.createIpcPool();
          made.push(ownPool);
          from = ownPool;
        }
        slotsDevice = from.allocate(total);
        made.push(slotsDevice);
      }
      parts = { layout, control, bells, slotsHost, slotsDevice, ownPool };
    } catch (e) {
      for (const c of made.reverse()) {
        try { c.close(); } catch { /* releasing what was made */ }
      }
      throw e;
    }
    return new ChannelHub<SlotBufferFor<M>, Meta>(new Block(parts));
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Slot states and membership, read from the control block now. */
  stats(): ChannelStats {
    if (this.#closed) throw closedError('stats');
    return channelStats(this.#ring);
  }

  /** This process's producer end (close it, or the hub, when done). */
  producer(options?: ChannelWaitOptions): ChannelProducer<B, Meta> {
    return this.#openLocal('producer', options) as ChannelProducer<B, Meta>;
  }

  /** This process's consumer end (close it, or the hub, when done). */
  consumer(options?: ChannelWaitOptions): ChannelConsumer<B, Meta> {
    return this.#openLocal('consumer', options) as ChannelConsumer<B, Meta>;
  }

  #openLocal(role: ChannelRole, options: ChannelWaitOptions | undefined, onClosed?: () => void): ChannelProducer<B, Meta> | ChannelConsumer<B, Meta> {
    const what = role === 'producer' ? 'producer()' : 'consumer()';
    if (this.#closed) throw closedError(what);
    const policy = checkWait(options);
    const k = this.#allocate(role, process.pid, PFLAG_HUB_LOCAL, what);
    const deadline = performance.now() + LOCAL_ACTIVATE_MS;
    while (!this.#ring.activate(k, roleNumber(role))) {
      if (performance.now() > deadline) {
        this.#ring.freeParticipant(k);
        throw new IpcError('ERR_TIMEOUT', `${what}: the channel's publish lock stayed held for ${LOCAL_ACTIVATE_MS} ms`);
      }
    }
    const init = {
      block: this.#block.retain(), index: k, role, policy,
      onClosed: () => {
        this.#locals.delete(end);
        onClosed?.();
      },
    };
    let end: ChannelProducer<B, Meta> | ChannelConsumer<B, Meta>;
    try {
      end = role === 'producer' ? new ChannelProducer<B, Meta>(init) : new ChannelConsumer<B, Meta>(init);
    } catch (e) {
      this.#block.release();
      this.#recoveries.recover(k, false);
      throw e;
    }
    this.#locals.add(end);
    return end;
  }

  static {
    openOwnedEnd = (hub, role, options) => hub.#openLocal(role, options, () => hub.close());
  }

  #allocate(role: ChannelRole, pid: number, flags: number, what: string): number {
    this.#recycle();
    const k = this.#ring.allocateParticipant(roleNumber(role), pid, flags);
    if (k < 0) {
      throw new IpcError('ERR_LIMIT_REACHED', `${what}: the channel already has its ${this.#block.layout.maxParticipants - 1} ends (maxPeers); create it with a larger maxPeers`, { limit: 'maxPeers' });
    }
    return k;
  }

  /**
   * Attaches the process at the other end of `link` as a producer or consumer. The peer must call
   * acceptChannel(link); while the two run, neither side should read other messages from that
   * link. The peer's death is then noticed through the link and repaired.
   */
  async attach(link: Link, options: AttachOptions): Promise<void> {
    if (this.#closed) throw closedError('attach');
    const role = checkRole(options?.role, 'attach');
    let pid = 0;
    try { pid = link.peer.pid; } catch { /* not known */ }
    const k = this.#allocate(role, pid, 0, 'attach');
    let activated = false;
    const unhook = link.onClose(() => {
      const peer = this.#peers.get(k);
      if (peer?.link === link) this.#peers.delete(k);
      if (!activated) {
        this.#ring.freeParticipant(k);
        return;
      }
      if (this.#released) return;
      this.#recoveries.recover(k, true);
      // Whether it left cleanly or not: GPU writes it queued die with its process.
      if (this.#block.fences) repairFencesWhenGone(this.#ring, this.#block.fences, k, () => !this.#released);
    });
    const scope = waitScope(options, 'ChannelHub.attach');
    try {
      await offer(link, this.#block, k, role, () => (activated = this.#ring.activate(k, roleNumber(role))), () => !this.#closed, scope.signal);
      this.#peers.set(k, { link, unhook });
    } catch (e) {
      if (!activated) {
        unhook();
        if (!this.#closed) this.#ring.freeParticipant(k);
      }
      throw scope.translate(e);
    } finally {
      scope.done();
    }
  }

  /** Entries of ends that left (and whose link closed), or died and whose process is gone, can be
   * handed out again. */
  #recycle(): void {
    const ring = this.#ring;
    for (let k = 1; k < this.#block.layout.maxParticipants; k++) {
      if (this.#peers.has(k)) continue;  // its link is open: it may still be finishing (end())
      const st = ring.participantState(k);
      if (st === PState.Ended || (st === PState.Dead && !processAlive(ring.view.getUint32(ring.partOff(k) + P.pid, true)))) {
        ring.recycleParticipant(k);
      }
    }
  }

  /**
   * Closes the ends this hub opened, leaves the channel, and stops watching the peers (peers keep
   * working on the memory they mapped). Idempotent.
   */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const end of [...this.#locals]) end.close();
    for (const { unhook } of this.#peers.values()) unhook();
    this.#peers.clear();
    try {
      if (this.#ring.participantState(0) === PState.Alive || this.#recoveries.has(0)) this.#recoveries.leaveSelf();
    } catch (e) {
      process.emitWarning(`cuda-ipc channel: leaving the control block failed: ${(e as Error).message}`, { code: 'CUDA_IPC_CHANNEL' });
    }
    // Finish leaving (and repairs in progress) once the lock frees, then release.
    this.#recoveries.whenIdle(() => {
      this.#released = true;
      this.#block.release();
    });
  }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }
}

function checkMemory(memory: ChannelMemory | undefined): { device?: Device; pool?: IpcPool } {
  if (memory === undefined || memory === 'host') return {};
  if (typeof memory !== 'object' || memory === null) throw invalidArgType("memory must be 'host', { pool } or { device }");
  if ('pool' in memory) {
    const pool = memory.pool;
    if (!(pool instanceof IpcPool)) throw invalidArgType('memory.pool must be an IpcPool (device.createIpcPool())');
    if (pool.imported) throw new IpcError('ERR_IMPORTED_POOL', 'channel slots must come from a pool of this process; pass one made with device.createIpcPool()');
    return { device: pool.device, pool };
  }
  if ('device' in memory && memory.device instanceof Device) return { device: memory.device };
  throw invalidArgValue("memory must be 'host', { pool: IpcPool } or { device: Device }");
}
