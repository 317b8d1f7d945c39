// How an end waits for the control block to change: spin briefly on the event loop's thread,
// then sleep on its doorbell (an eventfd polled by the event loop itself: one hop to wake up).
//
// Wait modes:
//  - 'adaptive' (default): spin for up to `spinMicros` (default 10 us) while recent waits mostly
//    ended within that bound (a peer answering within microseconds: the spin saves a wake-up, and
//    a spin that succeeds burns only the wait itself), then sleep. A wait that did not spin and
//    still ended within the bound counts as such a wait too. Once most recent waits outlast the
//    bound (an idle peer), it stops spinning, apart from a probe every PROBE_EVERY waits that
//    notices when waits get short again; one probe that catches an answer turns spinning back on.
//    So the CPU it burns in vain is bounded by the spin bound per wait while waits are short, and
//    by a sixteenth of it while they are long.
//  - 'sleep': never spin (the least CPU).
//  - 'spin': always spin for `spinMicros` (default 50 us), then sleep.
// Spinning blocks this thread's event loop for at most the bound. A wait is spin() (synchronous:
// receive() and acquire() call it before they queue anything, so a wait that ends while spinning
// costs no promise) and, if that runs out, sleep(); park() is both.
//
// What a spinning round trip costs is mostly cache lines, not code: each message moves about ten
// lines between the two cores one after the other (the slot's state word, the producer and
// consumer header lines, the ring entry, the data), so its time follows the machine's
// core-to-core latency (the bench's spin floor measures it).
//
// Sleeping: set this end's bit in the sleepers word, re-check, then poll the doorbell; a waker
// clears the bit and rings (slot-ring.ts). A timer re-checks after WAIT_BACKSTOP_MS in any case, so
// that a wake-up lost with a process that died while ringing costs a second, not a hang; a
// backstop that finds the condition met is counted (`rescued`): it should never happen.
import { IpcError } from '../errors.js';
import { addon } from '../native/addon.js';
import type { NativeDoorbell, NativeSharedWords } from '../native/channel-types.js';
import type { Ring } from './slot-ring.js';

/** How an end waits: see ChannelWaitOptions.wait. */
export type WaitMode = 'adaptive' | 'sleep' | 'spin';

/** An end's wait mode and spin bound, as checked from its ChannelWaitOptions. */
export interface WaitPolicy {
  mode: WaitMode;
  /** 'adaptive': the most it spins; 'spin': how long it spins. Microseconds. */
  spinMicros: number;
}

export const DEFAULT_ADAPTIVE_SPIN_MICROS = 10;
export const DEFAULT_SPIN_MICROS = 50;
export const MAX_SPIN_MICROS = 100_000;
const WAIT_BACKSTOP_MS = 1000;
/** #waitStart of a wait that spun its whole bound (so it did not end within it). */
const OUTLASTED = -1;
/** Adaptive: while not spinning, one wait in this many spins the whole bound (a probe). */
const PROBE_EVERY = 16;
/** Adaptive: it spins while at least this share of recent waits ended within the bound. */
const MIN_HIT_RATE = 0.3;
/** Adaptive: the share a hit raises it to at least (spinning resumes for the next few waits). */
const HIT_RATE_AFTER_HIT = 0.55;

/** Counts of how waits ended, for tests and benchmarks. */
export interface WaitStats {
  /** Waits that ended while spinning. */
  spinHits: number;
  /** Spins that ran out (a sleep followed). A wait spins once at most. */
  spinMisses: number;
  /** Waits that went to sleep (bit set, doorbell polled). */
  sleeps: number;
  /** Sleeps ended by the doorbell. */
  rung: number;
  /** Sleeps ended by the backstop timer with the condition met: a lost wake-up. */
  rescued: number;
}

export class Waiter {
  readonly #ring: Ring;
  readonly #words: NativeSharedWords;
  readonly #policy: WaitPolicy;
  readonly #doorbell: NativeDoorbell;
  #resolve: ((status: number) => void) | undefined;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;
  /** Adaptive: the share of recent waits that ended within the spin bound (an exponential average). */
  #hits = 1;
  #waits = 0;
  /** Adaptive: when the current wait began (performance.now()), for sleep()'s learning; 0 when
   * not timed, OUTLASTED once it spun its bound in vain. */
  #waitStart = 0;
  readonly stats: WaitStats = { spinHits: 0, spinMisses: 0, sleeps: 0, rung: 0, rescued: 0 };

  /** Waits for participant `ring.me`, whose doorbell is `fd` (borrowed). */
  constructor(ring: Ring, fd: number, policy: WaitPolicy) {
    this.#ring = ring;
    this.#words = ring.w;
    this.#policy = policy;
    this.#doorbell = new addon.Doorbell(fd, (status) => this.#wake(status));
  }

  get policy(): WaitPolicy {
    return this.#policy;
  }

  /**
   * Returns once `ready()` may have become true: the sequence word at `seqOff` changed, or this
   * end was woken (possibly spuriously: re-check), or cancel()/close() was called. Rejects only
   * when polling the doorbell failed. `spun`: the caller has just spun (spin() returned false),
   * so this goes straight to sleep.
   */
  async park(seqOff: number, sleepersOff: number, ready: () => boolean, spun = false): Promise<void> {
    if (spun ? ready() : this.spin(seqOff, ready)) return;
    await this.sleep(sleepersOff, ready);
  }

  /**
   * The first half of a wait, synchronous: true when `ready()` holds or the sequence word at
   * `seqOff` changed while spinning (re-check), false when the spin budget ran out (or the policy
   * does not spin now): then sleep(). The callers' fast paths spin here before they allocate a
   * pending request, so that a wait that ends while spinning costs no promise and no microtask.
   */
  spin(seqOff: number, ready: () => boolean): boolean {
    if (this.#closed) return true;
    const w = this.#words;
    // Read before ready(): a change after the check moves the word, which ends the spin at once.
    const seq = w.load32(seqOff);
    if (ready()) return true;
    const budget = this.#budget();
    if (budget > 0) {
      if (w.spinWait32(seqOff, seq, budget)) {
        this.stats.spinHits++;
        this.#learn(true);
        return true;
      }
      this.stats.spinMisses++;
      // The wait has outlasted the spin bound already: sleep() learns that without a clock read.
      this.#waitStart = OUTLASTED;
    } else {
      // Adaptive, not spinning: whether the wait ends within the bound anyway (only the wake-up
      // was slow) decides whether spinning would pay. Timed from here; a spin hit needs no clock.
      this.#waitStart = this.#policy.mode === 'adaptive' ? performance.now() : 0;
    }
    return false;
  }

  /** The second half of a wait (after spin() returned false): sleep on the doorbell. */
  async sleep(sleepersOff: number, ready: () => boolean): Promise<void> {
    if (this.#closed) return;
    const t0 = this.#waitStart;
    this.#waitStart = 0;
    this.#ring.enterSleep(sleepersOff);
    let status = 0;
    try {
      if (ready() || this.#closed) return;
      this.stats.sleeps++;
      status = await this.#sleep();
      if (status === 0) this.stats.rung++;
      else if (status === 1 && ready()) this.stats.rescued++;
    } finally {
      if (!this.#closed) this.#ring.leaveSleep(sleepersOff);
      // A wait that ended within the bound although it slept (it did not spin: the peer answered
      // that fast, only the wake-up was slow) says spinning would have caught it.
      this.#learn(t0 > 0 && (performance.now() - t0) * 1000 <= this.#policy.spinMicros);
    }
    if (status < 0) throw new IpcError('ERR_CHANNEL_CORRUPT', `waiting on the channel's doorbell failed (errno ${-status})`);
  }

  /** Ends a pending sleep now (the waiter re-checks). */
  cancel(): void {
    this.#wake(2);
  }

  /** Ends any sleep and stops polling. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#timer);
    this.#doorbell.close();
    this.#wake(2);
  }

  // Spin budget for the next wait, in microseconds.
  #budget(): number {
    const { mode, spinMicros } = this.#policy;
    if (mode === 'spin') return spinMicros;
    if (mode === 'sleep' || spinMicros === 0) return 0;
    if (this.#hits >= MIN_HIT_RATE) return spinMicros;
    return ++this.#waits % PROBE_EVERY === 0 ? spinMicros : 0;
  }

  // One hit turns spinning back on at once (a probe caught an answer: the peer is awake), and
  // keeps it on for a few misses; a run of misses turns it off.
  #learn(hit: boolean): void {
    if (hit) this.#hits = Math.max(this.#hits + (1 - this.#hits) / 8, HIT_RATE_AFTER_HIT);
    else this.#hits -= this.#hits / 8;
  }

  /** 0 rung, 1 backstop timer, 2 cancelled; negative: -errno from polling. */
  #sleep(): Promise<number> {
    if (this.#resolve) throw new Error('cuda-ipc internal: a channel wait is already pending');
    return new Promise<number>((resolve) => {
      this.#resolve = resolve;
      this.#doorbell.ref();
      if (this.#timer) this.#timer.refresh();
      else this.#timer = setTimeout(() => this.#wake(1), WAIT_BACKSTOP_MS).unref();
    });
  }

  #wake(status: number): void {
    const resolve = this.#resolve;
    if (!resolve) return;
    this.#resolve = undefined;
    if (!this.#closed) this.#doorbell.unref();
    resolve(status);
  }
}
