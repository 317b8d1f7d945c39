// Channels: rings of shared slots between processes. One process (the hub) creates the slots and
// the control block and attaches each peer over a link; after that, messages move through shared
// memory alone (futex wake-ups, or spinning in spin mode), and the links only tell who died.
import { readFileSync } from 'node:fs';
import { IpcError } from '../errors.js';
import { addon } from '../native.js';
import type { NativeSharedWords } from '../channel-types.js';
import { HostBuffer } from '../host/index.js';
import { type Link } from '../link/index.js';
import { DeviceBuffer } from '../cuda/buffer.js';
import { Device } from '../cuda/device.js';
import type { Stream } from '../cuda/stream.js';
import { IpcPool } from '../ipc/pool.js';
import {
  H, P, S, Kind, PState, PRole, MetaKind, FLAG_REDELIVERED, LIMITS, checkParams, computeLayout, readHeader, writeHeader,
  publishFence, releaseFence, kindOf, type Layout,
} from './layout.js';
import { Fences, type FenceWait } from './fences.js';
import { JsWords } from './js-words.js';
import { Ring, corrupt } from './ring.js';
import { Sleeper } from './sleeper.js';

export type ChannelRole = 'producer' | 'consumer';
/** 'queue': each message goes to one consumer (work sharing; also one to one and many to one).
 * 'broadcast': each message goes to every consumer; its slot is freed once all released it. */
export type ChannelTopology = 'queue' | 'broadcast';
/** Where the slots live: host shared memory (memfd), or device memory from an IPC pool (yours,
 * or a new one on `device`). */
export type ChannelMemory = 'host' | { pool: IpcPool } | { device: Device };
/** What a slot is: shared host memory or device memory. */
export type SlotBuffer = HostBuffer | DeviceBuffer;
/** The slot type a `memory` option gives. */
export type SlotBufferFor<M> = [M] extends ['host'] ? HostBuffer : [M] extends [undefined] ? HostBuffer : [M] extends [{ pool: IpcPool } | { device: Device }] ? DeviceBuffer : SlotBuffer;

export interface ChannelWaitOptions {
  /**
   * How an endpoint waits when it has to (no message yet, every slot in flight):
   * 'futex' (default): a native thread sleeps on a futex and wakes the event loop; no CPU is
   * used while waiting. 'spin': first spin on the calling thread for up to `spinMicros` (the
   * event loop is blocked meanwhile), then sleep as with 'futex'. The lowest latency, at the
   * cost of a busy core.
   */
  wait?: 'futex' | 'spin';
  /** Spin mode: how long to spin before sleeping, in microseconds (default 50, at most 100000). */
  spinMicros?: number;
}

export interface ChannelOptions extends ChannelWaitOptions {
  /** Number of slots: messages in flight at once (backpressure beyond that). */
  slots: number;
  /** Bytes per slot. For device memory, a multiple of 256 keeps every slot aligned for kernels. */
  slotBytes: number;
  memory?: ChannelMemory;
  topology?: ChannelTopology;
  /** Bytes of metadata per message (`publish(slot, { meta })`); default 256, a multiple of 8. */
  metaBytes?: number;
  /** Peers this channel can have attached at once (default 15, at most 31). */
  maxPeers?: number;
  /** Consumers end once this many producers have attached and all have left (default 1). */
  producers?: number;
  /** Producers fail once this many consumers have attached and all have left (default 1); a
   * broadcast producer waits until this many are attached before its first acquire returns. */
  consumers?: number;
}

export interface CreateOptions extends ChannelOptions {
  /** This process's role: 'none' makes it a hub that only owns the slots and watches its peers
   * (pipeline() does that). */
  role: ChannelRole | 'none';
}

export interface AcquireOptions {
  /** Device slots: GPU work queued on this stream after acquire waits for the consumers' GPU
   * work on the slot's previous message (no CPU wait). Without it, acquire waits on the CPU. */
  stream?: Stream;
  signal?: AbortSignal;
}

export interface PublishOptions {
  /** Device slots: the stream your GPU work on the slot ran on; consumers' GPU work waits for
   * it (default: the legacy stream). */
  stream?: Stream;
  /** JSON-serialisable metadata, or a Uint8Array (at most the channel's metaBytes once encoded). */
  meta?: unknown;
  /** Bytes of the slot the message uses (default: the whole slot). */
  length?: number;
}

export interface ReleaseOptions {
  /** Device slots: the stream that ran the consumer's GPU work on the message (default: the
   * legacy stream); the producer's next use of the slot waits for that work. */
  stream?: Stream;
}

export interface ReceiveOptions {
  signal?: AbortSignal;
}

export interface AcceptOptions extends ChannelWaitOptions {
  /** Refuse the channel unless its slots are this kind of memory (pairs with the type
   * parameter: `acceptChannel<DeviceBuffer>(link, { memory: 'device' })`). */
  memory?: 'host' | 'device';
  signal?: AbortSignal;
}

export interface ChannelStats {
  slots: { free: number; writing: number; published: number; taken: number };
  producers: { attached: number; live: number; died: number };
  consumers: { attached: number; live: number; died: number };
  /** Positions published so far. */
  published: number;
}

const PROTOCOL = '@cuda-ipc/channel';
const DEFAULT_META_BYTES = 256;
const DEFAULT_SPIN_MICROS = 50;
/** Sleeping endpoints re-check the control block at least this often. */
const WAIT_TIMEOUT_MS = 1000;
const RETRY_MS = 2;
const RECOVERY_GIVE_UP_MS = 5000;

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const kCreate = Symbol('cuda-ipc.channel.create');
const kRelease = Symbol('cuda-ipc.channel.release');
const kSlotWait = Symbol('cuda-ipc.channel.slot-wait');
const kTicket = Symbol('cuda-ipc.channel.ticket');
/** A dead peer's fences are raised once its process is gone; after this long, it is left alone. */
const FENCE_REPAIR_GIVE_UP_MS = 60_000;

/** Per-slot publish tickets: the previous one + 1, wrapping, never 0 (0: never published). */
const nextTicket = (t: number): number => ((t + 1) >>> 0) || 1;

function closedError(what: string): IpcError {
  return new IpcError('ERR_CHANNEL_CLOSED', `${what}: the channel is closed`);
}

function abortError(signal: AbortSignal, what: string): IpcError {
  const r = signal.reason as { message?: string } | undefined;
  return new IpcError('ERR_TIMEOUT', `${what} was aborted: ${r?.message ?? 'the signal fired'}`, { cause: signal.reason });
}

function checkWait(o: ChannelWaitOptions): { spin: boolean; spinMicros: number } {
  const wait = o.wait ?? 'futex';
  if (wait !== 'futex' && wait !== 'spin') throw new IpcError('ERR_INVALID_ARG', `wait must be 'futex' or 'spin'; got ${String(wait)}`);
  const spinMicros = o.spinMicros ?? DEFAULT_SPIN_MICROS;
  if (!Number.isFinite(spinMicros) || spinMicros < 0 || spinMicros > 100000) {
    throw new IpcError('ERR_INVALID_ARG', `spinMicros must be in 0..100000; got ${String(spinMicros)}`);
  }
  return { spin: wait === 'spin', spinMicros };
}

const roleNumber = (r: ChannelRole | 'none'): number => (r === 'producer' ? PRole.Producer : r === 'consumer' ? PRole.Consumer : PRole.Hub);

/** What a hub tells a peer it attaches. */
interface AttachMessage {
  [PROTOCOL]: 'attach';
  version: 2;
  index: number;
  role: ChannelRole;
  control: HostBuffer;
  slots: HostBuffer | DeviceBuffer;
}

function isProtocol(m: unknown, op: string): boolean {
  return typeof m === 'object' && m !== null && (m as Record<string, unknown>)[PROTOCOL] === op;
}

function disposeQuietly(values: unknown): void {
  const visit = (v: unknown, depth: number): void => {
    if (depth > 4 || v === null || typeof v !== 'object') return;
    if (v instanceof HostBuffer || v instanceof DeviceBuffer || v instanceof IpcPool) {
      try { v.close(); } catch { /* already gone */ }
      return;
    }
    if (Array.isArray(v)) for (const x of v) visit(x, depth + 1);
    else for (const x of Object.values(v)) visit(x, depth + 1);
  };
  visit(values, 0);
}

interface Waiting<T> {
  resolve(v: T): void;
  reject(e: unknown): void;
  signal?: AbortSignal;
  onAbort?: () => void;
  stream?: Stream;
}

interface ChannelInit {
  hub: boolean;
  role: ChannelRole | 'none';
  index: number;
  layout: Layout & { expectProducers: number; expectConsumers: number };
  control: HostBuffer;
  words: NativeSharedWords;
  slotsHost?: HostBuffer;
  slotsDevice?: DeviceBuffer;
  ownPool?: IpcPool;
  hubLink?: Link;
  wait: { spin: boolean; spinMicros: number };
}

/**
 * One process's end of a channel: a producer, a consumer, or (role 'none') a hub that only owns
 * the memory. Create the hub with Channel.create() and attach peers with attach(link, { role });
 * a peer gets its end with acceptChannel(link). createChannel(link, options) does both for one
 * to one.
 *
 * Producer: `const slot = await ch.acquire()`, write into `slot.buffer` (or `slot.bytes`), then
 * `ch.publish(slot, { meta })`; `await ch.end()` when done. Consumer: `for await (const msg of ch)`
 * with `msg.buffer`, `msg.meta`, and `msg.release()` once done with the slot.
 */
export class Channel<B extends SlotBuffer = SlotBuffer> implements Disposable, AsyncDisposable, AsyncIterable<ChannelMessage<B>> {
  readonly role: ChannelRole | 'none';
  readonly topology: ChannelTopology;
  readonly memory: 'host' | 'device';
  readonly slotCount: number;
  readonly slotBytes: number;
  readonly metaBytes: number;
  /** True in the process that created the channel (it owns the memory and watches the peers). */
  readonly isHub: boolean;
  /** This endpoint's participant index (the hub is 0). */
  readonly index: number;
  /** The device of device slots. */
  readonly device: Device | undefined;

  readonly #ring: Ring;
  readonly #words: NativeSharedWords;
  readonly #control: HostBuffer;
  readonly #layout: Layout & { expectProducers: number; expectConsumers: number };
  readonly #slotsHost: HostBuffer | undefined;
  readonly #slotsDevice: DeviceBuffer | undefined;
  readonly #ownPool: IpcPool | undefined;
  readonly #views: Array<HostBuffer | DeviceBuffer | undefined>;
  /** Device slots: GPU-side ordering through fence words in the control block. */
  readonly #fences: Fences | undefined;
  readonly #wait: { spin: boolean; spinMicros: number };
  readonly #sleeper = new Sleeper();
  readonly #hubLink: Link | undefined;
  #unhookHub: (() => void) | undefined;
  /** Peers: the link to the hub closed. */
  #hubLost = false;
  readonly #peers = new Map<number, { link: Link; unhook: () => void }>();
  #closed = false;
  /** Closed, but still finishing its leave or a recovery before releasing the memory. */
  #closing = false;
  #ending = false;
  /** Broadcast consumers: the next position to read. */
  #cursor = 0;
  /** Consumers: messages handed out and not yet released. */
  readonly #held = new Map<number, ChannelMessage<B>>();
  /** Producers: slots acquired and not yet published. */
  readonly #writing = new Map<number, ChannelSlot<B>>();
  /** Producers: publishes waiting for the publish lock, in order. */
  readonly #deferred: number[] = [];
  #deferTimer: NodeJS.Timeout | undefined;
  #deferWaiters: Array<() => void> = [];
  readonly #receivers: Array<Waiting<ChannelMessage<B> | undefined>> = [];
  readonly #acquirers: Array<Waiting<ChannelSlot<B>>> = [];
  #pumping = false;
  #ended = false;
  #endError: IpcError | undefined;
  /** Participants whose repair waits for the publish lock, with when it started. */
  readonly #recoveries = new Map<number, number>();
  #recoveryTimer: NodeJS.Timeout | undefined;

  /** @internal Use Channel.create, createChannel or acceptChannel. */
  constructor(token: typeof kCreate, init: ChannelInit) {
    if (token !== kCreate) throw new IpcError('ERR_INVALID_ARG', 'use Channel.create(), createChannel() or acceptChannel()');
    const l = init.layout;
    this.role = init.role;
    this.topology = l.broadcast ? 'broadcast' : 'queue';
    this.memory = l.device ? 'device' : 'host';
    this.slotCount = l.slotCount;
    this.slotBytes = l.slotBytes;
    this.metaBytes = l.metaBytes;
    this.isHub = init.hub;
    this.index = init.index;
    this.#layout = l;
    this.#control = init.control;
    this.#words = init.words;
    this.#ring = new Ring(init.words, init.control.bytes, l);
    this.#ring.me = init.index;
    this.#slotsHost = init.slotsHost;
    this.#slotsDevice = init.slotsDevice;
    this.device = init.slotsDevice?.device;
    this.#ownPool = init.ownPool;
    this.#fences = init.slotsDevice ? new Fences(init.slotsDevice.device, init.words) : undefined;
    this.#hubLink = init.hubLink;
    this.#wait = init.wait;
    this.#views = new Array(l.slotCount).fill(undefined);
    if (init.role === 'consumer' && l.broadcast) this.#cursor = init.words.load64(this.#ring.partOff(init.index) + P.cursor);
    if (this.#hubLink) {
      this.#unhookHub = this.#hubLink.onClose(() => {
        this.#unhookHub = undefined;
        this.#hubLost = true;
        this.#repairFencesWhenGone(0);
        // The hub went away: take its place in the control block if it left without a word.
        this.#recover(0, true);
      });
    }
  }

  // ------------------------------------------------------------------------------------------
  // Creating and attaching

  /** Creates a channel in this process, the hub: it allocates the slots and the control block. */
  static create<M extends ChannelMemory | undefined = undefined>(options: CreateOptions & { memory?: M }): Channel<SlotBufferFor<M>> {
    const role = options.role;
    if (role !== 'producer' && role !== 'consumer' && role !== 'none') {
      throw new IpcError('ERR_INVALID_ARG', `role must be 'producer', 'consumer' or 'none'; got ${String(role)}`);
    }
    const topology = options.topology ?? 'queue';
    if (topology !== 'queue' && topology !== 'broadcast') {
      throw new IpcError('ERR_INVALID_ARG', `topology must be 'queue' or 'broadcast'; got ${String(topology)}`);
    }
    const memory = options.memory ?? 'host';
    let device: Device | undefined;
    let pool: IpcPool | undefined;
    if (memory !== 'host') {
      if (typeof memory !== 'object' || memory === null) throw new IpcError('ERR_INVALID_ARG', "memory must be 'host', { pool } or { device }");
      if ('pool' in memory) {
        pool = memory.pool;
        if (!(pool instanceof IpcPool)) throw new IpcError('ERR_INVALID_ARG', 'memory.pool must be an IpcPool (device.createIpcPool())');
        if (pool.imported) throw new IpcError('ERR_IMPORTED_POOL', 'channel slots must come from a pool of this process; pass one made with device.createIpcPool()');
        device = pool.device;
      } else if ('device' in memory && memory.device instanceof Device) {
        device = memory.device;
      } else {
        throw new IpcError('ERR_INVALID_ARG', "memory must be 'host', { pool: IpcPool } or { device: Device }");
      }
      if (topology === 'broadcast' && role !== 'producer') {
        throw new IpcError('ERR_UNSUPPORTED', 'a broadcast channel on device memory is produced by the process that creates it: create it with role \'producer\'');
      }
    }
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
      if (!Number.isSafeInteger(v) || v < 1 || v > params.maxParticipants) {
        throw new IpcError('ERR_INVALID_ARG', `${what} must be an integer in 1..${params.maxParticipants}; got ${String(v)}`);
      }
    }
    const wait = checkWait(options);
    const layout = computeLayout(params);
    const hubRole = role === 'producer' ? 1 : role === 'consumer' ? 2 : 0;
    const toClose: Array<{ close(): void }> = [];
    try {
      const control = HostBuffer.allocate(layout.totalBytes);
      toClose.push(control);
      const view = new DataView(control.bytes.buffer, control.bytes.byteOffset, control.bytes.byteLength);
      writeHeader(view, layout, expectProducers, expectConsumers, hubRole);
      const words = new JsWords(new addon.SharedWords(control.fd, layout.totalBytes), control.bytes);
      toClose.push(words);
      // The hub is participant 0.
      const p0 = layout.participantsOffset;
      view.setUint32(p0 + P.role, roleNumber(role), true);
      view.setUint32(p0 + P.pid, process.pid, true);
      view.setUint32(p0 + P.generation, 1, true);
      if (role === 'producer') {
        words.add32(H.producersLive, 1);
        words.add32(H.producersAttached, 1);
      } else if (role === 'consumer') {
        words.or32(H.consumerMask, 1);  // broadcast: messages are held for participant 0 too
        words.add32(H.consumersLive, 1);
        words.add32(H.consumersAttached, 1);
      }
      words.store32(p0 + P.state, PState.Alive);
      let slotsHost: HostBuffer | undefined;
      let slotsDevice: DeviceBuffer | undefined;
      let ownPool: IpcPool | undefined;
      const total = layout.slotCount * layout.slotBytes;
      if (!device) {
        slotsHost = HostBuffer.allocate(total);
        toClose.push(slotsHost);
      } else {
        if (!pool) {
          ownPool = device.createIpcPool();
          toClose.push(ownPool);
          pool = ownPool;
        }
        slotsDevice = pool.allocate(total);
        toClose.push(slotsDevice);
      }
      return new Channel<SlotBufferFor<M>>(kCreate, {
        hub: true, role, index: 0, layout: { ...layout, expectProducers, expectConsumers }, control, words,
        slotsHost, slotsDevice, ownPool, wait,
      });
    } catch (e) {
      for (const c of toClose.reverse()) {
        try { c.close(); } catch { /* releasing what was made */ }
      }
      throw e;
    }
  }

  /**
   * Hub only: attaches the process at the other end of `link` as a producer or consumer. The peer
   * must call acceptChannel(link); while the two run, neither side should read other messages
   * from that link. The peer's death is then noticed through the link and repaired.
   */
  async attach(link: Link, options: { role: ChannelRole; signal?: AbortSignal }): Promise<void> {
    if (!this.isHub) throw new IpcError('ERR_INVALID_ARG', 'attach: only the process that created the channel (Channel.create) attaches peers');
    this.#assertOpen('attach');
    const role = options?.role;
    if (role !== 'producer' && role !== 'consumer') throw new IpcError('ERR_INVALID_ARG', `attach: role must be 'producer' or 'consumer'; got ${String(role)}`);
    if (this.memory === 'device' && this.topology === 'broadcast' && role === 'producer') {
      throw new IpcError('ERR_UNSUPPORTED', 'a broadcast channel on device memory has one producer: the process that created it');
    }
    let pid = 0;
    try { pid = link.peer.pid; } catch { /* not known */ }
    this.#recycle();
    const k = this.#ring.allocateParticipant(roleNumber(role), pid);
    if (k < 0) {
      throw new IpcError('ERR_INVALID_ARG', `attach: the channel already has its ${this.#layout.maxParticipants - 1} peers (maxPeers); create it with a larger maxPeers`);
    }
    let activated = false;
    const unhook = link.onClose(() => {
      const peer = this.#peers.get(k);
      if (peer?.link === link) this.#peers.delete(k);
      if (!activated) {
        this.#ring.freeParticipant(k);
        return;
      }
      this.#recover(k, true);
      // Whether it left cleanly or not: GPU writes it queued die with its process.
      this.#repairFencesWhenGone(k);
    });
    try {
      const message: AttachMessage = {
        [PROTOCOL]: 'attach', version: 2, index: k, role,
        control: this.#control, slots: (this.#slotsHost ?? this.#slotsDevice)!,
      };
      link.send(message);
      const reply = await link.receive({ signal: options.signal });
      if (isProtocol(reply, 'refused')) {
        throw new IpcError('ERR_PEER_REFUSED', `the peer refused the channel: ${String((reply as { message?: unknown }).message)}`);
      }
      if (!isProtocol(reply, 'ready') || (reply as { index?: unknown }).index !== k) {
        disposeQuietly(reply);
        throw new IpcError('ERR_FRAME_INVALID', 'attach: the peer answered with something other than the channel handshake; do not send other messages on a link while attach/acceptChannel run');
      }
      for (;;) {
        this.#assertOpen('attach');
        if (link.closed) throw new IpcError('ERR_PEER_GONE', 'attach: the peer went away during the handshake');
        if (this.#ring.activate(k, roleNumber(role))) break;
        await delay(RETRY_MS);  // a publish holds the lock (broadcast): microseconds
      }
      activated = true;
      this.#peers.set(k, { link, unhook });
      link.send({ [PROTOCOL]: 'active', index: k });
    } catch (e) {
      if (!activated) {
        unhook();
        if (!this.#closed) this.#ring.freeParticipant(k);
      }
      throw e;
    }
  }

  // ------------------------------------------------------------------------------------------
  // Accessors

  get closed(): boolean {
    return this.#closed;
  }

  /** Slot states and membership, read from the control block now. */
  stats(): ChannelStats {
    this.#assertOpen('stats');
    const c = (off: number) => this.#ring.counter(off);
    return {
      slots: this.#ring.slotCounts(),
      producers: { attached: c(H.producersAttached), live: c(H.producersLive), died: c(H.producersDied) },
      consumers: { attached: c(H.consumersAttached), live: c(H.consumersLive), died: c(H.consumersDied) },
      published: this.#words.load64(H.tail),
    };
  }

  #assertOpen(what: string): void {
    if (this.#closed) throw closedError(what);
  }

  #assertRole(role: ChannelRole, what: string): void {
    this.#assertOpen(what);
    if (this.role !== role) {
      throw new IpcError('ERR_INVALID_ARG', `${what}: this end of the channel is a ${this.role === 'none' ? 'hub without a role' : this.role}, not a ${role}`);
    }
  }

  #alive(): boolean {
    return this.#ring.participantState(this.index) === PState.Alive;
  }

  #detachedError(what: string): IpcError {
    return new IpcError('ERR_CHANNEL_CLOSED', `${what}: this end was removed from the channel (its link to the hub closed, so its messages were handed to others); attach again over a new link`);
  }

  /** A host view of slot s, made once (again if the user closed it). */
  #view(s: number): HostBuffer | DeviceBuffer {
    let v = this.#views[s];
    if (!v || v.closed) {
      const src = (this.#slotsHost ?? this.#slotsDevice)!;
      v = src.view(s * this.slotBytes, this.slotBytes);
      this.#views[s] = v;
    }
    return v;
  }

  // ------------------------------------------------------------------------------------------
  // Waiting

  /** Parks until the sequence word at `seqOff` changes (or the timeout); spins first in spin mode. */
  async #park(seqOff: number, sleepRole: number, ready: () => boolean): Promise<void> {
    const w = this.#words;
    if (this.#wait.spin) {
      const seq = w.load32(seqOff);
      if (ready()) return;
      if (w.spinWait32(seqOff, seq, this.#wait.spinMicros)) return;
    }
    const seq = w.load32(seqOff);
    this.#ring.enterSleep(sleepRole);
    try {
      if (ready() || this.#closed) return;
      const status = await this.#sleeper.wait(w, seqOff, seq, WAIT_TIMEOUT_MS);
      if (status < 0) throw new IpcError('ERR_CHANNEL_CORRUPT', `waiting on the channel failed (errno ${-status})`);
    } finally {
      if (!this.#closed) this.#ring.leaveSleep(sleepRole);
    }
  }

  // ------------------------------------------------------------------------------------------
  // Producer

  /**
   * A free slot to write into; waits while every slot is in flight (backpressure). Rejects with
   * ERR_PEER_GONE once every consumer died (ERR_CHANNEL_CLOSED once they all left).
   */
  acquire(options: AcquireOptions = {}): Promise<ChannelSlot<B>> {
    try {
      this.#assertRole('producer', 'acquire');
      if (this.#acquirers.length === 0 && !this.#pumping) {
        const slot = this.#tryAcquire();
        if (slot) return this.memory === 'host' ? Promise.resolve(slot) : this.#afterAcquire(slot, options);
      }
    } catch (e) {
      return Promise.reject(e);
    }
    const queued = this.#enqueue(this.#acquirers, options.signal, 'acquire', options.stream);
    return this.memory === 'host' ? queued : queued.then((slot) => this.#afterAcquire(slot, options));
  }

  /** A free slot now, or undefined when every slot is in flight. Device slots: you must order
   * your writes after the consumers' work yourself (slot.waitOn(stream) or await slot.ready()). */
  tryAcquire(): ChannelSlot<B> | undefined {
    this.#assertRole('producer', 'tryAcquire');
    return this.#tryAcquire();
  }

  async #afterAcquire(slot: ChannelSlot<B>, options: AcquireOptions): Promise<ChannelSlot<B>> {
    if (this.memory === 'device') {
      if (options.stream) slot.waitOn(options.stream);
      else await slot.ready();
    }
    return slot;
  }

  #consumersGone(): boolean {
    const r = this.#ring;
    return r.counter(H.consumersLive) === 0 && r.counter(H.consumersAttached) >= this.#layout.expectConsumers;
  }

  #goneError(what: string): IpcError {
    return this.#ring.counter(H.consumersDied) > 0
      ? new IpcError('ERR_PEER_GONE', `${what}: every consumer of the channel is gone (${this.#ring.counter(H.consumersDied)} died)`)
      : new IpcError('ERR_CHANNEL_CLOSED', `${what}: every consumer has closed the channel`);
  }

  #tryAcquire(): ChannelSlot<B> | undefined {
    if (this.#ending) throw closedError('acquire (end() was called)');
    if (!this.#alive()) throw this.#detachedError('acquire');
    if (this.#consumersGone()) throw this.#goneError('acquire');
    if (this.topology === 'broadcast' && this.#ring.counter(H.consumersAttached) < this.#layout.expectConsumers) return undefined;
    const s = this.#ring.claimSlot();
    if (s < 0) return undefined;
    const slot = new ChannelSlot<B>(this, s, this.#view(s) as B);
    this.#writing.set(s, slot);
    return slot;
  }

  /**
   * Publishes `slot`: the consumers can take it at once. With device slots the slot's publish
   * fence is written on `stream` first, so consumers that waitOn() it see everything queued there.
   */
  publish(slot: ChannelSlot<B>, options: PublishOptions = {}): void {
    this.#assertRole('producer', 'publish');
    const s = slot?.index;
    if (!(slot instanceof ChannelSlot) || this.#writing.get(s) !== slot) {
      throw new IpcError('ERR_INVALID_ARG', 'publish: that slot is not one this producer acquired and has not yet published');
    }
    const view = this.#ring.view;
    const so = this.#ring.slotOff(s);
    const length = options.length ?? this.slotBytes;
    if (!Number.isSafeInteger(length) || length < 0 || length > this.slotBytes) {
      throw new IpcError('ERR_OUT_OF_RANGE', `publish: length must be an integer in 0..${this.slotBytes}; got ${String(length)}`);
    }
    // Metadata straight into the slot record.
    let metaKind: number = MetaKind.None;
    let metaLength = 0;
    const meta = options.meta;
    if (meta !== undefined) {
      const area = this.#ring.bytes.subarray(so + S.meta, so + S.meta + this.metaBytes);
      if (meta instanceof Uint8Array) {
        if (meta.byteLength > this.metaBytes) throw this.#metaTooLarge(meta.byteLength);
        area.set(meta);
        metaKind = MetaKind.Bytes;
        metaLength = meta.byteLength;
      } else {
        const json = JSON.stringify(meta);
        if (json === undefined) throw new IpcError('ERR_NOT_TRANSFERABLE', 'publish: meta must be JSON-serialisable or a Uint8Array');
        const r = encoder.encodeInto(json, area);
        if (r.read !== json.length) throw this.#metaTooLarge(Buffer.byteLength(json));
        metaKind = MetaKind.Json;
        metaLength = r.written;
      }
    }
    view.setUint32(so + S.length, length >>> 0, true);
    view.setUint32(so + S.length + 4, Math.floor(length / 2 ** 32), true);
    view.setUint32(so + S.metaLength, metaLength, true);
    view.setUint32(so + S.metaKind, metaKind, true);
    if (this.#fences) {
      // The slot is ours (writing) until the commit below: nobody else touches its ticket.
      const ticket = nextTicket(view.getUint32(so + S.ticket, true));
      view.setUint32(so + S.ticket, ticket, true);
      this.#fences.signal(options.stream, publishFence(this.#layout, s), ticket);
    }
    this.#writing.delete(s);
    slot[kSlotWait](true);
    if (this.#deferred.length > 0) {
      this.#deferred.push(s);
      return;
    }
    this.#commit(s);
  }

  #metaTooLarge(n: number): IpcError {
    return new IpcError('ERR_MESSAGE_TOO_LARGE', `publish: meta takes ${n} bytes; this channel holds ${this.metaBytes} per message (metaBytes)`);
  }

  /** Publishes s now or defers it while the publish lock is busy. */
  #commit(s: number): void {
    const r = this.#ring.publish(s);
    if (r === 'busy') {
      this.#deferred.push(s);
      this.#scheduleDeferred();
    } else if (r === 'detached') {
      throw this.#detachedError('publish');
    }
  }

  #scheduleDeferred(): void {
    if (this.#deferTimer) return;
    this.#deferTimer = setTimeout(() => {
      this.#deferTimer = undefined;
      while (this.#deferred.length > 0 && !this.#closed) {
        const s = this.#deferred[0]!;
        if (this.#ring.publish(s) === 'busy') {
          this.#scheduleDeferred();
          return;
        }
        this.#deferred.shift();  // published ('detached': taken back by recovery, dropped)
      }
      const waiters = this.#deferWaiters;
      this.#deferWaiters = [];
      for (const w of waiters) w();
    }, RETRY_MS);
  }

  /** Gives back a slot acquired and not published. */
  discard(slot: ChannelSlot<B>): void {
    this.#assertRole('producer', 'discard');
    if (this.#writing.get(slot.index) !== slot) return;
    this.#writing.delete(slot.index);
    slot[kSlotWait](true);
    this.#ring.discard(slot.index);
  }

  /**
   * Producer: no more messages from this end. Consumers finish once they took what was
   * published. Resolves once every message this end published was released (rejects with
   * ERR_PEER_GONE if the consumers died first), then closes this end. For a consumer or a hub
   * without a role, the same as close().
   */
  async end(): Promise<void> {
    if (this.#closed) return;
    if (this.role !== 'producer') {
      this.close();
      return;
    }
    this.#ending = true;
    try {
      if (this.#deferred.length > 0) await new Promise<void>((resolve) => this.#deferWaiters.push(resolve));
      for (const slot of [...this.#writing.values()]) this.discard(slot);
      // Leave first, so that consumers see the end even while they hold our last messages. The
      // hub does not hand this entry to anyone else while our link to it is open, so counting
      // "our" messages by index stays right.
      while (!this.#leaveSelf()) {
        if (performance.now() - (this.#recoveries.get(this.index) ?? 0) > RECOVERY_GIVE_UP_MS) {
          throw new IpcError('ERR_TIMEOUT', `end: the channel's publish lock stayed held for ${RECOVERY_GIVE_UP_MS} ms (a process died inside it and was not repaired)`);
        }
        await delay(RETRY_MS);
      }
      const done = () => this.#closed || this.#hubLost || this.#ring.inFlightFrom(this.index) === 0 || this.#consumersGone();
      while (!done()) await this.#park(H.spaceSeq, PRole.Producer, done);
      if (!this.#closed && !this.#hubLost && this.#ring.inFlightFrom(this.index) > 0 && this.#ring.counter(H.consumersDied) > 0) {
        throw new IpcError('ERR_PEER_GONE', `end: the consumers died with ${this.#ring.inFlightFrom(this.index)} message(s) unreleased`);
      }
    } finally {
      this.close();
    }
  }

  // ------------------------------------------------------------------------------------------
  // Consumer

  /**
   * The next message, or undefined once the channel ended cleanly (every producer ended and all
   * their messages were taken). Rejects with ERR_PEER_GONE, after the messages already published,
   * when a producer died.
   */
  receive(options: ReceiveOptions = {}): Promise<ChannelMessage<B> | undefined> {
    try {
      this.#assertRole('consumer', 'receive');
      if (this.#receivers.length === 0 && !this.#pumping) {
        const m = this.#poll();
        if (m !== null) return Promise.resolve(m);
      }
    } catch (e) {
      return Promise.reject(e);
    }
    return this.#enqueue(this.#receivers, options.signal, 'receive');
  }

  /** A message now; undefined when none is there (or the channel ended: see receive()). */
  tryReceive(): ChannelMessage<B> | undefined {
    this.#assertRole('consumer', 'tryReceive');
    return this.#poll() ?? undefined;
  }

  [Symbol.asyncIterator](): AsyncIterator<ChannelMessage<B>> {
    this.#assertRole('consumer', 'iterate');
    return {
      next: async () => {
        const m = await this.receive();
        return m ? { value: m, done: false } : { value: undefined, done: true };
      },
      return: async () => ({ value: undefined, done: true }),
    };
  }

  #producersGone(): boolean {
    const r = this.#ring;
    return r.counter(H.producersLive) === 0 && r.counter(H.producersAttached) >= this.#layout.expectProducers;
  }

  /** A message, undefined at the end, null when there is none yet. Throws the end error. */
  #poll(): ChannelMessage<B> | undefined | null {
    if (this.#endError) throw this.#endError;
    if (this.#ended || this.#closed) return undefined;
    let m = this.#takeOne();
    if (m) return m;
    if (!this.#producersGone()) return null;
    // Every producer left: whatever they published is visible now; drain it, then end.
    m = this.#takeOne();
    if (m) return m;
    this.#ended = true;
    const died = this.#ring.counter(H.producersDied);
    if (died > 0) {
      this.#endError = new IpcError('ERR_PEER_GONE', `the channel's producer${died > 1 ? 's' : ''} died (${died}); every message published before was delivered`);
      throw this.#endError;
    }
    return undefined;
  }

  #takeOne(): ChannelMessage<B> | undefined {
    const ring = this.#ring;
    if (this.topology === 'queue') {
      const s = ring.take();
      if (s < 0) return undefined;
      if (!this.#alive()) {
        // Detached while taking (recovery already ran for us): hand it back, then stop.
        if (!ring.returnTaken(s)) {
          process.emitWarning(`cuda-ipc channel: a message taken after this end was detached could not be handed back (slot ${s})`, { code: 'CUDA_IPC_CHANNEL' });
        }
        throw this.#detachedError('receive');
      }
      return this.#message(s);
    }
    for (;;) {
      const s = ring.peekAt(this.#cursor);
      if (s === -1) {
        if (!this.#alive()) throw this.#detachedError('receive');
        return undefined;
      }
      this.#cursor++;
      if (s === -2) continue;  // not ours (published before we attached, or we were removed)
      return this.#message(s);
    }
  }

  #message(s: number): ChannelMessage<B> {
    const view = this.#ring.view;
    const so = this.#ring.slotOff(s);
    const length = view.getUint32(so + S.length, true) + view.getUint32(so + S.length + 4, true) * 2 ** 32;
    const metaLength = view.getUint32(so + S.metaLength, true);
    const metaKind = view.getUint32(so + S.metaKind, true);
    if (length > this.slotBytes || metaLength > this.metaBytes || metaKind > MetaKind.Bytes) {
      this.#abandon(s);
      throw corrupt(`message in slot ${s}: length ${length}, meta ${metaLength} bytes of kind ${metaKind}`);
    }
    let meta: unknown;
    if (metaKind !== MetaKind.None) {
      const bytes = this.#ring.bytes.subarray(so + S.meta, so + S.meta + metaLength);
      if (metaKind === MetaKind.Bytes) meta = bytes.slice();
      else {
        try {
          meta = JSON.parse(decoder.decode(bytes));
        } catch {
          this.#abandon(s);
          throw corrupt(`message in slot ${s}: its meta is not JSON`);
        }
      }
    }
    const word = this.topology === 'queue' ? this.#ring.takenWords[s]! : 0;
    const m = new ChannelMessage<B>(this, s, this.#view(s) as B, {
      position: this.#words.load64(so + S.position),
      length,
      meta,
      producer: view.getUint32(so + S.publisher, true),
      redelivered: (word & FLAG_REDELIVERED) !== 0,
      ticket: view.getUint32(so + S.ticket, true),
    });
    this.#held.set(s, m);
    return m;
  }

  /** Releases a slot whose message could not be handed out. */
  #abandon(s: number): void {
    if (this.topology === 'broadcast') this.#ring.releaseHeld(s);
    else this.#ring.releaseTaken(s);
  }

  /** @internal */
  [kRelease](m: ChannelMessage<B>, options: ReleaseOptions): void {
    if (this.#held.get(m.index) !== m) return;
    this.#held.delete(m.index);
    if (this.#closed) return;
    if (this.#fences) {
      if (this.topology === 'queue') {
        // Read by the producer that claims the slot next (after the release below).
        const so = this.#ring.slotOff(m.index);
        this.#ring.view.setUint32(so + S.releasedBy, this.index, true);
        this.#ring.view.setUint32(so + S.releaseTicket, m[kTicket], true);
      }
      this.#fences.signal(options.stream, releaseFence(this.#layout, m.index, this.index), m[kTicket]);
    }
    if (this.topology === 'broadcast') this.#ring.releaseHeld(m.index);
    else this.#ring.releaseTaken(m.index);
  }

  // ------------------------------------------------------------------------------------------
  // The wait queue shared by acquire and receive

  #enqueue<T>(queue: Array<Waiting<T>>, signal: AbortSignal | undefined, what: string, stream?: Stream): Promise<T> {
    if (signal?.aborted) return Promise.reject(abortError(signal, what));
    return new Promise<T>((resolve, reject) => {
      const entry: Waiting<T> = { resolve, reject, signal, stream };
      if (signal) {
        entry.onAbort = () => {
          const i = queue.indexOf(entry);
          if (i >= 0) queue.splice(i, 1);
          reject(abortError(signal, what));
          if (queue.length === 0) this.#sleeper.cancel();
        };
        signal.addEventListener('abort', entry.onAbort, { once: true });
      }
      queue.push(entry);
      void this.#pump();
    });
  }

  #settle<T>(queue: Array<Waiting<T>>, value: T | undefined, error?: unknown): void {
    const e = queue.shift();
    if (!e) return;
    if (e.onAbort) e.signal!.removeEventListener('abort', e.onAbort);
    if (error !== undefined) e.reject(error);
    else e.resolve(value as T);
  }

  /** Serves queued acquires / receives in order, parking between attempts. */
  async #pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      const producer = this.role === 'producer';
      const queue: Array<Waiting<any>> = producer ? this.#acquirers : this.#receivers;
      while (queue.length > 0) {
        if (this.#closed) {
          while (queue.length > 0) {
            if (producer) this.#settle(queue, undefined, closedError('acquire'));
            else this.#settle(queue, undefined);
          }
          break;
        }
        let got: ChannelSlot<B> | ChannelMessage<B> | undefined | null;
        try {
          got = producer ? this.#tryAcquire() ?? null : this.#poll();
        } catch (e) {
          while (queue.length > 0) this.#settle(queue, undefined, e);
          break;
        }
        if (got !== null) {
          this.#settle(queue, got);
          if (!producer && got === undefined) while (queue.length > 0) this.#settle(queue, undefined);
          continue;
        }
        try {
          if (producer) await this.#park(H.spaceSeq, PRole.Producer, () => this.#canAcquire());
          else await this.#park(H.dataSeq, PRole.Consumer, () => this.#canReceive());
        } catch (e) {
          while (queue.length > 0) this.#settle(queue, undefined, e);
          break;
        }
        if (queue.length === 0 && !producer && this.#canReceive() && !this.#closed) {
          // Woken for a message nobody here wants any more: pass the wake-up on.
          this.#ring.signalData();
        }
      }
    } finally {
      this.#pumping = false;
    }
  }

  #canAcquire(): boolean {
    if (this.#closed || this.#consumersGone()) return true;
    if (this.topology === 'broadcast' && this.#ring.counter(H.consumersAttached) < this.#layout.expectConsumers) return false;
    return this.#ring.hasFree();
  }

  #canReceive(): boolean {
    return this.#closed || !this.#ring.isEmpty(this.#cursor) || this.#producersGone() || !this.#alive();
  }

  // ------------------------------------------------------------------------------------------
  // Leaving, recovery, closing

  /**
   * Takes this endpoint out of the control block (a clean leave). The publish lock is held for
   * microseconds at a time, so this spins for it briefly; a lock still held after 50 ms belongs
   * to a process that died inside it, and the hub's recovery of that process releases it: the
   * leave then finishes asynchronously (true when it finished now).
   */
  #leaveSelf(): boolean {
    const deadline = performance.now() + 50;
    for (;;) {
      const r = this.#ring.leave(this.index, false, this.#recoveries.has(this.index));
      if (r !== 'busy') {
        this.#recoveries.delete(this.index);
        return true;
      }
      if (!this.#recoveries.has(this.index)) this.#recoveries.set(this.index, performance.now());
      if (performance.now() > deadline) return false;
      spinBriefly();
    }
  }

  /** Repairs the control block after participant k died (retrying while the lock is busy). */
  #recover(k: number, died: boolean): void {
    if (this.#closed && !this.#closing) return;
    let r: 'done' | 'not-alive' | 'busy';
    try {
      r = this.#ring.leave(k, died, this.#recoveries.has(k));
    } catch (e) {
      this.#recoveries.delete(k);
      process.emitWarning(`cuda-ipc channel: could not recover participant ${k}: ${(e as Error).message}`, { code: 'CUDA_IPC_CHANNEL' });
      return;
    }
    if (r === 'busy') {
      if (!this.#recoveries.has(k)) this.#recoveries.set(k, performance.now());
      this.#scheduleRecovery();
      return;
    }
    this.#recoveries.delete(k);
  }

  /**
   * Retries pending recoveries (and a closing end's own leave) every few milliseconds while the
   * publish lock is busy. A lock held for seconds belongs to a process that died inside it and
   * that nobody here can recover: give up then, with a warning, rather than retry forever.
   */
  #scheduleRecovery(): void {
    if (this.#recoveryTimer) return;
    this.#recoveryTimer = setTimeout(() => {
      this.#recoveryTimer = undefined;
      for (const [j, since] of [...this.#recoveries]) {
        if (performance.now() - since > RECOVERY_GIVE_UP_MS) {
          this.#recoveries.delete(j);
          process.emitWarning(`cuda-ipc channel: gave up repairing participant ${j}: the publish lock stayed held for ${RECOVERY_GIVE_UP_MS} ms`, { code: 'CUDA_IPC_CHANNEL' });
          continue;
        }
        if (j === this.index) {
          try {
            if (this.#ring.leave(j, false, true) !== 'busy') this.#recoveries.delete(j);
          } catch (e) {
            this.#recoveries.delete(j);
            process.emitWarning(`cuda-ipc channel: leaving the control block failed: ${(e as Error).message}`, { code: 'CUDA_IPC_CHANNEL' });
          }
        } else {
          this.#recover(j, true);
        }
      }
      if (this.#recoveries.size > 0) this.#scheduleRecovery();
      else if (this.#closing) this.#release();
    }, RETRY_MS);
    if (this.#closed) this.#recoveryTimer.unref();
  }

  /** Hub: entries of peers that left (and whose link closed), or died and whose process is gone,
   * can be handed out again. */
  #recycle(): void {
    for (let k = 1; k < this.#layout.maxParticipants; k++) {
      if (this.#peers.has(k)) continue;  // its link is open: it may still be finishing (end())
      const st = this.#ring.participantState(k);
      if (st === PState.Ended || (st === PState.Dead && !processAlive(this.#ring.view.getUint32(this.#ring.partOff(k) + P.pid, true)))) {
        this.#ring.recycleParticipant(k);
      }
    }
  }

  /**
   * Closes this end now. A producer's acquired slots are given back; a consumer's unreleased
   * messages are handed to other consumers (work sharing: flagged redelivered) or dropped
   * (broadcast). The hub stops watching its peers; peers keep working on the shared memory they
   * mapped. Idempotent.
   */
  close(): void {
    if (this.#closed) return;
    if (this.role === 'consumer') {
      // Broadcast: the producer's next use of these slots waits for our release fences, and we
      // never released them (queue: they go to another consumer, which releases them).
      if (this.#fences && this.topology === 'broadcast') {
        for (const m of this.#held.values()) this.#fences.raise(releaseFence(this.#layout, m.index, this.index), m[kTicket]);
      }
      this.#held.clear();
    }
    for (const slot of this.#writing.values()) slot[kSlotWait](true);
    this.#writing.clear();
    this.#closed = true;
    this.#closing = true;
    clearTimeout(this.#deferTimer);
    for (const w of this.#deferWaiters.splice(0)) w();
    this.#sleeper.close();
    this.#unhookHub?.();
    this.#unhookHub = undefined;
    for (const { unhook } of this.#peers.values()) unhook();
    this.#peers.clear();
    let left = true;
    try {
      if (this.#ring.participantState(this.index) === PState.Alive || this.#recoveries.has(this.index)) left = this.#leaveSelf();
    } catch (e) {
      process.emitWarning(`cuda-ipc channel: leaving the control block failed: ${(e as Error).message}`, { code: 'CUDA_IPC_CHANNEL' });
    }
    void this.#pump();
    if (left && this.#recoveries.size === 0) {
      this.#release();
    } else {
      // Finish leaving (and any recovery in progress) once the lock frees, then release.
      this.#recoveryTimer?.unref();
      this.#scheduleRecovery();
    }
  }

  /** Unmaps and closes everything this end holds. */
  #release(): void {
    if (!this.#closing) return;
    this.#closing = false;
    clearTimeout(this.#recoveryTimer);
    for (const v of this.#views) v?.close();
    try {
      this.#fences?.close();  // before the mapping it registered goes away
    } catch (e) {
      process.emitWarning(`cuda-ipc channel: unregistering the control block from the GPU failed: ${(e as Error).message}`, { code: 'CUDA_IPC_CHANNEL' });
    }
    this.#slotsHost?.close();
    this.#slotsDevice?.close();
    this.#ownPool?.close();
    this.#words.close();
    this.#control.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.end();
  }

  // ------------------------------------------------------------------------------------------
  // Accepting (the peer side)

  /** @internal */
  static async accept<B extends SlotBuffer = SlotBuffer>(link: Link, options: AcceptOptions = {}): Promise<Channel<B>> {
    const wait = checkWait(options);
    const msg = await link.receive({ signal: options.signal });
    if (!isProtocol(msg, 'attach')) {
      disposeQuietly(msg);
      throw new IpcError('ERR_FRAME_INVALID', 'acceptChannel: the first message on the link was not a channel (the other side must call attach or createChannel)');
    }
    const m = msg as AttachMessage;
    const toClose: Array<{ close(): void }> = [];
    const refuse = (error: IpcError): never => {
      try { link.send({ [PROTOCOL]: 'refused', message: error.message }); } catch { /* the link is gone */ }
      throw error;
    };
    try {
      for (const v of [m.control, m.slots]) {
        if (v && typeof (v as { close?: unknown }).close === 'function') toClose.push(v as { close(): void });
      }
      if (m.version !== 2) refuse(new IpcError('ERR_DESCRIPTOR_VERSION', `acceptChannel: channel protocol version ${String(m.version)}; this side speaks 2`));
      if (!(m.control instanceof HostBuffer)) refuse(new IpcError('ERR_DESCRIPTOR_INVALID', 'acceptChannel: the control block is not shared memory'));
      const control = m.control;
      const view = new DataView(control.bytes.buffer, control.bytes.byteOffset, control.bytes.byteLength);
      let layout: ReturnType<typeof readHeader>;
      try {
        layout = readHeader(view, control.byteLength);
      } catch (e) {
        refuse(e as IpcError);
        throw e;
      }
      const role = m.role;
      const k = m.index;
      if ((role !== 'producer' && role !== 'consumer') || !Number.isInteger(k) || k < 1 || k >= layout.maxParticipants) {
        refuse(new IpcError('ERR_DESCRIPTOR_INVALID', `acceptChannel: bad role or index (${String(role)}, ${String(k)})`));
      }
      if (options.memory !== undefined && options.memory !== (layout.device ? 'device' : 'host')) {
        refuse(new IpcError('ERR_INVALID_ARG', `acceptChannel: the channel's slots are ${layout.device ? 'device' : 'host'} memory, not ${options.memory} as asked`));
      }
      const total = layout.slotCount * layout.slotBytes;
      let slotsHost: HostBuffer | undefined;
      let slotsDevice: DeviceBuffer | undefined;
      if (layout.device) {
        if (!(m.slots instanceof DeviceBuffer)) refuse(new IpcError('ERR_DESCRIPTOR_INVALID', 'acceptChannel: device slots expected'));
        slotsDevice = m.slots as DeviceBuffer;
      } else {
        if (!(m.slots instanceof HostBuffer)) refuse(new IpcError('ERR_DESCRIPTOR_INVALID', 'acceptChannel: host slots expected'));
        slotsHost = m.slots as HostBuffer;
      }
      const slotsLength = (slotsHost ?? slotsDevice)!.byteLength;
      if (slotsLength < total) refuse(new IpcError('ERR_DESCRIPTOR_INVALID', `acceptChannel: the slots hold ${slotsLength} bytes, fewer than ${layout.slotCount} x ${layout.slotBytes}`));
      const words = new JsWords(new addon.SharedWords(control.fd, layout.totalBytes), control.bytes);
      toClose.push(words);
      const po = layout.participantsOffset + k * 64;
      if (words.load32(po + P.state) !== PState.Recovering || view.getUint32(po + P.role, true) !== roleNumber(role)) {
        refuse(new IpcError('ERR_DESCRIPTOR_INVALID', 'acceptChannel: the participant entry the hub named is not waiting for this peer'));
      }
      link.send({ [PROTOCOL]: 'ready', index: k });
      const active = await link.receive({ signal: options.signal });
      if (!isProtocol(active, 'active')) {
        disposeQuietly(active);
        throw new IpcError('ERR_FRAME_INVALID', 'acceptChannel: the hub did not confirm the attach');
      }
      return new Channel<B>(kCreate, {
        hub: false, role, index: k, layout, control, words, slotsHost, slotsDevice, hubLink: link, wait,
      });
    } catch (e) {
      for (const c of toClose.reverse()) {
        try { c.close(); } catch { /* releasing what arrived */ }
      }
      throw e;
    }
  }

  /** @internal For tests: the control block's bytes, shared with every participant. */
  static controlBytesForTesting(ch: Channel<SlotBuffer>): Uint8Array {
    return ch.#control.bytes;
  }

  /** @internal For ChannelSlot and ChannelMessage. */
  static fences(ch: Channel<SlotBuffer>): Fences | undefined {
    return ch.#fences;
  }

  /** @internal For ChannelSlot: the release fences slot s's previous message must reach (read
   * while this producer holds the slot, before its publish changes the ticket). */
  static slotWaits(ch: Channel<SlotBuffer>, s: number): FenceWait[] {
    return ch.#slotWaits(s);
  }

  /** @internal For ChannelMessage. */
  static publishFenceOf(ch: Channel<SlotBuffer>, s: number): number {
    return publishFence(ch.#layout, s);
  }

  #slotWaits(s: number): FenceWait[] {
    if (!this.#fences) return [];
    const view = this.#ring.view;
    const so = this.#ring.slotOff(s);
    if (this.topology === 'queue') {
      const ticket = view.getUint32(so + S.releaseTicket, true);
      if (ticket === 0) return [];
      const k = view.getUint32(so + S.releasedBy, true);
      if (k >= this.#layout.maxParticipants) throw corrupt(`slot ${s} was released by participant ${k}`);
      return [[releaseFence(this.#layout, s, k), ticket]];
    }
    const ticket = view.getUint32(so + S.ticket, true);
    if (ticket === 0) return [];
    const out: FenceWait[] = [];
    const holders = this.#ring.lastHolders(s);
    for (let k = 0; k < this.#layout.maxParticipants; k++) if (holders & (1 << k)) out.push([releaseFence(this.#layout, s, k), ticket]);
    return out;
  }

  /**
   * Participant k's link closed. GPU writes it queued on its fences (publish, release) never run
   * once its process is gone, and streams of others may already wait for them: once the process
   * has exited, raise those fences from here. A process still running after its link closed
   * keeps its GPU work, so its own writes land. Nothing to do for host slots.
   */
  #repairFencesWhenGone(k: number): void {
    if (!this.#fences) return;
    const po = this.#ring.partOff(k);
    const pid = this.#ring.view.getUint32(po + P.pid, true);
    const generation = this.#ring.view.getUint32(po + P.generation, true);
    const started = performance.now();
    let delayMs = 1;
    const check = (): void => {
      if (this.#closed && !this.#closing) return;  // unmapped: nothing left to repair here
      if (this.#ring.view.getUint32(po + P.generation, true) !== generation) return;  // entry reused
      if (processGone(pid)) {
        this.#raiseFencesOf(k);
        return;
      }
      if (performance.now() - started > FENCE_REPAIR_GIVE_UP_MS) return;
      delayMs = Math.min(delayMs * 2, 100);
      setTimeout(check, delayMs).unref();
    };
    check();
  }

  #raiseFencesOf(k: number): void {
    const fences = this.#fences!;
    const ring = this.#ring;
    const w = this.#words;
    for (let s = 0; s < this.slotCount; s++) {
      const so = ring.slotOff(s);
      const before = w.load32(so + S.state);
      const ticket = ring.view.getUint32(so + S.ticket, true);
      if (ticket === 0) continue;
      // Its release fence can take the slot's newest ticket: a dead participant holds nothing.
      fences.raise(releaseFence(this.#layout, s, k), ticket);
      // Its publish fence only for a message that is its own, published (a slot another producer
      // is writing has a ticket whose write is still coming).
      const kind = kindOf(before);
      if ((kind === Kind.Published || kind === Kind.Taken) && ring.view.getUint32(so + S.publisher, true) === k &&
          w.load32(so + S.state) === before && ring.view.getUint32(so + S.ticket, true) === ticket) {
        fences.raise(publishFence(this.#layout, s), ticket);
      }
    }
  }
}

/** A slot a producer acquired: write into it, then publish it. */
export class ChannelSlot<B extends SlotBuffer = SlotBuffer> {
  readonly index: number;
  /** The slot's memory: a HostBuffer (host channels) or a DeviceBuffer (device channels). */
  readonly buffer: B;
  readonly #channel: Channel<any>;
  #done = false;

  /** @internal */
  constructor(channel: Channel<any>, index: number, buffer: B) {
    this.#channel = channel;
    this.index = index;
    this.buffer = buffer;
  }

  get byteLength(): number {
    return this.buffer.byteLength;
  }

  /** Host slots: the slot's bytes (zero-copy). */
  get bytes(): Uint8Array {
    if (!(this.buffer instanceof HostBuffer)) {
      throw new IpcError('ERR_UNSUPPORTED', 'slot.bytes: this slot is device memory; write it with slot.buffer (kernels, copies)');
    }
    return this.buffer.bytes;
  }

  /** Device slots: GPU work queued on `stream` after this waits until the consumers' work on the
   * slot's previous message is done. acquire({ stream }) does this for you. No-op for host slots. */
  waitOn(stream: Stream): void {
    const fences = Channel.fences(this.#channel);
    if (!fences) return;
    for (const [off, v] of Channel.slotWaits(this.#channel, this.index)) fences.waitOn(stream, off, v);
  }

  /** Resolves once the consumers' GPU work on the previous message in this slot is done. */
  async ready(): Promise<void> {
    const fences = Channel.fences(this.#channel);
    if (fences) await fences.synchronize(Channel.slotWaits(this.#channel, this.index));
  }

  /** @internal */
  [kSlotWait](done: boolean): void {
    this.#done = done;
  }

  /** False once published or discarded. */
  get pending(): boolean {
    return !this.#done;
  }
}

interface MessageInit {
  position: number;
  length: number;
  meta: unknown;
  producer: number;
  redelivered: boolean;
  /** Device slots: the publish ticket (the value its fences reach). */
  ticket: number;
}

/** A message a consumer received. Release it once done with its slot (or use `using`). */
export class ChannelMessage<B extends SlotBuffer = SlotBuffer> implements Disposable {
  readonly index: number;
  /** The message's position in the channel's order (per channel, increasing). */
  readonly position: number;
  /** The slot's memory (valid until release()). */
  readonly buffer: B;
  /** Bytes of the slot the producer said it used. */
  readonly length: number;
  readonly meta: unknown;
  /** Participant index of the producer that published it. */
  readonly producer: number;
  /** Work sharing: another consumer took this message before and left without releasing it. */
  readonly redelivered: boolean;
  readonly #channel: Channel<any>;
  #released = false;
  /** @internal */
  readonly [kTicket]: number;

  /** @internal */
  constructor(channel: Channel<any>, index: number, buffer: B, init: MessageInit) {
    this[kTicket] = init.ticket;
    this.#channel = channel;
    this.index = index;
    this.buffer = buffer;
    this.position = init.position;
    this.length = init.length;
    this.meta = init.meta;
    this.producer = init.producer;
    this.redelivered = init.redelivered;
  }

  /** Host slots: the message's bytes, `length` of them (zero-copy, valid until release()). */
  get bytes(): Uint8Array {
    if (!(this.buffer instanceof HostBuffer)) {
      throw new IpcError('ERR_UNSUPPORTED', 'msg.bytes: this message is in device memory; use msg.buffer with msg.waitOn(stream)');
    }
    if (this.#released) throw new IpcError('ERR_CLOSED', 'msg.bytes: the message was released');
    return this.buffer.bytes.subarray(0, this.length);
  }

  get released(): boolean {
    return this.#released;
  }

  /** Device slots: GPU work queued on `stream` after this waits for the producer's work on the
   * message (its publish fence). No-op for host slots. */
  waitOn(stream: Stream): void {
    Channel.fences(this.#channel)?.waitOn(stream, Channel.publishFenceOf(this.#channel, this.index), this[kTicket]);
  }

  /** Resolves once the producer's GPU work on the message is done (host reads of device slots). */
  async synchronize(): Promise<void> {
    const fences = Channel.fences(this.#channel);
    if (fences) await fences.synchronize([[Channel.publishFenceOf(this.#channel, this.index), this[kTicket]]]);
  }

  /** Returns the slot to the producer. With device slots, pass the stream your GPU work on the
   * message ran on: the producer's next use of the slot waits for it. Idempotent. */
  release(options: ReleaseOptions = {}): void {
    if (this.#released) return;
    this.#released = true;
    this.#channel[kRelease](this, options);
  }

  [Symbol.dispose](): void {
    this.release();
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** A short synchronous back-off while another process finishes a microsecond-long critical section. */
function spinBriefly(): void {
  const end = performance.now() + 0.05;
  while (performance.now() < end) { /* spin */ }
}

/** True once process `pid` has exited (a zombie counts: its files, GPU contexts included, are
 * closed by then). Unknown (0) counts as gone. */
function processGone(pid: number): boolean {
  if (!pid) return true;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    const state = stat.charAt(stat.lastIndexOf(')') + 2);
    return state === 'Z' || state === 'X';
  } catch (e) {
    if ((e as { code?: string }).code === 'ENOENT') return true;
    return !processAlive(pid);
  }
}

function processAlive(pid: number): boolean {
  if (!pid) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as { code?: string }).code === 'EPERM';
  }
}

/**
 * One to one: creates a channel here in `options.role` and attaches the process at the other end
 * of `link` in the other role. The peer calls acceptChannel(link).
 */
export async function createChannel<M extends ChannelMemory | undefined = undefined>(
  link: Link, options: ChannelOptions & { role: ChannelRole; memory?: M },
): Promise<Channel<SlotBufferFor<M>>> {
  const ch = Channel.create<M>(options);
  try {
    await ch.attach(link, { role: options.role === 'producer' ? 'consumer' : 'producer' });
  } catch (e) {
    ch.close();
    throw e;
  }
  return ch;
}

/** The peer's side of attach()/createChannel(): receives the channel over `link`, checks it, and
 * returns this process's end in the role the hub gave it. */
export function acceptChannel<B extends SlotBuffer = SlotBuffer>(link: Link, options: AcceptOptions = {}): Promise<Channel<B>> {
  return Channel.accept<B>(link, options);
}

export { LIMITS as CHANNEL_LIMITS };
