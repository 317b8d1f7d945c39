// Events: points in a stream's work. Interprocess events (created here or opened from another
// process) let one process's GPU work wait for another's without the CPU.
import { driver, Flags, whenStreamDone } from './driver.js';
import { Device, defaultDevice } from './device.js';
import { Stream, streamHandle } from './stream.js';
import { IpcError } from '../errors.js';
import { raceWait, type WaitOptions } from '../abort.js';
import { DriverObject } from './driver-object.js';
import { takeWaiterStream, returnWaiterStream } from './waiter-streams.js';

declare module './stream.js' {
  interface Stream {
    /** Work queued on this stream after this call waits for `event` (on the GPU, not the CPU). */
    waitEvent(event: Event): void;
  }
}

// stream.waitEvent(event), beside Event (stream.ts names no Event: see its class comment); not
// enumerable, like the class's own methods.
Object.defineProperty(Stream.prototype, 'waitEvent', {
  configurable: true,
  writable: true,
  value: function waitEvent(this: Stream, event: Event): void {
    this.device.activate();
    driver.streamWaitEvent(this.handle, event.handle);
  },
});

/** Options of Event.create(). */
export interface EventOptions {
  /** Shareable with other processes. Implies no timing (the driver refuses both at once). */
  interprocess?: boolean;
}

/**
 * A CUDA event: record it on a stream, wait for it on the CPU or on other streams; interprocess
 * events travel over links (`openIpcEvent` for a descriptor).
 */
export class Event extends DriverObject {
  readonly interprocess: boolean;
  /** True for an event opened from another process's handle. */
  readonly imported: boolean;

  /** @internal */
  constructor(device: Device, handle: bigint, interprocess: boolean, imported: boolean) {
    super(device, handle, imported ? 'imported Event' : 'Event', (h) => driver.eventDestroy(h));
    this.interprocess = interprocess;
    this.imported = imported;
  }

  /**
   * Creates an event on `device` (default: the working device, else device 0); `interprocess:
   * true` to share it.
   */
  static create(device: Device = defaultDevice(), options: EventOptions = {}): Event {
    const interprocess = options.interprocess ?? false;
    if (interprocess && !device.capabilities.ipcEvents) {
      throw new IpcError('ERR_UNSUPPORTED', `device ${device.ordinal} (${device.name}) does not support interprocess events`);
    }
    device.activate();
    // Timing is always off: it costs a little on every record and nothing here measures with it.
    const flags = Flags.EVENT_DISABLE_TIMING | (interprocess ? Flags.EVENT_INTERPROCESS : 0);
    return new Event(device, driver.eventCreate(flags), interprocess, false);
  }

  /** Captures the work queued on `stream` so far (the legacy default stream when omitted). */
  record(stream?: Stream): void {
    this.device.activate();
    driver.eventRecord(this.handle, streamHandle(stream));
  }

  /** true once the captured work is done (or the event was never recorded). */
  query(): boolean {
    this.device.activate();
    return driver.eventQuery(this.handle);
  }

  /** Resolves once the captured work is done, without blocking any thread. `options`: give up
   * waiting on a signal (AbortError) or after a timeout (ERR_TIMEOUT); the GPU work goes on. */
  synchronize(options?: WaitOptions): Promise<void> {
    return raceWait(this.#synchronize(), options, 'Event.synchronize');
  }

  async #synchronize(): Promise<void> {
    const waiter = takeWaiterStream(this.device);
    try {
      driver.streamWaitEvent(waiter.handle, this.handle);
      await whenStreamDone(waiter.handle, this);
    } finally {
      returnWaiterStream(waiter);
    }
  }
}
