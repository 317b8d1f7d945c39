// The receiving half of a link: each decoded message goes to exactly one consumer, a pending
// receive() first, else the link's 'message' listeners, else a queue that receive() and
// `for await` read. A queue at one of its bounds (LinkOptions.inbox: messages, bytes, fds) pauses
// reading, so that the kernel (and then the sender, whose send() returns false) holds the backlog
// instead of this heap and this fd table; reading resumes once the queue is down to a quarter of
// its message bound and half of the others. A message whose values are still arriving (a
// DeferredValue's ready promise) waits in order with the ones behind it until it is ready.
// Every byte held here also counts against the process's bound across links (received-memory.ts):
// once it is reached, reading pauses too, unless the application is waiting for a message here (a
// pending receive() or a 'message' listener: that message goes straight to it).
import type { EventEmitter } from 'node:events';
import { IpcError } from '../../errors.js';
import type { ReceivedMessage } from './inbound.js';
import { disposeValues } from '../messages/message-decoder.js';
import { Queue, type Waiter } from '../transport/queue.js';
import { armWait, type WaitOptions } from '../../abort.js';
import { noteChange } from '../../observe/hooks.js';
import type { SocketInterest } from '../transport/socket-interest.js';
import { boundReached, holdReceived, releaseReceived, unwatchReceivedMemory, watchReceivedMemory, type ReceivedMemoryListener } from '../transport/received-memory.js';

/** An inbox collected with messages still counted (a link dropped unclosed) gives their bytes back. */
const uncounted = new FinalizationRegistry<{ bytes: number }>((account) => releaseReceived(account.bytes));

/** The bounds of the queue (LinkLimits.inbox). */
export interface InboxLimits {
  readonly messages: number;
  readonly bytes: number;
  readonly fds: number;
}

/** What the queue holds now. */
export interface InboxCounts {
  messages: number;
  bytes: number;
  fds: number;
  /** Reading is paused until the consumers catch up. */
  paused: boolean;
}

interface Queued {
  entry: ReceivedMessage;
  bytes: number;
  fds: number;
}

export class Inbox {
  /** The link: its 'message' and 'messageerror' listeners are consumers. */
  readonly #link: EventEmitter;
  readonly #interest: SocketInterest;
  readonly #limits: InboxLimits;
  readonly #queue = new Queue<Queued>();
  /** Messages not ready yet (the first one's values still arriving) and those behind them, in order. */
  readonly #staged = new Queue<Queued>();
  /** Bytes held (and counted against the process's bound): an object the finalizer can read. */
  readonly #account = { bytes: 0 };
  #fds = 0;
  #waiters: Waiter[] = [];
  readonly #watch: ReceivedMemoryListener = {
    boundReached: () => this.#checkBounds(),
    roomAgain: () => this.#maybeResumeReading(),
  };

  constructor(link: EventEmitter, interest: SocketInterest, limits: InboxLimits) {
    this.#link = link;
    this.#interest = interest;
    this.#limits = limits;
    watchReceivedMemory(this.#watch);
    uncounted.register(this, this.#account);
  }

  get #bytes(): number {
    return this.#account.bytes;
  }

  #count(bytes: number, fds: number): void {
    this.#account.bytes += bytes;
    this.#fds += fds;
    holdReceived(bytes);
  }

  #uncount(bytes: number, fds: number): void {
    this.#account.bytes -= bytes;
    this.#fds -= fds;
    releaseReceived(bytes);
  }

  /** The application is waiting for a message here: a pending receive() or a 'message' listener. */
  consumerWaiting(): boolean {
    return this.#waiters.length > 0 || this.#link.listenerCount('message') > 0;
  }

  counts(): InboxCounts {
    return { messages: this.#queue.length, bytes: this.#bytes, fds: this.#fds, paused: this.#interest.readingPaused };
  }

  /** Messages received and not yet consumed. */
  get length(): number {
    return this.#queue.length;
  }

  /** The oldest message not yet consumed, if any. */
  take(): ReceivedMessage | undefined {
    const q = this.#shift();
    if (q) this.#maybeResumeReading();
    return q?.entry;
  }

  #shift(): Queued | undefined {
    const q = this.#queue.shift();
    if (q) this.#uncount(q.bytes, q.fds);
    return q;
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
      // Paused for the process's bound only? A waiting consumer reads anyway.
      this.#maybeResumeReading();
      this.#interest.consumerWaiting();
    });
  }

  /** Hands a received message (`bytes` long, holding `fds` fds) to its consumer, once it is ready. */
  deliver(entry: ReceivedMessage, bytes: number, fds: number): void {
    if (this.#staged.length > 0 || (entry.ok && entry.ready)) {
      this.#staged.push({ entry, bytes, fds });
      this.#count(bytes, fds);
      if (this.#staged.length === 1) this.#awaitReady();
      this.#checkBounds();
      return;
    }
    this.#deliverNow(entry, bytes, fds);
  }

  /** Waits for the first staged message, then delivers it and every ready one behind it. */
  #awaitReady(): void {
    const head = this.#staged.peek()!;
    const ready = head.entry.ok ? head.entry.ready : undefined;
    const next = (failure?: unknown): void => {
      if (this.#staged.peek() !== head) return;  // disposed meanwhile (the link closed)
      this.#staged.shift();
      this.#uncount(head.bytes, head.fds);
      let entry = head.entry;
      if (failure !== undefined && entry.ok) {
        disposeValues(entry.owned);
        const error = failure instanceof IpcError ? failure : new IpcError('ERR_DESCRIPTOR_INVALID', `a received value could not be completed: ${String((failure as Error)?.message ?? failure)}`, { cause: failure });
        entry = { ok: false, error };
      } else if (entry.ok) {
        entry = { ok: true, value: entry.value, owned: entry.owned };
      }
      this.#deliverNow(entry, failure !== undefined ? 0 : head.bytes, failure !== undefined ? 0 : head.fds);
      while (this.#staged.length > 0) {
        const h = this.#staged.peek()!;
        if (h.entry.ok && h.entry.ready) {
          this.#awaitReady();
          return;
        }
        this.#staged.shift();
        this.#uncount(h.bytes, h.fds);
        this.#deliverNow(h.entry, h.bytes, h.fds);
      }
      this.#maybeResumeReading();
    };
    if (!ready) {
      queueMicrotask(() => next());
      return;
    }
    ready.then(() => next(), (e: unknown) => next(e ?? new Error('rejected')));
  }

  #deliverNow(entry: ReceivedMessage, bytes: number, fds: number): void {
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
    this.#queue.push({ entry, bytes, fds });
    this.#count(bytes, fds);
    this.#checkBounds();
  }

  #checkBounds(): void {
    const l = this.#limits;
    const messages = this.#queue.length + this.#staged.length;
    const full = messages >= l.messages || this.#bytes >= l.bytes || this.#fds >= l.fds || (boundReached() && !this.consumerWaiting());
    if (full && !this.#interest.readingPaused && !this.#interest.closed) {
      // Let the kernel queue (and then the sender) hold the backlog instead of our heap.
      this.#interest.setReading(false);
      noteChange(); // `cuda-ipc status` shows the pause
    }
  }

  /** A 'message' listener was added: it gets what is queued (unless receive() calls wait). */
  drainToListeners(): void {
    const link = this.#link;
    while (this.#queue.length > 0 && this.#waiters.length === 0 && link.listenerCount('message') > 0) {
      const { entry } = this.#shift()!;
      if (entry.ok) link.emit('message', entry.value);
      else if (link.listenerCount('messageerror') > 0) link.emit('messageerror', entry.error);
      else process.emitWarning(`a received message was dropped: ${entry.error.message}`, { code: entry.error.code });
    }
    this.#maybeResumeReading();
    if (link.listenerCount('message') > 0) this.#interest.consumerWaiting();
  }

  /** The link closed: every pending receive() rejects with `error`. */
  rejectWaiters(error: IpcError): void {
    unwatchReceivedMemory(this.#watch);  // called once the link closed: nothing to pause or resume any more
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w.reject(error);
  }

  /** Drops the messages no one will read, releasing their fds and decoded buffers. */
  disposeUnread(): void {
    for (const { entry } of this.#queue.drain()) if (entry.ok) disposeValues(entry.owned);
    for (const { entry } of this.#staged.drain()) if (entry.ok) disposeValues(entry.owned);
    releaseReceived(this.#account.bytes);
    this.#account.bytes = 0;
    this.#fds = 0;
  }

  #maybeResumeReading(): void {
    const l = this.#limits;
    if (this.#interest.readingPaused && !this.#interest.closed && (this.#queue.length + this.#staged.length) * 4 <= l.messages && this.#bytes * 2 <= l.bytes && this.#fds * 2 <= l.fds &&
      (!boundReached() || this.consumerWaiting())) {
      this.#interest.setReading(true);
      noteChange();
    }
  }
}

