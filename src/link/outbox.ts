// The sending half of a link: frames go straight into the kernel when the socket has room; when
// it is full they wait in a queue (with a copy of the frame and a dup of every borrowed fd) that
// drains as the socket becomes writable. flush() resolves once the queue is empty.
import { IpcError } from '../errors.js';
import { addon } from '../native.js';
import type { NativeSocket } from '../posix-types.js';
import { closeFds } from './fds.js';
import { Queue, type Waiter } from './queue.js';
import type { SocketInterest } from './socket-interest.js';
import { probe, Probe } from './probe.js';

interface Outgoing {
  frame: Uint8Array;
  body: Uint8Array | null;
  /** Owned by the outbox: closed once sent or dropped. */
  fds: number[] | null;
}

function errnoCode(e: unknown): string | undefined {
  return (e as { code?: unknown })?.code as string | undefined;
}

export class Outbox {
  readonly #sock: NativeSocket;
  readonly #interest: SocketInterest;
  /** For messages: who the peer is, e.g. "child process 1234". */
  readonly #peerName: string;
  readonly #queue = new Queue<Outgoing>();
  #flushWaiters: Waiter[] = [];

  constructor(sock: NativeSocket, interest: SocketInterest, peerName: string) {
    this.#sock = sock;
    this.#interest = interest;
    this.#peerName = peerName;
  }

  /** Frames waiting for socket space. */
  get length(): number {
    return this.#queue.length;
  }

  /**
   * Sends head[0, headLength) and `body` as one record with `fds`, now or once the socket has
   * room. `fds` are borrowed except `ownedFds`, which the outbox closes once sent or dropped (and
   * on failure). Throws the error the sender sees when the socket refuses the frame.
   */
  send(head: Uint8Array, headLength: number, body: Uint8Array | null, fds: readonly number[], ownedFds: readonly number[]): void {
    if (this.#queue.length === 0) {
      let sent: boolean;
      probe?.(Probe.SocketSend);
      try {
        sent = this.#sock.send(head, headLength, body, fds.length ? fds : null);
      } catch (e) {
        closeFds(ownedFds);
        throw this.#sendFailed(e);
      }
      probe?.(Probe.SocketSent);
      if (sent) {
        if (ownedFds.length) closeFds(ownedFds);
        return;
      }
    }
    // The socket is full: keep a copy, and our own dup of every borrowed fd, until it drains.
    const queued: number[] = [];
    try {
      for (const fd of fds) queued.push(ownedFds.includes(fd) ? fd : addon.dup(fd));
    } catch (e) {
      closeFds(queued.filter((fd) => !ownedFds.includes(fd)));
      closeFds(ownedFds);
      throw e;
    }
    this.#queue.push({
      frame: Uint8Array.prototype.slice.call(head, 0, headLength),
      body: body ? body.slice() : null,
      fds: queued.length ? queued : null,
    });
    this.#interest.setWriting(true);
  }

  /** Resolves once every queued frame is in the kernel; rejects if the outbox is dropped first. */
  whenEmpty(): Promise<void> {
    if (this.#queue.length === 0) return Promise.resolve();
    return new Promise<void>((resolve, reject) => this.#flushWaiters.push({ resolve: () => resolve(), reject }));
  }

  /** The socket has room: sends what waits, until it is full again. */
  drain(): void {
    while (this.#queue.length > 0 && !this.#interest.closed) {
      const o = this.#queue.peek()!;
      let sent: boolean;
      try {
        sent = this.#sock.send(o.frame, o.frame.byteLength, o.body, o.fds);
      } catch (e) {
        this.drop(this.#sendFailed(e));
        return;
      }
      if (!sent) {
        this.#interest.setWriting(true);
        return;
      }
      this.#queue.shift();
      closeFds(o.fds);
    }
    const waiters = this.#flushWaiters;
    this.#flushWaiters = [];
    for (const w of waiters) w.resolve(undefined);
  }

  /** Drops every queued frame (closing its fds); pending flushes reject with `error`. */
  drop(error: IpcError): void {
    for (const o of this.#queue.drain()) closeFds(o.fds);
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
    return new IpcError('ERR_LINK_CLOSED', `cannot send on the link: ${String((e as Error)?.message ?? e)}`, { cause: e });
  }
}
