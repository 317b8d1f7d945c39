// The sending half of a link: frames go straight into the kernel when the socket has room; when
// it is full they wait in a queue (with a copy of the frame and a dup of every borrowed fd) that
// drains as the socket becomes writable. The queue is bounded in messages, bytes and fds
// (LinkOptions.sendQueue): a message that would pass a bound fails with ERR_SEND_QUEUE_FULL, and
// nothing queued is ever dropped while the link is open. Control frames (HELLO, RELEASE,
// GOODBYE) always queue: they are small, and a lost RELEASE would pin the peer's memory. A message
// sent while ended leases wait for their RELEASE (a reply after closing what came, in the same
// turn) takes the RELEASE with it in one call: two records, one sendmmsg.
import { IpcError, fdLimitError } from '../../errors.js';
import { addon } from '../../native/addon.js';
import { closeFds } from '../transport/fds.js';
import { HEADER_BYTES, MAX_RELEASE_IDS, encodeRelease } from '../transport/frame.js';
import { Queue, type Waiter } from '../transport/queue.js';
import type { SocketInterest } from '../transport/socket-interest.js';
import type { FrameTransport } from '../transport/frame-transport.js';
import { probe, Probe } from '../transport/probe.js';

interface Outgoing {
  /** null for a RELEASE, whose frame is made from `releaseIds` when it goes. */
  frame: Uint8Array | null;
  body: Uint8Array | null;
  /** A queued RELEASE: later releases join it while it waits (one frame, not one per id). */
  releaseIds?: number[];
  /** A control frame: not counted against the bounds. */
  control: boolean;
  /** Owned by the outbox: closed once sent or dropped. */
  fds: number[] | null;
  /** What it counts against the bytes bound (frame, body and a large message's memfd). */
  bytes: number;
}

/** The bounds of the queue (LinkLimits.sendQueue). */
export interface SendQueueLimits {
  readonly messages: number;
  readonly bytes: number;
  readonly fds: number;
}

/** What waits in the queue now. */
export interface SendQueueCounts {
  messages: number;
  bytes: number;
  fds: number;
}

/** How long to wait before retrying a send the kernel refused for want of fds (ETOOMANYREFS). */
const FD_RETRY_MS = 20;

function errnoCode(e: unknown): string | undefined {
  return (e as { code?: unknown })?.code as string | undefined;
}

/** Ended leases whose RELEASE has not gone yet (lease.ts IncomingLeases). */
export interface WaitingReleases {
  readonly waiting: readonly number[];
  /** A RELEASE of `waiting` went out. */
  sent(): void;
}

/** The RELEASE that travels behind a message: encoded here, copied by the kernel at once. */
const pairScratch = new Uint8Array(HEADER_BYTES + 8 + 8 * 64);

export class Outbox {
  readonly #sock: FrameTransport;
  readonly #releases: WaitingReleases;
  readonly #interest: SocketInterest;
  /** For messages: who the peer is, e.g. "child process 1234". */
  readonly #peerName: string;
  readonly #limits: SendQueueLimits;
  /** Runs when the queue has emptied (the link's 'drain'). */
  readonly #onDrained: () => void;
  readonly #queue = new Queue<Outgoing>();
  /** Messages (not control frames), bytes and fds queued, against the bounds. */
  #messages = 0;
  #bytes = 0;
  #fds = 0;
  /** The queued RELEASE that is still the last entry, which new releases join. */
  #lastRelease: Outgoing | undefined;
  #flushWaiters: Waiter[] = [];
  #retryTimer: NodeJS.Timeout | undefined;
  /** A message was queued since the last 'drain': the next empty queue is news. */
  #drainOwed = false;

  constructor(sock: FrameTransport, interest: SocketInterest, peerName: string, limits: SendQueueLimits, releases: WaitingReleases, onDrained: () => void) {
    this.#sock = sock;
    this.#releases = releases;
    this.#interest = interest;
    this.#peerName = peerName;
    this.#limits = limits;
    this.#onDrained = onDrained;
  }

  /** Frames waiting for socket space. */
  get length(): number {
    return this.#queue.length;
  }

  /** Messages, bytes and fds waiting for socket space. */
  counts(): SendQueueCounts {
    return { messages: this.#messages, bytes: this.#bytes, fds: this.#fds };
  }

  /**
   * Sends a RELEASE of `ids` now, or once the socket has room: releases queued one after another
   * travel together, so a peer that does not read gets one RELEASE frame per 16381 ids, not one
   * per batch.
   */
  sendRelease(ids: readonly number[], scratch: Uint8Array): void {
    const last = this.#lastRelease;
    if (last && last.releaseIds!.length + ids.length <= MAX_RELEASE_IDS) {
      last.releaseIds!.push(...ids);
      return;
    }
    const frame = encodeRelease(ids, scratch);
    if (this.send(frame, frame.byteLength, null, [], [], 0, true)) return;
    const queued = this.#queue.peekLast()!;
    queued.frame = null;
    queued.releaseIds = ids.slice();
    this.#lastRelease = queued;
  }

  /**
   * Sends head[0, headLength) and `body` as one record with `fds`, now or once the socket has
   * room. `fds` are borrowed except `ownedFds`, which the outbox closes once sent or dropped (and
   * on failure). `extraBytes`: memory the message holds besides its frame (a large message's
   * memfd). `control`: a control frame, never refused. Returns true when the record went into the
   * kernel now, false when it was queued. Throws ERR_SEND_QUEUE_FULL when the queue is at a bound,
   * or the error the sender sees when the socket refuses the frame.
   */
  send(
    head: Uint8Array,
    headLength: number,
    body: Uint8Array | null,
    fds: readonly number[],
    ownedFds: readonly number[],
    extraBytes = 0,
    control = false,
  ): boolean {
    if (this.#queue.length === 0) {
      let sent: boolean;
      const ids = this.#releases.waiting;
      const paired = !control && ids.length > 0 && ids.length <= MAX_RELEASE_IDS;
      if (paired) probe?.(Probe.ReleaseSend);
      probe?.(Probe.SocketSend);
      try {
        if (paired) {
          const n = this.#sock.sendPair(head, headLength, body, fds.length ? fds : null, encodeRelease(ids, pairScratch));
          if (n === 2) this.#releases.sent();  // (else the flush scheduled for them sends them)
          sent = n > 0;
        } else {
          sent = this.#sock.send(head, headLength, body, fds.length ? fds : null);
        }
      } catch (e) {
        if (errnoCode(e) !== 'ETOOMANYREFS') {
          closeFds(ownedFds);
          throw this.#sendFailed(e);
        }
        // Too many fds in flight to a peer that has not read them: wait for it, as for room.
        sent = false;
        this.#retryLater();
      }
      probe?.(Probe.SocketSent);
      if (sent) {
        if (ownedFds.length) closeFds(ownedFds);
        return true;
      }
    }
    const bytes = headLength + (body?.byteLength ?? 0) + extraBytes;
    if (!control && this.#messages > 0) this.#checkRoom(bytes, fds.length, ownedFds);
    // The socket is full: keep a copy, and our own dup of every borrowed fd, until it drains.
    const queued: number[] = [];
    try {
      for (const fd of fds) queued.push(ownedFds.includes(fd) ? fd : addon.dup(fd));
    } catch (e) {
      closeFds(queued.filter((fd) => !ownedFds.includes(fd)));
      closeFds(ownedFds);
      throw fdLimitError(e, 'link.send (a queued message keeps a copy of each fd it carries)');
    }
    this.#queue.push({
      frame: Uint8Array.prototype.slice.call(head, 0, headLength),
      body: body ? body.slice() : null,
      fds: queued.length ? queued : null,
      bytes,
      control,
    });
    this.#lastRelease = undefined;
    if (!control) {
      this.#messages++;
      this.#bytes += bytes;
      this.#fds += queued.length;
      this.#drainOwed = true;
    }
    this.#interest.setWriting(true);
    return false;
  }

  /** Throws ERR_SEND_QUEUE_FULL (closing `ownedFds`) when a message of `bytes` and `nfds` would pass a bound. */
  #checkRoom(bytes: number, nfds: number, ownedFds: readonly number[]): void {
    const l = this.#limits;
    const over =
      this.#messages + 1 > l.messages ? `${l.messages} messages (sendQueue.messages)`
      : this.#bytes + bytes > l.bytes ? `${l.bytes} bytes (sendQueue.bytes)`
      : this.#fds + nfds > l.fds ? `${l.fds} fds (sendQueue.fds)`
      : undefined;
    if (!over) return;
    closeFds(ownedFds);
    const limit = over.slice(over.indexOf('(') + 1, -1);
    throw new IpcError(
      'ERR_SEND_QUEUE_FULL',
      `link.send: the ${this.#peerName} is not reading fast enough and the queue of unsent messages holds ${this.#messages} ` +
        `messages, ${this.#bytes} bytes and ${this.#fds} fds; this message would pass its bound of ${over}. Stop sending when ` +
        "send() returns false and resume on the link's 'drain' event (or await link.flush()), or raise the bound",
      { limit },
    );
  }

  /** Resolves once every queued frame is in the kernel; rejects if the outbox is dropped first. */
  whenEmpty(): Promise<void> {
    if (this.#queue.length === 0) return Promise.resolve();
    return new Promise<void>((resolve, reject) => this.#flushWaiters.push({ resolve: () => resolve(), reject }));
  }

  /** Removes a flush waiter that gave up (aborted). */
  forget(waiter: Waiter): void {
    this.#flushWaiters = this.#flushWaiters.filter((w) => w !== waiter);
  }

  /** Adds a flush waiter (resolved when the queue is empty, rejected when it is dropped). */
  wait(waiter: Waiter): void {
    this.#flushWaiters.push(waiter);
  }

  /** The socket has room: sends what waits, until it is full again. */
  drain(): void {
    while (this.#queue.length > 0 && !this.#interest.closed) {
      const o = this.#queue.peek()!;
      const frame = o.frame ?? encodeRelease(o.releaseIds!);
      let sent: boolean;
      try {
        sent = this.#sock.send(frame, frame.byteLength, o.body, o.fds);
      } catch (e) {
        if (errnoCode(e) === 'ETOOMANYREFS') {
          this.#retryLater();
          return;
        }
        this.drop(this.#sendFailed(e));
        return;
      }
      if (!sent) {
        this.#interest.setWriting(true);
        return;
      }
      this.#queue.shift();
      if (o === this.#lastRelease) this.#lastRelease = undefined;
      if (!o.control) {
        this.#messages--;
        this.#bytes -= o.bytes;
        this.#fds -= o.fds?.length ?? 0;
      }
      closeFds(o.fds);
    }
    if (this.#queue.length > 0) return;
    const waiters = this.#flushWaiters;
    this.#flushWaiters = [];
    for (const w of waiters) w.resolve(undefined);
    if (this.#drainOwed) {
      this.#drainOwed = false;
      this.#onDrained();
    }
  }

  /** Tries the queue again after a while (the kernel wants the peer to read fds first). */
  #retryLater(): void {
    if (this.#retryTimer) return;
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = undefined;
      if (!this.#interest.closed) this.drain();
    }, FD_RETRY_MS);
  }

  /** Drops every queued frame (closing its fds); pending flushes reject with `error`. */
  drop(error: IpcError): void {
    clearTimeout(this.#retryTimer);
    this.#retryTimer = undefined;
    for (const o of this.#queue.drain()) closeFds(o.fds);
    this.#lastRelease = undefined;
    this.#messages = 0;
    this.#bytes = 0;
    this.#fds = 0;
    this.#drainOwed = false;
    const waiters = this.#flushWaiters;
    this.#flushWaiters = [];
    for (const w of waiters) w.reject(error);
  }

  /** Maps a sendmsg failure to the error the caller sees. */
  #sendFailed(e: unknown): IpcError {
    const code = errnoCode(e);
    if (code === 'EPIPE' || code === 'ECONNRESET' || code === 'ENOTCONN' || code === 'ECONNREFUSED') {
      // The peer's end is gone; its GOODBYE (or the EOF) is still in our receive queue and will
      // close the link with the right reason on the next poll.
      return new IpcError('ERR_LINK_CLOSED', `cannot send: the ${this.#peerName} has closed the link (or exited)`, { cause: e });
    }
    if (code === 'EMSGSIZE') {
      return new IpcError('ERR_MESSAGE_TOO_LARGE', 'cannot send: the frame is larger than the socket buffer allows', { cause: e });
    }
    if (e instanceof IpcError) return e;
    const limited = fdLimitError(e, 'link.send');
    if (limited !== e) return limited as IpcError;
    return new IpcError('ERR_LINK_CLOSED', `cannot send on the link: ${String((e as Error)?.message ?? e)}`, { cause: e });
  }
}
