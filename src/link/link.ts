// Link: one connection between two processes over a Unix SOCK_SEQPACKET socket, carrying
// structured messages with file descriptors. Made by spawn()/parentLink(), listen()/connect().
// The link holds the state and runs the handshake and the close; its parts do one job each:
// sending (outbox.ts), handing messages to consumers (inbox.ts), encoding and decoding messages
// (message-encoder.ts, inbound.ts and message-decoder.ts), leases (lease.ts). Its types are in link-types.ts.
import { EventEmitter } from 'node:events';
import { IpcError } from '../errors.js';
import { addon } from '../native.js';
import type { NativeSocket } from '../posix-types.js';
import { acquireEncoder, type MessageLimit } from './message-encoder.js';
import {
  ENCODING_MASK,
  FEATURE_GONE,
  FEATURE_LARGE_MESSAGES,
  FrameType,
  encodeGone,
  type GoneEntry,
  HEADER_BYTES,
  HELLO_PAYLOAD_BYTES,
  LARGE_INLINE_BYTES,
  LARGE_PAYLOAD,
  MAX_FDS,
  MAX_FRAME_BYTES,
  MAX_PAYLOAD_BYTES,
  OUR_FEATURES,
  RefuseReason,
  encodeRelease,
  parseHeader,
  writeHeader,
  writeU64,
  type FrameHeader,
} from './frame.js';
import { writeLargePayload } from './large-message.js';
import { dispatchGone } from './gone.js';
import { DEFAULT_LINK_LIMITS, type LinkLimits } from './link-options.js';
import { readPayload, type InboundContext, type InboundFrame } from './inbound.js';
import { leaseIdsOf } from './message-decoder.js';
import { IncomingLeases, OutgoingLeases, releaseHold, type LeaseCounts, type LeaseHold } from './lease.js';
import { closeFds } from './fds.js';
import { SocketInterest } from './socket-interest.js';
import { Outbox, type SendQueueCounts } from './outbox.js';
import { armWait, waitScope, type WaitOptions } from '../abort.js';
import { Inbox, type InboxCounts } from './inbox.js';
import { uidAllowed, uidRefusal } from './handshake.js';
import type { Waiter } from './queue.js';
import { noteChange, observeLink } from '../observe/hooks.js';
import { probe, Probe } from './probe.js';
import { FRAME_RING_DEFAULT, LinkTransport, RecordSource, type RingState } from './ring-transport.js';
import { invalidArgValue } from '../arg-errors.js';
import type { LinkEvents, LinkSetup, LinkState, PeerCredentials, ReceiveOptions } from './link-types.js';

export type { LinkEvents, LinkSetup, LinkState, PeerCredentials, ReceiveOptions } from './link-types.js';

/** @internal */
export const kCreate: unique symbol = Symbol('cuda-ipc.link.create');
/** @internal Resolves when the handshake completed, rejects with the reason if it failed. */
export const kOpened: unique symbol = Symbol('cuda-ipc.link.opened');
/** @internal Which frame rings the link uses (ring-transport.ts). */
export const kRingState: unique symbol = Symbol('cuda-ipc.link.ringState');

// Sent frames are copied by the kernel, or by the outbox when they must wait: one scratch serves.
const releaseScratch = new Uint8Array(HEADER_BYTES + 8 + 8 * 64);
const largeScratch = new Uint8Array(HEADER_BYTES + LARGE_INLINE_BYTES);
const largeView = new DataView(largeScratch.buffer);
let nextLinkId = 1;

export interface Link<In = unknown, Out = unknown> {
  /** Adds a listener for `event` (see LinkEvents). */
  on<E extends keyof LinkEvents>(event: E, listener: (...args: LinkEvents<In>[E]) => void): this;
  /** Adds a listener called once for `event`. */
  once<E extends keyof LinkEvents>(event: E, listener: (...args: LinkEvents<In>[E]) => void): this;
  /** Removes a listener. */
  off<E extends keyof LinkEvents>(event: E, listener: (...args: LinkEvents<In>[E]) => void): this;
  /** Same as on(). */
  addListener<E extends keyof LinkEvents>(event: E, listener: (...args: LinkEvents<In>[E]) => void): this;
  /** Same as off(). */
  removeListener<E extends keyof LinkEvents>(event: E, listener: (...args: LinkEvents<In>[E]) => void): this;
  /** Adds a listener before the others. */
  prependListener<E extends keyof LinkEvents>(event: E, listener: (...args: LinkEvents<In>[E]) => void): this;
  /** Adds a once-listener before the others. */
  prependOnceListener<E extends keyof LinkEvents>(event: E, listener: (...args: LinkEvents<In>[E]) => void): this;
}

/**
 * A connection to another process.
 *
 * Sending: `send(value)` is synchronous and returns true when the message went straight to the
 * peer, false when the peer is behind: the message had to wait in the link's queue (the peer's
 * socket is full), or the peer holds at least half the leases the link allows (LinkOptions.leases).
 * Like a stream's write(), false says "stop" and the 'drain' event says when to go on (the queue
 * is empty and the peer below half its leases). The queue and the leases are bounded: a message
 * that would pass a bound throws (ERR_SEND_QUEUE_FULL, ERR_LIMIT_REACHED) and is not sent;
 * nothing is dropped. Receiving: each message goes to exactly one consumer: a
 * pending `receive()` first, else the 'message' listeners, else an inbox that `receive()` and
 * `for await (const m of link)` read. A message that could not be decoded (e.g. no transfer handler
 * for it here) rejects that receive() or fires 'messageerror'; the link stays open.
 *
 * Ending: `close()` is immediate (unsent and unread messages are dropped, their fds and decoded
 * buffers released); `end()` first flushes. The peer sees a clean close ('close' without a
 * reason, receive() rejecting with ERR_LINK_CLOSED) or, if this process died, ERR_PEER_GONE. Messages
 * that arrived before the close stay readable. 'error' is emitted only when someone listens for
 * it; 'close' always fires, with the reason.
 *
 * Leases: a sent value whose transfer handler holds a resource for it (a HostBuffer's mapping,
 * device memory, ...) is leased to the peer until the peer releases it or the link closes for any
 * reason; `leases` counts what this side holds for the peer. Received leased values tell the
 * sender when they are released, batched in RELEASE frames.
 *
 * Types: `Link<In, Out>` types what `receive()`, iteration and 'message' give (`In`) and what
 * `send()` takes (`Out`); both default to `unknown`. `spawn<In, Out>()`, `parentLink<In, Out>()`
 * and `connect<In, Out>()` return typed links, and `receive<T>()` types one message. Nothing is
 * checked at run time: the two processes agree on the types (e.g. share a module of them).
 */
export class Link<In = unknown, Out = unknown> extends EventEmitter implements Disposable, AsyncDisposable, AsyncIterable<In> {
  /** Unique in this process; stable for the link's life. */
  readonly id = nextLinkId++;
  readonly #setup: LinkSetup;
  readonly #sock: LinkTransport;
  readonly #recvBuf: Buffer;
  readonly #recvView: DataView;
  readonly #header: FrameHeader = { type: FrameType.Hello, flags: 0, payloadLength: 0, fdCount: 0 };
  #state: LinkState = 'handshaking';
  #peer: PeerCredentials | undefined;
  /** The features of the peer's HELLO; undefined until it arrived. */
  #peerFeatures: number | undefined;
  readonly #limits: LinkLimits;
  /** send() returned false and 'drain' has not fired since. */
  #behind = false;
  /** What a message may hold: maxMessageBytes, or one frame for a peer without large messages. */
  #sendLimit: MessageLimit;
  /** Why the link closed; undefined for a clean close. */
  #reason: IpcError | undefined;
  #closedBy: 'local' | 'peer' | undefined;
  #helloSent = false;
  #goodbyeSent = false;
  readonly #interest: SocketInterest;
  readonly #outbox: Outbox;
  readonly #inbox: Inbox;
  #openWaiters: Waiter[] = [];
  readonly #closeHooks = new Set<(link: Link, reason: IpcError | undefined) => void>();
  #handshakeTimer: NodeJS.Timeout | undefined;
  /** Leases granted to the peer: what this process keeps alive for it. */
  readonly #leasesOut = new OutgoingLeases(this);
  /** Leases the peer granted: ended ones go back in RELEASE frames. */
  readonly #leasesIn = new IncomingLeases((ids) => this.#sendRelease(ids));
  readonly #inbound: InboundContext;

  /** @internal Use spawn(), parentLink(), listen() or connect(). */
  constructor(token: typeof kCreate, setup: LinkSetup) {
    super();
    if (token !== kCreate) {
      throw invalidArgValue('Link cannot be constructed directly; use spawn(), parentLink(), listen() or connect()');
    }
    this.#setup = setup;
    this.#limits = setup.limits ?? DEFAULT_LINK_LIMITS;
    this.#inbound = { link: this, leases: this.#leasesIn, maxMessageBytes: this.#limits.maxMessageBytes };
    this.#sendLimit = {
      bytes: this.#limits.maxMessageBytes,
      why: `this link sends (maxMessageBytes ${this.#limits.maxMessageBytes})`,
      option: 'maxMessageBytes',
    };
    try {
      this.#sock = new LinkTransport(setup.fd, MAX_FRAME_BYTES, this.#onRecord, this.#onState, (e) => this.#shutdown(e, 'local'), setup.frameRing ?? FRAME_RING_DEFAULT);
    } catch (e) {
      closeFds([setup.fd]);
      throw e;
    }
    this.#recvBuf = Buffer.from(this.#sock.recvBuffer);
    this.#recvView = new DataView(this.#sock.recvBuffer);
    this.#interest = new SocketInterest(this.#sock);
    this.#outbox = new Outbox(this.#sock, this.#interest, setup.peerName, this.#limits.sendQueue, () => this.#maybeDrain());
    this.#inbox = new Inbox(this, this.#interest, this.#limits.inbox);
    try {
      if (setup.peerFrom === 'hello') addon.setPassCred(setup.fd, true);
      else this.#peer = addon.peerCred(setup.fd);
    } catch (e) {
      this.#sock.close();
      throw e;
    }
    observeLink(this, this.#leasesIn); // listed by `cuda-ipc status` until it closes
    if (setup.handshakeTimeoutMs !== undefined) {
      this.#handshakeTimer = setTimeout(() => {
        this.#shutdown(
          new IpcError('ERR_TIMEOUT', `the ${setup.peerName} did not complete the link handshake within ${setup.handshakeTimeoutMs} ms`),
          'local',
        );
      }, setup.handshakeTimeoutMs).unref();
    }
    this.on('newListener', (event: string | symbol) => {
      if (event === 'message' && this.#inbox.length > 0) process.nextTick(() => this.#inbox.drainToListeners());
    });
    if (this.#peer && setup.verifyPeer && !uidAllowed(this.#peer.uid, setup.allowUids)) {
      this.#refuse();
      return;
    }
    if (setup.helloFirst) this.#sendHello();
  }

  /** The bounds this link keeps (LinkOptions, defaults filled in). */
  get limits(): LinkLimits {
    return this.#limits;
  }

  /** The peer's pid/uid/gid (SO_PEERCRED, or for a spawned child the credentials of its HELLO). */
  get peer(): PeerCredentials {
    if (!this.#peer) throw new IpcError('ERR_INVALID_STATE', 'link.peer is not known before the handshake completes; await the link (spawn/connect resolve once it did)');
    return this.#peer;
  }
  get state(): LinkState {
    return this.#state;
  }
  get closed(): boolean {
    return this.#state === 'closed';
  }
  /** Frames waiting in the outbox for socket space. */
  get pendingSends(): number {
    return this.#outbox.length;
  }
  /**
   * What waits for room in the socket, against LinkOptions.sendQueue: messages, bytes (frames,
   * and the memfds of large messages) and fds. All 0 while the peer keeps up.
   */
  get sendQueue(): SendQueueCounts {
    return this.#outbox.counts();
  }
  /** Messages received and not yet consumed. */
  get pendingReceives(): number {
    return this.#inbox.length;
  }
  /**
   * Messages received and not yet consumed, against LinkOptions.inbox: messages, bytes, the fds
   * their values hold, and whether reading is paused until consumers catch up.
   */
  get receiveQueue(): InboxCounts {
    return this.#inbox.counts();
  }
  /**
   * Leases this process holds for the peer: values sent on this link that the peer has not
   * released yet, and the bytes they keep alive. Both 0 once the link is closed.
   */
  get leases(): LeaseCounts {
    return { count: this.#leasesOut.count, bytes: this.#leasesOut.bytes };
  }

  // ------------------------------------------------------------------------------------------
  // Sending

  /**
   * Sends `value`: JSON data, bigints, typed arrays (a Uint8Array alone is sent as raw bytes and
   * arrives as a Uint8Array) and objects with a transfer handler (HostBuffer, ...), in one frame
   * with all their fds. Returns true when it went straight to the peer, false when the peer is
   * behind (stop sending until 'drain'; see the class notes). Throws without sending:
   * ERR_NOT_TRANSFERABLE, ERR_MESSAGE_TOO_LARGE (maxMessageBytes), ERR_SEND_QUEUE_FULL
   * (sendQueue), ERR_LIMIT_REACHED (leases), ERR_FD_LIMIT (no fd left for it), and
   * ERR_LINK_CLOSED / ERR_PEER_GONE once the link is closed.
   */
  send(value: Out): boolean {
    probe?.(Probe.SendStart);
    if (this.#state === 'closed') throw this.#closedError('send');
    const enc = acquireEncoder();
    enc.busy = true;
    try {
      const m = enc.encode(value, this, this.#sendLimit);
      const payloadLength = m.headLength - HEADER_BYTES + (m.body?.byteLength ?? 0);
      let sent: boolean;
      try {
        if (m.holds.length > 0) this.#checkLeaseRoom(m.holds, m.ownedFds);
        if (payloadLength <= MAX_PAYLOAD_BYTES) {
          writeHeader(enc.view, FrameType.Message, m.encoding, payloadLength, m.fds.length);
          sent = this.#outbox.send(enc.scratch, m.headLength, m.body, m.fds, m.ownedFds);
        } else {
          sent = this.#sendLarge(enc.scratch, m.headLength, m.body, m.encoding, payloadLength, m.fds, m.ownedFds);
        }
      } catch (e) {
        // Nothing was leased: the peer will never see these ids.
        for (const { hold } of m.holds) releaseHold(hold);
        throw e;
      }
      for (const { id, hold } of m.holds) this.#leasesOut.add(id, hold);
      // Behind: the message waits in the queue, or the peer holds half the leases it may.
      if (!sent || this.#leasesHigh()) {
        if (!this.#behind) noteChange(); // `cuda-ipc status` lists what waits for the peer
        this.#behind = true;
        sent = false;
      }
      for (const commit of m.commits) {
        try {
          commit();
        } catch (e) {
          // The message is on its way; a handler's bookkeeping error must not read as a failed send.
          process.emitWarning(`a transfer handler's onCommit threw: ${String((e as Error)?.message ?? e)}`, { code: 'CUDA_IPC_TRANSFER_HANDLER' });
        }
      }
      return sent;
    } finally {
      enc.busy = false;
      enc.shrink();
    }
  }

  /** Throws ERR_LIMIT_REACHED (closing `ownedFds`) when `holds` would pass LinkOptions.leases. */
  #checkLeaseRoom(holds: ReadonlyArray<{ hold: LeaseHold }>, ownedFds: readonly number[]): void {
    const l = this.#limits.leases;
    let bytes = 0;
    for (const { hold } of holds) bytes += hold.bytes ?? 0;
    const count = this.#leasesOut.count;
    const over =
      count + holds.length > l.count ? { limit: 'leases.count', what: `${l.count} leases` }
      : this.#leasesOut.bytes + bytes > l.bytes ? { limit: 'leases.bytes', what: `${l.bytes} bytes of leases` }
      : undefined;
    if (!over) return;
    closeFds(ownedFds);
    throw new IpcError(
      'ERR_LIMIT_REACHED',
      `link.send: the ${this.#setup.peerName} holds ${count} leases (${this.#leasesOut.bytes} bytes) of what this link sent and has not ` +
        `released them; this message would pass the bound of ${over.what} (${over.limit}). Wait for 'drain' (send() returned false ` +
        'once the peer held half of it), make the peer close what it received, or raise the bound',
      { limit: over.limit },
    );
  }

  /** The peer holds at least half the leases (count or bytes) the link allows. */
  #leasesHigh(): boolean {
    const l = this.#limits.leases;
    return this.#leasesOut.count * 2 >= l.count || this.#leasesOut.bytes * 2 >= l.bytes;
  }

  /** 'drain' once the link is no longer behind: the queue is empty and the peer below half its leases. */
  #maybeDrain(): void {
    if (!this.#behind || this.#state === 'closed' || this.#outbox.length > 0 || this.#leasesHigh()) return;
    this.#behind = false;
    noteChange();
    this.emit('drain');
  }

  /**
   * Sends a payload too large for a frame (head[16, headLength) then body) in a sealed memfd,
   * attached before the records' fds. Closes `ownedFds` if it throws, as the outbox does.
   */
  #sendLarge(head: Uint8Array, headLength: number, body: Uint8Array | null, encoding: number, payloadLength: number, fds: readonly number[], ownedFds: readonly number[]): boolean {
    let fd: number;
    try {
      if (fds.length + 1 > MAX_FDS) {
        throw new IpcError('ERR_MESSAGE_TOO_LARGE', `link.send: a message larger than a frame carries its payload as one of its ${MAX_FDS} fds, and this one has ${fds.length} more; split it into several messages`, { limit: 'MAX_FDS' });
      }
      fd = writeLargePayload(head, HEADER_BYTES, headLength, body);
    } catch (e) {
      closeFds(ownedFds);
      throw e;
    }
    writeHeader(largeView, FrameType.Message, encoding | LARGE_PAYLOAD, LARGE_INLINE_BYTES, 1 + fds.length);
    writeU64(largeView, HEADER_BYTES, payloadLength);
    // The memfd's pages count against the queue's bytes while the message waits.
    return this.#outbox.send(largeScratch, largeScratch.byteLength, null, [fd, ...fds], [fd, ...ownedFds], payloadLength);
  }

  /**
   * Resolves once every sent frame is in the kernel (the queue is empty); rejects if the link
   * closes first, or with an AbortError / ERR_TIMEOUT per `options`.
   */
  flush(options?: WaitOptions): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const waiter = { resolve: () => resolve(), reject };
      const disarm = armWait(options, 'link.flush', (error) => {
        this.#outbox.forget(waiter);
        reject(error);
      });
      waiter.resolve = () => {
        disarm();
        resolve();
      };
      waiter.reject = (e: unknown) => {
        disarm();
        reject(e);
      };
      if (this.#outbox.length === 0) waiter.resolve();
      else if (this.#state === 'closed') waiter.reject(this.#closedError('flush'));
      else this.#outbox.wait(waiter);
    });
  }

  #sendControl(type: FrameType, payload?: Uint8Array): void {
    const frame = new Uint8Array(HEADER_BYTES + (payload?.byteLength ?? 0));
    writeHeader(new DataView(frame.buffer), type, 0, payload?.byteLength ?? 0, 0);
    if (payload) frame.set(payload, HEADER_BYTES);
    this.#outbox.send(frame, frame.byteLength, null, [], [], 0, true);
  }

  /** True while the link is open and its peer takes GONE notices (its HELLO said so). */
  get acceptsGone(): boolean {
    return this.#state === 'open' && ((this.#peerFeatures ?? 0) & FEATURE_GONE) !== 0;
  }

  /** @internal Sends GONE frames for `entries` (gone.ts batches them; see announceGone). */
  sendGone(entries: readonly GoneEntry[]): void {
    if (!this.acceptsGone) return;
    for (const frame of encodeGone(entries)) this.#outbox.send(frame, frame.byteLength, null, [], [], 0, true);
  }

  /** Tells the peer that this process is done with the values it leased under `ids`. */
  #sendRelease(ids: readonly number[]): void {
    if (this.#state !== 'open') return;
    probe?.(Probe.ReleaseSend);
    this.#outbox.sendRelease(ids, releaseScratch);
  }

  #sendHello(): void {
    this.#helloSent = true;
    try {
      const hello = new Uint8Array(HELLO_PAYLOAD_BYTES);
      new DataView(hello.buffer).setUint32(0, OUR_FEATURES | this.#sock.features, true);
      this.#sendControl(FrameType.Hello, hello);
    } catch (e) {
      // The peer is already gone; the receive side reports it.
    }
  }

  /** Once open: offers this side's frame ring when both HELLOs asked for rings. */
  #offerRing(peerFeatures: number): void {
    let offer;
    try {
      offer = this.#sock.offer(peerFeatures);
    } catch (e) {
      // No ring (out of fds or memory): the link works on the socket alone.
      process.emitWarning(`a link could not set up its frame ring and uses its socket alone: ${String((e as Error)?.message ?? e)}`, { code: 'CUDA_IPC_LINK_RING' });
      return;
    }
    if (!offer) return;
    try {
      // A control frame: it never counts against the send queue's bounds.
      this.#outbox.send(offer.frame, offer.frame.byteLength, null, offer.fds, [], 0, true);
    } catch {
      // The peer is already gone; the receive side reports it.
    }
    this.#sock.offerSent();
  }

  #refuse(): void {
    const { error, payload } = uidRefusal(this.#peer!, this.#setup.peerName);
    try {
      this.#sendControl(FrameType.Refuse, payload);
    } catch {
      // Best effort: the peer learns from the close either way.
    }
    this.#shutdown(error, 'local');
  }

  /** A REFUSE with `reason` and `text` (at most 1024 bytes kept), straight to the socket, best effort. */
  #sendRefusal(reason: RefuseReason, text: string): void {
    const body = Buffer.from(text.slice(0, 1000));
    const frame = new Uint8Array(HEADER_BYTES + 2 + body.byteLength);
    const view = new DataView(frame.buffer);
    writeHeader(view, FrameType.Refuse, 0, 2 + body.byteLength, 0);
    view.setUint16(HEADER_BYTES, reason, true);
    frame.set(body, HEADER_BYTES + 2);
    try {
      this.#sock.send(frame, frame.byteLength, null, null);
    } catch {
      // The peer learns from the close either way.
    }
  }

  // ------------------------------------------------------------------------------------------
  // Receiving

  /**
   * The next message (see the class notes for who gets which message). `T` narrows what this
   * one message is expected to be (`In` by default); it is not checked at run time.
   */
  receive<T extends In = In>(options?: ReceiveOptions): Promise<T> {
    const entry = this.#inbox.take();
    if (entry) return entry.ok ? Promise.resolve(entry.value as T) : Promise.reject(entry.error);
    if (this.#state === 'closed') return Promise.reject(this.#closedError('receive'));
    return this.#inbox.wait(options) as Promise<T>;
  }

  /** Yields messages until the link closes cleanly; throws if it closed with an error. */
  async *[Symbol.asyncIterator](): AsyncIterator<In> {
    for (;;) {
      let value: In;
      try {
        value = await this.receive();
      } catch (e) {
        if (e instanceof IpcError && e.code === 'ERR_LINK_CLOSED') return;
        throw e;
      }
      yield value;
    }
  }

  // Called by the transport for every record, with the bytes in #recvBuf[0, length) (or in the
  // transport's ring buffer, for a frame that came through the frame ring).
  #onRecord = (status: number, length: number, fds: number[] | undefined, cred: [number, number, number] | undefined, source: RecordSource): void => {
    probe?.(Probe.RecordIn);
    if (this.#state === 'closed') {
      closeFds(fds);
      return;
    }
    if (status !== 0) {
      if (status === 2 && this.#fdsLostHere(length)) return;
      this.#shutdown(
        (status & 2) !== 0
          ? new IpcError('ERR_FDS_TRUNCATED', `the ${this.#setup.peerName} sent a message with more fds than a link accepts; they were closed`)
          : new IpcError('ERR_FRAME_INVALID', `the ${this.#setup.peerName} sent a record larger than ${MAX_FRAME_BYTES} bytes`),
        'local',
      );
      return;
    }
    const ring = source === RecordSource.Ring;
    const view = ring ? this.#sock.ringView : this.#recvView;
    let h: FrameHeader;
    try {
      h = parseHeader(view, length, fds?.length ?? 0, this.#header);
    } catch (e) {
      closeFds(fds);
      this.#shutdown(e as IpcError, 'local');
      return;
    }
    if (h.type !== FrameType.Hello && h.type !== FrameType.Refuse && h.type !== FrameType.Goodbye && this.#state !== 'open') {
      closeFds(fds);
      const what = h.type === FrameType.Message ? 'message' : h.type === FrameType.Release ? 'RELEASE' : h.type === FrameType.Gone ? 'GONE' : h.type === FrameType.Ring ? 'RING' : 'RING_START';
      this.#shutdown(new IpcError('ERR_FRAME_INVALID', `the ${this.#setup.peerName} sent a ${what} before the link handshake`), 'local');
      return;
    }
    let f: InboundFrame;
    try {
      f = readPayload(h, ring ? this.#sock.ringBuffer : this.#recvBuf, view, length, fds, this.#inbound);
    } catch (e) {
      // readPayload closed the fds. Anything but an IpcError would be a bug in the decoder; the
      // link still closes with a typed reason rather than throw out of the socket callback.
      const reason = e instanceof IpcError ? e : new IpcError('ERR_FRAME_INVALID', `could not decode a frame from the ${this.#setup.peerName}: ${String((e as Error)?.message ?? e)}`, { cause: e });
      // A message over our limit is the one refusal the sender can act on: tell it why.
      if (reason.code === 'ERR_MESSAGE_TOO_LARGE') this.#sendRefusal(RefuseReason.TooLarge, reason.message);
      this.#shutdown(reason, 'local');
      return;
    }
    switch (f.type) {
      case FrameType.Message:
        probe?.(Probe.Delivered);
        this.#inbox.deliver(f.message, f.bytes, f.fds);
        return;
      case FrameType.Release: {
        const unknown = this.#leasesOut.release(f.ids);
        probe?.(Probe.ReleaseDone);
        if (this.#behind) this.#maybeDrain();
        if (unknown !== undefined) {
          // A correct peer releases each lease it was given exactly once, so this is a broken or
          // hostile peer; closing (which ends every lease it holds) is the one safe answer.
          this.#shutdown(
            new IpcError('ERR_FRAME_INVALID', `the ${this.#setup.peerName} released lease ${unknown}, which this link never granted or had already ended`),
            'local',
          );
        }
        return;
      }
      case FrameType.Hello:
        this.#onHello(cred, f.features);
        return;
      case FrameType.Ring:
        try {
          if (!this.#sock.acceptOffer(f.capacity, f.fds)) return;
        } catch (e) {
          this.#shutdown(e as IpcError, 'local');
          return;
        }
        try {
          this.#sendControl(FrameType.RingStart);
        } catch {
          // The peer is already gone; the receive side reports it.
        }
        return;
      case FrameType.RingStart:
        try {
          this.#sock.startReceiving();
        } catch (e) {
          this.#shutdown(e as IpcError, 'local');
        }
        return;
      case FrameType.Gone:
        dispatchGone(f.entries, this);
        return;
      case FrameType.Goodbye:
        this.#shutdown(undefined, 'peer');
        return;
      case FrameType.Refuse:
        this.#shutdown(
          f.reason === RefuseReason.TooLarge
            ? new IpcError('ERR_MESSAGE_TOO_LARGE', `the ${this.#setup.peerName} closed the link on a message larger than it accepts: ${f.text}`, { limit: 'maxMessageBytes' })
            : new IpcError('ERR_PEER_REFUSED', `the ${this.#setup.peerName} refused the link: ${f.text}`),
          'peer',
        );
        return;
    }
  };

  /**
   * A record arrived whole but without (some of) its fds, which the kernel closed (MSG_CTRUNC).
   * When its header is sound and announces no more fds than a record may carry, the fds were
   * lost here, because this process (or the system) had no descriptor left for them: that message
   * alone fails with ERR_FD_LIMIT and the leases it granted go back to the sender; the link, and
   * the process's other links, go on. Returns false for anything else (the caller closes the link).
   */
  #fdsLostHere(length: number): boolean {
    const v = this.#recvView;
    if (length < HEADER_BYTES) return false;
    const declared = v.getUint16(12, true);
    let h: FrameHeader;
    try {
      h = parseHeader(v, length, declared, this.#header);
    } catch {
      return false;
    }
    if (h.type !== FrameType.Message || declared === 0 || declared > MAX_FDS || this.#state !== 'open') return false;
    const error = new IpcError(
      'ERR_FD_LIMIT',
      `a message from the ${this.#setup.peerName} carried ${declared} fds, and this process had no descriptor left for them ` +
        '(EMFILE/ENFILE: see `ulimit -n`); the message was dropped and its leases returned. Close buffers, links or channels you no longer need',
    );
    if ((h.flags & LARGE_PAYLOAD) !== 0) {
      // Its payload was in the lost memfd: which leases it granted is unknowable, so only closing
      // the link (which ends them all) gives them back.
      this.#shutdown(error, 'local');
      return true;
    }
    const ids = (h.flags & ENCODING_MASK) === 2 ? leaseIdsOf(this.#recvBuf, HEADER_BYTES, length) : [];
    if (ids === undefined) return false;
    for (const id of ids) if (!this.#leasesIn.isLive(id)) this.#leasesIn.open(id).end();
    this.#inbox.deliver({ ok: false, error }, 0, 0);
    return true;
  }

  #onHello(cred: [number, number, number] | undefined, features: number): void {
    if (this.#state !== 'handshaking') {
      this.#shutdown(new IpcError('ERR_FRAME_INVALID', `the ${this.#setup.peerName} sent a second HELLO`), 'local');
      return;
    }
    this.#peerFeatures = features;
    if ((features & FEATURE_LARGE_MESSAGES) === 0) {
      // A peer that only takes frames (an older cuda-ipc): the send fails here, not at the peer.
      this.#sendLimit = {
        bytes: Math.min(MAX_PAYLOAD_BYTES, this.#limits.maxMessageBytes),
        why: `the ${this.#setup.peerName} accepts (${MAX_PAYLOAD_BYTES}, one frame: its cuda-ipc does not take larger messages)`,
        option: 'maxMessageBytes',
      };
    }
    if (this.#setup.peerFrom === 'hello') {
      if (!cred) {
        this.#shutdown(new IpcError('ERR_FRAME_INVALID', `the ${this.#setup.peerName}'s HELLO carried no credentials`), 'local');
        return;
      }
      this.#peer = { pid: cred[0], uid: cred[1], gid: cred[2] };
      try {
        addon.setPassCred(this.#sock.fd, false);
      } catch {
        // Credentials on later records are ignored anyway.
      }
      if (this.#setup.verifyPeer && !uidAllowed(this.#peer.uid, this.#setup.allowUids)) {
        this.#refuse();
        return;
      }
    }
    if (!this.#helloSent) this.#sendHello();
    if ((this.#state as LinkState) === 'closed') return;
    this.#state = 'open';
    clearTimeout(this.#handshakeTimer);
    this.#offerRing(features);
    const waiters = this.#openWaiters;
    this.#openWaiters = [];
    for (const w of waiters) w.resolve(undefined);
  }

  #onState = (what: 'writable' | 'eof' | 'error', errno: number | undefined): void => {
    if (this.#state === 'closed') return;
    if (what === 'writable') {
      this.#interest.writableSeen();
      this.#outbox.drain();
      return;
    }
    const detail = what === 'eof' ? '' : ` (socket error ${errno})`;
    const pid = this.#peer ? ` (pid ${this.#peer.pid})` : '';
    this.#shutdown(
      new IpcError(
        'ERR_PEER_GONE',
        `the ${this.#setup.peerName}${pid} went away without closing the link${detail}: it exited, crashed or was killed`,
      ),
      'peer',
    );
  };

  // ------------------------------------------------------------------------------------------
  // Closing

  /**
   * Registers `hook` to run once when the link closes, before the 'close' event (transfer
   * handlers use it to drop per-link state). Runs at once if the link is already closed.
   * Returns a function that unregisters it.
   */
  onClose(hook: (link: Link, reason: IpcError | undefined) => void): () => void {
    if (this.#state === 'closed') {
      hook(this, this.#reason);
      return () => {};
    }
    this.#closeHooks.add(hook);
    return () => this.#closeHooks.delete(hook);
  }

  /** Keep the process alive while this link is open (the default). */
  ref(): this {
    if (this.#state !== 'closed') this.#sock.ref();
    return this;
  }
  /** Let the process exit even though this link is open. */
  unref(): this {
    if (this.#state !== 'closed') this.#sock.unref();
    return this;
  }

  /**
   * Closes now: tells the peer (if the socket has room), drops frames still in the outbox and
   * messages never received (releasing their fds and buffers). Idempotent.
   */
  close(): void {
    if (this.#state !== 'closed') {
      if (!this.#goodbyeSent && this.#outbox.length === 0 && this.#helloSent) {
        this.#goodbyeSent = true;
        const frame = new Uint8Array(HEADER_BYTES);
        writeHeader(new DataView(frame.buffer), FrameType.Goodbye, 0, 0, 0);
        try {
          this.#sock.send(frame, HEADER_BYTES, null, null);
        } catch {
          // The peer is gone already.
        }
      }
      this.#shutdown(undefined, 'local');
    }
    this.#inbox.disposeUnread();
  }

  /**
   * Sends everything still queued, says goodbye, then closes. A peer that does not read keeps it
   * waiting: `options.signal` / `options.timeout` give up (AbortError / ERR_TIMEOUT), and the
   * link is closed at once, what was still queued dropped.
   */
  async end(options?: WaitOptions): Promise<void> {
    const scope = waitScope(options, 'link.end');
    if (this.#state !== 'closed') {
      try {
        await this.flush({ signal: scope.signal });
        if ((this.#state as LinkState) !== 'closed' && !this.#goodbyeSent && this.#helloSent) {
          this.#goodbyeSent = true;
          this.#sendControl(FrameType.Goodbye);
          await this.flush({ signal: scope.signal });
        }
      } catch (e) {
        // The link closed meanwhile (close() below releases what is left), or the caller gave up.
        const given = scope.translate(e);
        if (given !== e) {
          this.close();
          throw given;
        }
      } finally {
        scope.done();
      }
    }
    this.close();
  }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }
  /** Same as end(), for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.end();
  }

  /** @internal */
  [kRingState](): RingState {
    return this.#sock.ringState;
  }

  /** @internal */
  [kOpened](): Promise<void> {
    if (this.#state === 'open') return Promise.resolve();
    if (this.#state === 'closed') return Promise.reject(this.#reason ?? this.#closedError('handshake'));
    return new Promise<void>((resolve, reject) => this.#openWaiters.push({ resolve: () => resolve(), reject }));
  }

  #closedError(what: string): IpcError {
    const r = this.#reason;
    if (r) return new IpcError(r.code, r.message, { cause: r });
    return this.#closedBy === 'peer'
      ? new IpcError('ERR_LINK_CLOSED', `cannot ${what}: the ${this.#setup.peerName} closed the link`)
      : new IpcError('ERR_LINK_CLOSED', `cannot ${what}: the link is closed; open a new one (spawn/connect) to talk again`);
  }

  #shutdown(reason: IpcError | undefined, by: 'local' | 'peer'): void {
    if (this.#state === 'closed') return;
    const wasOpen = this.#state === 'open';
    this.#state = 'closed';
    this.#interest.close();
    this.#reason = reason;
    this.#closedBy = by;
    clearTimeout(this.#handshakeTimer);
    this.#sock.close();
    this.#outbox.drop(this.#closedError('flush'));
    // The peer can no longer use or release anything: every lease on this link ends, both ways.
    this.#leasesIn.close();
    this.#leasesOut.close();
    this.#inbox.rejectWaiters(this.#closedError('receive'));
    const openWaiters = this.#openWaiters;
    this.#openWaiters = [];
    for (const w of openWaiters) w.reject(reason ?? this.#closedError('complete the handshake'));
    if (by === 'local') this.#inbox.disposeUnread();
    for (const hook of this.#closeHooks) {
      try {
        hook(this, reason);
      } catch (e) {
        process.emitWarning(`a link close hook threw: ${String((e as Error)?.message ?? e)}`, { code: 'CUDA_IPC_CLOSE_HOOK' });
      }
    }
    this.#closeHooks.clear();
    if (!wasOpen && openWaiters.length > 0) return;  // the opener reports it; the user never saw this link
    if (reason && this.listenerCount('error') > 0) this.emit('error', reason);
    this.emit('close', reason);
  }
}
