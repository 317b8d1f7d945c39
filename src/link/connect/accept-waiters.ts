// The accept() side both listeners share (listener.ts for socket names, tcp-listener.ts for TCP):
// callers waiting for the next link, each giving up on its own signal or timeout.
import type { IpcError } from '../../errors.js';
import { armWait, type WaitOptions } from '../../abort.js';
import type { Link } from '../connection/link.js';

interface Waiter {
  resolve(link: Link): void;
  reject(error: unknown): void;
}

export class AcceptWaiters {
  #waiters: Waiter[] = [];

  /** Whether an accept() is waiting. */
  get waiting(): boolean {
    return this.#waiters.length > 0;
  }

  /** Hands `link` to the accept() that has waited longest; false when none waits. */
  hand(link: Link): boolean {
    const w = this.#waiters.shift();
    w?.resolve(link);
    return w !== undefined;
  }

  /** The link handed next; `options`: give up on a signal (AbortError) or after a timeout (ERR_TIMEOUT). */
  wait(options: WaitOptions | undefined): Promise<Link> {
    return new Promise<Link>((resolve, reject) => {
      const waiter: Waiter = { resolve, reject };
      let gaveUp = false;
      const disarm = armWait(options, 'listener.accept', (error) => {
        gaveUp = true;
        this.#waiters = this.#waiters.filter((w) => w !== waiter);
        reject(error);
      });
      if (gaveUp) return;
      waiter.resolve = (link) => {
        disarm();
        resolve(link);
      };
      waiter.reject = (error) => {
        disarm();
        reject(error);
      };
      this.#waiters.push(waiter);
    });
  }

  /** Every accept() still waiting rejects with `error` (the listener closed). */
  rejectAll(error: IpcError): void {
    for (const w of this.#waiters.splice(0)) w.reject(error);
  }
}

/** Yields the links `accept()` gives until it rejects with ERR_LINK_CLOSED (a listener's iterator). */
export async function* acceptUntilClosed(accept: () => Promise<Link>): AsyncGenerator<Link, void, undefined> {
  for (;;) {
    let link: Link;
    try {
      link = await accept();
    } catch (e) {
      if ((e as IpcError | undefined)?.code === 'ERR_LINK_CLOSED') return;
      throw e;
    }
    yield link;
  }
}
