// What a producer end and a consumer end both hold: their participant entry in the control block,
// the memory (Block), how they wait, their views of the slots, and leaving. A peer's end also
// watches its link to the hub: when it closes, the peer repairs the hub's entries (and those of
// the ends the hub had in its own process) in the hub's place.
import { IpcError } from '../errors.js';
import type { Link } from '../link/index.js';
import type { HostBuffer } from '../host/index.js';
import type { DeviceBuffer } from '../cuda/buffer.js';
import { H, P, PState, PRole, PFLAG_HUB_LOCAL } from './layout.js';
import { Ring } from './slot-ring.js';
import { ringKindFor } from './c-ring.js';
import { Waiter, type WaitPolicy } from './waiter.js';
import { Recoveries, repairFencesWhenGone } from './recovery.js';
import type { Block } from './block.js';
import type { ChannelRole, ChannelStats } from './options.js';
import { observeChannelEnd } from './status.js';
import type { ChannelRegistration } from '../observe/hooks.js';

export interface EndInit {
  /** A reference of its own (the end releases it once closed). */
  block: Block;
  index: number;
  role: ChannelRole;
  policy: WaitPolicy;
  /** Peers: the link to the hub. */
  hubLink?: Link;
  /** Runs once the end is closed (e.g. the hub of a one-to-one channel closes with its end). */
  onClosed?: () => void;
}

export class Endpoint {
  readonly block: Block;
  readonly index: number;
  readonly role: ChannelRole;
  readonly ring: Ring;
  readonly waiter: Waiter;
  readonly recoveries: Recoveries;
  /** Closed by the user (or the hub); the memory may stay mapped until the leave finishes. */
  closed = false;
  /** The memory was released: nothing may touch it any more. */
  released = false;
  /** Peers: the link to the hub closed. */
  hubLost = false;
  readonly #views: Array<HostBuffer | DeviceBuffer | undefined>;
  readonly #seqOff: number;
  readonly #sleepersOff: number;
  #unhookHub: (() => void) | undefined;
  #onClosed: (() => void) | undefined;
  readonly #status: ChannelRegistration;

  constructor(init: EndInit) {
    const { block, index } = init;
    this.block = block;
    this.index = index;
    this.role = init.role;
    const role = init.role === 'producer' ? PRole.Producer : PRole.Consumer;
    this.#seqOff = Ring.sequenceFor(role);
    this.#sleepersOff = Ring.sleepersFor(role);
    // The C ring where the addon has it, unless CUDA_IPC_CHANNEL_RING says (c-ring.ts).
    this.ring = block.ring(index, ringKindFor());
    this.recoveries = new Recoveries(this.ring);
    this.waiter = new Waiter(this.ring, block.bells.fd(index), init.policy);
    this.#views = new Array(block.slotCount).fill(undefined);
    this.#onClosed = init.onClosed;
    if (init.hubLink) {
      this.#unhookHub = init.hubLink.onClose(() => {
        this.#unhookHub = undefined;
        this.hubLost = true;
        this.#status.changed();
        this.#recoverHub();
      });
    }
    this.#status = observeChannelEnd(this);
  }

  /** Still a live member (not removed by a recovery after its link to the hub closed). */
  alive(): boolean {
    return this.ring.participantState(this.index) === PState.Alive;
  }

  detachedError(what: string): IpcError {
    return new IpcError('ERR_CHANNEL_CLOSED', `${what}: this end was removed from the channel (its link to the hub closed, so its messages were handed to others); attach again over a new link`);
  }

  assertOpen(what: string): void {
    if (this.closed) throw new IpcError('ERR_CHANNEL_CLOSED', `${what}: the channel is closed`);
  }

  counter(off: number): number {
    return this.ring.counter(off);
  }

  /** A view of slot s, made once (again if the user closed it). */
  view(s: number): HostBuffer | DeviceBuffer {
    let v = this.#views[s];
    if (!v || v.closed) {
      v = this.block.slots.view(s * this.block.slotBytes, this.block.slotBytes);
      this.#views[s] = v;
    }
    return v;
  }

  /** Returns once `ready()` may be true (spin, then sleep on the doorbell: waiter.ts); `spun`:
   * the caller's spin() just ran out, so sleep at once. */
  park(ready: () => boolean, spun = false): Promise<void> {
    return this.waiter.park(this.#seqOff, this.#sleepersOff, ready, spun);
  }

  /** Spins per the wait policy, synchronously: true when `ready()` may be true now, false when
   * the spin ran out (then park(ready, true)). */
  spin(ready: () => boolean): boolean {
    return this.waiter.spin(this.#seqOff, ready);
  }

  stats(): ChannelStats {
    return channelStats(this.ring);
  }

  /**
   * Closes this end: stops waiting, stops watching the hub, leaves the control block, and
   * releases the memory once the leave is done (a leave that must wait for the publish lock
   * finishes in the background). The caller has settled its own state first. Idempotent.
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.#status.unregister();
    this.waiter.close();
    this.#unhookHub?.();
    this.#unhookHub = undefined;
    try {
      if (this.alive() || this.recoveries.has(this.index)) this.recoveries.leaveSelf();
    } catch (e) {
      process.emitWarning(`cuda-ipc channel: leaving the control block failed: ${(e as Error).message}`, { code: 'CUDA_IPC_CHANNEL' });
    }
    this.recoveries.whenIdle(() => this.#release());
    const onClosed = this.#onClosed;
    this.#onClosed = undefined;
    onClosed?.();
  }

  #release(): void {
    if (this.released) return;
    this.released = true;
    for (const v of this.#views) v?.close();
    this.ring.close();  // before the doorbells it borrows close
    this.block.release();
  }

  /** The hub went away: take its place for its own entry and its in-process ends, if they were
   * still members (a hub that closed cleanly took them out itself). GPU writes they queued die
   * with their process however they left: their fences are raised once it is gone. */
  #recoverHub(): void {
    if (this.released) return;
    const ring = this.ring;
    for (let k = 0; k < this.block.layout.maxParticipants; k++) {
      if (k === this.index) continue;
      const po = ring.partOff(k);
      if (k !== 0 && (ring.w.load32(po + P.flags) & PFLAG_HUB_LOCAL) === 0) continue;
      const st = ring.participantState(k);
      if (st === PState.Empty) continue;
      if (this.block.fences) repairFencesWhenGone(ring, this.block.fences, k, () => !this.released);
      if (st === PState.Alive) this.recoveries.recover(k, true);
    }
  }
}

/** Slot states and membership, read from the control block now. */
export function channelStats(ring: Ring): ChannelStats {
  const c = (off: number) => ring.counter(off);
  return {
    slots: ring.slotCounts(),
    producers: { attached: c(H.producersAttached), live: c(H.producersLive), died: c(H.producersDied) },
    consumers: { attached: c(H.consumersAttached), live: c(H.consumersLive), died: c(H.consumersDied) },
    published: ring.w.load64(H.tail),
  };
}
