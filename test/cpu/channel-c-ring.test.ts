// The C ring (native/py/channel_ring.c through the addon, src/channel/c-ring.ts) serving a Node
// channel end: it shares a channel with the JavaScript ring, a message published through one is
// taken through the other in both directions, in one process and across two; and its results
// come back as the JavaScript ring's (errors, detached ends, slots freed).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { ChannelHub, createChannel, type ChannelConsumer, type ChannelProducer } from '../../src/channel/index.js';
import { spawn, type SpawnedChild } from '../../src/link/index.js';
import { cRingUnavailable, defaultRingKind, RING_ENV } from '../../src/channel/c-ring.js';
import { ringKindOf } from '../helpers/channel-internals.js';
import { readPayload, writePayload } from '../fixtures/channel-payload.js';

const skip = cRingUnavailable() ?? false;
const CHILD = new URL('../fixtures/channel-child.js', import.meta.url);

/** Makes an end with CUDA_IPC_CHANNEL_RING set to `ring` (the variable is read when the end is made). */
function withRing<T>(ring: string, make: () => T): T {
  const before = process.env[RING_ENV];
  process.env[RING_ENV] = ring;
  try {
    return make();
  } finally {
    if (before === undefined) delete process.env[RING_ENV];
    else process.env[RING_ENV] = before;
  }
}

/** `n` messages through 4 slots (so every slot is reused, freed by the other ring): payloads checked,
 * meta (JSON, bytes, none) and positions as published. */
async function stream(producer: ChannelProducer, consumer: ChannelConsumer, n: number): Promise<void> {
  const got = (async () => {
    let i = 0;
    for await (const msg of consumer) {
      const p = readPayload(msg.bytes);
      assert.equal(p.seq, i, 'in order');
      assert.equal(msg.length, p.length);
      assert.equal(msg.position, i, 'one producer, one consumer: message i at position i');
      assert.equal(msg.redelivered, false);
      if (i % 3 === 0) assert.deepEqual(msg.meta, { seq: i });
      else if (i % 3 === 1) assert.deepEqual(msg.meta, Uint8Array.of(i & 0xff, 7));
      else assert.equal(msg.meta, undefined);
      msg.release();
      i++;
    }
    return i;
  })();
  for (let i = 0; i < n; i++) {
    const slot = await producer.acquire();
    const length = writePayload(slot.bytes, i, 0);
    producer.publish(slot, { length, meta: i % 3 === 0 ? { seq: i } : i % 3 === 1 ? Uint8Array.of(i & 0xff, 7) : undefined });
  }
  await producer.end();
  assert.equal(await got, n, 'every message taken, then the stream ended');
}

for (const [from, to] of [['c', 'js'], ['js', 'c'], ['c', 'c']] as const) {
  test(`one process: a producer on the ${from} ring, a consumer on the ${to} ring`, { skip }, async () => {
    using hub = ChannelHub.create({ slots: 4, slotBytes: 64 });
    const producer = withRing(from, () => hub.producer());
    const consumer = withRing(to, () => hub.consumer());
    assert.equal(ringKindOf(producer), from);
    assert.equal(ringKindOf(consumer), to);
    await stream(producer, consumer, 500);
    assert.deepEqual(hub.stats().slots, { free: 4, writing: 0, published: 0, taken: 0 }, 'every slot back');
    consumer.close();
  });
}

test('the C ring: tryAcquire says when every slot is in flight, discard hands one back, a release frees one for the other ring', { skip }, () => {
  using hub = ChannelHub.create({ slots: 2, slotBytes: 64 });
  const producer = withRing('c', () => hub.producer());
  const consumer = withRing('js', () => hub.consumer());
  const a = producer.tryAcquire()!;
  const b = producer.tryAcquire()!;
  assert.ok(a && b);
  assert.equal(producer.tryAcquire(), undefined, 'both slots in flight');
  producer.discard(b);
  assert.deepEqual(hub.stats().slots, { free: 1, writing: 1, published: 0, taken: 0 });
  producer.publish(a, { length: 1 });
  const m = consumer.tryReceive()!;
  assert.equal(m.index, a.index);
  assert.equal(producer.tryAcquire()?.index, b.index, 'the discarded slot claimed again');
  assert.equal(producer.tryAcquire(), undefined);
  m.release();
  assert.equal(producer.tryAcquire()?.index, a.index, 'the slot the JavaScript consumer released');
  consumer.close();
  producer.close();
});

test('the C ring: a producer whose consumers all left gets ERR_CHANNEL_CLOSED, as on the JavaScript ring', { skip }, () => {
  using hub = ChannelHub.create({ slots: 2, slotBytes: 64 });
  const producer = withRing('c', () => hub.producer());
  const consumer = withRing('c', () => hub.consumer());
  consumer.close();
  assert.throws(() => producer.tryAcquire(), (e: unknown) => (e as { code?: string }).code === 'ERR_CHANNEL_CLOSED');
  producer.close();
});

async function exited(s: SpawnedChild): Promise<void> {
  if (s.child.exitCode === null && s.child.signalCode === null) await once(s.child, 'exit');
}

test('two processes: a Node child on the C ring consumes what this process publishes on the JavaScript ring', { skip }, async () => {
  const n = 20_000;
  const c = await spawn(CHILD, ['consume'], { env: { ...process.env, [RING_ENV]: 'c' } });
  const ch = withRing('js', () => createChannel(c.link, { role: 'producer', slots: 8, slotBytes: 64 }));
  const producer = await ch;
  assert.equal(ringKindOf(producer), 'js');
  for (let i = 0; i < n; i++) {
    const slot = await producer.acquire();
    producer.publish(slot, { length: writePayload(slot.bytes, i, 0), ...(i % 1000 === 0 ? { meta: { seq: i } } : {}) });
  }
  await producer.end();
  const r = (await c.link.receive({ signal: AbortSignal.timeout(60_000) })) as { done: { error?: string; count: number; lastPosition: number; metaSeen: number }; ring: string };
  assert.equal(r.ring, 'c', 'the child took them through the C ring');
  assert.equal(r.done.error, undefined);
  assert.equal(r.done.count, n);
  assert.equal(r.done.lastPosition, n - 1);
  assert.equal(r.done.metaSeen, n / 1000);
  await exited(c);
});

test('two processes: a Node child on the C ring publishes, this process takes on the JavaScript ring', { skip }, async () => {
  const n = 20_000;
  const c = await spawn(CHILD, ['produce', String(n), '0'], { env: { ...process.env, [RING_ENV]: 'c' } });
  const consumer = await withRing('js', () => createChannel(c.link, { role: 'consumer', slots: 8, slotBytes: 64 }));
  assert.equal(ringKindOf(consumer), 'js');
  let i = 0;
  for await (const msg of consumer) {
    const p = readPayload(msg.bytes);
    assert.equal(p.seq, i);
    assert.equal(msg.position, i);
    if (i % 1000 === 0) assert.deepEqual(msg.meta, { seq: i });
    msg.release();
    i++;
  }
  assert.equal(i, n);
  const r = (await c.link.receive({ signal: AbortSignal.timeout(60_000) })) as { produced: number; ring: string };
  assert.deepEqual(r, { produced: n, ring: 'c' });
  consumer.close();
  await exited(c);
});

test('broadcast: consumers on the C ring and on the JavaScript ring each get every message; a slot is reused only once both released it', { skip }, async () => {
  const n = 300;
  using hub = ChannelHub.create({ slots: 4, slotBytes: 64, topology: 'broadcast', consumers: 2 });
  const producer = withRing('c', () => hub.producer());
  const consumers = [withRing('c', () => hub.consumer()), withRing('js', () => hub.consumer())];
  assert.deepEqual(consumers.map((c) => ringKindOf(c)), ['c', 'js']);
  const seen = consumers.map(async (consumer, k) => {
    let i = 0;
    for await (const msg of consumer) {
      const p = readPayload(msg.bytes);
      assert.equal(p.seq, i, `consumer ${k}: in order`);
      assert.equal(msg.position, i);
      // The slower one (k = 1) yields before releasing: the producer must not reuse its slot meanwhile.
      if (k === 1 && i % 7 === 0) await new Promise((r) => setImmediate(r));
      msg.release();
      i++;
    }
    return i;
  });
  for (let i = 0; i < n; i++) {
    const slot = await producer.acquire();
    producer.publish(slot, { length: writePayload(slot.bytes, i, 0) });
  }
  await producer.end();
  assert.deepEqual(await Promise.all(seen), [n, n]);
  assert.deepEqual(hub.stats().slots, { free: 4, writing: 0, published: 0, taken: 0 });
  for (const c of consumers) c.close();
});

test('which ring an end takes: the C ring by default on host and device slots, CUDA_IPC_CHANNEL_RING=js or =c for every end, a bad value warned about once and the default kept', { skip }, async () => {
  assert.equal(defaultRingKind(), 'c', 'host and device slots alike (the C ring measured faster on both: bench/channel.ts)');
  const before = process.env[RING_ENV];
  delete process.env[RING_ENV];
  const warnings: Error[] = [];
  const onWarning = (w: Error) => { if ((w as { code?: string }).code === 'CUDA_IPC_ENV') warnings.push(w); };
  process.on('warning', onWarning);
  try {
    using hub = ChannelHub.create({ slots: 2, slotBytes: 64 });
    const byDefault = hub.producer();
    assert.equal(ringKindOf(byDefault), 'c', 'unset: the C ring');
    const js = withRing('js', () => hub.consumer());
    assert.equal(ringKindOf(js), 'js');
    const bad = ['javascript', 'javascript'].map((v) => withRing(v, () => hub.consumer()));
    assert.deepEqual(bad.map((c) => ringKindOf(c)), ['c', 'c'], 'a bad value: the default holds');
    await new Promise((r) => setImmediate(r));  // (warnings are emitted on the next tick)
    assert.equal(warnings.length, 1, 'warned once for that value');
    assert.match(warnings[0]!.message, /CUDA_IPC_CHANNEL_RING="javascript" is not a ring \(c: the C ring, js: the JavaScript ring\); the default holds/);
    for (const end of [byDefault, js, ...bad]) end.close();
  } finally {
    process.off('warning', onWarning);
    if (before === undefined) delete process.env[RING_ENV];
    else process.env[RING_ENV] = before;
  }
});
