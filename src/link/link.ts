// Link: one connection between two processes over a Unix SOCK_SEQPACKET socket, carrying
// structured messages with file descriptors. Made by spawn()/parentLink(), listen()/connect().
// The link holds the state and runs the handshake and the close; its parts do one job each:
// sending (outbox.ts), handing messages to consumers (inbox.ts), encoding and decoding messages
// (message-encoder.ts, inbound.ts and message-decoder.ts), leases (lease.ts).
import { EventEmitter } from 'node:events';
import { IpcError } from '../errors.js';
import { addon } from '../native.js';
import { acquireEncoder } from './message-encoder.js';
import {
  FrameType,
  HEADER_BYTES,
  HELLO_PAYLOAD_BYTES,
  MAX_FRAME_BYTES,
  encodeRelease,
  parseHeader,
  writeHeader,
  type FrameHeader,
} from './frame.js';
import { readPayload, type InboundContext, type InboundFrame } from './inbound.js';
import { IncomingLeases, OutgoingLeases, releaseHold, type LeaseCounts } from './lease.js';
import { closeFds } from './fds.js';
import { SocketInterest } from './socket-interest.js';
import { Outbox } from './outbox.js';
import { Inbox } from './inbox.js';
import { uidAllowed, uidRefusal } from './handshake.js';
import type { Waiter } from './queue.js';
import { observeLink } from '../observe/hooks.js';
import { probe, Probe } from './probe.js';
import { FRAME_RING_DEFAULT, LinkTransport, RecordSource, type RingState } from './ring-transport.js';

/** Who is on the other end, as the kernel reports it. */
export interface PeerCredentials {
  readonly pid: number;
  readonly uid: number;
  readonly gid: number;
}

export type LinkState = 'handshaking' | 'open' | 'closed';

export interface ReceiveOptions {
  /** Abort the wait (e.g. `AbortSignal.timeout(1000)`); the promise rejects with ERR_TIMEOUT. */
  signal?: AbortSignal;
}

/** @internal How the opener configures a link. */
export interface LinkSetup {
  /** The connected socket; the link owns it from the constructor call on, even if that throws. */
  fd: number;
  /**
   * Where the peer's credentials come from: 'socket' = SO_PEERCRED (accept/connect, and a child's
   * view of its parent); 'hello' = credentials the kernel attaches to the peer's HELLO (the
   * parent's end of a socketpair, where SO_PEERCRED would name the parent itself).
   */
  peerFrom: 'socket' | 'hello';
  /** Refuse a peer whose uid is neither ours nor in allowUids. */
  verifyPeer: boolean;
  allowUids: readonly number[];
  /** Send HELLO at once (otherwise after the peer's HELLO was accepted). */
  helloFirst: boolean;
  handshakeTimeoutMs?: number;
  /** For messages: who the peer is, e.g. "child process 1234". */
  peerName: string;
  /** Offer frame rings (ring-transport.ts); default: unless CUDA_IPC_LINK_RING=0. */
  frameRing?: boolean;
}

/** @internal */
export const kCreate: unique symbol = Symbol('cuda-ipc.link.create');
/** @internal Resolves when the handshake completed, rejects with the reason if it failed. */
export const kOpened: unique symbol = Symbol('cuda-ipc.link.opened');
/** @internal Which frame rings the link uses (ring-transport.ts). */
export const kRingState: unique symbol = Symbol('cuda-ipc.link.ringState');

// Sent frames are copied by the kernel, or by the outbox when they must wait: one scratch serves.
const releaseScratch = new Uint8Array(HEADER_BYTES + 8 + 8 * 64);
let nextLinkId = 1;

export interface Link {
  on(event: 'message', listener: (value: unknown) => void): this;
  on(event: 'messageerror', listener: (error: IpcError) => void): this;
  on(event: 'error', listener: (error: IpcError) => void): this;
  on(event: 'close', listener: (reason: IpcError | undefined) => void): this;
  once(event: 'message', listener: (value: unknown) => void): this;
  once(event: 'messageerror', listener: (error: IpcError) => void): this;
  once(event: 'error', listener: (error: IpcError) => void): this;
  once(event: 'close', listener: (reason: IpcError | undefined) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
  once(event: string | symbol, listener: (...args: any[]) => void): this;
}

/**
 * A connection to another process.
 *
 * Sending: `send(value)` is synchronous; when the peer is slow the frame waits in an outbox
 * (`flush()` resolves once it is empty). Receiving: each message goes to exactly one consumer: a
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
 */
export class Link extends EventEmitter implements Disposable, AsyncDisposable, AsyncIterable<unknown> {
  /** Unique in this process; stable for the link's life. */
  readonly id = nextLinkId++;
  readonly #setup: LinkSetup;
  readonly #sock: LinkTransport;
  readonly #recvBuf: Buffer;
  readonly #recvView: DataView;
  readonly #header: FrameHeader = { type: FrameType.Hello, flags: 0, payloadLength: 0, fdCount: 0 };
  #state: LinkState = 'handshaking';
  #peer: PeerCredentials | undefined;
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
  readonly #inbound: InboundContext = { link: this, leases: this.#leasesIn };

  /** @internal Use spawn(), parentLink(), listen() or connect(). */
  constructor(token: typeof kCreate, setup: LinkSetup) {
    super();
    if (token !== kCreate) {
      throw new IpcError('ERR_INVALID_ARG', 'Link cannot be constructed directly; use spawn(), parentLink(), listen() or connect()');
    }
    this.#setup = setup;
    try {
      this.#sock = new LinkTransport(setup.fd, MAX_FRAME_BYTES, this.#onRecord, this.#onState, (e) => this.#shutdown(e, 'local'), setup.frameRing ?? FRAME_RING_DEFAULT);
    } catch (e) {
      closeFds([setup.fd]);
      throw e;
    }
    this.#recvBuf = Buffer.from(this.#sock.recvBuffer);
    this.#recvView = new DataView(this.#sock.recvBuffer);
    this.#interest = new SocketInterest(this.#sock);
    this.#outbox = new Outbox(this.#sock, this.#interest, setup.peerName);
    this.#inbox = new Inbox(this, this.#interest);
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

  /** The peer's pid/uid/gid (SO_PEERCRED, or for a spawned child the credentials of its HELLO). */
  get peer(): PeerCredentials {
    if (!this.#peer) throw new IpcError('ERR_INVALID_ARG', 'link.peer is not known before the handshake completes');
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
  /** Messages received and not yet consumed. */
  get pendingReceives(): number {
    return this.#inbox.length;
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
   * with all their fds. Throws ERR_NOT_TRANSFERABLE / ERR_MESSAGE_TOO_LARGE without sending, and
   * ERR_LINK_CLOSED / ERR_PEER_GONE once the link is closed.
   */
  send(value: unknown): void {
    probe?.(Probe.SendStart);
    if (this.#state === 'closed') throw this.#closedError('send');
    const enc = acquireEncoder();
    enc.busy = true;
    try {
      const m = enc.encode(value, this);
      writeHeader(enc.view, FrameType.Message, m.encoding, m.headLength - HEADER_BYTES + (m.body?.byteLength ?? 0), m.fds.length);
      try {
        this.#outbox.send(enc.scratch, m.headLength, m.body, m.fds, m.ownedFds);
      } catch (e) {
        // Nothing was leased: the peer will never see these ids.
        for (const { hold } of m.holds) releaseHold(hold);
        throw e;
      }
      for (const { id, hold } of m.holds) this.#leasesOut.add(id, hold);
      for (const commit of m.commits) {
        try {
          commit();
        } catch (e) {
          // The message is on its way; a handler's bookkeeping error must not read as a failed send.
          process.emitWarning(`a transfer handler's onCommit threw: ${String((e as Error)?.message ?? e)}`, { code: 'CUDA_IPC_TRANSFER_HANDLER' });
        }
      }
    } finally {
      enc.busy = false;
    }
  }

  /** Resolves once every sent frame is in the kernel; rejects if the link closes first. */
  flush(): Promise<void> {
    if (this.#outbox.length === 0) return Promise.resolve();
    if (this.#state === 'closed') return Promise.reject(this.#closedError('flush'));
    return this.#outbox.whenEmpty();
  }

  #sendControl(type: FrameType, payload?: Uint8Array): void {
    const frame = new Uint8Array(HEADER_BYTES + (payload?.byteLength ?? 0));
    writeHeader(new DataView(frame.buffer), type, 0, payload?.byteLength ?? 0, 0);
    if (payload) frame.set(payload, HEADER_BYTES);
    this.#outbox.send(frame, frame.byteLength, null, [], []);
  }

  /** Tells the peer that this process is done with the values it leased under `ids`. */
  #sendRelease(ids: readonly number[]): void {
    if (this.#state !== 'open') return;
    probe?.(Probe.ReleaseSend);
    const frame = encodeRelease(ids, releaseScratch);
    this.#outbox.send(frame, frame.byteLength, null, [], []);
  }

  #sendHello(): void {
    this.#helloSent = true;
    const payload = new Uint8Array(HELLO_PAYLOAD_BYTES);
    new DataView(payload.buffer).setUint32(0, this.#sock.features, true);
    try {
      this.#sendControl(FrameType.Hello, payload);
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
      this.#outbox.send(offer.frame, offer.frame.byteLength, null, offer.fds, []);
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

  // ------------------------------------------------------------------------------------------
  // Receiving

  /** The next message (see the class notes for who gets which message). */
  receive(options?: ReceiveOptions): Promise<unknown> {
    const entry = this.#inbox.take();
    if (entry) return entry.ok ? Promise.resolve(entry.value) : Promise.reject(entry.error);
    if (this.#state === 'closed') return Promise.reject(this.#closedError('receive'));
    return this.#inbox.wait(options?.signal);
  }

  /** Yields messages until the link closes cleanly; throws if it closed with an error. */
  async *[Symbol.asyncIterator](): AsyncIterator<unknown> {
    for (;;) {
      let value: unknown;
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
      this.#shutdown(new IpcError('ERR_FRAME_INVALID', `the ${this.#setup.peerName} sent a frame of type ${h.type} before the link handshake`), 'local');
      return;
    }
    let f: InboundFrame;
    try {
      f = readPayload(h, ring ? this.#sock.ringBuffer : this.#recvBuf, view, length, fds, this.#inbound);
    } catch (e) {
      // readPayload closed the fds. Anything but an IpcError would be a bug in the decoder; the
      // link still closes with a typed reason rather than throw out of the socket callback.
      const reason = e instanceof IpcError ? e : new IpcError('ERR_FRAME_INVALID', `could not decode a frame from the ${this.#setup.peerName}: ${String((e as Error)?.message ?? e)}`, { cause: e });
      this.#shutdown(reason, 'local');
      return;
    }
    switch (f.type) {
      case FrameType.Message:
        probe?.(Probe.Delivered);
        this.#inbox.deliver(f.message);
        return;
      case FrameType.Release: {
        const unknown = this.#leasesOut.release(f.ids);
        probe?.(Probe.ReleaseDone);
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
      case FrameType.Goodbye:
        this.#shutdown(undefined, 'peer');
        return;
      case FrameType.Refuse:
        this.#shutdown(new IpcError('ERR_PEER_REFUSED', `the ${this.#setup.peerName} refused the link: ${f.text}`), 'peer');
        return;
    }
  };

  #onHello(cred: [number, number, number] | undefined, peerFeatures: number): void {
    if (this.#state !== 'handshaking') {
      this.#shutdown(new IpcError('ERR_FRAME_INVALID', `the ${this.#setup.peerName} sent a second HELLO`), 'local');
      return;
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
    this.#offerRing(peerFeatures);
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

  /** Sends everything still queued, says goodbye, then closes. */
  async end(): Promise<void> {
    if (this.#state !== 'closed') {
      try {
        await this.flush();
        if ((this.#state as LinkState) !== 'closed' && !this.#goodbyeSent && this.#helloSent) {
          this.#goodbyeSent = true;
          this.#sendControl(FrameType.Goodbye);
          await this.flush();
        }
      } catch {
        // The link closed meanwhile; close() below releases what is left.
      }
    }
    this.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }
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
