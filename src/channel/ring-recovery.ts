// Taking a participant out of the ring (docs/channel-protocol.md section 6): the steps on the shared
// control block when an end leaves or died, and the work-sharing redelivery of taken slots. recovery.ts
// decides when and by whom they run (the hub's link closing, a repair retried while a live publisher
// holds the lock); slot-ring.ts holds every other step of the ring. Python: channel/ring_recovery.py.
import { LOCK_SPIN_MICROS, Ring, corrupt } from './slot-ring.js';
import { H, P, S, Kind, PState, PRole, FLAG_REDELIVERED, genOf, slotWord, kindOf, ownerOf, bitOf } from './layout.js';

/** The tail, range-checked (a negative one is garbage from a peer). */
function tailOf(ring: Ring): number {
  const v = ring.w.load64(H.tail);
  if (v < 0) throw corrupt('tail out of range');
  return v;
}

/**
 * Takes participant k out of the channel: it left (`died` false: this process closing its own
 * endpoint) or died (its link closed while it was alive). Idempotent and safe against a second
 * process recovering the same participant (only the one that moves it from alive proceeds).
 *
 * Returns 'done', 'not-alive' (nothing to do), or 'busy' (the publish lock was held by a live
 * publisher: call again later; the entry stays marked as being recovered by this process).
 *
 * What it repairs: the publish lock it died holding (completing a publish that had reached its
 * commit point); slots it was writing (freed: never published); slots it had taken (work
 * sharing: published again at the tail, flagged redelivered); its holds on broadcast messages
 * (dropped; a slot whose last holder it was is freed); its bit in the consumer mask; its
 * sleeper bits; the live/died counters. Then it wakes everyone so that they re-check.
 */
export function leave(ring: Ring, k: number, died: boolean, resuming = false): 'done' | 'not-alive' | 'busy' {
  const w = ring.w;
  const po = ring.partOff(k);
  if (!resuming && w.cas32(po + P.state, PState.Alive, PState.Recovering) !== PState.Alive) return 'not-alive';
  const role = ring.participantRole(k);
  const bit = bitOf(k);

  // 1. The lock it died holding.
  if (w.load32(H.lock) === k + 1) {
    const t = tailOf(ring);
    for (let s = 0; s < ring.n; s++) {
      const so = ring.slotOff(s);
      const word = w.load32(so + S.state);
      // Only the lock holder marks a slot published at position == tail: this one was committed.
      if (kindOf(word) === Kind.Published && w.load64(so + S.position) === t) {
        w.store32(ring.ringOff(t), s);
        w.store64(H.tail, t + 1);
        break;
      }
    }
    w.cas32(H.lock, k + 1, 0);
  }

  // 2. Its slots. A broadcast consumer's bit leaves the mask under the lock (a publish in
  //    progress must not copy a mask that still names it after the slots were scanned); taken
  //    slots are published again under the lock.
  if (ring.l.broadcast) {
    if (role === PRole.Consumer) {
      if (!w.spinCas32(H.lock, 0, ring.me + 1, LOCK_SPIN_MICROS)) return 'busy';
      try {
        w.and32(H.consumerMask, ~bit >>> 0);
      } finally {
        w.store32(H.lock, 0);
      }
    }
  } else {
    w.and32(H.consumerMask, ~bit >>> 0);
    if (holdsTaken(ring, k)) {
      if (!w.spinCas32(H.lock, 0, ring.me + 1, LOCK_SPIN_MICROS)) return 'busy';
      try {
        redeliverTaken(ring, k);
      } finally {
        w.store32(H.lock, 0);
      }
    }
  }
  for (let s = 0; s < ring.n; s++) {
    const so = ring.slotOff(s);
    const word = w.load32(so + S.state);
    const kind = kindOf(word);
    if (kind === Kind.Writing && ownerOf(word) === k) w.cas32(so + S.state, word, Kind.Free);
    else if (ring.l.broadcast && kind === Kind.Published) {
      if ((w.load32(so + S.holders) & bit) !== 0) ring.releaseHeld(s, k);
      else if (w.load32(so + S.holders) === 0) w.cas32(so + S.state, word, Kind.Free);  // its last holder died mid-release
    }
  }

  // 3. Sleeper bits and counters.
  w.and32(H.dataSleepers, ~bit >>> 0);
  w.and32(H.spaceSleepers, ~bit >>> 0);
  if (role === PRole.Producer) {
    w.add32(H.producersLive, -1);
    if (died) w.add32(H.producersDied, 1);
  } else if (role === PRole.Consumer) {
    w.add32(H.consumersLive, -1);
    if (died) w.add32(H.consumersDied, 1);
  }
  w.store32(po + P.state, died ? PState.Dead : PState.Ended);
  ring.wakeEveryone();
  return 'done';
}

/** Work sharing: publishes slot `s`, which this participant took, again (flagged redelivered).
 * False when the lock stayed busy for 50 ms. */
export function returnTaken(ring: Ring, s: number): boolean {
  const deadline = performance.now() + 50;
  while (!ring.w.spinCas32(H.lock, 0, ring.me + 1, LOCK_SPIN_MICROS)) if (performance.now() > deadline) return false;
  try {
    redeliverTaken(ring, ring.me, s);
  } finally {
    ring.w.store32(H.lock, 0);
  }
  ring.signalData();
  return true;
}

function holdsTaken(ring: Ring, k: number): boolean {
  for (let s = 0; s < ring.n; s++) {
    const word = ring.w.load32(ring.slotOff(s) + S.state);
    if (kindOf(word) === Kind.Taken && ownerOf(word) === k) return true;
  }
  return false;
}

/** With the lock held: publishes every slot k had taken (or just `only`) again, at the tail, flagged. */
function redeliverTaken(ring: Ring, k: number, only = -1): void {
  const w = ring.w;
  for (let s = 0; s < ring.n; s++) {
    if (only >= 0 && s !== only) continue;
    const so = ring.slotOff(s);
    const word = w.load32(so + S.state);
    if (kindOf(word) !== Kind.Taken || ownerOf(word) !== k) continue;
    const pos = w.load64(so + S.position);
    if (pos >= 0) w.cas64(H.head, pos, pos + 1);  // it took it but had not advanced head
    const t = tailOf(ring);
    w.store64(so + S.position, t);
    const publisher = ring.view.getUint32(so + S.publisher, true) & 0xff;
    if (w.cas32(so + S.state, word, slotWord(Kind.Published, publisher, FLAG_REDELIVERED | genOf(t))) !== word) continue;
    w.store32(ring.ringOff(t), s);
    w.store64(H.tail, t + 1);
  }
}
