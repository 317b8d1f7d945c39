// Channels when a process dies: its slots come back, work-sharing messages it held are delivered
// again (flagged), a dead producer ends its consumers with ERR_PEER_GONE after what it published.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { spawn, type Link, type SpawnedChild } from '../../src/link/index.js';
import { ChannelHub, acceptChannel, type ChannelProducer } from '../../src/channel/index.js';
import { waitStatsOf } from '../helpers/channel-internals.js';
import { writePayload, readPayload } from '../fixtures/channel-payload.js';
import { waitUntil } from '../helpers/wait.js';

const CHILD = new URL('../fixtures/channel-child.js', import.meta.url);
const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;

function reply(link: Link, ms = 30_000): Promise<any> {
  return link.receive({ signal: AbortSignal.timeout(ms) });
}

async function produce(ch: ChannelProducer, from: number, to: number): Promise<void> {
  for (let i = from; i < to; i++) {
    const slot = await ch.acquire();
    ch.publish(slot, { length: writePayload(slot.bytes, i, 0) });
  }
}

async function exited(s: SpawnedChild): Promise<void> {
  if (s.child.exitCode === null && s.child.signalCode === null) await once(s.child, 'exit');
}

async function kill(s: SpawnedChild): Promise<void> {
  const exit = once(s.child, 'exit');
  s.child.kill('SIGKILL');
  await exit;
}

test('work sharing: a consumer SIGKILLed holding messages; they are redelivered, flagged, exactly once', async () => {
  const total = 2000;
  using hub = ChannelHub.create({ slots: 8, slotBytes: 64, consumers: 3 });
  const ch = hub.producer();
  const victim = await spawn(CHILD, ['hold', '3']);
  await hub.attach(victim.link, { role: 'consumer' });
  await produce(ch, 0, 3);
  const held = (await reply(victim.link)).held as number[];
  assert.deepEqual(held, [0, 1, 2]);
  const workers: SpawnedChild[] = [];
  for (let i = 0; i < 2; i++) {
    const w = await spawn(CHILD, ['worker']);
    await hub.attach(w.link, { role: 'consumer' });
    workers.push(w);
  }
  await produce(ch, 3, 500);
  await kill(victim);
  await produce(ch, 500, total);
  await ch.end();
  const seen = new Array<number>(total).fill(0);
  const redelivered: number[] = [];
  for (const w of workers) {
    const r = await reply(w.link);
    assert.equal(r.error, undefined);
    for (const mark of r.seqs as number[]) {
      const seq = mark < 0 ? -mark - 1 : mark;
      if (mark < 0) redelivered.push(seq);
      seen[seq]!++;
    }
    await exited(w);
  }
  assert.deepEqual(redelivered.sort((a, b) => a - b), held, 'exactly the held messages came again, flagged');
  assert.ok(seen.every((n) => n === 1), 'every message delivered once (the victim never finished its three)');
});

test('work sharing: a consumer SIGKILLed at a random point mid-stream; nothing lost, nothing doubled unflagged', async () => {
  for (let round = 0; round < 3; round++) {
    const total = 1500;
    const hub = ChannelHub.create({ slots: 6, slotBytes: 64, consumers: 3 });
    const ch = hub.producer();
    const kids: SpawnedChild[] = [];
    for (let i = 0; i < 3; i++) {
      // Each reports a message as done just before releasing it (so a report can precede a
      // death, never follow one), and dawdles a little so that it usually holds one.
      const k = await spawn(CHILD, ['worker', i === 0 ? '1' : '0', '1']);
      await hub.attach(k.link, { role: 'consumer' });
      kids.push(k);
    }
    const reports = new Map<number, number[]>();
    kids.forEach((k, i) => {
      reports.set(i, []);
      k.link.on('message', (m: any) => { if (typeof m?.seq === 'number') reports.get(i)!.push(m.seq); });
    });
    const killAt = 200 + Math.floor(Math.random() * 600);
    await produce(ch, 0, killAt);
    await kill(kids[0]!);
    await produce(ch, killAt, total);
    await ch.end();
    for (const k of kids.slice(1)) await exited(k);
    const count = new Array<number>(total).fill(0);
    const flagged = new Set<number>();
    for (const list of reports.values()) {
      for (const mark of list) {
        const seq = mark < 0 ? -mark - 1 : mark;
        count[seq]!++;
        if (mark < 0) flagged.add(seq);
      }
    }
    for (let s = 0; s < total; s++) {
      assert.ok(count[s]! >= 1, `round ${round}: message ${s} was lost (killed at ${killAt})`);
      if (count[s]! > 1) assert.ok(flagged.has(s) && count[s] === 2, `round ${round}: message ${s} seen ${count[s]} times, flagged: ${flagged.has(s)}`);
    }
    assert.ok(ch.closed, 'end() closed the producer');
    hub.close();
  }
});

test('a producer (not the hub) SIGKILLed: the consumer gets what it published, then ERR_PEER_GONE; its slots come back', async () => {
  using hub = ChannelHub.create({ slots: 16, slotBytes: 64 });
  const ch = hub.consumer();
  const p = await spawn(CHILD, ['produce-and-hang', '10']);
  await hub.attach(p.link, { role: 'producer' });
  assert.equal((await reply(p.link)).produced, 10);
  assert.deepEqual(ch.stats().slots, { free: 5, writing: 1, published: 10, taken: 0 });
  await kill(p);
  const seqs: number[] = [];
  await assert.rejects(async () => {
    for await (const msg of ch) {
      seqs.push(readPayload(msg.bytes).seq);
      msg.release();
    }
  }, code('ERR_PEER_GONE'));
  assert.deepEqual(seqs, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  const s = ch.stats();
  assert.deepEqual(s.slots, { free: 16, writing: 0, published: 0, taken: 0 }, 'the slot it was writing is free again');
  assert.deepEqual(s.producers, { attached: 1, live: 0, died: 1 });
  await assert.rejects(ch.receive(), code('ERR_PEER_GONE'), 'the end is sticky');
  ch.close();
});

test('the hub producer SIGKILLed: its consumer gets what it published, then ERR_PEER_GONE', async () => {
  const p = await spawn(CHILD, ['hub-produce', '12']);
  const ch = await acceptChannel(p.link, { role: 'consumer' });
  assert.equal((await reply(p.link)).produced, 12);
  await kill(p);
  const seqs: number[] = [];
  let error: unknown;
  try {
    for await (const msg of ch) {
      seqs.push(readPayload(msg.bytes).seq);
      msg.release();
    }
  } catch (e) {
    error = e;
  }
  assert.ok(code('ERR_PEER_GONE')(error), String(error));
  assert.deepEqual(seqs, Array.from({ length: 12 }, (_, i) => i));
  ch.close();
});

test('broadcast: a consumer SIGKILLed while holding slots no longer blocks the producer', async () => {
  const total = 400;
  using hub = ChannelHub.create({ slots: 4, slotBytes: 64, topology: 'broadcast', consumers: 3 });
  const ch = hub.producer();
  const victim = await spawn(CHILD, ['hold', '2']);
  await hub.attach(victim.link, { role: 'consumer' });
  const others: SpawnedChild[] = [];
  for (let i = 0; i < 2; i++) {
    const k = await spawn(CHILD, ['consume']);
    await hub.attach(k.link, { role: 'consumer' });
    others.push(k);
  }
  await produce(ch, 0, 4);
  assert.deepEqual((await reply(victim.link)).held, [0, 1]);
  // The victim stopped reading: every slot stays held for it, so the producer waits...
  let done = false;
  const slept = waitStatsOf(ch).sleeps;
  const rest = produce(ch, 4, total).then(() => { done = true; });
  // The producer going to sleep for a slot is the event; then it must not have finished.
  await waitUntil(() => waitStatsOf(ch).sleeps > slept || done, 'the producer to sleep waiting for a slot');
  assert.equal(done, false, 'the producer is held back by the stalled consumer');
  // ...until it dies and its holds are dropped.
  await kill(victim);
  await rest;
  await ch.end();
  for (const k of others) {
    const r = await reply(k.link);
    assert.equal(r.done.error, undefined);
    assert.equal(r.done.count, total);
    await exited(k);
  }
});

/**
 * Resolves once `end`'s waiter has gone to sleep: it counts the sleep in the same synchronous step
 * that set its sleeper bit and started polling its doorbell (waiter.ts sleep()), so nothing more
 * needs to pass.
 */
async function asleep(end: object): Promise<void> {
  await waitUntil(() => waitStatsOf(end).sleeps > 0, 'the end to sleep on its doorbell');
}

for (const wait of ['adaptive', 'sleep', 'spin'] as const) {
  test(`every consumer killed while the producer sleeps (${wait}): its doorbell wakes it, acquire rejects with ERR_PEER_GONE`, async (t) => {
    using hub = ChannelHub.create({ slots: 2, slotBytes: 64 });
    const ch = hub.producer({ wait });
    const c = await spawn(CHILD, ['hold', '2']);
    await hub.attach(c.link, { role: 'consumer' });
    await produce(ch, 0, 2);
    await reply(c.link);
    const pending = assert.rejects(ch.acquire(), code('ERR_PEER_GONE'));
    await asleep(ch);
    const t0 = performance.now();
    await kill(c);
    // Its two messages are published again; nobody is left to take them.
    await pending;
    t.diagnostic(`noticed ${(performance.now() - t0).toFixed(1)} ms after the kill was sent`);
    assert.deepEqual(ch.stats().consumers, { attached: 1, live: 0, died: 1 });
    const st = waitStatsOf(ch);
    assert.ok(st.rung >= 1 && st.rescued === 0, `woken by the doorbell, not the backstop timer: ${JSON.stringify(st)}`);
  });
}

test('a producer killed while the consumer sleeps: the hub\'s recovery rings its doorbell; receive rejects with ERR_PEER_GONE', async (t) => {
  using hub = ChannelHub.create({ slots: 4, slotBytes: 64 });
  const ch = hub.consumer();
  const p = await spawn(CHILD, ['produce-and-hang', '0']);
  await hub.attach(p.link, { role: 'producer' });
  assert.equal((await reply(p.link)).produced, 0);
  const pending = assert.rejects(ch.receive(), code('ERR_PEER_GONE'));
  await asleep(ch);
  const t0 = performance.now();
  await kill(p);
  await pending;
  t.diagnostic(`noticed ${(performance.now() - t0).toFixed(1)} ms after the kill was sent`);
  const st = waitStatsOf(ch);
  assert.ok(st.rung >= 1 && st.rescued === 0, `woken by the doorbell, not the backstop timer: ${JSON.stringify(st)}`);
});

test('the hub killed while its peer sleeps: the peer notices through its link, repairs the hub\'s entries, wakes itself', async (t) => {
  const p = await spawn(CHILD, ['hub-idle']);
  const ch = await acceptChannel(p.link, { role: 'consumer' });
  assert.deepEqual(await reply(p.link), { ready: true });
  const pending = assert.rejects(ch.receive(), code('ERR_PEER_GONE'));
  await asleep(ch);
  const t0 = performance.now();
  await kill(p);
  await pending;
  t.diagnostic(`noticed ${(performance.now() - t0).toFixed(1)} ms after the kill was sent`);
  assert.deepEqual(ch.stats().producers, { attached: 1, live: 0, died: 1 }, 'the hub\'s own producer end was recovered as dead');
  const st = waitStatsOf(ch);
  assert.ok(st.rung >= 1 && st.rescued === 0, `woken by the doorbell, not the backstop timer: ${JSON.stringify(st)}`);
  ch.close();
});
