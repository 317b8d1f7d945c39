// Taking participants out of the control block: this end leaving, or someone else repairing a
// participant that died (slot-ring.ts, leave()). A repair needs the publish lock for microseconds at a
// time; while a live publisher holds it, the repair is retried every few milliseconds, and given
// up (with a warning) after RECOVERY_GIVE_UP_MS, when the lock belongs to a process that died
// inside it and that nobody here can repair.
//
// Also the GPU side of a death (device slots): fence writes a participant queued die with its
// process, so once that process is gone the survivors raise its fences from the CPU.
import { IpcError } from '../errors.js';
import { processGone } from '../processes.js';
import { Kind, P, S, kindOf, publishFence, releaseFence } from './layout.js';
import type { Ring } from './slot-ring.js';
import { leave } from './ring-recovery.js';
import type { Fences } from './fences.js';

const RETRY_MS = 2;
export const RECOVERY_GIVE_UP_MS = 5000;
/** A dead peer's fences are raised once its process is gone; after this long, it is left alone. */
const FENCE_REPAIR_GIVE_UP_MS = 60_000;

export class Recoveries {
  readonly #ring: Ring;
  /** Participants whose leave or repair waits for the publish lock: since when, and how. */
  readonly #pending = new Map<number, { since: number; died: boolean }>();
  #timer: NodeJS.Timeout | undefined;
  #onIdle: (() => void) | undefined;
  #background = false;

  constructor(ring: Ring) {
    this.#ring = ring;
  }

  get idle(): boolean {
    return this.#pending.size === 0;
  }

  /** Since when this participant's own leave waits for the lock (undefined: it does not). */
  pendingSince(k: number): number | undefined {
    return this.#pending.get(k)?.since;
  }

  has(k: number): boolean {
    return this.#pending.has(k);
  }

  /** Runs `f` once nothing is pending (now, if nothing is); the retries stop holding the
   * process open from then on: the owner closed. */
  whenIdle(f: () => void): void {
    this.#background = true;
    this.#timer?.unref();
    if (this.idle) f();
    else this.#onIdle = f;
  }

  /** Repairs the control block after participant k died (`died`) or left, now or on retry. */
  recover(k: number, died = true): void {
    let r: 'done' | 'not-alive' | 'busy';
    try {
      r = leave(this.#ring, k, died, this.#pending.has(k));
    } catch (e) {
      this.#pending.delete(k);
      process.emitWarning(`cuda-ipc channel: could not recover participant ${k}: ${(e as Error).message}`, { code: 'CUDA_IPC_CHANNEL' });
      this.#idleCheck();
      return;
    }
    if (r === 'busy') {
      if (!this.#pending.has(k)) this.#pending.set(k, { since: performance.now(), died });
      this.#schedule();
      return;
    }
    this.#pending.delete(k);
    this.#idleCheck();
  }

  /**
   * This participant leaves cleanly. The lock is held for microseconds at a time, so this spins
   * for it for up to 50 ms; true when the leave is done (or there was nothing to do). Otherwise
   * it is retried in the background: call again, or wait for whenIdle().
   */
  leaveSelf(): boolean {
    const me = this.#ring.me;
    const deadline = performance.now() + 50;
    for (;;) {
      const r = leave(this.#ring, me, false, this.#pending.has(me));
      if (r !== 'busy') {
        this.#pending.delete(me);
        this.#idleCheck();
        return true;
      }
      if (!this.#pending.has(me)) this.#pending.set(me, { since: performance.now(), died: false });
      if (performance.now() > deadline) {
        this.#schedule();
        return false;
      }
      spinBriefly();
    }
  }

  #schedule(): void {
    if (this.#timer) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      for (const [k, { since, died }] of [...this.#pending]) {
        if (performance.now() - since > RECOVERY_GIVE_UP_MS) {
          this.#pending.delete(k);
          process.emitWarning(`cuda-ipc channel: gave up ${k === this.#ring.me ? 'leaving the channel' : `repairing participant ${k}`}: ` +
            `the publish lock stayed held for ${RECOVERY_GIVE_UP_MS} ms`, { code: 'CUDA_IPC_CHANNEL' });
          continue;
        }
        this.recover(k, died);
      }
      if (!this.idle) this.#schedule();
      this.#idleCheck();
    }, RETRY_MS);
    if (this.#background) this.#timer.unref();
  }

  #idleCheck(): void {
    if (!this.idle || !this.#onIdle) return;
    const f = this.#onIdle;
    this.#onIdle = undefined;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    f();
  }
}

/** The error of an end() whose leave could not get the lock. */
export function lockStuckError(what: string): IpcError {
  return new IpcError('ERR_TIMEOUT', `${what}: the channel's publish lock stayed held for ${RECOVERY_GIVE_UP_MS} ms (a process died inside it and was not repaired)`);
}

/**
 * Participant k's process may have queued GPU writes on its fences (publish, release) that will
 * never run once it is gone, and streams of others may already wait for them: once the process
 * has exited, raise those fences from here. A process still running after its link closed keeps
 * its GPU work, so its own writes land. `mapped()` says whether the caller still maps the block.
 */
export function repairFencesWhenGone(ring: Ring, fences: Fences, k: number, mapped: () => boolean): void {
  const po = ring.partOff(k);
  const pid = ring.view.getUint32(po + P.pid, true);
  const generation = ring.view.getUint32(po + P.generation, true);
  const started = performance.now();
  let delayMs = 1;
  const check = (): void => {
    if (!mapped()) return;
    if (ring.view.getUint32(po + P.generation, true) !== generation) return;  // entry reused
    if (processGone(pid)) {
      raiseFencesOf(ring, fences, k);
      return;
    }
    if (performance.now() - started > FENCE_REPAIR_GIVE_UP_MS) return;
    delayMs = Math.min(delayMs * 2, 100);
    setTimeout(check, delayMs).unref();
  };
  check();
}

function raiseFencesOf(ring: Ring, fences: Fences, k: number): void {
  const w = ring.w;
  for (let s = 0; s < ring.n; s++) {
    const so = ring.slotOff(s);
    const before = w.load32(so + S.state);
    const ticket = ring.view.getUint32(so + S.ticket, true);
    if (ticket === 0) continue;
    // Its release fence can take the slot's newest ticket: a dead participant holds nothing.
    fences.raise(releaseFence(ring.l, s, k), ticket);
    // Its publish fence only for a message that is its own, published (a slot another producer
    // is writing has a ticket whose write is still coming).
    const kind = kindOf(before);
    if ((kind === Kind.Published || kind === Kind.Taken) && ring.view.getUint32(so + S.publisher, true) === k &&
        w.load32(so + S.state) === before && ring.view.getUint32(so + S.ticket, true) === ticket) {
      fences.raise(publishFence(ring.l, s), ticket);
    }
  }
}

/** A short synchronous back-off while another process finishes a microsecond-long critical section. */
function spinBriefly(): void {
  const end = performance.now() + 0.05;
  while (performance.now() < end) { /* spin */ }
}

