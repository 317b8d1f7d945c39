// The ring protocol itself, with several participants simulated in one process over one control
// block, and deaths injected at exact points (inside the publish lock, between taking a message
// and advancing head, halfway through a broadcast release).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { addon } from '../../src/native/addon.js';
import { HostBuffer } from '../../src/host/index.js';
import { Ring } from '../../src/channel/slot-ring.js';
import { leave } from '../../src/channel/ring-recovery.js';
import { computeLayout, writeHeader, H, P, S, PRole, PState, Kind, slotWord } from '../../src/channel/layout.js';

function block(slotCount: number, broadcast = false, producers = 1, consumers = 1) {
  const l = computeLayout({ slotCount, slotBytes: 64, metaBytes: 0, maxParticipants: 8, device: false, broadcast });
  const hb = HostBuffer.allocate(l.totalBytes);
  writeHeader(new DataView(hb.bytes.buffer), l, producers, consumers);
  const words = new addon.SharedWords(hb.fd, l.totalBytes);
  const layout = { ...l, expectProducers: producers, expectConsumers: consumers };
  const bells = { rung: [] as number[], ring(k: number) { this.rung.push(k); } };
  const hub = new Ring(words, hb.bytes, layout, bells);  // participant 0: the hub
  hub.w.store32(hub.partOff(0) + P.role, PRole.Hub);
  hub.w.store32(hub.partOff(0) + P.state, PState.Alive);
  const join = (role: number) => {
    const k = hub.allocateParticipant(role, process.pid);
    assert.ok(hub.activate(k, role));
    return new Ring(words, hb.bytes, layout, bells, k);
  };
  const close = () => { words.close(); hb.close(); };
  return { l, hub, join, close, w: words, bells };
}

function publish(r: Ring, n = 1): number[] {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const s = r.claimSlot();
    assert.ok(s >= 0, 'a free slot');
    assert.equal(r.publish(s), 'ok');
    out.push(s);
  }
  return out;
}

test('work sharing: two producers, two consumers; every position taken once, in order', () => {
  const { hub, join, close } = block(4, false, 2, 2);
  const p1 = join(PRole.Producer), p2 = join(PRole.Producer), c1 = join(PRole.Consumer), c2 = join(PRole.Consumer);
  const seen: number[] = [];
  for (let round = 0; round < 500; round++) {
    publish(round % 2 ? p1 : p2, 1 + (round % 2));
    for (const c of round % 3 ? [c1, c2] : [c2, c1]) {
      const s = c.take();
      if (s < 0) continue;
      seen.push(hub.w.load64(hub.slotOff(s) + S.position));
      assert.ok(c.releaseTaken(s));
    }
    for (let s = c1.take(); s >= 0; s = c1.take()) {
      seen.push(hub.w.load64(hub.slotOff(s) + S.position));
      c1.releaseTaken(s);
    }
  }
  assert.deepEqual(seen, Array.from({ length: seen.length }, (_, i) => i), 'positions 0, 1, 2, ... each once');
  assert.equal(seen.length, hub.w.load64(H.tail));
  close();
});

test('a publisher dead inside the lock: a committed publish is completed, an uncommitted one dropped', () => {
  const { hub, join, close } = block(4);
  const p = join(PRole.Producer), c = join(PRole.Consumer);
  // Committed: state published at position == tail, the ring entry and tail not yet written.
  let s = p.claimSlot();
  hub.w.store32(H.lock, p.me + 1);
  hub.w.store64(hub.slotOff(s) + S.position, 0);
  hub.w.store32(hub.slotOff(s) + S.state, slotWord(Kind.Published, p.me));
  assert.equal(c.take(), -1, 'not visible yet');
  assert.equal(leave(hub, p.me, true), 'done');
  assert.equal(hub.w.load32(H.lock), 0, 'the lock is free again');
  assert.equal(c.take(), s, 'the committed message is delivered');
  c.releaseTaken(s);
  // Uncommitted: it died after claiming and taking the lock, before the commit point.
  const p2 = join(PRole.Producer);
  s = p2.claimSlot();
  hub.w.store32(H.lock, p2.me + 1);
  hub.w.store64(hub.slotOff(s) + S.position, 1);
  assert.equal(leave(hub, p2.me, true), 'done');
  assert.equal(hub.w.load32(H.lock), 0);
  assert.equal(c.take(), -1, 'nothing half-written is delivered');
  assert.deepEqual(hub.slotCounts(), { free: 4, writing: 0, published: 0, taken: 0 });
  assert.equal(hub.counter(H.producersDied), 2);
  close();
});

test('a consumer dead between taking and advancing head: others move on; its message comes again, flagged', () => {
  const { hub, join, close } = block(4, false, 1, 2);
  const p = join(PRole.Producer), c1 = join(PRole.Consumer), c2 = join(PRole.Consumer);
  publish(p, 3);
  // c1 takes position 0 by hand and "dies" before advancing head.
  const s0 = hub.w.load32(hub.ringOff(0));
  const word = hub.w.load32(hub.slotOff(s0) + S.state);
  assert.equal(hub.w.cas32(hub.slotOff(s0) + S.state, word, slotWord(Kind.Taken, c1.me)), word);
  assert.equal(hub.w.load64(H.head), 0);
  const a = c2.take();
  assert.notEqual(a, s0, 'c2 skips the taken position');
  assert.equal(leave(hub, c1.me, true), 'done');
  const got = [a, c2.take(), c2.take()];
  assert.equal(c2.take(), -1);
  assert.deepEqual([...got].sort(), [0, 1, 2].map((i) => hub.w.load32(hub.ringOff(i))).sort(), 'all three, once each');
  const redelivered = got.filter((s) => (c2.takenWords[s]! & (1 << 16)) !== 0);
  assert.deepEqual(redelivered, [s0], 'exactly the dead consumer\'s message is flagged');
  close();
});

test('broadcast: a consumer dead halfway through releasing the last hold; the slot is freed by recovery', () => {
  const { hub, join, close } = block(2, true, 1, 2);
  const p = join(PRole.Producer), c1 = join(PRole.Consumer), c2 = join(PRole.Consumer);
  const [s] = publish(p, 1);
  assert.equal(hub.w.load32(hub.slotOff(s!) + S.holders), (1 << c1.me) | (1 << c2.me));
  assert.ok(c2.releaseHeld(s!));
  // c1 clears its bit (holders 0) and dies before marking the slot free.
  hub.w.and32(hub.slotOff(s!) + S.holders, ~(1 << c1.me) >>> 0);
  assert.equal(hub.slotCounts().published, 1);
  assert.equal(leave(hub, c1.me, true), 'done');
  assert.equal(hub.slotCounts().free, 2);
  // Later messages are no longer held for it.
  const [t] = publish(p, 1);
  assert.equal(hub.w.load32(hub.slotOff(t!) + S.holders), 1 << c2.me);
  close();
});

test('recovery waits for a live publisher\'s lock instead of breaking it', () => {
  const { hub, join, close } = block(2, false, 1, 1);
  const p = join(PRole.Producer), c = join(PRole.Consumer);
  publish(p, 1);
  assert.ok(c.take() >= 0);
  hub.w.store32(H.lock, p.me + 1);  // p is alive and publishing
  assert.equal(leave(hub, c.me, true), 'busy', 'redelivery needs the lock');
  assert.equal(hub.participantState(c.me), PState.Recovering);
  hub.w.store32(H.lock, 0);
  assert.equal(leave(hub, c.me, true, true), 'done', 'resumed once the lock is free');
  assert.equal(leave(hub, c.me, true), 'not-alive', 'idempotent');
  assert.equal(hub.counter(H.consumersDied), 1);
  close();
});

test('wake-ups: a sleeper set in the sleepers word is rung once; work sharing wakes one, broadcast and space wake all', () => {
  for (const broadcast of [false, true]) {
    const { hub, join, close, bells } = block(4, broadcast, 1, 2);
    const p = join(PRole.Producer), c1 = join(PRole.Consumer), c2 = join(PRole.Consumer);
    bells.rung.length = 0;
    publish(p, 1);
    assert.deepEqual(bells.rung, [], 'nobody asleep: no doorbell rung');
    c1.enterSleep(H.dataSleepers);
    c2.enterSleep(H.dataSleepers);
    publish(p, 1);
    if (broadcast) {
      assert.deepEqual(bells.rung.sort(), [c1.me, c2.me], 'broadcast: every sleeping consumer');
      assert.equal(hub.w.load32(H.dataSleepers), 0);
    } else {
      assert.equal(bells.rung.length, 1, 'work sharing: one sleeping consumer per message');
      publish(p, 1);
      assert.deepEqual(bells.rung.sort(), [c1.me, c2.me], 'the next message wakes the other');
      publish(p, 1);
      assert.equal(bells.rung.length, 2, 'nobody left asleep');
    }
    // A producer asleep for space is rung by a release.
    bells.rung.length = 0;
    p.enterSleep(H.spaceSleepers);
    const s = broadcast ? c1.peekAt(0) : c1.take();
    if (broadcast) c1.releaseHeld(s);
    else c1.releaseTaken(s);
    if (broadcast) assert.deepEqual(bells.rung, [], 'broadcast: the slot is still held by c2');
    else assert.deepEqual(bells.rung, [p.me]);
    close();
  }
});

test('wake-ups: recovery rings every live participant, asleep or not, and clears the dead one\'s bits', () => {
  const { hub, join, close, bells } = block(4, false, 1, 2);
  const p = join(PRole.Producer), c1 = join(PRole.Consumer), c2 = join(PRole.Consumer);
  c1.enterSleep(H.dataSleepers);
  c2.enterSleep(H.dataSleepers);
  bells.rung.length = 0;
  assert.equal(leave(hub, c2.me, true), 'done');
  assert.deepEqual(bells.rung.sort(), [hub.me, p.me, c1.me].sort(), 'every live participant; not the dead one');
  assert.equal(hub.w.load32(H.dataSleepers), 0);
  close();
});
