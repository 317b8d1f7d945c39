// Channels on host memory: ordering, loss and duplicates, backpressure, topologies, wait modes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { spawn, type Link, type SpawnedChild } from '../../src/link/index.js';
import {
  ChannelHub, createChannel, acceptChannel, type ChannelProducer, type ChannelSlot, type WaitMode,
} from '../../src/channel/index.js';
import { waitStatsOf } from '../helpers/channel-internals.js';
import { writePayload, readPayload } from '../fixtures/channel-payload.js';
import { randomPauses } from '../fixtures/channel-pauses.js';
import { argError } from '../helpers/arg-error.js';
import { waitUntil } from '../helpers/wait.js';

const CHILD = new URL('../fixtures/channel-child.js', import.meta.url);
const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;

async function child(args: string[], wait: WaitMode = 'adaptive'): Promise<SpawnedChild> {
  return spawn(CHILD, args, { env: { ...process.env, CHANNEL_WAIT: wait } });
}

function reply(link: Link, ms = 60_000): Promise<any> {
  return link.receive({ signal: AbortSignal.timeout(ms) });
}

async function produce(ch: ChannelProducer, from: number, to: number, id = 0, metaEvery = 1000): Promise<void> {
  for (let i = from; i < to; i++) {
    const slot = await ch.acquire();
    const length = writePayload(slot.bytes, i, id);
    ch.publish(slot, { length, ...(i % metaEvery === 0 ? { meta: { seq: i } } : {}) });
  }
}

async function exited(s: SpawnedChild): Promise<void> {
  if (s.child.exitCode === null && s.child.signalCode === null) await once(s.child, 'exit');
}

test('1,000,000 messages one way: order kept, no loss, no duplicate, every checksum right', async () => {
  const n = 1_000_000;
  const c = await child(['consume']);
  const ch = await createChannel(c.link, { role: 'producer', slots: 64, slotBytes: 64 });
  const t0 = performance.now();
  await produce(ch, 0, n);
  await ch.end();
  const r = await reply(c.link);
  const ms = performance.now() - t0;
  assert.equal(r.done.error, undefined);
  assert.equal(r.done.count, n);
  assert.equal(r.done.next['0'], n, 'the last message seen is the last one sent');
  assert.equal(r.done.lastPosition, n - 1, 'one producer, one consumer: message i is at position i');
  assert.equal(r.done.metaSeen, n / 1000);
  assert.equal(r.done.redelivered, 0);
  await exited(c);
  console.log(`1,000,000 messages in ${(ms / 1000).toFixed(1)} s (${Math.round(n / ms * 1000)} msg/s)`);
});

for (const wait of ['spin', 'sleep'] as const) {
  test(`${wait} mode on both sides delivers the same stream`, async () => {
    const n = 20_000;
    const c = await child(['consume'], wait);
    const ch = await createChannel(c.link, { role: 'producer', slots: 8, slotBytes: 64, wait, spinMicros: wait === 'spin' ? 20 : undefined });
    assert.deepEqual(ch.waitPolicy, { mode: wait, spinMicros: wait === 'spin' ? 20 : 10 });
    await produce(ch, 0, n);
    if (wait === 'sleep') assert.equal(waitStatsOf(ch).spinHits, 0, 'sleep mode never spins');
    await ch.end();
    const r = await reply(c.link);
    assert.equal(r.done.error, undefined);
    assert.equal(r.done.count, n);
    await exited(c);
  });
}

test('a wait spins once, then sleeps until the doorbell; a message or slot already there costs no wait', async () => {
  using hub = ChannelHub.create({ slots: 1, slotBytes: 64 });
  // Both ends in this process: nothing can arrive while one of them spins, so each wait runs its
  // spin out and sleeps; the other end, run from a timer, wakes it. (A sleep may also end at once
  // on a ring left from the ends' attach, which rings everyone: then the end spins and sleeps
  // again. Either way every sleep follows exactly one spin that ran out.)
  const producer = hub.producer({ wait: 'spin', spinMicros: 2000 });
  const consumer = hub.consumer({ wait: 'spin', spinMicros: 2000 });
  const received = consumer.receive();
  assert.deepEqual(waitStatsOf(consumer), { spinHits: 0, spinMisses: 1, sleeps: 1, rung: 0, rescued: 0 }, 'spun once (not again in the queue), then slept');
  setTimeout(() => {
    void producer.acquire().then((slot) => producer.publish(slot, { length: writePayload(slot.bytes, 7, 0) }));
  }, 10);
  const m = (await received)!;
  assert.equal(readPayload(m.bytes).seq, 7);
  assert.equal(m.position, 0);
  const c = waitStatsOf(consumer);
  assert.ok(c.rung >= 1 && c.rung === c.sleeps && c.spinMisses === c.sleeps && c.spinHits === 0 && c.rescued === 0, JSON.stringify(c));

  // The one slot is held: acquire spins once, sleeps, and the release wakes it.
  const acquired = producer.acquire();
  assert.deepEqual(waitStatsOf(producer), { spinHits: 0, spinMisses: 1, sleeps: 1, rung: 0, rescued: 0 });
  setTimeout(() => m.release(), 10);
  const slot = await acquired;
  const p = waitStatsOf(producer);
  assert.ok(p.rung >= 1 && p.rung === p.sleeps && p.spinMisses === p.sleeps && p.spinHits === 0 && p.rescued === 0, JSON.stringify(p));

  // Ready at once: no wait at all.
  producer.publish(slot, { length: writePayload(slot.bytes, 8, 0) });
  const again = (await consumer.receive())!;
  assert.equal(readPayload(again.bytes).seq, 8);
  assert.equal(again.position, 1);
  again.release();
  assert.deepEqual(waitStatsOf(consumer), c, 'a message already published is taken without a wait');
});

test('adaptive waits stop spinning while the peer is slow (a probe now and then)', async (t) => {
  using hub = ChannelHub.create({ slots: 1, slotBytes: 64 });
  const producer = hub.producer();
  const consumer = hub.consumer();
  assert.deepEqual(consumer.waitPolicy, { mode: 'adaptive', spinMicros: 10 });
  const n = 48;
  for (let i = 0; i < n; i++) {
    // Each message comes milliseconds after the receive began: far past the spin bound.
    const received = consumer.receive();
    setTimeout(() => {
      void producer.acquire().then((slot) => producer.publish(slot, { length: writePayload(slot.bytes, i, 0) }));
    }, 2);
    const m = (await received)!;
    assert.equal(readPayload(m.bytes).seq, i);
    m.release();
  }
  const st = waitStatsOf(consumer);
  assert.equal(st.spinHits, 0);
  assert.ok(st.sleeps >= n && st.rescued === 0, JSON.stringify(st));
  // It spins until most recent waits outlasted the bound (about ten), then only every 16th wait.
  assert.ok(st.spinMisses >= 5 && st.spinMisses <= 20, `spun in ${st.spinMisses} of ${st.sleeps} waits`);
  t.diagnostic(`adaptive: spun in ${st.spinMisses} of ${st.sleeps} waits`);
});

test('no lost wake-up: 1,000,000 messages with random pauses on both sides, every sleeper woken by its doorbell', async () => {
  const n = 1_000_000;
  const seed = (Date.now() % 1_000_000) + 1;
  const c = await child(['random-consume', String(seed + 1)]);
  const ch = await createChannel(c.link, { role: 'producer', slots: 4, slotBytes: 64 });
  const pause = randomPauses(seed);
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    const slot = await ch.acquire();
    ch.publish(slot, { length: writePayload(slot.bytes, i, 0) });
    await pause();
  }
  const mine = waitStatsOf(ch);
  await ch.end();
  const r = await reply(c.link);
  const ms = performance.now() - t0;
  assert.equal(r.done.error, undefined, `seed ${seed}`);
  assert.equal(r.done.count, n, `seed ${seed}`);
  for (const [who, st] of [['producer', mine], ['consumer', r.done.stats]] as const) {
    assert.equal(st.rescued, 0, `${who}: a sleep ended by the backstop timer found its condition met (a lost wake-up; seed ${seed})`);
    assert.ok(st.sleeps > 0 && st.rung > 0, `${who} slept and was woken by its doorbell (${JSON.stringify(st)})`);
  }
  await exited(c);
  console.log(`1,000,000 messages with random pauses in ${(ms / 1000).toFixed(1)} s (seed ${seed}); ` +
    `producer waits: ${JSON.stringify(mine)}; consumer waits: ${JSON.stringify(r.done.stats)}`);
});

test('backpressure: acquire waits while every slot is in flight and resumes on release', async () => {
  const slots = 4;
  const c = await child(['hold-release', String(slots)]);
  const ch = await createChannel(c.link, { role: 'producer', slots, slotBytes: 64 });
  await produce(ch, 0, slots);
  assert.deepEqual((await reply(c.link)).held, [0, 1, 2, 3]);
  assert.equal(ch.tryAcquire(), undefined, 'no free slot while the consumer holds all four');
  assert.deepEqual(ch.stats().slots, { free: 0, writing: 0, published: 0, taken: 4 });
  let acquired: ChannelSlot | undefined;
  const slept = waitStatsOf(ch).sleeps;
  const pending = ch.acquire().then((s) => (acquired = s));
  // acquire going to sleep for a slot is the event; then it must not have got one.
  await waitUntil(() => waitStatsOf(ch).sleeps > slept || acquired !== undefined, 'acquire to sleep waiting for a slot');
  assert.equal(acquired, undefined, 'acquire is still waiting');
  c.link.send({ release: true });
  const slot = await pending;
  ch.publish(slot, { length: writePayload(slot.bytes, slots, 0) });
  await produce(ch, slots + 1, 200);
  await ch.end();
  const r = await reply(c.link);
  assert.equal(r.done.error, undefined);
  assert.equal(r.done.count, 200);
  await exited(c);
});

test('a consumer waits while the channel is empty; an abort signal ends the wait', async () => {
  const c = await child(['produce', '0']);
  const hub = ChannelHub.create({ slots: 4, slotBytes: 64 });
  const ch = hub.consumer();
  await hub.attach(c.link, { role: 'producer' });
  // The child ends at once (0 messages): the iteration ends cleanly.
  assert.equal(await ch.receive(), undefined);
  hub.close();
  assert.ok(ch.closed, 'closing the hub closes the ends it opened');
  await exited(c);

  using lonelyHub = ChannelHub.create({ slots: 4, slotBytes: 64 });
  const lonely = lonelyHub.consumer();
  await assert.rejects(lonely.receive({ timeout: 50 }), code('ERR_TIMEOUT'));
  await assert.rejects(lonely.receive({ signal: AbortSignal.timeout(20) }), (e: unknown) => (e as Error).name === 'AbortError' && ((e as Error).cause as Error).name === 'TimeoutError');
  const later = lonely.receive();
  lonely.close();
  assert.equal(await later, undefined, 'close() ends a pending receive');
  assert.equal(lonelyHub.closed, false, 'closing an end leaves its hub open');
});

test('many producers to one consumer: every producer\'s order kept, the end comes after all ended', async () => {
  const producers = 3;
  const per = 10_000;
  using hub = ChannelHub.create({ slots: 16, slotBytes: 64, producers });
  const ch = hub.consumer();
  const kids: SpawnedChild[] = [];
  for (let i = 1; i <= producers; i++) {
    // Each marks its messages with its participant index (what msg.producer says).
    const k = await child(['produce', String(per)]);
    await hub.attach(k.link, { role: 'producer' });
    kids.push(k);
  }
  const next = new Map<number, number>();
  let count = 0;
  for await (const msg of ch) {
    const p = readPayload(msg.bytes);
    assert.equal(p.seq, next.get(p.producer) ?? 0, `producer ${p.producer} in order`);
    assert.equal(msg.producer, p.producer, 'msg.producer names the participant that published it');
    next.set(p.producer, p.seq + 1);
    count++;
    msg.release();
  }
  assert.equal(count, producers * per);
  assert.equal(next.size, producers);
  for (const n of next.values()) assert.equal(n, per);
  ch.close();
  for (const k of kids) {
    assert.equal((await reply(k.link)).produced, per);
    await exited(k);
  }
});

test('work sharing: each message goes to exactly one of three consumers', async () => {
  const total = 3000;
  using hub = ChannelHub.create({ slots: 8, slotBytes: 64, consumers: 3 });
  const ch = hub.producer();
  const kids: SpawnedChild[] = [];
  for (let i = 0; i < 3; i++) {
    const k = await child(['worker']);
    await hub.attach(k.link, { role: 'consumer' });
    kids.push(k);
  }
  await produce(ch, 0, total);
  await ch.end();
  const seen = new Array<number>(total).fill(0);
  const shares: number[] = [];
  for (const k of kids) {
    const r = await reply(k.link);
    assert.equal(r.error, undefined);
    let last = -1;
    for (const s of r.seqs as number[]) {
      assert.ok(s >= 0, 'nothing is redelivered when nobody dies');
      assert.ok(s > last, 'each consumer sees its share in order');
      last = s;
      seen[s]!++;
    }
    shares.push(r.seqs.length);
    await exited(k);
  }
  assert.ok(seen.every((x) => x === 1), 'every message delivered exactly once');
  assert.equal(shares.reduce((a, b) => a + b), total);
});

test('broadcast: every consumer gets every message; a slot is reused only after all released it', async () => {
  const total = 600;
  using hub = ChannelHub.create({ slots: 4, slotBytes: 64, topology: 'broadcast', consumers: 3 });
  const ch = hub.producer();
  const kids: SpawnedChild[] = [];
  for (let i = 0; i < 3; i++) {
    // Different release delays: the fast consumers must not make the producer overwrite a slot
    // the slow one still reads.
    const k = await child(['consume', i === 0 ? '1' : '0']);
    await hub.attach(k.link, { role: 'consumer' });
    kids.push(k);
  }
  await produce(ch, 0, 200);
  await produce(ch, 200, total);
  await ch.end();
  for (const k of kids) {
    const r = await reply(k.link);
    assert.equal(r.done.error, undefined);
    assert.equal(r.done.count, total);
    assert.equal(r.done.next['0'], total);
    assert.equal(r.done.lastPosition, total - 1, 'every consumer attached before the first publish: message i is at position i');
    await exited(k);
  }
});

test('usage errors are typed: foreign slot, publish twice, meta too large, bad options; roles are types', async () => {
  const hub = ChannelHub.create({ slots: 2, slotBytes: 64, metaBytes: 16 });
  const ch = hub.producer();
  // @ts-expect-error a producer has no receive(): the roles are distinct types
  assert.equal(ch.receive, undefined);
  // @ts-expect-error nor a consumer an acquire()
  assert.equal(hub.consumer().acquire, undefined);
  const slot = await ch.acquire();
  assert.throws(() => ch.publish(slot, { meta: 'x'.repeat(40) }), code('ERR_MESSAGE_TOO_LARGE'));
  assert.throws(() => ch.publish(slot, { length: 65 }), argError('ERR_OUT_OF_RANGE'));
  ch.publish(slot, { meta: { a: 1 } });
  assert.throws(() => ch.publish(slot), argError('ERR_INVALID_ARG_VALUE'));
  const other = await ch.acquire();
  assert.equal(ch.tryAcquire(), undefined, 'two slots, both in flight (no consumer yet: messages wait)');
  ch.discard(other);
  assert.ok(ch.tryAcquire(), 'a discarded slot is free again');
  hub.close();
  assert.throws(() => ch.tryAcquire(), code('ERR_CHANNEL_CLOSED'));
  assert.throws(() => hub.producer(), code('ERR_CHANNEL_CLOSED'));
  ch.close();
  hub.close();

  for (const bad of [{ slots: 0 }, { slots: 1.5 }, { slotBytes: 0 }, { metaBytes: 7 }, { maxPeers: 0 }, { maxPeers: 40 }, { topology: 'ring' }, { consumers: 0 }]) {
    assert.throws(() => ChannelHub.create({ slots: 2, slotBytes: 8, ...(bad as object) }), argError(), JSON.stringify(bad));
  }
  assert.throws(() => ChannelHub.create({ slots: 2, slotBytes: 8, memory: { pool: {} as never } }), argError('ERR_INVALID_ARG_TYPE'));
  using small = ChannelHub.create({ slots: 2, slotBytes: 8, maxPeers: 2 });
  for (const bad of [{ wait: 'poll' }, { wait: 'futex' }, { spinMicros: -1 }, { spinMicros: 200_000 }]) {
    assert.throws(() => small.consumer(bad as never), argError(), JSON.stringify(bad));
  }
  small.consumer();
  small.producer();
  assert.throws(() => small.consumer(), (e: unknown) => code('ERR_LIMIT_REACHED')(e) && (e as { limit?: string }).limit === 'maxPeers', 'maxPeers ends at most');
  await assert.rejects(small.attach({} as never, { role: 'observer' as never }), argError('ERR_INVALID_ARG_VALUE'));
});

test('acceptChannel refuses a role other than the one it asked for; the hub learns why', async () => {
  const c = await child(['accept-report', 'consumer']);
  try {
    using hub = ChannelHub.create({ slots: 2, slotBytes: 64, maxPeers: 4 });
    await assert.rejects(hub.attach(c.link, { role: 'producer' }), (e: unknown) => code('ERR_PEER_REFUSED')(e) && /as a producer, not a consumer/.test(String(e)));
    assert.deepEqual(await reply(c.link), { error: 'ERR_DESCRIPTOR_KIND' });
    await hub.attach(c.link, { role: 'consumer' });
    assert.deepEqual(await reply(c.link), { accepted: true, role: 'consumer' });
    assert.deepEqual(hub.stats().consumers, { attached: 1, live: 0, died: 0 }, 'it accepted, then closed its end');
  } finally {
    await c.link.end();
    await exited(c);
  }
});

test('acceptChannel refuses a link whose first message is not a channel', async () => {
  const c = await spawn(new URL('../fixtures/link-child.js', import.meta.url));
  try {
    const p = acceptChannel(c.link, { signal: AbortSignal.timeout(5000) });
    c.link.send({ op: 'echo', value: { hello: 1 } });
    // link-child answers the echo; that is the first message acceptChannel sees.
    await assert.rejects(p, code('ERR_FRAME_INVALID'));
  } finally {
    await c.link.end();
    await exited(c);
  }
});

test('slot.dataView and msg.dataView: numbers in place, one DataView per slot for every message through it', async () => {
  using hub = ChannelHub.create({ slots: 2, slotBytes: 16 });
  const producer = hub.producer();
  const consumer = hub.consumer();
  try {
    const seen = new Map<number, DataView>();
    for (let i = 0; i < 6; i++) {
      const slot = await producer.acquire();
      const view = slot.dataView;
      assert.equal(view.byteLength, 16);
      if (seen.has(slot.index)) assert.equal(view, seen.get(slot.index), 'the same DataView each time the slot comes round');
      seen.set(slot.index, view);
      view.setFloat64(0, i * 1.5, true);
      view.setUint32(8, 1000 + i, true);
      producer.publish(slot, { length: 12 });
      const msg = await consumer.receive();
      assert.ok(msg);
      assert.equal(msg.dataView.getFloat64(0, true), i * 1.5);
      assert.equal(msg.dataView.getUint32(8, true), 1000 + i);
      msg.release();
      assert.throws(() => msg.dataView, code('ERR_CLOSED'));
    }
    assert.equal(seen.size, 2);
  } finally {
    producer.close();
    consumer.close();
  }
});
