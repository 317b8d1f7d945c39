// A producer's end of a channel: acquire a free slot, write it, publish it; end() when done.
import { IpcError, checkViewBytes } from '../errors.js';
import { raceWait, type WaitOptions } from '../abort.js';
import { HostBuffer } from '../host/index.js';
import type { Stream } from '../cuda/stream.js';
import { H, S, MetaKind, publishFence, releaseFence } from './layout.js';
import { corrupt } from './slot-ring.js';
import { CIP, CSlotRing } from './c-ring.js';
import type { Fences, FenceWait } from './fences.js';
import { Endpoint, type EndInit } from './endpoint.js';
import { WaitQueue } from './wait-queue.js';
import { ChannelEnd } from './part.js';
import { lockStuckError, RECOVERY_GIVE_UP_MS } from './recovery.js';
import {
  closedError, delay, type AcquireOptions, type ChannelShape, type PublishOptions,
  type PublishArgs, type SlotBuffer,
} from './options.js';
import { invalidArgValue, badNumber } from '../arg-errors.js';

const RETRY_MS = 2;
const encoder = new TextEncoder();
const kDone = Symbol('cuda-ipc.channel.slot-done');

/** Per-slot publish tickets: the previous one + 1, wrapping, never 0 (0: never published). */
const nextTicket = (t: number): number => ((t + 1) >>> 0) || 1;

/** What a ChannelSlot asks its producer. */
interface SlotOwner {
  readonly fences: Fences | undefined;
  /** The release fences slot s's previous message must reach. */
  waitsFor(s: number): FenceWait[];
}

/**
 * This process's producer end of a channel (from createChannel, acceptChannel or
 * ChannelHub.producer()). `const slot = await producer.acquire()`, write into `slot.buffer` (or
 * `slot.bytes`), then `producer.publish(slot, { meta })`; `await producer.end()` when done.
 */
export class ChannelProducer<B extends SlotBuffer = SlotBuffer, Meta = unknown> extends ChannelEnd implements ChannelShape, Disposable, AsyncDisposable {
  readonly role = 'producer' as const;
  readonly #end: Endpoint;
  readonly #fences: Fences | undefined;
  readonly #owner: SlotOwner;
  /** Slots acquired and not yet published, by slot (an array: see ChannelConsumer's #held). */
  readonly #writing: Array<ChannelSlot<B> | undefined>;
  /** Publishes waiting for the publish lock, in order. */
  readonly #deferred: number[] = [];
  #deferTimer: NodeJS.Timeout | undefined;
  #deferWaiters: Array<() => void> = [];
  readonly #acquirers: WaitQueue<ChannelSlot<B>>;
  /** #canAcquire, bound once (a wait passes it down; no closure per wait). */
  readonly #canAcquireNow: () => boolean;
  #ending = false;

  /** @internal Use createChannel, acceptChannel or ChannelHub.producer(). */
  constructor(init: EndInit) {
    const end = new Endpoint(init);
    super(end);
    const b = end.block;
    this.#end = end; // its own reference for the paths below: ChannelEnd's is private to it
    this.#fences = b.fences;
    this.#writing = new Array<ChannelSlot<B> | undefined>(b.slotCount).fill(undefined);
    this.#owner = { fences: b.fences, waitsFor: (s) => this.#slotWaits(s) };
    this.#canAcquireNow = () => this.#canAcquire();
    this.#acquirers = new WaitQueue<ChannelSlot<B>>({
      isClosed: () => end.closed,
      closedOutcome: () => ({ error: closedError('acquire') }),
      poll: () => this.#tryAcquire() ?? null,
      isFinal: () => false,
      park: (spun) => end.park(this.#canAcquireNow, spun),
      cancel: () => end.waiter.cancel(),
    });
  }

  /**
   * A free slot to write into; waits while every slot is in flight (backpressure). Rejects with
   * ERR_PEER_GONE once every consumer died (ERR_CHANNEL_CLOSED once they all left).
   */
  acquire(options: AcquireOptions = {}): Promise<ChannelSlot<B>> {
    let spun = false;
    try {
      const e = this.#end;
      e.assertOpen('acquire');
      if (!this.#acquirers.busy) {
        let slot = this.#tryAcquire();
        // Every slot in flight: spin here first (as ChannelConsumer.receive does).
        if (!slot && !options.signal?.aborted) {
          if (e.spin(this.#canAcquireNow)) slot = this.#tryAcquire();
          else spun = true;
        }
        if (slot) return this.memory === 'host' ? Promise.resolve(slot) : this.#afterAcquire(slot, options);
      }
    } catch (e) {
      return Promise.reject(e);
    }
    const queued = this.#acquirers.enqueue(options, 'ChannelProducer.acquire', spun);
    return this.memory === 'host' ? queued : queued.then((slot) => this.#afterAcquire(slot, options));
  }

  /** A free slot now, or undefined when every slot is in flight. Device slots: you must order
   * your writes after the consumers' work yourself (slot.waitOn(stream) or await slot.ready()). */
  tryAcquire(): ChannelSlot<B> | undefined {
    this.#end.assertOpen('tryAcquire');
    return this.#tryAcquire();
  }

  async #afterAcquire(slot: ChannelSlot<B>, options: AcquireOptions): Promise<ChannelSlot<B>> {
    if (options.stream) slot.waitOn(options.stream);
    // A wait given up hands the slot back, unwritten.
    else await raceWait(slot.ready(), options, 'ChannelProducer.acquire', () => this.discard(slot));
    return slot;
  }

  #consumersGone(): boolean {
    const e = this.#end;
    return e.counter(H.consumersLive) === 0 && e.counter(H.consumersAttached) >= e.block.layout.expectConsumers;
  }

  #goneError(what: string): IpcError {
    const died = this.#end.counter(H.consumersDied);
    return died > 0
      ? new IpcError('ERR_PEER_GONE', `${what}: every consumer of the channel is gone (${died} died)`)
      : new IpcError('ERR_CHANNEL_CLOSED', `${what}: every consumer has closed the channel`);
  }

  #tryAcquire(): ChannelSlot<B> | undefined {
    const e = this.#end;
    if (this.#ending) throw closedError('acquire (end() was called)');
    if (e.ring instanceof CSlotRing) return this.#slot(this.#cAcquire(e.ring));
    if (!e.alive()) throw e.detachedError('acquire');
    if (this.#consumersGone()) throw this.#goneError('acquire');
    if (this.topology === 'broadcast' && e.counter(H.consumersAttached) < e.block.layout.expectConsumers) return undefined;
    return this.#slot(e.ring.claimSlot());
  }

  /** The C ring: the checks above and the claim in one native call (cip_acquire, same order). */
  #cAcquire(ring: CSlotRing): number {
    const s = ring.acquire();
    if (s >= 0 || s === CIP.NONE) return s;
    if (s === CIP.NOT_ALIVE) throw this.#end.detachedError('acquire');
    if (s === CIP.CONSUMERS_GONE) throw this.#goneError('acquire');
    throw ring.fail(s, 'acquire');
  }

  /** Slot s claimed (or none: negative) as this producer's. */
  #slot(s: number): ChannelSlot<B> | undefined {
    if (s < 0) return undefined;
    const e = this.#end;
    const slot = new ChannelSlot<B>(this.#owner, s, e.view(s) as B);
    this.#writing[s] = slot;
    return slot;
  }

  #canAcquire(): boolean {
    const e = this.#end;
    if (e.closed || this.#consumersGone() || !e.alive()) return true;
    if (this.topology === 'broadcast' && e.counter(H.consumersAttached) < e.block.layout.expectConsumers) return false;
    return e.ring.hasFree();
  }

  /**
   * Publishes `slot`: the consumers can take it at once. With device slots the slot's publish
   * fence is raised once the work queued on `stream` so far is done, so consumers that waitOn()
   * the message see everything queued there.
   *
   * `meta` is required on every publish when the channel's `Meta` type excludes undefined
   * (`createChannel<{ seq: number }>`): consumers read `msg.meta` as that type, and a message
   * without meta would break it. For a channel whose messages carry meta only sometimes, say so
   * in its type, `createChannel<{ seq: number } | undefined>`, and consumers check `msg.meta`.
   *
   * @throws TypeError ERR_INVALID_ARG_VALUE for a slot this producer did not acquire or already
   * published; RangeError ERR_OUT_OF_RANGE for a `length` outside 0..slotBytes.
   * @throws IpcError ERR_MESSAGE_TOO_LARGE for meta larger than the channel's metaBytes once
   * encoded; ERR_NOT_TRANSFERABLE for meta that is not JSON-serialisable; ERR_CHANNEL_CLOSED once
   * this end is closed.
   */
  publish(slot: ChannelSlot<B>, ...options: PublishArgs<Meta>): void;
  publish(slot: ChannelSlot<B>, options: PublishOptions = {}): void {
    const e = this.#end;
    e.assertOpen('publish');
    const s = slot?.index;
    if (!(slot instanceof ChannelSlot) || this.#writing[s] !== slot) {
      throw invalidArgValue('publish: that slot is not one this producer acquired and has not yet published');
    }
    const ring = e.ring;
    const view = ring.view;
    const so = ring.slotOff(s);
    const length = options.length ?? this.slotBytes;
    if (!Number.isSafeInteger(length) || length < 0 || length > this.slotBytes) {
      throw badNumber(length, `publish: length must be an integer in 0..${this.slotBytes}; got ${String(length)}`);
    }
    // Metadata straight into the slot record.
    let metaKind: number = MetaKind.None;
    let metaLength = 0;
    const meta = options.meta;
    if (meta !== undefined) {
      const area = ring.bytes.subarray(so + S.meta, so + S.meta + this.metaBytes);
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
      this.#fences.signal(options.stream, publishFence(e.block.layout, s), ticket);
    }
    this.#writing[s] = undefined;
    slot[kDone]();
    if (this.#deferred.length > 0) {
      this.#deferred.push(s);
      return;
    }
    this.#commit(s);
  }

  #metaTooLarge(n: number): IpcError {
    return new IpcError('ERR_MESSAGE_TOO_LARGE', `publish: meta takes ${n} bytes; this channel holds ${this.metaBytes} per message (metaBytes)`);
  }

  /** Publishes s now, or defers it while the publish lock is busy. */
  #commit(s: number): void {
    const r = this.#end.ring.publish(s);
    if (r === 'busy') {
      this.#deferred.push(s);
      this.#scheduleDeferred();
    } else if (r === 'detached') {
      throw this.#end.detachedError('publish');
    }
  }

  #scheduleDeferred(): void {
    if (this.#deferTimer) return;
    this.#deferTimer = setTimeout(() => {
      this.#deferTimer = undefined;
      while (this.#deferred.length > 0 && !this.#end.closed) {
        const s = this.#deferred[0]!;
        if (this.#end.ring.publish(s) === 'busy') {
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
    this.#end.assertOpen('discard');
    if (this.#writing[slot.index] !== slot) return;
    this.#writing[slot.index] = undefined;
    slot[kDone]();
    this.#end.ring.discard(slot.index);
  }

  /**
   * No more messages from this end. Consumers finish once they took what was published.
   * Resolves once every message this end published was released (rejects with ERR_PEER_GONE if
   * the consumers died first), then closes this end. A consumer that is stuck (stopped, not
   * releasing) keeps it waiting: `options.signal` / `options.timeout` give up (AbortError /
   * ERR_TIMEOUT), and this end is closed anyway; what it published stays published.
   */
  end(options?: WaitOptions): Promise<void> {
    if (this.#end.closed) return Promise.resolve();
    return raceWait(this.#finish(), options, 'ChannelProducer.end', () => this.close());
  }

  async #finish(): Promise<void> {
    const e = this.#end;
    if (e.closed) return;
    this.#ending = true;
    try {
      if (this.#deferred.length > 0) await new Promise<void>((resolve) => this.#deferWaiters.push(resolve));
      for (const slot of this.#writing) if (slot) this.discard(slot);
      // Leave first, so that consumers see the end even while they hold our last messages. The
      // hub does not hand this entry to anyone else while this end is open, so counting "our"
      // messages by index stays right.
      while (!e.recoveries.leaveSelf()) {
        if (performance.now() - (e.recoveries.pendingSince(this.index) ?? 0) > RECOVERY_GIVE_UP_MS) throw lockStuckError('end');
        await delay(RETRY_MS);
      }
      const done = () => e.closed || e.hubLost || e.ring.inFlightFrom(this.index) === 0 || this.#consumersGone();
      while (!done()) await e.park(done);
      if (!e.closed && !e.hubLost && e.ring.inFlightFrom(this.index) > 0 && e.counter(H.consumersDied) > 0) {
        throw new IpcError('ERR_PEER_GONE', `end: the consumers died with ${e.ring.inFlightFrom(this.index)} message(s) unreleased`);
      }
    } finally {
      this.close();
    }
  }

  /** Closes this end now: acquired slots are given back; what was published stays published.
   * Idempotent. */
  close(): void {
    const e = this.#end;
    if (e.closed) return;
    for (const slot of this.#writing) slot?.[kDone]();
    this.#writing.fill(undefined);
    clearTimeout(this.#deferTimer);
    for (const w of this.#deferWaiters.splice(0)) w();
    e.close();
    void this.#acquirers.pump();
  }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  /** Same as end(), for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.end();
  }

  /** The release fences slot s's previous message must reach (read while this producer holds the
   * slot, before its publish changes the ticket). */
  #slotWaits(s: number): FenceWait[] {
    if (!this.#fences) return [];
    const ring = this.#end.ring;
    const l = this.#end.block.layout;
    const view = ring.view;
    const so = ring.slotOff(s);
    if (this.topology === 'queue') {
      const ticket = view.getUint32(so + S.releaseTicket, true);
      if (ticket === 0) return [];
      const k = view.getUint32(so + S.releasedBy, true);
      if (k >= l.maxParticipants) throw corrupt(`slot ${s} was released by participant ${k}`);
      return [[releaseFence(l, s, k), ticket]];
    }
    const ticket = view.getUint32(so + S.ticket, true);
    if (ticket === 0) return [];
    const out: FenceWait[] = [];
    const holders = ring.lastHolders(s);
    for (let k = 0; k < l.maxParticipants; k++) if (holders & (1 << k)) out.push([releaseFence(l, s, k), ticket]);
    return out;
  }
}

/** A slot a producer acquired: write into it, then publish it. */
export class ChannelSlot<B extends SlotBuffer = SlotBuffer> {
  readonly index: number;
  /** The slot's memory: a HostBuffer (host channels) or a DeviceBuffer (device channels). */
  readonly buffer: B;
  readonly #owner: SlotOwner;
  #done = false;

  /** @internal */
  constructor(owner: SlotOwner, index: number, buffer: B) {
    this.#owner = owner;
    this.index = index;
    this.buffer = buffer;
  }

  get byteLength(): number {
    return this.buffer.byteLength;
  }

  /**
   * Host slots: the slot's bytes (zero-copy).
   * @throws IpcError ERR_UNSUPPORTED for a device slot; ERR_VIEW_TOO_LARGE for a slot larger than
   * one typed array can be (`buffer.constants.MAX_LENGTH`, 4 GiB on Node 20).
   */
  get bytes(): Uint8Array {
    return this.#host('slot.bytes').bytes;
  }

  /**
   * Host slots: a DataView over the slot (the same object every time this slot comes round), for
   * numbers at byte offsets: `slot.dataView.setFloat64(8, x, true)`. Errors as `bytes`.
   */
  get dataView(): DataView {
    return this.#host('slot.dataView').dataView;
  }

  #host(what: string): HostBuffer {
    if (!(this.buffer instanceof HostBuffer)) {
      throw new IpcError('ERR_UNSUPPORTED', `${what}: this slot is device memory; write it with slot.buffer (kernels, copies)`);
    }
    checkViewBytes(this.buffer.byteLength, what, 'write it with slot.buffer.write(src, offset) in pieces');
    return this.buffer;
  }

  /** Device slots: GPU work queued on `stream` after this waits until the consumers' work on the
   * slot's previous message is done. acquire({ stream }) does this for you. No-op for host slots. */
  waitOn(stream: Stream): void {
    const fences = this.#owner.fences;
    if (!fences) return;
    for (const [off, v] of this.#owner.waitsFor(this.index)) fences.waitOn(stream, off, v);
  }

  /** Resolves once the consumers' GPU work on the previous message in this slot is done
   * (`options`: give up on a signal or after a timeout; the GPU work goes on). */
  async ready(options?: WaitOptions): Promise<void> {
    const fences = this.#owner.fences;
    if (fences) await raceWait(fences.synchronize(this.#owner.waitsFor(this.index)), options, 'ChannelSlot.ready');
  }

  /** False once published or discarded. */
  get pending(): boolean {
    return !this.#done;
  }

  /** @internal */
  [kDone](): void {
    this.#done = true;
  }
}
