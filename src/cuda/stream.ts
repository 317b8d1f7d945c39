// Streams: ordered queues of GPU work. Waiting for one never blocks the event loop: completion
// is reported by a host function that the driver runs when the stream reaches it.
import { driver, Flags, whenStreamDone } from './driver.js';
import { Device, defaultDevice } from './device.js';
import { IpcError } from '../errors.js';
import { raceWait, type WaitOptions } from '../abort.js';
import { DriverObject } from './driver-object.js';
import { invalidArgValue, badNumber } from '../arg-errors.js';

/**
 * A CUDA stream of one device: `Stream.create(device)`; work queued on it runs in order; `await
 * stream.synchronize()` waits without blocking the event loop. `stream.waitEvent(event)` is
 * declared and defined in event.ts, beside Event: an event is a point in a stream's work, so
 * event.ts builds on this file, never the reverse.
 */
export class Stream extends DriverObject {
  private constructor(device: Device, handle: bigint) {
    super(device, handle, 'Stream', (h) => driver.streamDestroy(h));
  }

  /** A new non-blocking stream (it does not synchronise with the legacy default stream). */
  static create(device: Device = defaultDevice()): Stream {
    device.activate();
    return new Stream(device, driver.streamCreate(Flags.STREAM_NON_BLOCKING));
  }

  /** Resolves when all work queued so far has finished. `options`: give up waiting on a signal
   * (AbortError) or after a timeout (ERR_TIMEOUT); the work goes on. */
  synchronize(options?: WaitOptions): Promise<void> {
    return raceWait(whenStreamDone(this.handle), options, 'Stream.synchronize');
  }

  /** GPU-side signal: when the stream reaches this point, it writes `value` at `offset` of `target`. */
  writeValue32(target: MemoryTarget, offset: number, value: number): void {
    checkU32(value);
    driver.streamWriteValue32(this.handle, this.#memOpAddress(target, offset, 4), value >>> 0, 0);
  }

  /** writeValue32 for a 64-bit word. */
  writeValue64(target: MemoryTarget, offset: number, value: bigint): void {
    driver.streamWriteValue64(this.handle, this.#memOpAddress(target, offset, 8), BigInt.asUintN(64, value), 0);
  }

  /**
   * GPU-side wait: work queued after this waits until the 32-bit word at `offset` of `target`
   * satisfies `condition` against `value` ('geq' compares as a wrapping counter, like the driver).
   */
  waitValue32(target: MemoryTarget, offset: number, value: number, condition: WaitCondition = 'geq'): void {
    checkU32(value);
    driver.streamWaitValue32(this.handle, this.#memOpAddress(target, offset, 4), value >>> 0, waitFlag(condition));
  }

  /** waitValue32 for a 64-bit word. */
  waitValue64(target: MemoryTarget, offset: number, value: bigint, condition: WaitCondition = 'geq'): void {
    driver.streamWaitValue64(this.handle, this.#memOpAddress(target, offset, 8), BigInt.asUintN(64, value), waitFlag(condition));
  }

  #memOpAddress(target: MemoryTarget, offset: number, size: 4 | 8): bigint {
    const caps = this.device.capabilities;
    if (!caps.streamMemOps || (size === 8 && !caps.streamMemOps64)) {
      throw new IpcError('ERR_UNSUPPORTED',
        `device ${this.device.ordinal} (${this.device.name}) does not support ${size * 8}-bit stream memory operations; ` +
        'order the work with events (Event, stream.waitEvent) instead');
    }
    const kind = (target as { kind?: string }).kind;
    if (kind === 'pool' || kind === 'pool-import') {
      // Measured on driver 580: cuStreamWriteValue32 answers CUDA_ERROR_INVALID_VALUE for pool memory.
      throw new IpcError('ERR_UNSUPPORTED',
        'stream memory operations cannot target memory-pool buffers (the driver refuses them); ' +
        'use a DeviceBuffer.allocate buffer for flags, shared through its legacy handle or a link');
    }
    if (!Number.isSafeInteger(offset) || offset < 0 || offset + size > target.byteLength) {
      throw badNumber(offset, `a ${size}-byte word at offset ${offset} does not fit in ${target.byteLength} bytes`);
    }
    const address = target.devicePointer + BigInt(offset);
    if (address % BigInt(size) !== 0n) {
      throw invalidArgValue(`stream memory operations need a ${size}-byte aligned address; offset ${offset} is not`);
    }
    this.device.activate();
    return address;
  }

  /** true when all queued work is done. */
  query(): boolean {
    this.device.activate();
    return driver.streamQuery(this.handle);
  }
}

/** Memory that stream memory operations can target: a DeviceBuffer, or anything with a device address. */
export interface MemoryTarget {
  readonly devicePointer: bigint;
  readonly byteLength: number;
}

/**
 * How a stream wait compares the word with the value: `geq` (as a wrapping counter), `eq`, `and`
 * (any bit set), `nor` (not all bits set).
 */
export type WaitCondition = 'geq' | 'eq' | 'and' | 'nor';

function waitFlag(condition: WaitCondition): number {
  switch (condition) {
    case 'geq': return Flags.WAIT_VALUE_GEQ;
    case 'eq': return Flags.WAIT_VALUE_EQ;
    case 'and': return Flags.WAIT_VALUE_AND;
    case 'nor': return Flags.WAIT_VALUE_NOR;
    default: throw invalidArgValue(`unknown wait condition '${condition as string}'; use 'geq', 'eq', 'and' or 'nor'`);
  }
}

function checkU32(value: number): void {
  if (!Number.isInteger(value) || value < 0 || value > 0xffffffff) {
    throw badNumber(value, `a 32-bit stream value must be an integer in 0..2^32-1, got ${value}`);
  }
}

/** The raw handle of an optional stream: the legacy default stream (0) when none is given. */
export function streamHandle(stream: Stream | undefined): bigint {
  return stream ? stream.handle : 0n;
}
