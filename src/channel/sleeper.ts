// A promise over the native waiter thread: one futex wait at a time, started lazily.
import { addon } from '../native.js';
import type { NativeFutexWaiter, NativeSharedWords } from '../channel-types.js';
import { JsWords } from './js-words.js';

export const WaitStatus = { Changed: 0, Timeout: 1, Cancelled: 2 } as const;

export class Sleeper {
  #native: NativeFutexWaiter | undefined;
  #resolve: ((status: number) => void) | undefined;
  #closed = false;

  get waiting(): boolean {
    return this.#resolve !== undefined;
  }

  /** Resolves with a WaitStatus (or -errno) once the word at `offset` may have left `expected`. */
  wait(words: NativeSharedWords, offset: number, expected: number, timeoutMs: number): Promise<number> {
    if (this.#closed) return Promise.resolve(WaitStatus.Cancelled);
    if (this.#resolve) throw new Error('cuda-ipc internal: a channel wait is already pending');
    this.#native ??= new addon.FutexWaiter((status) => {
      const resolve = this.#resolve;
      this.#resolve = undefined;
      resolve?.(status);
    });
    const native = this.#native;
    // The waiter thread takes only the addon's own object (it checks a type tag): unwrap JsWords.
    const target = words instanceof JsWords ? words.native : words;
    return new Promise<number>((resolve) => {
      this.#resolve = resolve;
      try {
        native.wait(target, offset, expected, timeoutMs, 0);
      } catch (e) {
        this.#resolve = undefined;
        throw e;
      }
    });
  }

  cancel(): void {
    this.#native?.cancel();
  }

  /** Ends any wait (it resolves Cancelled) and joins the thread. */
  close(): void {
    this.#closed = true;
    const native = this.#native;
    this.#native = undefined;
    native?.close();
    const resolve = this.#resolve;
    this.#resolve = undefined;
    resolve?.(WaitStatus.Cancelled);
  }
}
