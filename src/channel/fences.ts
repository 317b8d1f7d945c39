// GPU-side ordering between the processes of a device channel: 32-bit fence words in the shared
// control block, raised by one process's stream (cuStreamWriteValue32, after its work on a slot)
// and waited for by another's (cuStreamWaitValue32), with no CPU wait in between.
//
// Why not interprocess events: measured on an H200 (driver 580), an IPC event whose record was
// still queued when the recording process exited (cleanly or killed) never completes, for every
// waiter, even after its owner records it again. A fence word lives in memory the survivors can
// write, so once a dead peer's process is gone they raise its fences themselves (raise()) and
// nobody's stream waits forever.
//
// Values are tickets that grow by one per message in a slot and compare as wrapping counters,
// like the driver's CU_STREAM_WAIT_VALUE_GEQ: value v has been reached when (word - v) as int32
// is >= 0.
//
// Stream memory operations cost 1.5-1.9 us of driver time each (measured on an H200), more than
// the rest of a message. So none is made that is not needed: a wait whose value is already
// reached is skipped, and a fence whose stream has nothing left to run (cuStreamQuery) is written
// by the CPU at once instead of by the stream. Writes are not deferred to batch them: a write
// queued later would land behind whatever the caller queues on the stream meanwhile.
import { driver, Flags, whenStreamDone } from '../cuda/driver.js';
import type { Device } from '../cuda/device.js';
import { streamHandle, type Stream } from '../cuda/stream.js';
import { takeWaiterStream, returnWaiterStream } from '../cuda/waiter-streams.js';
import type { NativeSharedWords } from '../native/channel-types.js';

export type FenceWait = readonly [offset: number, value: number];

/** True when a fence holding `word` has reached `value` (wrapping comparison). */
export const fenceReached = (word: number, value: number): boolean => ((word - value) | 0) >= 0;

export class Fences {
  readonly device: Device;
  readonly #words: NativeSharedWords;
  readonly #host: bigint;
  readonly #base: bigint;
  #registered = true;

  /** Maps the control block (the mapping `words` holds) for `device`. */
  constructor(device: Device, words: NativeSharedWords) {
    this.device = device;
    this.#words = words;
    device.activate();
    this.#host = words.address;
    driver.memHostRegister(this.#host, words.byteLength, Flags.HOST_REGISTER_PORTABLE | Flags.HOST_REGISTER_DEVICEMAP);
    try {
      this.#base = driver.memHostGetDevicePointer(this.#host);
    } catch (e) {
      driver.memHostUnregister(this.#host);
      throw e;
    }
  }

  /** Writes `value` into the fence at `offset` once the work queued on `stream` so far is done:
   * now from the CPU when the stream is idle, else by the stream. */
  signal(stream: Stream | undefined, offset: number, value: number): void {
    this.device.activate();
    const handle = streamHandle(stream);
    if (driver.streamQuery(handle)) {
      // Everything queued on it has completed (and its memory writes with it).
      this.#words.store32(offset, value >>> 0);
      return;
    }
    // The default flags put a memory barrier before the write: the slot's bytes land first.
    driver.streamWriteValue32(handle, this.#base + BigInt(offset), value >>> 0, 0);
  }

  /** Work queued on `stream` after this waits until the fence at `offset` reaches `value`. */
  waitOn(stream: Stream | undefined, offset: number, value: number): void {
    // Already reached: the work before the write is done (the write follows a memory barrier),
    // so there is nothing to wait for, and the driver call (about 2 us) is saved.
    if (this.reached(offset, value)) return;
    this.device.activate();
    driver.streamWaitValue32(streamHandle(stream), this.#base + BigInt(offset), value >>> 0, Flags.WAIT_VALUE_GEQ);
  }

  reached(offset: number, value: number): boolean {
    return fenceReached(this.#words.load32(offset), value);
  }

  /** Resolves once every fence reached its value, without blocking a thread. */
  async synchronize(waits: readonly FenceWait[]): Promise<void> {
    const pending = waits.filter(([off, v]) => !this.reached(off, v));
    if (pending.length === 0) return;
    const stream = takeWaiterStream(this.device);
    try {
      for (const [off, v] of pending) this.waitOn(stream, off, v);
      await whenStreamDone(stream.handle, this);
    } finally {
      returnWaiterStream(stream);
    }
  }

  /**
   * From the CPU: raises the fence at `offset` to `value` unless it is already there or past it.
   * For a participant whose process is gone: the writes it queued will never run.
   */
  raise(offset: number, value: number): void {
    for (let i = 0; i < 64; i++) {
      const cur = this.#words.load32(offset);
      if (fenceReached(cur, value)) return;
      if (this.#words.cas32(offset, cur, value >>> 0) === cur) return;
    }
  }

  /** Unmaps the control block from the device. Call before the mapping goes away. */
  close(): void {
    if (!this.#registered) return;
    this.#registered = false;
    this.device.activate();
    driver.memHostUnregister(this.#host);
  }
}
