// Doorbells: one eventfd per participant entry of a channel. The hub makes the set with the
// control block and hands all of it to every participant at attach (one link message, the fds in
// its SCM_RIGHTS), so any participant can wake any other, including ones that attach later,
// without a link between them. Participant k sleeps by polling eventfd k on its event loop
// (waiter.ts); others ring it when the control block says k is asleep (slot-ring.ts).
//
// On the wire (a link transfer record of kind 'channel-doorbells'): data is u32 count (LE), the
// record carries `count` eventfds, entry k first. The receiver checks each is an eventfd.
import { IpcError, fdLimitError } from '../errors.js';
import { addon } from '../native/addon.js';
import { registerTransferHandler, type TransferHandler } from '../link/index.js';

export const DOORBELLS_KIND = 'channel-doorbells';

export class Doorbells implements Disposable {
  /** eventfd of each participant entry; owned (closed by close()). */
  readonly #fds: number[];
  #closed = false;

  private constructor(fds: number[]) {
    this.#fds = fds;
  }

  /** A fresh set of `count` eventfds (the hub, with a new control block). */
  static create(count: number): Doorbells {
    const fds: number[] = [];
    try {
      for (let i = 0; i < count; i++) fds.push(addon.eventfdCreate());
    } catch (e) {
      for (const fd of fds) addon.close(fd);
      throw fdLimitError(e, 'a channel (its doorbells are eventfds)');
    }
    return new Doorbells(fds);
  }

  /** Takes ownership of received fds once each is checked to be an eventfd. */
  static adopt(fds: number[]): Doorbells {
    for (const fd of fds) {
      let ok = false;
      try {
        ok = addon.isEventfd(fd);
      } catch {
        // unreadable: refused below
      }
      if (!ok) throw new IpcError('ERR_DESCRIPTOR_INVALID', 'received channel doorbells that are not eventfds');
    }
    return new Doorbells(fds.slice());
  }

  get count(): number {
    return this.#fds.length;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Participant k's eventfd (borrowed). */
  fd(k: number): number {
    if (this.#closed) throw new IpcError('ERR_CHANNEL_CLOSED', 'the channel\'s doorbells are closed');
    const fd = this.#fds[k];
    if (fd === undefined) throw new IpcError('ERR_CHANNEL_CORRUPT', `no doorbell for participant ${k}`);
    return fd;
  }

  /** Wakes participant k (its poll sees the eventfd readable). */
  ring(k: number): void {
    if (this.#closed) return;
    const fd = this.#fds[k];
    if (fd !== undefined) addon.eventfdRing(fd);
  }

  /** fds for a send (borrowed by the link during send()). */
  fdsForSend(): readonly number[] {
    if (this.#closed) throw new IpcError('ERR_CLOSED', 'link.send: the channel\'s doorbells are closed');
    return this.#fds;
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const fd of this.#fds) {
      try { addon.close(fd); } catch { /* already gone */ }
    }
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

const doorbellsTransfer: TransferHandler<Doorbells> = {
  kind: DOORBELLS_KIND,
  canTransfer: (value): value is Doorbells => value instanceof Doorbells,
  encode(bells) {
    const fds = bells.fdsForSend();
    const data = new Uint8Array(4);
    new DataView(data.buffer).setUint32(0, fds.length, true);
    return { data, fds };
  },
  decode(data, fds) {
    if (data.byteLength !== 4 || new DataView(data.buffer, data.byteOffset, 4).getUint32(0, true) !== fds.length || fds.length === 0) {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', `received malformed channel doorbells (${data.byteLength} bytes, ${fds.length} fds)`);
    }
    const bells = Doorbells.adopt(fds);
    fds.fill(-1);  // owned by `bells` now
    return bells;
  },
};

registerTransferHandler(doorbellsTransfer);
