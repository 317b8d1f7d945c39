// Transfers on one NCCL communicator, started strictly in sequence order (NCCL matches operations
// by order on both sides): each starts once the one before it was queued, and an earlier transfer
// that waits for its consumer (a lazily received tensor set) is made to receive now when a later
// one is asked for. The twin of python/cuda_ipc/link/nccl/nccl_order.py.
import { IpcError } from '../../errors.js';

/** What a transfer's start resolves with once its NCCL work is queued: when that work is done. */
export interface Queued {
  readonly done: Promise<void>;
}

/** A transfer waiting for its turn: `start` queues its NCCL work and resolves with its completion. */
interface Entry {
  start?: () => Promise<Queued>;
  /** A transfer received lazily: asked to start now (it calls submit for its sequence). */
  force?: () => void;
  fail: (error: IpcError) => void;
}

/** Transfers of one communicator, started strictly in sequence order. */
export class TransferOrder {
  #next = 0;
  #entries = new Map<number, Entry>();
  #busy = false;
  #highest = -1;
  #failed: IpcError | undefined;
  /** Transfers queued whose work has not finished. */
  inFlight = 0;
  readonly #onIdle: () => void;

  constructor(onIdle: () => void) {
    this.#onIdle = onIdle;
  }

  /** `sequence` will be started by `start`; `fail` runs instead if the communicator ends first. */
  submit(sequence: number, start: () => Promise<Queued>, fail: (error: IpcError) => void): void {
    if (this.#failed) {
      fail(this.#failed);
      return;
    }
    const e = this.#entries.get(sequence);
    if (e) {
      e.start = start;
      e.fail = fail;
    } else {
      this.#entries.set(sequence, { start, fail });
    }
    this.#highest = Math.max(this.#highest, sequence);
    this.#pump();
  }

  /** `sequence` waits for its consumer; `force()` makes it submit now (a later transfer needs the way). */
  defer(sequence: number, force: () => void, fail: (error: IpcError) => void): void {
    if (this.#failed) {
      fail(this.#failed);
      return;
    }
    this.#entries.set(sequence, { force, fail });
    this.#pump();
  }

  #pump(): void {
    while (!this.#busy) {
      const e = this.#entries.get(this.#next);
      if (!e) return;
      if (!e.start) {
        // Lazy, and something after it is waiting: make it receive now (it submits synchronously,
        // and that submit pumps: it may have started it already). Look again rather than start it
        // a second time (which queued its receives twice: NCCL out of step with the sender).
        if (this.#highest <= this.#next || !e.force) return;
        const force = e.force;
        e.force = undefined;
        force();
        continue;
      }
      this.#entries.delete(this.#next);
      this.#busy = true;
      this.inFlight++;
      const start = e.start;
      start().then(
        ({ done }) => {
          this.#busy = false;
          this.#next++;
          done.then(() => this.#settled(), () => this.#settled());
          this.#pump();
        },
        () => {
          // start() reported its own failure to its owner; the communicator is aborted by then.
          this.#busy = false;
          this.#next++;
          this.#settled();
          this.#pump();
        },
      );
    }
  }

  #settled(): void {
    if (--this.inFlight === 0) this.#onIdle();
  }

  /** The communicator ended: every waiting transfer fails with `error`, and so will later ones. */
  fail(error: IpcError): void {
    this.#failed ??= error;
    const entries = [...this.#entries.values()];
    this.#entries.clear();
    for (const e of entries) e.fail(error);
  }
}
