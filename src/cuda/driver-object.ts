// The shape every driver-handle wrapper shares (streams, events, modules): the handle while open,
// ERR_CLOSED after, an idempotent close() that destroys it in its device's context, and the leak
// backstop for one that is collected while open.
import { Device } from './device.js';
import { IpcError } from '../errors.js';
import { trackLeak, untrackLeak } from '../leak.js';

export abstract class DriverObject {
  readonly device: Device;
  #handle: bigint;
  readonly #what: string;
  readonly #destroy: (handle: bigint) => void;

  protected constructor(device: Device, handle: bigint, what: string, destroy: (handle: bigint) => void) {
    this.device = device;
    this.#handle = handle;
    this.#what = what;
    this.#destroy = destroy;
    trackLeak(this, what, () => {
      device.activate();
      destroy(handle);
    });
  }

  /** The driver's handle; throws ERR_CLOSED once closed. */
  get handle(): bigint {
    if (this.#handle === 0n) throw new IpcError('ERR_CLOSED', `this ${this.#what} was closed; create a new one`);
    return this.#handle;
  }

  get closed(): boolean { return this.#handle === 0n; }

  /** Destroys the driver object. Idempotent. */
  close(): void {
    if (this.#handle === 0n) return;
    const h = this.#handle;
    this.#handle = 0n;
    untrackLeak(this);
    this.device.activate();
    this.#destroy(h);
  }

  [Symbol.dispose](): void { this.close(); }
}
