// Streams: ordered queues of GPU work. Waiting for one never blocks the event loop: completion
// is reported by a host function that the driver runs when the stream reaches it.
import { driver, Flags, whenStreamDone } from './driver.js';
import { Device } from './device.js';
import { IpcError } from '../errors.js';
import { trackLeak, untrackLeak } from '../leak.js';

export class Stream {
  readonly device: Device;
  #handle: bigint;

  private constructor(device: Device, handle: bigint) {
    this.device = device;
    this.#handle = handle;
    trackLeak(this, 'Stream', () => {
      device.activate();
      driver.streamDestroy(handle);
    });
  }

  /** A new non-blocking stream (it does not synchronise with the legacy default stream). */
  static create(device: Device = Device.get(0)): Stream {
    device.activate();
    return new Stream(device, driver.streamCreate(Flags.STREAM_NON_BLOCKING));
  }

  /** The driver's handle; throws once the stream is closed. */
  get handle(): bigint {
    if (this.#handle === 0n) throw new IpcError('ERR_CLOSED', 'this stream was closed; create a new one with Stream.create()');
    return this.#handle;
  }

  get closed(): boolean { return this.#handle === 0n; }

  /** Resolves when all work queued so far has finished. */
  synchronize(): Promise<void> {
    return whenStreamDone(this.handle);
  }

  /** true when all queued work is done. */
  query(): boolean {
    this.device.activate();
    return driver.streamQuery(this.handle);
  }

  close(): void {
    if (this.#handle === 0n) return;
    const h = this.#handle;
    this.#handle = 0n;
    untrackLeak(this);
    this.device.activate();
    driver.streamDestroy(h);
  }

  [Symbol.dispose](): void { this.close(); }
}

/** The raw handle of an optional stream: the legacy default stream (0) when none is given. */
export function streamHandle(stream: Stream | undefined): bigint {
  return stream ? stream.handle : 0n;
}
