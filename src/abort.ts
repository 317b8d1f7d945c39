// Cancelling waits the Node way. Every call that waits takes `signal` (an AbortSignal) and
// `timeout` (milliseconds): an aborted signal rejects the wait with an AbortError (name
// 'AbortError', code 'ABORT_ERR', the signal's reason as `cause`), as fs, events.once and fetch
// do; a timeout rejects it with IpcError ERR_TIMEOUT. Either way the wait is withdrawn, so that
// nothing it was waiting for (a message, a slot) is taken by a caller that gave up.
import { IpcError } from './errors.js';
import { checkSignal, invalidArgType, outOfRange, received } from './arg-errors.js';

/** Options of every call that waits: give up on a signal, or after a time. */
export interface WaitOptions {
  /** Gives up when the signal aborts: the promise rejects with an AbortError (code ABORT_ERR). */
  signal?: AbortSignal;
  /**
   * Gives up after this many milliseconds: the promise rejects with ERR_TIMEOUT. At most
   * 2147483647 (2^31-1, what a timer holds; more is a RangeError ERR_OUT_OF_RANGE); Infinity: never.
   */
  timeout?: number;
}

/** The error of an aborted wait: what Node's own APIs reject with. */
export class AbortError extends Error {
  override name = 'AbortError';
  readonly code = 'ABORT_ERR';
  constructor(message = 'The operation was aborted', options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** The AbortError of a wait in `what` whose signal fired with `reason`. */
export function abortError(reason: unknown, what: string): AbortError {
  return new AbortError(`${what} was aborted`, { cause: reason });
}

/** The ERR_TIMEOUT of a wait in `what` that took more than `ms`. */
export function timeoutError(ms: number, what: string): IpcError {
  return new IpcError('ERR_TIMEOUT', `${what} did not finish within ${ms} ms (the timeout option); wait longer, or find out why the other side is stuck`);
}

/** The longest delay a timer holds (2^31-1 ms, about 24.8 days): Node fires a longer one at once, with a TimeoutOverflowWarning. */
export const MAX_TIMEOUT_MS = 2 ** 31 - 1;

/**
 * Checks `options.timeout`: a non-negative number of milliseconds up to MAX_TIMEOUT_MS (what a
 * timer can hold), Infinity for none, or undefined.
 */
export function checkTimeout(value: unknown, name = 'options.timeout'): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'number') throw invalidArgType(`The "${name}" property must be of type number. ${received(value)}`);
  if (value === Infinity) return undefined;
  if (Number.isNaN(value) || value < 0 || value > MAX_TIMEOUT_MS) {
    throw outOfRange(`The value of "${name}" is out of range. It must be a non-negative number of milliseconds up to ${MAX_TIMEOUT_MS} (2^31-1, what a timer can hold), or Infinity for none. Received ${value}`);
  }
  return value;
}

/** Checks a wait's options (signal, timeout): TypeError / RangeError with Node's codes. */
export function checkWaitOptions(options: WaitOptions | undefined): { signal: AbortSignal | undefined; timeout: number | undefined } {
  if (options === undefined) return { signal: undefined, timeout: undefined };
  if (typeof options !== 'object' || options === null) throw invalidArgType(`The "options" argument must be of type object. ${received(options)}`);
  return { signal: checkSignal(options.signal), timeout: checkTimeout(options.timeout) };
}

const noop = (): void => {};

/**
 * Arms `options` for one wait in `what`: `fire` runs once with the AbortError or ERR_TIMEOUT when
 * the signal aborts or the timeout passes (at once, synchronously, for a signal aborted already).
 * Returns the disarm function, to call when the wait ends otherwise. Checks the options first
 * (throws TypeError / RangeError).
 */
export function armWait(options: WaitOptions | undefined, what: string, fire: (error: Error) => void): () => void {
  const { signal, timeout } = checkWaitOptions(options);
  if (!signal && timeout === undefined) return noop;
  if (signal?.aborted) {
    fire(abortError(signal.reason, what));
    return noop;
  }
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  const disarm = (): void => {
    if (timer) clearTimeout(timer);
    if (onAbort) signal!.removeEventListener('abort', onAbort);
    timer = undefined;
    onAbort = undefined;
  };
  if (signal) {
    onAbort = () => {
      disarm();
      fire(abortError(signal.reason, what));
    };
    signal.addEventListener('abort', onAbort, { once: true });
  }
  if (timeout !== undefined) {
    timer = setTimeout(() => {
      disarm();
      fire(timeoutError(timeout, what));
    }, timeout);
  }
  return disarm;
}

/**
 * `promise`, or the AbortError / ERR_TIMEOUT of `options` if that comes first; then `cancel` runs
 * (to withdraw what the wait asked for). For waits whose work cannot be withdrawn (a stream's
 * work runs on), giving up only stops the waiting.
 */
export function raceWait<T>(promise: Promise<T>, options: WaitOptions | undefined, what: string, cancel?: (error: Error) => void): Promise<T> {
  if (options === undefined || (options.signal === undefined && options.timeout === undefined)) {
    checkWaitOptions(options);
    return promise;
  }
  return new Promise<T>((resolve, reject) => {
    let done = false;
    const disarm = armWait(options, what, (error) => {
      if (done) return;
      done = true;
      cancel?.(error);
      reject(error);
    });
    promise.then(
      (v) => {
        disarm();
        if (!done) {
          done = true;
          resolve(v);
        }
      },
      (e: unknown) => {
        disarm();
        if (!done) {
          done = true;
          reject(e);
        }
      },
    );
  });
}

/** One signal for a wait made of several steps (see waitScope). */
export interface WaitScope {
  /** Aborts when the caller's signal aborts or the timeout passes; pass it to each step. */
  readonly signal: AbortSignal | undefined;
  /** What a step's rejection means to the caller: the scope's own AbortError / ERR_TIMEOUT for a step it aborted, else `e`. */
  translate(e: unknown): unknown;
  /** The wait is over: stop the timer. */
  done(): void;
}

/**
 * `options` for a wait of several steps (receive, then send, then receive...): one deadline for
 * all of them, not one per step. Steps are given `scope.signal`; a step it aborted rejects with an
 * AbortError whose cause is the scope's reason, which `translate` turns back into what the caller
 * expects (its own AbortError, or ERR_TIMEOUT naming `what`).
 */
export function waitScope(options: WaitOptions | undefined, what: string): WaitScope {
  const { signal, timeout } = checkWaitOptions(options);
  if (!signal && timeout === undefined) return { signal: undefined, translate: (e) => e, done: noop };
  const controller = new AbortController();
  let fired: Error | undefined;
  const disarm = armWait(options, what, (error) => {
    fired = error;
    controller.abort(error);
  });
  return {
    signal: controller.signal,
    translate: (e) => (fired !== undefined && (e === fired || (e as Error)?.cause === fired) ? fired : e),
    done: disarm,
  };
}
