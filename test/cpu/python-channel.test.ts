// Channels with a Python end, CPU only (host slots): 100,000 checksummed messages Node -> Python ->
// Node; a Python consumer SIGKILLed holding messages (redelivered to another consumer, flagged; the
// producer gets ERR_PEER_GONE once no consumer is left); a Python producer SIGKILLed (its consumer
// gets what it published, then ERR_PEER_GONE); and the Python side noticing the death of its hub.
// Runs with the machine's python3 (>= 3.10, standard library only); skips where there is none. The
// relay runs on both Python hot paths: the native helper (where it is built) and the standard library.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { crc32 } from 'node:zlib';
import { mkdtempSync, readFileSync, existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawnPython, spawn, type Link, type SpawnedChild } from '../../src/link/index.js';
import { ChannelHub, createChannel } from '../../src/channel/index.js';
import { noPython, PYTHON_HOT_PATHS, pythonFixture } from '../helpers/python.js';

const CHILD = pythonFixture('channel_child.py');
const skip = noPython;

function reply(link: Link, ms = 60_000): Promise<any> {
  return link.receive({ signal: AbortSignal.timeout(ms) });
}

async function kill(s: SpawnedChild): Promise<void> {
  if (s.child.exitCode !== null || s.child.signalCode !== null) return;
  const exit = once(s.child, 'exit');
  s.child.kill('SIGKILL');
  await exit;
}

async function exited(s: SpawnedChild): Promise<number | null> {
  if (s.child.exitCode === null && s.child.signalCode === null) await once(s.child, 'exit');
  return s.child.exitCode;
}

/** Payload byte j of message i. */
const byteOf = (i: number, j: number) => (i * 31 + j * 7) & 0xff;

for (const path of PYTHON_HOT_PATHS) test(`Node -> Python -> Node on host slots: 100,000 checksummed messages, in order, values checked (Python hot path: ${path.name})`, { skip: path.skip, timeout: 240_000 }, async (t) => {
  const total = 100_000;
  const py = await spawnPython(CHILD, ['relay'], { stdio: ['ignore', 'inherit', 'inherit'], env: { ...process.env, ...path.env } });
  try {
    const toPy = await createChannel(py.link, { role: 'producer', slots: 32, slotBytes: 512, memory: 'host' });
    const fromPy = await createChannel(py.link, { role: 'consumer', slots: 32, slotBytes: 512, memory: 'host' });
    const t0 = performance.now();
    const sending = (async () => {
      for (let i = 0; i < total; i++) {
        const slot = await toPy.acquire();
        const b = slot.bytes;
        const n = 1 + (i % 400);
        const payload = b.subarray(8, 8 + n);
        for (let j = 0; j < n; j++) payload[j] = byteOf(i, j);
        const v = new DataView(b.buffer, b.byteOffset, 8);
        v.setUint32(0, i, true);
        v.setUint32(4, crc32(payload), true);
        toPy.publish(slot, { length: 8 + n, meta: i % 997 === 0 ? { i, text: 'héllo' } : undefined });
      }
      await toPy.end();
    })();
    let received = 0;
    let metas = 0;
    for await (const msg of fromPy) {
      const b = msg.bytes;
      const v = new DataView(b.buffer, b.byteOffset, 8);
      const i = v.getUint32(0, true);
      assert.equal(i, received, 'answers come in order');
      const n = 1 + (i % 400);
      assert.equal(b.byteLength, 8 + n, `answer ${i}: length`);
      const payload = b.subarray(8);
      for (let j = 0; j < n; j++) if (payload[j] !== (byteOf(i, j) ^ 0x5a)) assert.fail(`answer ${i}: byte ${j} is ${payload[j]}`);
      const original = Buffer.from(payload).map((x) => x ^ 0x5a);
      assert.equal(v.getUint32(4, true), crc32(original), `answer ${i}: Python's checksum of what it read`);
      if (i % 997 === 0) {
        assert.deepEqual(msg.meta, { i, text: 'héllo' });
        metas++;
      } else assert.equal(msg.meta, undefined);
      msg.release();
      received++;
    }
    await sending;
    fromPy.close();
    const ms = performance.now() - t0;
    assert.equal(received, total);
    assert.equal(metas, Math.ceil(total / 997));
    const done = await reply(py.link);
    assert.equal(done.done, total);
    assert.equal(done.wait_stats.rescued, 0, 'no wake-up was lost on the Python side');
    assert.deepEqual(done.hot_paths, [path.name, path.name], 'both Python ends ran the hot path asked for');
    t.diagnostic(`${total} round trips in ${ms.toFixed(0)} ms (${((ms * 1000) / total).toFixed(1)} us each); Python waits: ${JSON.stringify(done.wait_stats)}`);
    assert.equal(await exited(py), 0);
  } finally {
    await kill(py);
    py.link.close();
  }
});

test('a Python consumer SIGKILLed holding messages: they go to the other consumer, flagged, once; then the producer gets ERR_PEER_GONE', { skip, timeout: 60_000 }, async () => {
  using hub = ChannelHub.create({ slots: 8, slotBytes: 64, consumers: 2 });
  const producer = hub.producer();
  const victim = await spawnPython(CHILD, ['hold', '3'], { stdio: ['ignore', 'inherit', 'inherit'] });
  try {
    await hub.attach(victim.link, { role: 'consumer' });
    for (let i = 0; i < 3; i++) {
      const slot = await producer.acquire();
      new DataView(slot.bytes.buffer, slot.bytes.byteOffset, 4).setUint32(0, 100 + i, true);
      producer.publish(slot, { length: 4 });
    }
    const held = await reply(victim.link);
    assert.deepEqual(held.held, [0, 1, 2]);
    assert.equal(hub.stats().slots.taken, 3, 'the Python consumer holds three slots');
    const other = hub.consumer();
    assert.equal(other.tryReceive(), undefined, 'nothing for the other consumer while Python holds them');
    await kill(victim);
    const again: number[] = [];
    for (let i = 0; i < 3; i++) {
      const m = await other.receive({ signal: AbortSignal.timeout(10_000) });
      assert.ok(m, 'a redelivered message');
      assert.equal(m.redelivered, true);
      again.push(new DataView(m.bytes.buffer, m.bytes.byteOffset, 4).getUint32(0, true));
      m.release();
    }
    assert.deepEqual(again.sort(), [100, 101, 102]);
    assert.equal(other.tryReceive(), undefined, 'each exactly once');
    assert.deepEqual(hub.stats().consumers, { attached: 2, live: 1, died: 1 });
    other.close();
    await assert.rejects(producer.acquire(), (e: any) => e.code === 'ERR_PEER_GONE');
  } finally {
    await kill(victim);
  }
});

test('the only (Python) consumer SIGKILLed: the Node producer gets ERR_PEER_GONE', { skip, timeout: 60_000 }, async () => {
  const victim = await spawnPython(CHILD, ['hold', '1'], { stdio: ['ignore', 'inherit', 'inherit'] });
  try {
    const producer = await createChannel(victim.link, { role: 'producer', slots: 4, slotBytes: 64 });
    const slot = await producer.acquire();
    producer.publish(slot, { length: 4 });
    assert.deepEqual((await reply(victim.link)).held, [0]);
    await kill(victim);
    // The hub repairs once the link's close is seen (an event-loop turn or two).
    const deadline = Date.now() + 10_000;
    let error: any;
    while (Date.now() < deadline) {
      try {
        producer.publish(await producer.acquire(), { length: 4 });
      } catch (e) {
        error = e;
        break;
      }
      await new Promise((r) => setTimeout(r, 5));
    }
    assert.equal(error?.code, 'ERR_PEER_GONE');
    producer.close();
  } finally {
    await kill(victim);
  }
});

test('a Python producer SIGKILLed: the Node consumer gets everything it published, then ERR_PEER_GONE', { skip, timeout: 60_000 }, async () => {
  const victim = await spawnPython(CHILD, ['produce', '5'], { stdio: ['ignore', 'inherit', 'inherit'] });
  try {
    const consumer = await createChannel(victim.link, { role: 'consumer', slots: 8, slotBytes: 64 });
    assert.deepEqual(await reply(victim.link), { published: 5 });
    await kill(victim);
    const got: Array<{ i: number; meta: unknown }> = [];
    await assert.rejects((async () => {
      for await (const m of consumer) {
        got.push({ i: new DataView(m.bytes.buffer, m.bytes.byteOffset, 4).getUint32(0, true), meta: m.meta });
        m.release();
      }
    })(), (e: any) => e.code === 'ERR_PEER_GONE');
    assert.deepEqual(got, [0, 1, 2, 3, 4].map((i) => ({ i, meta: { i } })));
    consumer.close();
  } finally {
    await kill(victim);
  }
});

test('a Python consumer whose hub is SIGKILLed takes what was published, then ends with ERR_PEER_GONE', { skip, timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-pyhub-'));
  const out = join(dir, 'result.json');
  const hub = await spawn(new URL('../fixtures/python-channel-hub.js', import.meta.url), [CHILD, out], { stdio: ['ignore', 'inherit', 'inherit'] });
  try {
    const ready = await reply(hub.link);
    assert.deepEqual(ready, { published: 4 });
    await kill(hub);
    const deadline = Date.now() + 20_000;
    while (!existsSync(out) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    assert.ok(existsSync(out), 'the Python consumer noticed its hub died and finished');
    const result = JSON.parse(readFileSync(out, 'utf8'));
    assert.deepEqual(result.received, [0, 1, 2, 3]);
    assert.equal(result.error, 'ERR_PEER_GONE', result.message);
  } finally {
    await kill(hub);
    rmSync(dir, { recursive: true, force: true });
  }
});
