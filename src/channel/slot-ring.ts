// The ring protocol over a control block (layout.ts): every operation a participant performs on
// shared state, written so that a participant that dies at any point leaves state that the
// recovery below can repair from the control block alone.
//
// Who changes what:
//  - A slot's state word moves by compare-and-swap only: free -> writing (a producer claims it),
//    writing -> published (inside the publish lock), published -> taken (a work-sharing consumer),
//    taken -> free (its taker releases it), published -> free (the last broadcast holder). The
//    owner byte names who may move it next, which is what recovery reads after a death.
//  - Publishing holds the publish lock (value: publisher index + 1): fill in the slot record,
//    mark it published at position `tail`, write the ring entry, advance `tail`. A publisher that
//    dies inside finds its lock word still set; recovery completes the publish when the slot was
//    already marked published (the commit point) and drops it otherwise.
//  - `head` (work sharing) is only a hint that anyone advances past a taken position, so a taker
//    that dies between taking and advancing blocks nobody.
//  - Plain fields of a slot record (length, meta, ...) are written only by the participant that
//    holds the slot, before the state word change (sequentially consistent) that hands it on.
//  - Wake-ups: every change someone may wait for is followed by a bump of its sequence word (for
//    spinners) and a look at its sleepers word; sleepers are woken through their doorbells
//    (doorbells.ts). Recovery and membership changes ring every live participant's doorbell,
//    because a waker that died between clearing a sleeper's bit and ringing took that wake-up
//    with it.
//
// Values read from shared memory are never trusted: slot indices and positions are range-checked
// and a bad one raises ERR_CHANNEL_CORRUPT, so a hostile or broken peer cannot crash this process.
import { IpcError } from '../errors.js';
import type { NativeSharedWords } from '../native/channel-types.js';
import {
  H, P, S, Kind, PState, PRole, GEN_MASK, genOf, slotWord, kindOf, flagsOf, bitOf, type Layout,
} from './layout.js';

/** Rings participant k's doorbell (Doorbells; a no-op in tests that need no wake-ups). */
export interface Bells {
  ring(k: number): void;
}

/** How long a publisher spins for the publish lock before deferring (µs). */
export const LOCK_SPIN_MICROS = 200;

export function corrupt(what: string): IpcError {
  return new IpcError('ERR_CHANNEL_CORRUPT', `the channel's shared control block is inconsistent (${what}); a peer wrote garbage into it. Close the channel`);
}

export type PublishResult = 'ok' | 'busy' | 'dropped' | 'detached';

export class Ring {
  readonly w: NativeSharedWords;
  readonly view: DataView;
  readonly bytes: Uint8Array;
  readonly l: Layout;
  readonly n: number;
  /** This participant's index. */
  me = 0;
  #hint = 0;
  /** Work sharing: the state word this participant set on each slot it took (for its release). */
  readonly takenWords: Uint32Array;
  /** Work sharing: the position of the message the last successful take() took. */
  takenPosition = 0;
  readonly bells: Bells;
  /** Which sleeping consumer a wake-one starts looking at (so that wake-ups go round). */
  #rotor = 0;
  /** Work sharing: the slot after the one this participant took last (where the next message
   * most likely is). */
  #nextTake = 0;
  /** Consumers: the tail this participant read last. Tail only grows, so positions below it stay
   * published (or taken): the publish line is read again only once they are used up, which lets a
   * consumer that is behind take a batch of messages without pulling the producer's line each time. */
  #tailSeen = 0;
  /** Whether the last successful take() found this end detached right after taking: undefined
   * here (the caller checks); the C ring (c-ring.ts) knows it from its take. */
  takeDetached: boolean | undefined = undefined;

  constructor(words: NativeSharedWords, bytes: Uint8Array, layout: Layout, bells: Bells, me = 0) {
    this.w = words;
    this.bells = bells;
    this.me = me;
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.l = layout;
    this.n = layout.slotCount;
    this.takenWords = new Uint32Array(layout.slotCount);
  }

  /** Releases what this ring holds of its own (the C ring's mapping); the JavaScript ring holds nothing. */
  close(): void {}

  slotOff(s: number): number { return this.l.slotRecordsOffset + s * this.l.slotRecordBytes; }
  partOff(k: number): number { return this.l.participantsOffset + k * 64; }
  ringOff(p: number): number { return this.l.ringOffset + (p % this.n) * 4; }

  #pos(off: number, what: string): number {
    const v = this.w.load64(off);
    if (v < 0) throw corrupt(`${what} out of range`);
    return v;
  }

  // ------------------------------------------------------------------------------------------
  // Wake-ups. A sequence word changes on every event (spinners watch it); sleepers have set their
  // bit in a sleepers word and poll their doorbell. The change itself is always made before the
  // sleepers word is read: with sequentially consistent operations on both sides, either the
  // sleeper's re-check sees the change or this sees the sleeper's bit.

  /** After a publish (or anything a consumer may wait for): wakes one sleeping consumer (work
   * sharing), or all of them (broadcast, or `all`). */
  signalData(all = false): void {
    this.w.add32(H.dataSeq, 1);
    if (this.w.load32(H.dataSleepers) !== 0) this.#wake(H.dataSleepers, all || this.l.broadcast);
  }

  /** After a slot was freed (or anything a producer may wait for): wakes every sleeping producer
   * (an acquire and an end() that waits for releases may both sleep on it). */
  signalSpace(): void {
    this.w.add32(H.spaceSeq, 1);
    if (this.w.load32(H.spaceSleepers) !== 0) this.#wake(H.spaceSleepers, true);
  }

  /** After a membership change or a recovery: bumps both sequences and rings every live
   * participant, asleep or not (a spurious wake-up costs a re-check). */
  wakeEveryone(): void {
    const w = this.w;
    w.add32(H.dataSeq, 1);
    w.add32(H.spaceSeq, 1);
    const asleep = (w.and32(H.dataSleepers, 0) | w.and32(H.spaceSleepers, 0)) >>> 0;
    for (let k = 0; k < this.l.maxParticipants; k++) {
      if ((asleep & bitOf(k)) !== 0 || w.load32(this.partOff(k) + P.state) === PState.Alive) this.bells.ring(k);
    }
  }

  /** Clears sleeper bits in the word at `maskOff` and rings the doorbell of each cleared one:
   * all of them, or the first one this process manages to clear. */
  #wake(maskOff: number, all: boolean): void {
    const w = this.w;
    if (all) {
      const m = w.and32(maskOff, 0);
      for (let k = 0; k < 32; k++) if ((m & bitOf(k)) !== 0) this.bells.ring(k);
      return;
    }
    let m = w.load32(maskOff);
    while (m !== 0) {
      // The first set bit at or after the rotor, else the first one.
      const high = (m & ~(bitOf(this.#rotor) - 1)) >>> 0;
      const pick = high !== 0 ? high : m;
      const k = 31 - Math.clz32(pick & -pick);
      const bit = bitOf(k);
      const old = w.and32(maskOff, ~bit >>> 0);
      if ((old & bit) !== 0) {
        this.#rotor = k + 1 === 32 ? 0 : k + 1;
        this.bells.ring(k);
        return;
      }
      m = (old & ~bit) >>> 0;  // someone else woke k: try another
    }
  }

  /** Marks this participant asleep in the sleepers word at `maskOff` (then re-check, then sleep). */
  enterSleep(maskOff: number): void {
    this.w.or32(maskOff, bitOf(this.me));
  }

  /** Clears this participant's sleeper bit (a waker may have cleared it already). */
  leaveSleep(maskOff: number): void {
    this.w.and32(maskOff, ~bitOf(this.me) >>> 0);
  }

  /** The sleepers word a participant of `role` sleeps in. */
  static sleepersFor(role: number): number {
    return role === PRole.Consumer ? H.dataSleepers : H.spaceSleepers;
  }

  /** The sequence word a participant of `role` spins on. */
  static sequenceFor(role: number): number {
    return role === PRole.Consumer ? H.dataSeq : H.spaceSeq;
  }

  // ------------------------------------------------------------------------------------------
  // Producers

  /** Claims a free slot for writing; -1 when every slot is in flight. */
  claimSlot(): number {
    const mine = slotWord(Kind.Writing, this.me);
    // The slot after the last one claimed is usually free (slots come back in the order they went
    // out): one compare-and-swap claims it. A scan that loads each word first costs a second
    // transfer of the slot's cache line from the consumer that freed it (load shared, then
    // upgrade for the swap).
    let s = this.#hint;
    if (this.w.cas32(this.slotOff(s) + S.state, Kind.Free, mine) !== Kind.Free) {
      s = this.w.claimFirst32(this.slotOff(0) + S.state, this.l.slotRecordBytes, this.n, s, 0xff, Kind.Free, mine);
      if (s < 0) return -1;
    }
    this.#hint = s + 1 === this.n ? 0 : s + 1;
    return s;
  }

  /** True when some slot is free (a scan that changes nothing). */
  hasFree(): boolean {
    return this.w.claimFirst32(this.slotOff(0) + S.state, this.l.slotRecordBytes, this.n, this.#hint, 0xff, Kind.Free, Kind.Free) >= 0;
  }

  /** Returns a claimed but unpublished slot. */
  discard(s: number): void {
    const off = this.slotOff(s) + S.state;
    if (this.w.cas32(off, slotWord(Kind.Writing, this.me), Kind.Free) === slotWord(Kind.Writing, this.me)) this.signalSpace();
  }

  /**
   * Publishes slot `s` (claimed by this participant; its length and meta already written).
   * 'busy': the publish lock stayed taken, nothing changed, try again later. 'dropped': a
   * broadcast channel with no consumer attached; the slot was freed. 'detached': the slot is no
   * longer this participant's (recovery took it back after its link to the hub closed).
   */
  publish(s: number): PublishResult {
    const w = this.w;
    // A free lock is taken with one swap in JS; only a busy one pays for the native spin.
    if (w.cas32(H.lock, 0, this.me + 1) !== 0 && !w.spinCas32(H.lock, 0, this.me + 1, LOCK_SPIN_MICROS)) return 'busy';
    let result: PublishResult = 'ok';
    try {
      const so = this.slotOff(s);
      const t = this.#pos(H.tail, 'tail');
      this.view.setUint32(so + S.publisher, this.me, true);
      this.view.setUint32(so + S.deliveries, 0, true);
      w.store64(so + S.position, t);
      if (this.l.broadcast) {
        const mask = w.load32(H.consumerMask);
        this.view.setUint32(so + S.lastHolders, mask, true);
        w.store32(so + S.holders, mask);
        if (mask === 0) {
          result = w.cas32(so + S.state, slotWord(Kind.Writing, this.me), Kind.Free) === slotWord(Kind.Writing, this.me) ? 'dropped' : 'detached';
          return result;
        }
      }
      // The commit point; a swap rather than a store, so that a slot recovery took back is never
      // published over whoever holds it now.
      if (w.cas32(so + S.state, slotWord(Kind.Writing, this.me), slotWord(Kind.Published, this.me, genOf(t))) !== slotWord(Kind.Writing, this.me)) {
        result = 'detached';
        return result;
      }
      w.store32(this.ringOff(t), s);
      w.store64(H.tail, t + 1);
    } finally {
      w.store32(H.lock, 0);
    }
    if (result === 'ok') this.signalData();
    else if (result === 'dropped') this.signalSpace();
    return result;
  }

  /** The holders of slot `s`'s previous message (broadcast), for release-event waits. */
  lastHolders(s: number): number {
    return this.view.getUint32(this.slotOff(s) + S.lastHolders, true);
  }

  // ------------------------------------------------------------------------------------------
  // Consumers

  /** Work sharing: takes the oldest published message; -1 when there is none. */
  take(): number {
    const w = this.w;
    // Read the state word of the slot that most likely holds the next message (producers claim
    // slots in turn: the one after the last taken) before tail and the ring: its cache line then
    // travels from the producer alongside theirs instead of after the ring entry names it. The
    // value is not used (the word is read again below).
    w.load32(this.slotOff(this.#nextTake) + S.state);
    // Bounded: each round either takes, or advances head past a taken position; a peer that
    // keeps rewinding head cannot hold us here.
    let t = this.#tailSeen;
    for (let round = 0; round < 4 * this.n + 64; round++) {
      let h = this.#pos(H.head, 'head');
      if (h >= t) {
        // Tail first, then head again: both only grow, so a head read after it is at least as
        // fresh, and then t - h <= slots (every position in [head, tail) holds a slot of its own).
        t = this.#tailSeen = this.#pos(H.tail, 'tail');
        h = this.#pos(H.head, 'head');
        if (h >= t) return -1;
      }
      if (t - h > this.n) throw corrupt(`${t - h} messages in a ring of ${this.n} slots`);
      const s = w.load32(this.ringOff(h));
      if (s >= this.n) throw corrupt(`ring entry names slot ${s} of ${this.n}`);
      const so = this.slotOff(s);
      const word = w.load32(so + S.state);
      // The generation in the word ties it to position h: if the slot is consumed and published
      // again before our swap, the word differs and the swap fails (no ABA).
      if (kindOf(word) === Kind.Published && ((word & GEN_MASK) >>> 0) === genOf(h) && w.load64(so + S.position) === h) {
        const taken = slotWord(Kind.Taken, this.me, flagsOf(word));
        if (w.cas32(so + S.state, word, taken) === word) {
          this.takenWords[s] = taken;
          this.takenPosition = h;
          this.#nextTake = s + 1 === this.n ? 0 : s + 1;
          w.cas64(H.head, h, h + 1);
          this.view.setUint32(so + S.deliveries, this.view.getUint32(so + S.deliveries, true) + 1, true);
          return s;
        }
        continue;
      }
      // Position h was taken (its taker may not have advanced head yet): move on.
      w.cas64(H.head, h, h + 1);
    }
    return -1;
  }

  /** Broadcast: the slot published at `cursor`; -1 when nothing is there yet, -2 when the message
   * at cursor is not held for this participant (skip it). */
  peekAt(cursor: number): number {
    let t = this.#tailSeen;
    if (cursor >= t) {
      t = this.#tailSeen = this.#pos(H.tail, 'tail');
      if (cursor >= t) return -1;
    }
    if (t - cursor > this.n) throw corrupt(`${t - cursor} messages ahead of a consumer in a ring of ${this.n} slots`);
    const s = this.w.load32(this.ringOff(cursor));
    if (s >= this.n) throw corrupt(`ring entry names slot ${s} of ${this.n}`);
    const so = this.slotOff(s);
    if (this.w.load64(so + S.position) !== cursor || (this.w.load32(so + S.holders) & (1 << this.me)) === 0) return -2;
    return s;
  }

  /** Work sharing: frees a slot this participant took. False when it no longer held it. */
  releaseTaken(s: number): boolean {
    const word = this.takenWords[s]!;
    if (this.w.cas32(this.slotOff(s) + S.state, word, Kind.Free) !== word) return false;
    this.signalSpace();
    return true;
  }

  /** Broadcast: drops this participant's hold on slot `s`; the last holder frees it. */
  releaseHeld(s: number, k = this.me): boolean {
    const bit = 1 << k;
    const so = this.slotOff(s);
    const old = this.w.and32(so + S.holders, ~bit >>> 0);
    if ((old & bit) === 0) return false;
    if ((old & ~bit) === 0) {
      const word = this.w.load32(so + S.state);
      if (kindOf(word) === Kind.Published) this.w.cas32(so + S.state, word, Kind.Free);
      this.signalSpace();
    }
    return true;
  }

  /** Work sharing: nothing published and untaken. Broadcast: nothing at or after `cursor`. */
  isEmpty(cursor: number): boolean {
    const t = this.#pos(H.tail, 'tail');
    return (this.l.broadcast ? cursor : this.#pos(H.head, 'head')) >= t;  // a stale "empty" is re-checked before parking
  }

  // ------------------------------------------------------------------------------------------
  // Membership (the hub)

  counter(off: number): number { return this.w.load32(off); }

  /** A free participant entry for a new end (`flags`: P flags, e.g. PFLAG_HUB_LOCAL), or -1. */
  allocateParticipant(role: number, pid: number, flags = 0): number {
    for (let k = 1; k < this.l.maxParticipants; k++) {
      const po = this.partOff(k);
      if (this.w.cas32(po + P.state, PState.Empty, PState.Recovering) !== PState.Empty) continue;
      this.view.setUint32(po + P.role, role, true);
      this.view.setUint32(po + P.pid, pid, true);
      this.w.store32(po + P.flags, flags);
      this.w.store64(po + P.cursor, 0);
      this.view.setUint32(po + P.generation, this.view.getUint32(po + P.generation, true) + 1, true);
      return k;
    }
    return -1;
  }

  /**
   * Makes participant k alive in its role. For a broadcast consumer this takes the publish lock
   * (its cursor starts at tail and its bit joins the mask atomically with respect to publishes):
   * false when the lock stayed busy (try again).
   */
  activate(k: number, role: number): boolean {
    const w = this.w;
    const po = this.partOff(k);
    if (role === PRole.Consumer) {
      if (this.l.broadcast) {
        if (!w.spinCas32(H.lock, 0, this.me + 1, LOCK_SPIN_MICROS)) return false;
        try {
          w.store64(po + P.cursor, this.#pos(H.tail, 'tail'));
          w.or32(H.consumerMask, 1 << k);
        } finally {
          w.store32(H.lock, 0);
        }
      } else {
        w.or32(H.consumerMask, 1 << k);
      }
      // live before attached: a reader that sees attached >= expected then sees live too.
      w.add32(H.consumersLive, 1);
      w.add32(H.consumersAttached, 1);
    } else if (role === PRole.Producer) {
      w.add32(H.producersLive, 1);
      w.add32(H.producersAttached, 1);
    }
    w.store32(po + P.state, PState.Alive);
    this.wakeEveryone();
    return true;
  }

  /** Returns an entry that never became alive (the attach failed before activate). */
  freeParticipant(k: number): void {
    const po = this.partOff(k);
    if (this.w.load32(po + P.state) === PState.Recovering) this.w.store32(po + P.state, PState.Empty);
  }

  /** After recovery, lets the hub hand the entry out again. */
  recycleParticipant(k: number): void {
    const po = this.partOff(k);
    const st = this.w.load32(po + P.state);
    if (st === PState.Dead || st === PState.Ended) this.w.cas32(po + P.state, st, PState.Empty);
  }

  participantState(k: number): number { return this.w.load32(this.partOff(k) + P.state); }
  participantRole(k: number): number { return this.view.getUint32(this.partOff(k) + P.role, true); }

  /** Counts of slot states, for stats and tests. */
  slotCounts(): { free: number; writing: number; published: number; taken: number } {
    const c = { free: 0, writing: 0, published: 0, taken: 0 };
    for (let s = 0; s < this.n; s++) {
      switch (kindOf(this.w.load32(this.slotOff(s) + S.state))) {
        case Kind.Free: c.free++; break;
        case Kind.Writing: c.writing++; break;
        case Kind.Published: c.published++; break;
        case Kind.Taken: c.taken++; break;
      }
    }
    return c;
  }

  /** Slots published by `k` that are still published or taken. */
  inFlightFrom(k: number): number {
    let n = 0;
    for (let s = 0; s < this.n; s++) {
      const so = this.slotOff(s);
      const kind = kindOf(this.w.load32(so + S.state));
      if ((kind === Kind.Published || kind === Kind.Taken) && this.view.getUint32(so + S.publisher, true) === k) n++;
    }
    return n;
  }
}
