// The shape every driver-handle wrapper shares (streams, events, modules): the handle while open,
// ERR_CLOSED after, an idempotent close() that destroys it in its device's context (or once the
// last hold a peer has on it ends), and the leak backstop for one that is collected while open.
import { Device } from './device.js';
import { IpcError } from '../errors.js';
import { trackLeak, untrackLeak, type LeakToken } from '../leak.js';

export abstract class DriverObject {
  readonly device: Device;
  #handle: bigint;
  readonly #what: string;
  readonly #destroy: (handle: bigint) => void;
  #closeRequested = false;
  #holds = 0;
  readonly #leak: LeakToken;
  /** Run once the driver object is destroyed (e.g. tell a peer we no longer use its event). */
  readonly afterDestroy: Array<() => void> = [];

  protected constructor(device: Device, handle: bigint, what: string, destroy: (handle: bigint) => void) {
    this.device = device;
    this.#handle = handle;
    this.#what = what;
    this.#destroy = destroy;
    this.#leak = trackLeak(this, `A ${what}`, () => {
      device.activate();
      destroy(handle);
    });
  }

  /** The driver's handle; throws ERR_CLOSED once closed. */
  get handle(): bigint {
    if (this.#closeRequested) throw new IpcError('ERR_CLOSED', `this ${this.#what} was closed; create a new one`);
    return this.#handle;
  }

  get closed(): boolean { return this.#closeRequested; }

  /** Keeps the driver object alive past close() until the returned function runs (a peer's lease). */
  hold(): () => void {
    this.handle; // throws once closed
    this.#holds++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      if (--this.#holds === 0 && this.#closeRequested) this.#destroyNow();
    };
  }

  /** Closes it for this process: destroyed now, or when the last hold ends. Idempotent. */
  close(): void {
    if (this.#closeRequested) return;
    this.#closeRequested = true;
    untrackLeak(this.#leak);
    if (this.#holds === 0) this.#destroyNow();
  }

  #destroyNow(): void {
    const h = this.#handle;
    if (h === 0n) return;
    this.#handle = 0n;
    try {
      this.device.activate();
      this.#destroy(h);
    } finally {
      for (const hook of this.afterDestroy.splice(0)) hook();
    }
  }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void { this.close(); }
}
