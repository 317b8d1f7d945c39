// The queue of pending acquires (a producer) or receives (a consumer): served in order by one
// pump that polls the control block and parks between attempts.
import { abortError } from './options.js';

interface Waiting<T> {
  resolve(v: T): void;
  reject(e: unknown): void;
  signal?: AbortSignal;
  onAbort?: () => void;
}

export interface QueueHooks<T> {
  /** Once closed, every waiter gets this. */
  closedOutcome(): { error: unknown } | { value: T };
  isClosed(): boolean;
  /** A value now, or null when there is none yet. What it throws, every waiter gets. */
  poll(): T | null;
  /** A value that also settles every later waiter (the end of a consumer's stream). */
  isFinal(value: T): boolean;
  /** Returns once poll() may have something (or the end was closed); what it throws, every waiter gets. */
  park(): Promise<void>;
  /** The pump parked, woke, and nobody waits any more (a consumer passes the wake-up on). */
  afterIdleWake?(): void;
  /** The last waiter gave up: stop sleeping. */
  cancel(): void;
}

export class WaitQueue<T> {
  readonly #hooks: QueueHooks<T>;
  readonly #entries: Array<Waiting<T>> = [];
  #pumping = false;

  constructor(hooks: QueueHooks<T>) {
    this.#hooks = hooks;
  }

  /** True while someone waits: a new request must queue behind them (order). */
  get busy(): boolean {
    return this.#entries.length > 0 || this.#pumping;
  }

  enqueue(signal: AbortSignal | undefined, what: string): Promise<T> {
    if (signal?.aborted) return Promise.reject(abortError(signal, what));
    return new Promise<T>((resolve, reject) => {
      const entry: Waiting<T> = { resolve, reject, signal };
      if (signal) {
        entry.onAbort = () => {
          const i = this.#entries.indexOf(entry);
          if (i >= 0) this.#entries.splice(i, 1);
          reject(abortError(signal, what));
          if (this.#entries.length === 0) this.#hooks.cancel();
        };
        signal.addEventListener('abort', entry.onAbort, { once: true });
      }
      this.#entries.push(entry);
      void this.pump();
    });
  }

  #settle(value: T | undefined, error?: unknown): void {
    const e = this.#entries.shift();
    if (!e) return;
    if (e.onAbort) e.signal!.removeEventListener('abort', e.onAbort);
    if (error !== undefined) e.reject(error);
    else e.resolve(value as T);
  }

  #settleAll(value: T | undefined, error?: unknown): void {
    while (this.#entries.length > 0) this.#settle(value, error);
  }

  /** Serves the waiters in order, parking between attempts. Call again after close(). */
  async pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    const h = this.#hooks;
    try {
      while (this.#entries.length > 0) {
        if (h.isClosed()) {
          const o = h.closedOutcome();
          if ('error' in o) this.#settleAll(undefined, o.error);
          else this.#settleAll(o.value);
          break;
        }
        let got: T | null;
        try {
          got = h.poll();
        } catch (e) {
          this.#settleAll(undefined, e);
          break;
        }
        if (got !== null) {
          this.#settle(got);
          if (h.isFinal(got)) this.#settleAll(got);
          continue;
        }
        try {
          await h.park();
        } catch (e) {
          this.#settleAll(undefined, e);
          break;
        }
        if (this.#entries.length === 0) h.afterIdleWake?.();
      }
    } finally {
      this.#pumping = false;
    }
  }
}
