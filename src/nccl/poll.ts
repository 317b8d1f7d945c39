// Waiting for a non-blocking communicator: NCCL answers ncclInProgress and does the work on its
// own threads; ncclCommGetAsyncError says when it is done. Polled from setImmediate for the first
// 2 ms (queueing one operation takes NCCL's thread tens of microseconds: a 1 ms timer per
// operation made a 32-chunk transfer spend 38 ms queueing, measured on two H200s), then on a timer
// with a short backoff (1 ms, doubling to 10 ms): the event loop stays free and no thread is parked.
import { armWait, type WaitOptions } from '../abort.js';
import { NcclResult } from './errors.js';

/** Reads back to back (between turns of the event loop) this long before the timers. */
const SPIN_MS = 2;
const FIRST_DELAY_MS = 1;
const MAX_DELAY_MS = 10;

/**
 * Calls `read` (ncclCommGetAsyncError's state) until it answers something other than
 * ncclInProgress, and resolves with that. Rejects with what `read` threw, or with the AbortError
 * / ERR_TIMEOUT of `options` (naming `what`). The first read happens now.
 */
export function pollWhileInProgress(read: () => number, options: WaitOptions | undefined, what: string): Promise<number> {
  return new Promise((resolve, reject) => {
    let done = false;
    let timer: NodeJS.Timeout | undefined;
    let immediate: NodeJS.Immediate | undefined;
    let delay = FIRST_DELAY_MS;
    const spinUntil = performance.now() + SPIN_MS;
    const disarm = armWait(options, what, (error) => {
      if (done) return;
      done = true;
      if (timer) clearTimeout(timer);
      if (immediate) clearImmediate(immediate);
      reject(error);
    });
    const tick = (): void => {
      if (done) return;
      let state: number;
      try {
        state = read();
      } catch (e) {
        done = true;
        disarm();
        reject(e);
        return;
      }
      if (state !== NcclResult.ncclInProgress) {
        done = true;
        disarm();
        resolve(state);
        return;
      }
      if (performance.now() < spinUntil) {
        immediate = setImmediate(tick);
        return;
      }
      timer = setTimeout(tick, delay);
      delay = Math.min(delay * 2, MAX_DELAY_MS);
    };
    tick();
  });
}
