// Channels on device memory (IPC pool slots, fence words in the control block). Skipped without a GPU.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { noGpu } from '../helpers/gpu.js';
import { Device } from '../../src/cuda/device.js';
import { Stream } from '../../src/cuda/stream.js';
import type { DeviceBuffer } from '../../src/cuda/buffer.js';
import { BuiltinKernels } from '../../src/cuda/builtins.js';
import { spawn, type Link, type SpawnedChild } from '../../src/link/index.js';
import { ChannelHub, createChannel, type ChannelProducer } from '../../src/channel/index.js';

const CHILD = new URL('../fixtures/channel-gpu-child.js', import.meta.url);
const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;
const reply = (link: Link, ms = 60_000): Promise<any> => link.receive({ signal: AbortSignal.timeout(ms) });
const exited = async (s: SpawnedChild) => {
  if (s.child.exitCode === null && s.child.signalCode === null) await once(s.child, 'exit');
};
const kill = async (s: SpawnedChild) => {
  const e = once(s.child, 'exit');
  s.child.kill('SIGKILL');
  await e;
};

/** Fills each slot with its seq in every word (a memset on the stream) and publishes it. */
async function produceSeq(ch: ChannelProducer, stream: Stream, from: number, to: number): Promise<void> {
  for (let seq = from; seq < to; seq++) {
    const slot = await ch.acquire({ stream });
    (slot.buffer as DeviceBuffer).fillUint32(seq, { stream });
    ch.publish(slot, { stream, meta: { seq } });
  }
}

describe('channels on device memory', { skip: noGpu }, () => {
  test('the consumer\'s kernel sees exactly what the producer\'s kernel wrote, both ways ordered by fences, no CPU sync', async () => {
    const device = Device.get(0);
    const c = await spawn(CHILD, ['verify', '300000'], { stdio: 'inherit' });
    using stream = Stream.create(device);
    const kernels = BuiltinKernels.for(device);
    const ch = await createChannel(c.link, { role: 'producer', slots: 2, slotBytes: 4 << 20, memory: { device } });
    assert.equal(ch.memory, 'device');
    const n = 300;
    for (let seq = 0; seq < n; seq++) {
      const slot = await ch.acquire({ stream });  // GPU-side wait for the consumer's release fence
      kernels.spin(300_000n, stream);              // slow producer: an unordered consumer would read stale data
      kernels.fillPattern(slot.buffer as DeviceBuffer, 'u32', (seq * 1000) >>> 0, 1, stream);
      ch.publish(slot, { stream, meta: { seq } });
    }
    await ch.end();
    const r = await reply(c.link);
    assert.deepEqual(r, { count: n, mismatches: 0 });
    await stream.synchronize();
    await exited(c);
  });

  test('20,000 messages on device slots: order kept, no loss, no duplicate', async () => {
    const device = Device.get(0);
    const c = await spawn(CHILD, ['seq'], { stdio: 'inherit' });
    using stream = Stream.create(device);
    using pool = device.createIpcPool();
    const ch = await createChannel(c.link, { role: 'producer', slots: 16, slotBytes: 4096, memory: { pool } });
    await produceSeq(ch, stream, 0, 20_000);
    await ch.end();
    assert.deepEqual(await reply(c.link), { count: 20_000, next: 20_000 });
    await exited(c);
  });

  test('work sharing on device slots: a consumer SIGKILLed holding messages; redelivered, flagged, exactly once', async () => {
    const device = Device.get(0);
    using stream = Stream.create(device);
    const total = 1000;
    using hub = ChannelHub.create({ slots: 8, slotBytes: 4096, memory: { device }, consumers: 3 });
    const ch = hub.producer();
    const victim = await spawn(CHILD, ['hold', '3'], { stdio: 'inherit' });
    await hub.attach(victim.link, { role: 'consumer' });
    await produceSeq(ch, stream, 0, 3);
    const held = (await reply(victim.link)).held as number[];
    assert.deepEqual(held, [0, 1, 2]);
    const workers: SpawnedChild[] = [];
    for (let i = 0; i < 2; i++) {
      const w = await spawn(CHILD, ['worker'], { stdio: 'inherit' });
      await hub.attach(w.link, { role: 'consumer' });
      workers.push(w);
    }
    await produceSeq(ch, stream, 3, 300);
    await kill(victim);
    await produceSeq(ch, stream, 300, total);
    await ch.end();
    const seen = new Array<number>(total).fill(0);
    const again: number[] = [];
    for (const w of workers) {
      const r = await reply(w.link);
      assert.equal(r.error, undefined);
      for (const mark of r.seqs as number[]) {
        const seq = mark < 0 ? -mark - 1 : mark;
        if (mark < 0) again.push(seq);
        seen[seq]!++;
      }
      await exited(w);
    }
    assert.deepEqual(again.sort((a, b) => a - b), held);
    assert.ok(seen.every((x) => x === 1));
  });

  test('a producer SIGKILLed on device slots: the consumer gets what it published, then ERR_PEER_GONE', async () => {
    const device = Device.get(0);
    using stream = Stream.create(device);
    using hub = ChannelHub.create({ slots: 16, slotBytes: 4096, memory: { device } });
    const ch = hub.consumer();
    const p = await spawn(CHILD, ['produce-and-hang', '10'], { stdio: 'inherit' });
    await hub.attach(p.link, { role: 'producer' });
    assert.equal((await reply(p.link)).produced, 10);
    await kill(p);
    const seqs: number[] = [];
    const word = new Uint32Array(1);
    await assert.rejects(async () => {
      for await (const msg of ch) {
        msg.waitOn(stream);
        await (msg.buffer as DeviceBuffer).readAsync(word, { stream });
        seqs.push(word[0]!);
        msg.release({ stream });
      }
    }, code('ERR_PEER_GONE'));
    assert.deepEqual(seqs, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert.equal(ch.stats().slots.free, 16);
    ch.close();
  });

  for (const how of ['exit', 'hang'] as const) {
    test(`a consumer ${how === 'exit' ? 'that exits' : 'SIGKILLed'} while its GPU work on a released message is still queued: the producer's stream does not wait forever`, async () => {
      const device = Device.get(0);
      using stream = Stream.create(device);
      using hub = ChannelHub.create({ slots: 1, slotBytes: 4096, memory: { device }, consumers: 2 });
      const ch = hub.producer();
      const victim = await spawn(CHILD, ['release-slow', how], { stdio: 'inherit' });
      await hub.attach(victim.link, { role: 'consumer' });
      await produceSeq(ch, stream, 0, 1);
      assert.equal((await reply(victim.link)).released, 0);
      if (how === 'hang') await kill(victim);
      else await exited(victim);
      const worker = await spawn(CHILD, ['worker'], { stdio: 'inherit' });
      await hub.attach(worker.link, { role: 'consumer' });
      // The slot is free in the control block; the GPU-side wait for the victim's release fence
      // (whose write died with it) must end once its process is gone.
      await produceSeq(ch, stream, 1, 50);
      const synced = await Promise.race([stream.synchronize().then(() => true), new Promise((r) => setTimeout(() => r(false), 20_000))]);
      assert.ok(synced, 'the producer\'s stream is stuck on the dead consumer\'s release');
      await ch.end();
      const r = await reply(worker.link);
      assert.equal(r.error, undefined);
      assert.deepEqual(r.seqs, Array.from({ length: 49 }, (_, i) => i + 1));
      await exited(worker);
    });
  }

  test('a producer SIGKILLed while its GPU work on a published message is still queued: the consumer\'s wait ends, then ERR_PEER_GONE', async () => {
    const device = Device.get(0);
    using stream = Stream.create(device);
    using hub = ChannelHub.create({ slots: 4, slotBytes: 4096, memory: { device } });
    const ch = hub.consumer();
    const p = await spawn(CHILD, ['produce-slow-and-hang'], { stdio: 'inherit' });
    await hub.attach(p.link, { role: 'producer' });
    assert.equal((await reply(p.link)).published, 1);
    const msg = (await ch.receive())!;
    msg.waitOn(stream);  // before the producer dies: its fence write is still queued behind 300 ms
    await kill(p);
    const synced = await Promise.race([stream.synchronize().then(() => true), new Promise((r) => setTimeout(() => r(false), 20_000))]);
    assert.ok(synced, 'the consumer\'s stream is stuck on the dead producer\'s publish');
    msg.release({ stream });
    await assert.rejects(ch.receive(), code('ERR_PEER_GONE'));
    ch.close();
  });

  test('broadcast on device slots: three consumers each get every message', async () => {
    const device = Device.get(0);
    using stream = Stream.create(device);
    using hub = ChannelHub.create({ slots: 4, slotBytes: 4096, memory: { device }, topology: 'broadcast', consumers: 3 });
    const ch = hub.producer();
    const kids: SpawnedChild[] = [];
    for (let i = 0; i < 3; i++) {
      const k = await spawn(CHILD, ['seq'], { stdio: 'inherit' });
      await hub.attach(k.link, { role: 'consumer' });
      kids.push(k);
    }
    await produceSeq(ch, stream, 0, 2000);
    await ch.end();
    for (const k of kids) {
      assert.deepEqual(await reply(k.link), { count: 2000, next: 2000 });
      await exited(k);
    }
  });

  test('broadcast on device slots produced by a peer: two consumers each get every message, in order', async () => {
    const device = Device.get(0);
    using hub = ChannelHub.create({ slots: 4, slotBytes: 4096, memory: { device }, topology: 'broadcast', consumers: 2 });
    const kids: SpawnedChild[] = [];
    for (let i = 0; i < 2; i++) {
      const k = await spawn(CHILD, ['seq'], { stdio: 'inherit' });
      await hub.attach(k.link, { role: 'consumer' });
      kids.push(k);
    }
    const p = await spawn(CHILD, ['produce-seq', '2000'], { stdio: 'inherit' });
    await hub.attach(p.link, { role: 'producer' });
    assert.deepEqual(await reply(p.link), { produced: 2000 });
    for (const k of kids) {
      assert.deepEqual(await reply(k.link), { count: 2000, next: 2000 });
      await exited(k);
    }
    await exited(p);
  });

  test('device slots on idle streams: fences written from the CPU, the consumer reads what the producer copied in', async () => {
    const device = Device.get(0);
    const c = await spawn(CHILD, ['seq'], { stdio: 'inherit' });
    using stream = Stream.create(device);
    const ch = await createChannel(c.link, { role: 'producer', slots: 4, slotBytes: 4096, memory: { device } });
    const words = new Uint32Array(1024);
    for (let seq = 0; seq < 5000; seq++) {
      const slot = await ch.acquire();  // waits on the CPU for the consumer's release
      words.fill(seq);
      // A synchronous copy: the stream has nothing queued when publish looks at it.
      (slot.buffer as DeviceBuffer).write(words);
      ch.publish(slot, { stream, meta: { seq } });
    }
    await ch.end();
    assert.deepEqual(await reply(c.link), { count: 5000, next: 5000 });
    await exited(c);
  });

  test('a consumer that releases messages unread and unwaited: its release lands after the publish; later messages in the slot are right', async () => {
    const device = Device.get(0);
    const c = await spawn(CHILD, ['skim'], { stdio: 'inherit' });
    using stream = Stream.create(device);
    const kernels = BuiltinKernels.for(device);
    const ch = await createChannel(c.link, { role: 'producer', slots: 1, slotBytes: 4096, memory: { device } });
    for (let seq = 0; seq < 40; seq++) {
      const slot = await ch.acquire({ stream });
      kernels.spin(2_000_000n, stream);  // the publish fence write stays queued for a while
      (slot.buffer as DeviceBuffer).fillUint32(seq, { stream });
      ch.publish(slot, { stream, meta: { seq } });
    }
    await ch.end();
    const synced = await Promise.race([stream.synchronize().then(() => true), new Promise((r) => setTimeout(() => r(false), 20_000))]);
    assert.ok(synced, 'the producer\'s stream is stuck');
    assert.deepEqual(await reply(c.link), { count: 40, checked: 20, wrong: 0 });
    await exited(c);
  });

  const examples = fileURLToPath(new URL('../../examples/', import.meta.url));
  for (const [name, file, expect] of [
    ['pipeline', 'pipeline/main.js', /pipeline: 64 messages checked, 0 wrong[\s\S]*pipeline: OK/],
    ['inference server', 'inference/server.js', /inference: 300 answers[\s\S]*0 wrong\s+inference: OK/],
  ] as const) {
    test(`example: ${name} on the GPU`, () => {
      const r = spawnSync(process.execPath, [examples + file], { encoding: 'utf8', timeout: 120_000 });
      assert.equal(r.status, 0, r.stdout + r.stderr);
      assert.doesNotMatch(r.stdout, /host shared memory/);
      assert.match(r.stdout, expect);
    });
  }
});
