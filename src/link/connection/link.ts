// Link: one connection between two processes carrying structured messages, over a Unix socket with
// fds or over TCP (transport/). Made by connect/ (spawn, listen, connect). It holds the state, the
// handshake and the close; its parts do one job each: link-sender.ts over outbox.ts, frame-dispatch.ts,
// inbound.ts, inbox.ts (here), messages/ (encoding), lifetimes/lease.ts. Types: link-types.ts.
import { EventEmitter } from 'node:events';
import { IpcError } from '../../errors.js';
import { addon } from '../../native/addon.js';
import { FEATURE_GONE, FEATURE_LARGE_MESSAGES, FEATURE_NCCL, FrameType, MAX_FRAME_BYTES, type GoneEntry } from '../transport/frame.js';
import { DEFAULT_LINK_LIMITS, type LinkLimits } from './link-options.js';
import { IncomingLeases, OutgoingLeases, type LeaseCounts } from '../lifetimes/lease.js';
import { closeFds } from '../transport/fds.js';
import { SocketInterest } from '../transport/socket-interest.js';
import type { Outbox, SendQueueCounts } from './outbox.js';
import { armWait, raceWait, waitScope, type WaitOptions } from '../../abort.js';
import { Inbox, type InboxCounts } from './inbox.js';
import { uidAllowed, uidRefusal } from '../transport/handshake.js';
import type { Waiter } from '../transport/queue.js';
import { linkTraffic, observeLink } from '../../observe/hooks.js';
import { probe, Probe } from '../transport/probe.js';
import { FRAME_RING_DEFAULT, UnixTransport, type RingState } from '../transport/unix-transport.js';
import { TcpTransport, closeGracefully } from '../transport/tcp-transport.js';
import type { FrameTransport, LinkTransportKind } from '../transport/frame-transport.js';
import { NcclAbortHooks, encodeNcclAbort, type NcclAbort, type NcclAbortReason } from '../messages/nccl-abort.js';
import { invalidArgValue } from '../../arg-errors.js';
import { LinkSender } from './link-sender.js';
import { FrameDispatch } from './frame-dispatch.js';
import type { LinkEvents, LinkSetup, LinkState, PeerCredentials, ReceiveOptions, RemoteEndpoint } from './link-types.js';

export type { LinkEvents, LinkSetup, LinkState, PeerCredentials, ReceiveOptions, RemoteEndpoint } from './link-types.js';
export type { LinkTransportKind } from '../transport/frame-transport.js';

/** @internal */
export const kCreate: unique symbol = Symbol('cuda-ipc.link.create');
/** @internal Resolves when the handshake completed, rejects with the reason if it failed. */
export const kOpened: unique symbol = Symbol('cuda-ipc.link.opened');
/** @internal Which frame rings the link uses (unix-transport.ts). */
export const kRingState: unique symbol = Symbol('cuda-ipc.link.ringState');

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
  readonly #sock: FrameTransport;
  #state: LinkState = 'handshaking';
  #peer: PeerCredentials | undefined;
  /** The features of the peer's HELLO; undefined until it arrived. */
  #peerFeatures: number | undefined;
  readonly #limits: LinkLimits;
  /** Why the link closed; undefined for a clean close. */
  #reason: IpcError | undefined;
  #closedBy: 'local' | 'peer' | undefined;
  readonly #interest: SocketInterest;
  readonly #sender: LinkSender;
  /** The sender's queue, which the getters, flush(), the socket's 'writable' and the close reach directly. */
  readonly #outbox: Outbox;
  readonly #inbox: Inbox;
  readonly #dispatch: FrameDispatch;
  #openWaiters: Waiter[] = [];
  readonly #closeHooks = new Set<(link: Link, reason: IpcError | undefined) => void>();
  readonly #drainHooks = new Set<() => Promise<void>>();
  #handshakeTimer: NodeJS.Timeout | undefined;
  /** Leases granted to the peer: what this process keeps alive for it. */
  readonly #leasesOut = new OutgoingLeases(this);
  /** Leases the peer granted: ended ones go back in RELEASE frames. */
  readonly #leasesIn = new IncomingLeases((ids) => this.#sender.sendRelease(ids));
  /** What the NCCL layer runs when the peer aborts a communicator (TCP links). */
  readonly #ncclAbortHooks = new NcclAbortHooks();

  /** @internal Use spawn(), parentLink(), listen() or connect(). */
  constructor(token: typeof kCreate, setup: LinkSetup) {
    super();
    if (token !== kCreate) {
      throw invalidArgValue('Link cannot be constructed directly; use spawn(), parentLink(), listen() or connect()');
    }
    this.#setup = setup;
    this.#limits = setup.limits ?? DEFAULT_LINK_LIMITS;
    // The transport exists before the dispatcher that reads its buffers: records reach it through this arrow.
    const onRecord = (status: number, length: number, fds: number[] | undefined, cred: [number, number, number] | undefined, source: number) =>
      this.#dispatch.record(status, length, fds, cred, source);
    const fail = (e: IpcError) => this.#shutdown(e, 'local');
    try {
      this.#sock = setup.tcp
        ? new TcpTransport(setup.tcp.socket, setup.tcp.leftover, this.#limits.maxMessageBytes, onRecord, this.#onState, fail, () => this.#inbox.consumerWaiting())
        : new UnixTransport(setup.fd, MAX_FRAME_BYTES, onRecord, this.#onState, fail, setup.frameRing ?? FRAME_RING_DEFAULT);
    } catch (e) {
      if (setup.tcp) closeGracefully(setup.tcp.socket);
      else closeFds([setup.fd]);
      throw e;
    }
    this.#interest = new SocketInterest(this.#sock);
    this.#sender = new LinkSender(this, this.#sock, this.#interest, this.#leasesOut, this.#leasesIn, this.#limits, setup.peerName);
    this.#outbox = this.#sender.outbox;
    this.#inbox = new Inbox(this, this.#interest, this.#limits.inbox);
    this.#dispatch = new FrameDispatch({
      link: this,
      sock: this.#sock,
      sender: this.#sender,
      inbox: this.#inbox,
      leasesOut: this.#leasesOut,
      leasesIn: this.#leasesIn,
      maxMessageBytes: this.#limits.maxMessageBytes,
      peerName: setup.peerName,
      hello: (cred, features) => this.#onHello(cred, features),
      shutdown: (reason, by) => this.#shutdown(reason, by),
      ncclAbort: (abort) => this.#ncclAbortHooks.run(abort),
    });
    try {
      if (setup.tcp) {
        // No credentials across machines: the token proved the peer (tcp-auth.ts); link.remote says where it is.
      } else if (setup.peerFrom === 'hello') addon.setPassCred(setup.fd, true);
      else this.#peer = addon.peerCred(setup.fd);
    } catch (e) {
      this.#sock.close();
      throw e;
    }
    observeLink(this, this.#leasesIn); // listed by `cuda-ipc status` until it closes
    if (setup.handshakeTimeoutMs !== undefined) {
      // Fired, it waits for the loop's next poll phase (setImmediate): a HELLO that came while the
      // loop was busy past the timeout is read first, and does not lose the race to the timer.
      this.#handshakeTimer = setTimeout(() => setImmediate(() => {
        if (this.#state !== 'handshaking') return;
        this.#shutdown(
          new IpcError('ERR_TIMEOUT', `the ${setup.peerName} did not complete the link handshake within ${setup.handshakeTimeoutMs} ms`),
          'local',
        );
      }), setup.handshakeTimeoutMs).unref();
    }
    this.on('newListener', (event: string | symbol) => {
      if (event === 'message') process.nextTick(() => this.#inbox.drainToListeners()); // even if empty: paused at the process's bound, it reads again
    });
    if (this.#peer && setup.verifyPeer && !uidAllowed(this.#peer.uid, setup.allowUids)) {
      this.#refuse();
      return;
    }
    if (setup.helloFirst) this.#sender.sendHello();
  }

  /** The bounds this link keeps (LinkOptions, defaults filled in). */
  get limits(): LinkLimits {
    return this.#limits;
  }

  /**
   * The peer's pid/uid/gid (SO_PEERCRED, or for a spawned child the credentials of its HELLO). A
   * TCP link has none (its peer may be on another machine): there it throws ERR_UNSUPPORTED; use
   * `link.remote`, or check `link.transport` first.
   */
  get peer(): PeerCredentials {
    if (this.#setup.tcp) {
      const r = this.#setup.tcp.remote;
      throw new IpcError('ERR_UNSUPPORTED', `link.peer: a TCP link knows no pid or uid of its peer (it may be on another machine); link.remote says where it is (${r.address} port ${r.port})`);
    }
    if (!this.#peer) throw new IpcError('ERR_INVALID_STATE', 'link.peer is not known before the handshake completes; await the link (spawn/connect resolve once it did)');
    return this.#peer;
  }

  /** What carries the link: 'unix' (a Unix socket, one machine) or 'tcp' (TCP or TLS, between machines). */
  get transport(): LinkTransportKind {
    return this.#sock.kind;
  }

  /** Where the peer of a TCP link is (address, port, family, tls); undefined on a Unix-socket link. */
  get remote(): RemoteEndpoint | undefined {
    return this.#setup.tcp?.remote;
  }

  /**
   * Host memory this link copied rather than shared: HostBuffers sent on a TCP link travel as a
   * copy of their bytes (and arrive as new HostBuffers). 0 on a Unix-socket link, where they are shared.
   */
  get bytesCopied(): { sent: number; received: number } {
    const t = linkTraffic(this);
    return { sent: t.copiedSent, received: t.copiedReceived };
  }

  /** Device memory this link moved over NCCL (DeviceBuffers, DeviceArrays, TensorMaps on a TCP link), by this side. */
  get bytesMoved(): { sent: number; received: number } {
    const t = linkTraffic(this);
    return { sent: t.ncclSent, received: t.ncclReceived };
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
  // Sending (link-sender.ts)

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
    return this.#sender.send(value);
  }

  /**
   * Resolves once every sent frame is in the kernel (the queue is empty, and on TCP the socket's
   * own write buffer too); rejects if the link closes first, or with an AbortError / ERR_TIMEOUT
   * per `options`.
   */
  flush(options?: WaitOptions): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const waiter = { resolve: () => resolve(), reject };
      const disarm = armWait(options, 'link.flush', (error) => {
        this.#outbox.forget(waiter);
        reject(error);
      });
      waiter.resolve = () => {
        const written = this.#sock.whenWritten?.();
        if (!written) {
          disarm();
          resolve();
          return;
        }
        written.then(
          () => {
            disarm();
            resolve();
          },
          () => {
            disarm();
            reject(this.#closedError('flush'));
          },
        );
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

  /** True while the link is open and its peer takes GONE notices (its HELLO said so). */
  get acceptsGone(): boolean {
    return this.#state === 'open' && ((this.#peerFeatures ?? 0) & FEATURE_GONE) !== 0;
  }

  /** @internal Whether the peer takes device memory over NCCL: an open TCP link whose peer's HELLO set feature bit 3 (PROTOCOL.md 8). */
  get peerTakesNccl(): boolean {
    return this.#state === 'open' && this.#sock.kind === 'tcp' && ((this.#peerFeatures ?? 0) & FEATURE_NCCL) !== 0;
  }

  /**
   * @internal Runs `hook` for each NCCL_ABORT the peer sends (PROTOCOL.md 8.4); without a hook
   * such frames are ignored. Returns a function that removes it. Hooks are dropped when the link closes.
   */
  onNcclAbort(hook: (abort: NcclAbort) => void): () => void {
    return this.#ncclAbortHooks.add(hook);
  }

  /**
   * @internal Tells the peer that this side aborted the NCCL communicator `id` (16 bytes) for
   * `reason` (1 could not take a transfer, 2 NCCL failed, 3 the communicator could not be made).
   * Returns false, sending nothing, where the peer does not take it (see peerTakesNccl); throws
   * ERR_LINK_CLOSED / ERR_PEER_GONE once the link is closed.
   */
  sendNcclAbort(id: Uint8Array, reason: NcclAbortReason, text: string): boolean {
    const frame = encodeNcclAbort(id, reason, text);
    if (this.#state === 'closed') throw this.#closedError('send NCCL_ABORT');
    if (!this.peerTakesNccl) return false;
    this.#sender.sendNcclAbort(frame);
    return true;
  }

  /** @internal Sends GONE frames for `entries` (gone.ts batches them; see announceGone). */
  sendGone(entries: readonly GoneEntry[]): void {
    if (!this.acceptsGone) return;
    this.#sender.sendGone(entries);
  }

  // ------------------------------------------------------------------------------------------
  // Receiving

  /**
   * The next message (see the class notes for who gets which message). `T` narrows what this
   * one message is expected to be (`In` by default); it is not checked at run time.
   * @throws IpcError (the promise rejects) ERR_LINK_CLOSED once the link closed cleanly and every
   * message was taken; ERR_PEER_GONE when the peer died or closed with an error; the error a
   * message's decoding raised (ERR_FRAME_INVALID, ERR_MESSAGE_TOO_LARGE, ERR_LIMIT_REACHED, ...);
   * ERR_TIMEOUT after `options.timeout`, an AbortError on `options.signal`.
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

  // ------------------------------------------------------------------------------------------
  // The handshake and the socket's state (frame-dispatch.ts acts on received frames; a HELLO comes back here)

  #onHello(cred: [number, number, number] | undefined, features: number): void {
    if (this.#state !== 'handshaking') {
      this.#shutdown(new IpcError('ERR_FRAME_INVALID', `the ${this.#setup.peerName} sent a second HELLO`), 'local');
      return;
    }
    this.#peerFeatures = features;
    if ((features & FEATURE_LARGE_MESSAGES) === 0) this.#sender.limitToOneFrame();
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
    if (!this.#sender.helloSent) this.#sender.sendHello();
    if ((this.#state as LinkState) === 'closed') return;
    this.#state = 'open';
    clearTimeout(this.#handshakeTimer);
    this.#sender.offerRing(features);
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
    const pid = this.#peer ? ` (pid ${this.#peer.pid})` : ''; // a TCP peer's name holds its address
    this.#shutdown(
      new IpcError(
        'ERR_PEER_GONE',
        `the ${this.#setup.peerName}${pid} went away without closing the link${detail}: it exited, crashed or was killed`,
      ),
      'peer',
    );
  };

  #refuse(): void {
    const { error, payload } = uidRefusal(this.#peer!, this.#setup.peerName);
    try {
      this.#sender.sendControl(FrameType.Refuse, payload);
    } catch {
      // Best effort: the peer learns from the close either way.
    }
    this.#shutdown(error, 'local');
  }

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

  /**
   * @internal Registers `hook`, which end() awaits before it says goodbye: a layer that sends bytes
   * beside the socket (NCCL transfers of device memory) resolves it once they all arrived.
   */
  onDrain(hook: () => Promise<void>): () => void {
    this.#drainHooks.add(hook);
    return () => this.#drainHooks.delete(hook);
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
      this.#sender.sayGoodbyeNow();
      this.#shutdown(undefined, 'local');
    }
    this.#inbox.disposeUnread();
  }

  /**
   * Sends everything still queued (device memory sent over NCCL on a TCP link included: until the
   * peer has it), says goodbye, then closes. A peer that does not read keeps it
   * waiting: `options.signal` / `options.timeout` give up (AbortError / ERR_TIMEOUT), and the
   * link is closed at once, what was still queued dropped.
   */
  async end(options?: WaitOptions): Promise<void> {
    const scope = waitScope(options, 'link.end');
    if (this.#state !== 'closed') {
      try {
        await this.flush({ signal: scope.signal });
        // Device memory sent over NCCL moves beside the socket: it must have arrived too.
        if (this.#drainHooks.size > 0) {
          for (const hook of [...this.#drainHooks]) await raceWait(hook(), { signal: scope.signal }, 'link.end');
          await this.flush({ signal: scope.signal });
        }
        if ((this.#state as LinkState) !== 'closed' && this.#sender.queueGoodbye()) await this.flush({ signal: scope.signal });
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
    this.#ncclAbortHooks.clear();
    if (!wasOpen && openWaiters.length > 0) return;  // the opener reports it; the user never saw this link
    if (reason && this.listenerCount('error') > 0) this.emit('error', reason);
    this.emit('close', reason);
  }
}
