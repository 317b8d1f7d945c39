// A consumer's end of a channel: receive messages (or iterate), release each once done with it.
import { IpcError, checkViewBytes, MAX_VIEW_BYTES } from '../errors.js';
import { raceWait, type WaitOptions } from '../abort.js';
import { HostBuffer, hostBufferRange } from '../host/host-buffer.js';
import type { Stream } from '../cuda/stream.js';
import { H, P, S, MetaKind, FLAG_REDELIVERED, publishFence, releaseFence } from './layout.js';
import { corrupt } from './slot-ring.js';
import { returnTaken } from './ring-recovery.js';
import type { Fences } from './fences.js';
import { Endpoint, type EndInit } from './endpoint.js';
import { WaitQueue } from './wait-queue.js';
import { ChannelEnd } from './part.js';
import type {
  ChannelShape, ReceiveOptions, ReleaseOptions, SlotBuffer,
} from './options.js';

const decoder = new TextDecoder();
const kTicket = Symbol('cuda-ipc.channel.ticket');
/** The stream a message's publish fence was last waited on (waitOn), or true once synchronize() saw it. */
const kWaited = Symbol('cuda-ipc.channel.waited');

/** What a ChannelMessage asks its consumer. */
interface MessageOwner {
  readonly fences: Fences | undefined;
  publishFence(s: number): number;
  release(m: ChannelMessage<any, any>, options: ReleaseOptions): void;
}

/**
 * This process's consumer end of a channel (from createChannel, acceptChannel or
 * ChannelHub.consumer()). `for await (const msg of consumer)` with `msg.buffer`, `msg.meta`, and
 * `msg.release()` once done with the slot.
 */
export class ChannelConsumer<B extends SlotBuffer = SlotBuffer, Meta = unknown> extends ChannelEnd implements ChannelShape, Disposable, AsyncDisposable, AsyncIterable<ChannelMessage<B, Meta>> {
  readonly role = 'consumer' as const;
  readonly #end: Endpoint;
  readonly #fences: Fences | undefined;
  readonly #owner: MessageOwner;
  /** Broadcast: the next position to read. */
  #cursor = 0;
  /** Messages handed out and not yet released, by slot. An array, not a Map: a Map that empties
   * and fills again on every message reallocates its table each time, and once the table is old
   * (it lived through a full GC) each of those lands in the old generation, which then fills with
   * garbage and costs a mark-compact every few hundred thousand messages. */
  readonly #held: Array<ChannelMessage<B, Meta> | undefined>;
  readonly #receivers: WaitQueue<ChannelMessage<B, Meta> | undefined>;
  /** #canReceive, bound once (a wait passes it down; no closure per wait). */
  readonly #canReceiveNow: () => boolean;
  /** Set by #receiveNow: it returned null after a spin that ran out (the queue sleeps at once). */
  #spunOut = false;
  #ended = false;
  #endError: IpcError | undefined;

  /** @internal Use createChannel, acceptChannel or ChannelHub.consumer(). */
  constructor(init: EndInit) {
    const end = new Endpoint(init);
    super(end);
    const b = end.block;
    this.#end = end; // its own reference for the paths below: ChannelEnd's is private to it
    this.#fences = b.fences;
    this.#held = new Array<ChannelMessage<B, Meta> | undefined>(b.slotCount).fill(undefined);
    this.#owner = {
      fences: b.fences,
      publishFence: (s) => publishFence(b.layout, s),
      release: (m, options) => this.#release(m, options),
    };
    if (b.layout.broadcast) this.#cursor = end.ring.w.load64(end.ring.partOff(end.index) + P.cursor);
    this.#canReceiveNow = () => this.#canReceive();
    this.#receivers = new WaitQueue<ChannelMessage<B, Meta> | undefined>({
      isClosed: () => end.closed,
      closedOutcome: () => ({ value: undefined }),
      poll: () => this.#poll(),
      isFinal: (m) => m === undefined,
      park: (spun) => end.park(this.#canReceiveNow, spun),
      // Woken for a message nobody here wants any more: pass the wake-up on.
      afterIdleWake: () => {
        if (!end.closed && this.#canReceive()) end.ring.signalData();
      },
      cancel: () => end.waiter.cancel(),
    });
  }

  /**
   * The next message, or undefined once the channel ended cleanly (every producer ended and all
   * their messages were taken). Rejects with ERR_PEER_GONE, after the messages already published,
   * when a producer died.
   */
  receive(options: ReceiveOptions = {}): Promise<ChannelMessage<B, Meta> | undefined> {
    let m: ChannelMessage<B, Meta> | undefined | null;
    try {
      m = this.#receiveNow(options.signal);
    } catch (e) {
      return Promise.reject(e);
    }
    return m !== null ? Promise.resolve(m) : this.#receivers.enqueue(options, 'ChannelConsumer.receive', this.#spunOut);
  }

  /** A message now; undefined when none is there (or the channel ended: see receive()). */
  tryReceive(): ChannelMessage<B, Meta> | undefined {
    this.#end.assertOpen('tryReceive');
    return this.#poll() ?? undefined;
  }

  /**
   * Iterates the messages until the channel ends (see receive()); `for await (const msg of
   * consumer)`.
   */
  [Symbol.asyncIterator](): AsyncIterator<ChannelMessage<B, Meta>> {
    this.#end.assertOpen('iterate');
    return {
      // Not an async function: a message that is there (or comes while spinning) is handed over
      // in one settled promise, without the extra microtask turns of awaiting receive().
      next: () => {
        let m: ChannelMessage<B, Meta> | undefined | null;
        try {
          m = this.#receiveNow(undefined);
        } catch (e) {
          return Promise.reject(e);
        }
        if (m !== null) return Promise.resolve(iteratorResult(m));
        return this.#receivers.enqueue(undefined, 'ChannelConsumer.receive', this.#spunOut).then(iteratorResult);
      },
      return: async () => ({ value: undefined, done: true }),
    };
  }

  /**
   * receive()'s synchronous part: a message, undefined at the end, or null when the caller must
   * queue (then #spunOut says whether a spin ran out already). Throws what receive() rejects with.
   */
  #receiveNow(signal: AbortSignal | undefined): ChannelMessage<B, Meta> | undefined | null {
    this.#spunOut = false;
    const e = this.#end;
    e.assertOpen('receive');
    if (this.#receivers.busy) return null;
    let m = this.#poll();
    // Nothing yet: spin here (what the queue would do first anyway), so that a message that
    // comes while spinning is handed out with no pending request, promise chain or microtask.
    if (m === null && !signal?.aborted) {
      if (e.spin(this.#canReceiveNow)) m = this.#poll();
      else this.#spunOut = true;
    }
    return m;
  }

  #producersGone(): boolean {
    const e = this.#end;
    return e.counter(H.producersLive) === 0 && e.counter(H.producersAttached) >= e.block.layout.expectProducers;
  }

  #canReceive(): boolean {
    const e = this.#end;
    return e.closed || !e.ring.isEmpty(this.#cursor) || this.#producersGone() || !e.alive();
  }

  /** A message, undefined at the end, null when there is none yet. Throws the end error. */
  #poll(): ChannelMessage<B, Meta> | undefined | null {
    if (this.#endError) throw this.#endError;
    if (this.#ended || this.#end.closed) return undefined;
    let m = this.#takeOne();
    if (m) return m;
    if (!this.#producersGone()) return null;
    // Every producer left: whatever they published is visible now; drain it, then end.
    m = this.#takeOne();
    if (m) return m;
    this.#ended = true;
    const died = this.#end.counter(H.producersDied);
    if (died > 0) {
      this.#endError = new IpcError('ERR_PEER_GONE', `the channel's producer${died > 1 ? 's' : ''} died (${died}); every message published before was delivered`);
      throw this.#endError;
    }
    return undefined;
  }

  #takeOne(): ChannelMessage<B, Meta> | undefined {
    const e = this.#end;
    const ring = e.ring;
    if (this.topology === 'queue') {
      const s = ring.take();
      if (s < 0) return undefined;
      if (ring.takeDetached ?? !e.alive()) {
        // Detached while taking (recovery already ran for us): hand it back, then stop.
        if (!returnTaken(ring, s)) {
          process.emitWarning(`cuda-ipc channel: a message taken after this end was detached could not be handed back (slot ${s})`, { code: 'CUDA_IPC_CHANNEL' });
        }
        throw e.detachedError('receive');
      }
      return this.#message(s, ring.takenPosition);
    }
    for (;;) {
      const s = ring.peekAt(this.#cursor);
      if (s === -1) {
        if (!e.alive()) throw e.detachedError('receive');
        return undefined;
      }
      this.#cursor++;
      if (s === -2) continue;  // not ours (published before we attached, or we were removed)
      return this.#message(s, this.#cursor - 1);
    }
  }

  /** The message in slot s, published at `position` (which take() or peekAt() checked). */
  #message(s: number, position: number): ChannelMessage<B, Meta> {
    const ring = this.#end.ring;
    const view = ring.view;
    const so = ring.slotOff(s);
    const length = view.getUint32(so + S.length, true) + view.getUint32(so + S.length + 4, true) * 2 ** 32;
    const metaLength = view.getUint32(so + S.metaLength, true);
    const metaKind = view.getUint32(so + S.metaKind, true);
    if (length > this.slotBytes || metaLength > this.metaBytes || metaKind > MetaKind.Bytes) {
      this.#abandon(s);
      throw corrupt(`message in slot ${s}: length ${length}, meta ${metaLength} bytes of kind ${metaKind}`);
    }
    let meta: unknown;
    if (metaKind !== MetaKind.None) {
      const bytes = ring.bytes.subarray(so + S.meta, so + S.meta + metaLength);
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
    const word = this.topology === 'queue' ? ring.takenWords[s]! : 0;
    const m = new ChannelMessage<B, Meta>(this.#owner, s, this.#end.view(s) as B, {
      position,
      length,
      meta,
      producer: view.getUint32(so + S.publisher, true),
      redelivered: (word & FLAG_REDELIVERED) !== 0,
      ticket: view.getUint32(so + S.ticket, true),
    });
    this.#held[s] = m;
    return m;
  }

  /** Releases a slot whose message could not be handed out. */
  #abandon(s: number): void {
    if (this.topology === 'broadcast') this.#end.ring.releaseHeld(s);
    else this.#end.ring.releaseTaken(s);
  }

  #release(m: ChannelMessage<B, Meta>, options: ReleaseOptions): void {
    if (this.#held[m.index] !== m) return;
    this.#held[m.index] = undefined;
    const e = this.#end;
    if (e.closed) return;
    const ring = e.ring;
    const fences = this.#fences;
    if (fences) {
      if (this.topology === 'queue') {
        // Read by the producer that claims the slot next (after the release below).
        const so = ring.slotOff(m.index);
        ring.view.setUint32(so + S.releasedBy, this.index, true);
        ring.view.setUint32(so + S.releaseTicket, m[kTicket], true);
      }
      // The release must not land before the publish did (a consumer may release without having
      // waited for the message): the producer's next publish in this slot could otherwise be
      // overtaken by this one's late write, and a fence would go backwards.
      const publish = publishFence(e.block.layout, m.index);
      if (m[kWaited] !== true && m[kWaited] !== options.stream && !fences.reached(publish, m[kTicket])) fences.waitOn(options.stream, publish, m[kTicket]);
      fences.signal(options.stream, releaseFence(e.block.layout, m.index, this.index), m[kTicket]);
    }
    if (this.topology === 'broadcast') ring.releaseHeld(m.index);
    else ring.releaseTaken(m.index);
  }

  /**
   * Closes this end now. Unreleased messages are handed to other consumers (work sharing:
   * flagged redelivered) or dropped (broadcast). Idempotent.
   */
  close(): void {
    const e = this.#end;
    if (e.closed) return;
    // Broadcast: the producer's next use of these slots waits for our release fences, and we
    // never released them (queue: they go to another consumer, which releases them).
    if (this.#fences && this.topology === 'broadcast') {
      for (const m of this.#held) if (m) this.#fences.raise(releaseFence(e.block.layout, m.index, this.index), m[kTicket]);
    }
    this.#held.fill(undefined);
    e.close();
    void this.#receivers.pump();
  }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  /** Same as close(), for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}

function iteratorResult<B extends SlotBuffer, Meta>(m: ChannelMessage<B, Meta> | undefined): IteratorResult<ChannelMessage<B, Meta>, undefined> {
  return m ? { value: m, done: false } : { value: undefined, done: true };
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
export class ChannelMessage<B extends SlotBuffer = SlotBuffer, Meta = unknown> implements Disposable {
  readonly index: number;
  /** The message's position in the channel's order (per channel, increasing). */
  readonly position: number;
  /** The slot's memory (valid until release()). */
  readonly buffer: B;
  /** Bytes of the slot the producer said it used. */
  readonly length: number;
  /** What the producer passed as `publish(slot, { meta })` (a Uint8Array arrives as a copy);
   * undefined when it passed none. Typed as the channel's `Meta`, not checked at run time. */
  readonly meta: Meta;
  /** Participant index of the producer that published it. */
  readonly producer: number;
  /** Work sharing: another consumer took this message before and left without releasing it. */
  readonly redelivered: boolean;
  readonly #owner: MessageOwner;
  #released = false;
  /** msg.bytes of a slot too large for one typed array (a view of its own). */
  #bytes: Uint8Array | undefined;
  /** @internal */
  readonly [kTicket]: number;
  /** @internal */
  [kWaited]: Stream | true | undefined;

  /** @internal */
  constructor(owner: MessageOwner, index: number, buffer: B, init: MessageInit) {
    this[kTicket] = init.ticket;
    this.#owner = owner;
    this.index = index;
    this.buffer = buffer;
    this.position = init.position;
    this.length = init.length;
    this.meta = init.meta as Meta;
    this.producer = init.producer;
    this.redelivered = init.redelivered;
  }

  /**
   * Host slots: the message's bytes, `length` of them (zero-copy, valid until release()).
   * @throws IpcError ERR_UNSUPPORTED for a device slot; ERR_CLOSED once released;
   * ERR_VIEW_TOO_LARGE for a message larger than one typed array can be
   * (`buffer.constants.MAX_LENGTH`, 4 GiB on Node 20).
   */
  get bytes(): Uint8Array {
    if (!(this.buffer instanceof HostBuffer)) {
      throw new IpcError('ERR_UNSUPPORTED', 'msg.bytes: this message is in device memory; use msg.buffer with msg.waitOn(stream)');
    }
    if (this.#released) throw new IpcError('ERR_CLOSED', 'msg.bytes: the message was released');
    checkViewBytes(this.length, 'msg.bytes', 'copy it out in pieces with msg.buffer.read(dst, offset)');
    // A slot too large for one typed array still gives a view of a message that fits.
    if (this.buffer.byteLength > MAX_VIEW_BYTES) return (this.#bytes ??= hostBufferRange(this.buffer, 0, this.length));
    return this.buffer.bytes.subarray(0, this.length);
  }

  /**
   * Host slots: a DataView over the message's slot (the same object every time this slot comes
   * round; the message is its first `length` bytes), for numbers at byte offsets:
   * `msg.dataView.getFloat64(8, true)`. Valid until release().
   * @throws IpcError as `bytes`; ERR_VIEW_TOO_LARGE for a slot larger than one typed array can be.
   */
  get dataView(): DataView {
    if (!(this.buffer instanceof HostBuffer)) {
      throw new IpcError('ERR_UNSUPPORTED', 'msg.dataView: this message is in device memory; use msg.buffer with msg.waitOn(stream)');
    }
    if (this.#released) throw new IpcError('ERR_CLOSED', 'msg.dataView: the message was released');
    checkViewBytes(this.buffer.byteLength, 'msg.dataView', 'copy the message out in pieces with msg.buffer.read(dst, offset)');
    return this.buffer.dataView;
  }

  get released(): boolean {
    return this.#released;
  }

  /** Device slots: GPU work queued on `stream` after this waits for the producer's work on the
   * message (its publish fence). No-op for host slots. */
  waitOn(stream: Stream): void {
    const fences = this.#owner.fences;
    if (!fences) return;
    fences.waitOn(stream, this.#owner.publishFence(this.index), this[kTicket]);
    if (this[kWaited] !== true) this[kWaited] = stream;
  }

  /** Resolves once the producer's GPU work on the message is done (host reads of device slots);
   * `options`: give up on a signal or after a timeout (the GPU work goes on). */
  async synchronize(options?: WaitOptions): Promise<void> {
    const fences = this.#owner.fences;
    if (!fences) return;
    await raceWait(fences.synchronize([[this.#owner.publishFence(this.index), this[kTicket]]]), options, 'ChannelMessage.synchronize');
    this[kWaited] = true;
  }

  /** Returns the slot to the producer. With device slots, pass the stream your GPU work on the
   * message ran on: the producer's next use of the slot waits for it. Idempotent. */
  release(options: ReleaseOptions = {}): void {
    if (this.#released) return;
    this.#released = true;
    this.#owner.release(this, options);
  }

  /** Same as release() without a stream, for `using msg`. */
  [Symbol.dispose](): void {
    this.release();
  }
}
