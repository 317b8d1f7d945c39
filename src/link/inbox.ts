// The receiving half of a link: each decoded message goes to exactly one consumer, a pending
// receive() first, else the link's 'message' listeners, else a queue that receive() and
// `for await` read. A full queue pauses reading, so that the kernel (and then the sender) holds
// the backlog instead of this heap.
import type { EventEmitter } from 'node:events';
import { IpcError } from '../errors.js';
import type { ReceivedMessage } from './inbound.js';
import { disposeValues } from './message-decoder.js';
import { Queue, type Waiter } from './queue.js';
import { armWait, type WaitOptions } from '../abort.js';
import type { SocketInterest } from './socket-interest.js';

const INBOX_PAUSE = 1024;
const INBOX_RESUME = 256;

export class Inbox {
  /** The link: its 'message' and 'messageerror' listeners are consumers. */
  readonly #link: EventEmitter;
  readonly #interest: SocketInterest;
  readonly #queue = new Queue<ReceivedMessage>();
  #waiters: Waiter[] = [];

  constructor(link: EventEmitter, interest: SocketInterest) {
    this.#link = link;
    this.#interest = interest;
  }

  /** Messages received and not yet consumed. */
  get length(): number {
    return this.#queue.length;
  }

  /** The oldest message not yet consumed, if any. */
  take(): ReceivedMessage | undefined {
    const entry = this.#queue.shift();
    if (entry) this.#maybeResumeReading();
    return entry;
  }

  /**
   * A receive() with nothing queued: resolves with the next message delivered, or rejects per
   * `options` (AbortError, ERR_TIMEOUT), withdrawn so that no later message goes to it.
   */
  wait(options: WaitOptions | undefined): Promise<unknown> {
    return new Promise<unknown>((resolve, reject) => {
      const waiter: Waiter = { resolve, reject };
      let gaveUp = false;
      const disarm = armWait(options, 'link.receive', (error) => {
        gaveUp = true;
        this.#waiters = this.#waiters.filter((w) => w !== waiter);
        reject(error);
      });
      if (gaveUp) return;
      waiter.resolve = (v) => {
        disarm();
        resolve(v);
      };
      waiter.reject = (e) => {
        disarm();
        reject(e);
      };
      this.#waiters.push(waiter);
    });
  }

  /** Hands a received message to its consumer. */
  deliver(entry: ReceivedMessage): void {
    const w = this.#waiters.shift();
    if (w) {
      if (entry.ok) w.resolve(entry.value);
      else w.reject(entry.error);
      return;
    }
    const link = this.#link;
    if (this.#queue.length === 0) {
      if (entry.ok && link.listenerCount('message') > 0) {
        link.emit('message', entry.value);
        return;
      }
      if (!entry.ok && link.listenerCount('messageerror') > 0) {
        link.emit('messageerror', entry.error);
        return;
      }
      if (!entry.ok && link.listenerCount('message') > 0) {
        process.emitWarning(`a received message was dropped: ${entry.error.message}`, { code: entry.error.code });
        return;
      }
    }
    this.#queue.push(entry);
    if (this.#queue.length >= INBOX_PAUSE && !this.#interest.readingPaused && !this.#interest.closed) {
      // Let the kernel queue (and then the sender) hold the backlog instead of our heap.
      this.#interest.setReading(false);
    }
  }

  /** A 'message' listener was added: it gets what is queued (unless receive() calls wait). */
  drainToListeners(): void {
    const link = this.#link;
    while (this.#queue.length > 0 && this.#waiters.length === 0 && link.listenerCount('message') > 0) {
      const entry = this.#queue.shift()!;
      if (entry.ok) link.emit('message', entry.value);
      else if (link.listenerCount('messageerror') > 0) link.emit('messageerror', entry.error);
      else process.emitWarning(`a received message was dropped: ${entry.error.message}`, { code: entry.error.code });
    }
    this.#maybeResumeReading();
  }

  /** The link closed: every pending receive() rejects with `error`. */
  rejectWaiters(error: IpcError): void {
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w.reject(error);
  }

  /** Drops the messages no one will read, releasing their fds and decoded buffers. */
  disposeUnread(): void {
    for (const entry of this.#queue.drain()) if (entry.ok) disposeValues(entry.owned);
  }

  #maybeResumeReading(): void {
    if (this.#interest.readingPaused && this.#queue.length <= INBOX_RESUME && !this.#interest.closed) {
      this.#interest.setReading(true);
    }
  }
}

