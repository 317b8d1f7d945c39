// What a link's socket is polled for: readable unless the inbox is full (inbox.ts pauses reading
// to let the kernel hold the backlog), writable while frames wait in the outbox (outbox.ts). Both
// change the one native setting, so it lives here.
import type { NativeSocket } from '../../native/posix-types.js';

export class SocketInterest {
  readonly #sock: NativeSocket;
  #reading = true;
  #writing = false;
  #closed = false;

  constructor(sock: NativeSocket) {
    this.#sock = sock;
  }

  get closed(): boolean {
    return this.#closed;
  }
  get readingPaused(): boolean {
    return !this.#reading;
  }

  setReading(on: boolean): void {
    if (this.#closed) return;
    this.#reading = on;
    this.#sock.setInterest(on, this.#writing);
  }

  setWriting(on: boolean): void {
    if (this.#writing === on || this.#closed) return;
    this.#writing = on;
    this.#sock.setInterest(this.#reading, on);
  }

  /** The socket reported it is writable: the poll no longer watches for that. */
  writableSeen(): void {
    this.#writing = false;
  }

  /** The application waits for a message: a transport holding one back for the process's bound (TCP) takes it now. */
  consumerWaiting(): void {
    if (!this.#closed) (this.#sock as { consumerWaiting?: () => void }).consumerWaiting?.();
  }

  /** The link closed (and its socket with it): nothing changes any more. */
  close(): void {
    this.#closed = true;
  }
}
