// The queue of pending acquires (a producer) or receives (a consumer): served in order by one
// pump that polls the control block and parks between attempts.
import { armWait, type WaitOptions } from '../abort.js';

interface Waiting<T> {
  resolve(v: T): void;
  reject(e: unknown): void;
  /** Stops the signal and timer of the wait's options. */
  disarm?: () => void;
}

export interface QueueHooks<T> {
  /** Once closed, every waiter gets this. */
  closedOutcome(): { error: unknown } | { value: T };
  isClosed(): boolean;
  /** A value now, or null when there is none yet. What it throws, every waiter gets. */
  poll(): T | null;
  /** A value that also settles every later waiter (the end of a consumer's stream). */
  isFinal(value: T): boolean;
  /** Returns once poll() may have something (or the end was closed); what it throws, every
   * waiter gets. `spun`: the caller spun already and it ran out (sleep at once). */
  park(spun: boolean): Promise<void>;
  /** The pump parked, woke, and nobody waits any more (a consumer passes the wake-up on). */
  afterIdleWake?(): void;
  /** The last waiter gave up: stop sleeping. */
  cancel(): void;
}

export class WaitQueue<T> {
  readonly #hooks: QueueHooks<T>;
  // The waiters in order: the first in a field of its own, the rest in an array. Nearly always
  // there is one waiter at most, and then queueing and serving it touch no array (a shift() and
  // push() per wait reallocate the array's store now and then).
  #first: Waiting<T> | undefined;
  readonly #rest: Array<Waiting<T>> = [];
  #pumping = false;
  /** The next pump's first park follows a spin that ran out (enqueue(..., spun)). */
  #spun = false;

  constructor(hooks: QueueHooks<T>) {
    this.#hooks = hooks;
  }

  /** True while someone waits: a new request must queue behind them (order). */
  get busy(): boolean {
    return this.#first !== undefined || this.#pumping;
  }

  /** Queues a request. `options`: give up on its signal (AbortError) or timeout (ERR_TIMEOUT),
   * withdrawn from the queue. `spun`: the caller has just spun for it in vain (the pump sleeps at
   * once instead of spinning a second time). */
  enqueue(options: WaitOptions | undefined, what: string, spun = false): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const entry: Waiting<T> = { resolve, reject };
      let gaveUp = false;
      const disarm = armWait(options, what, (error) => {
        gaveUp = true;
        this.#remove(entry);
        reject(error);
        if (this.#first === undefined) this.#hooks.cancel();
      });
      if (gaveUp) return;
      entry.disarm = disarm;
      if (this.#first === undefined) this.#first = entry;
      else this.#rest.push(entry);
      if (!this.#pumping) this.#spun = spun;
      void this.pump();
    });
  }

  #remove(entry: Waiting<T>): void {
    if (this.#first === entry) {
      this.#first = this.#rest.shift();
      return;
    }
    const i = this.#rest.indexOf(entry);
    if (i >= 0) this.#rest.splice(i, 1);
  }

  #settle(value: T | undefined, error?: unknown): void {
    const e = this.#first;
    if (!e) return;
    this.#first = this.#rest.length > 0 ? this.#rest.shift() : undefined;
    e.disarm?.();
    if (error !== undefined) e.reject(error);
    else e.resolve(value as T);
  }

  #settleAll(value: T | undefined, error?: unknown): void {
    while (this.#first !== undefined) this.#settle(value, error);
  }

  /** Serves the waiters in order, parking between attempts. Call again after close(). */
  async pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    const h = this.#hooks;
    try {
      while (this.#first !== undefined) {
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
        const spun = this.#spun;
        this.#spun = false;
        try {
          await h.park(spun);
        } catch (e) {
          this.#settleAll(undefined, e);
          break;
        }
        if (this.#first === undefined) h.afterIdleWake?.();
      }
    } finally {
      this.#pumping = false;
      this.#spun = false;
    }
  }
}
