// Backpressure on links, the way a Node stream does it: send() returns false once the peer is
// behind, 'drain' says when to go on, and the queue behind it is bounded in messages, bytes, fds
// and leases, each with a typed error naming the bound. Nothing queued is ever dropped.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { spawnSync } from 'node:child_process';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import '../../src/link/index.js';
import type { Link } from '../../src/link/connection/link.js';
import type { LinkOptions } from '../../src/link/connection/link-options.js';
import { fdCount } from '../fixtures/fd-count.js';
import { HELLO, linkPair, linkWithRawPeer, type RawPeer } from '../fixtures/link-pair.js';
import { addon } from '../../src/native/addon.js';
import { waitUntil } from '../helpers/wait.js';

const limited = (code: string, limit: string) => (e: unknown) => {
  assert.ok(e instanceof IpcError, String(e));
  assert.equal(e.code, code);
  assert.equal(e.limit, limit);
  return true;
};

/** A link whose raw peer has stopped reading: the socket fills after some hundred frames. */
async function stalledPeer(options?: LinkOptions): Promise<{ link: Link; raw: RawPeer; resume(): void; close(): void }> {
  const { link, raw } = linkWithRawPeer(options);
  raw.send(HELLO(1));
  await waitUntil(() => link.state === 'open', "the link to take the raw peer's HELLO");
  raw.socket.setInterest(false, false);
  return {
    link,
    raw,
    resume: () => raw.socket.setInterest(true, false),
    close() {
      link.close();
      raw.socket.close();
      for (const r of raw.records) for (const fd of r.fds) addon.close(fd);
    },
  };
}

/** Sends `value` until send() says the peer is behind; returns how many went. */
function fill(link: Link, value: () => unknown): number {
  for (let n = 1; n < 1_000_000; n++) if (!link.send(value())) return n;
  throw new Error('the socket never filled');
}

test("send() returns false once the peer is behind, and 'drain' fires when it caught up; nothing is lost", async () => {
  const p = await stalledPeer();
  try {
    const sent = fill(p.link, () => ({ n: 1 }));
    assert.equal(p.link.sendQueue.messages, 1, 'the message that returned false waits in the queue');
    for (let i = 0; i < 9; i++) assert.equal(p.link.send({ more: i }), false, 'still behind');
    assert.deepEqual(p.link.sendQueue, { messages: 10, bytes: p.link.sendQueue.bytes, fds: 0 });
    assert.ok(p.link.sendQueue.bytes > 10 * 16);
    const drained = once(p.link, 'drain');
    p.resume();
    await drained;
    assert.deepEqual(p.link.sendQueue, { messages: 0, bytes: 0, fds: 0 });
    // One more message, sent after all of them, arriving is the event: then every one is there.
    const messages = () => p.raw.records.filter((r) => r.bytes[5] === 2).length;
    assert.equal(p.link.send({ after: true }), true);
    await waitUntil(() => messages() >= sent + 10, `the messages to arrive (${messages()} of ${sent + 10})`);
    assert.equal(messages(), sent + 10, 'every message arrived, the one after them last');
  } finally {
    p.close();
  }
});

test('a queue at its bound refuses the next message with ERR_SEND_QUEUE_FULL naming the bound, and takes it once drained', async () => {
  for (const [options, value, limit] of [
    [{ sendQueue: { messages: 5 } }, () => ({ small: 1 }), 'sendQueue.messages'],
    [{ sendQueue: { bytes: 4000 } }, () => ({ pad: 'x'.repeat(1000) }), 'sendQueue.bytes'],
    [{ sendQueue: { fds: 3 } }, () => h, 'sendQueue.fds'],
  ] as const) {
    const before = fdCount();
    var h = HostBuffer.allocate(4096);
    const p = await stalledPeer(options);
    try {
      fill(p.link, value);
      let queued = 1;
      for (;;) {
        try {
          assert.equal(p.link.send(value()), false);
          queued++;
        } catch (e) {
          limited('ERR_SEND_QUEUE_FULL', limit)(e);
          break;
        }
        assert.ok(queued < 100, `${limit}: the bound held`);
      }
      assert.equal(p.link.sendQueue.messages, queued);
      assert.equal(p.link.closed, false, 'a full queue does not close the link');
      const drained = once(p.link, 'drain');
      p.resume();
      await drained;
      assert.equal(p.link.send(value()), true, `${limit}: room again`);
    } finally {
      p.close();
      h.close();
    }
    await waitUntil(() => fdCount() === before, `${limit}: the fds to be closed (${fdCount()} open, ${before} before)`);
  }
});

test('one message larger than sendQueue.bytes still fits an empty queue', async () => {
  const p = await stalledPeer({ sendQueue: { bytes: 1000 } });
  try {
    fill(p.link, () => ({ n: 1 }));
    const drained = once(p.link, 'drain');
    p.resume();
    await drained;
    p.raw.socket.setInterest(false, false);
    fill(p.link, () => ({ n: 2 }));
    assert.throws(() => p.link.send(new Uint8Array(2000)), limited('ERR_SEND_QUEUE_FULL', 'sendQueue.bytes'));
  } finally {
    p.close();
  }
  const q = await stalledPeer({ sendQueue: { bytes: 1000 } });
  try {
    // An empty queue takes a 300 KiB message (a large one, its memfd counted) while the socket is full.
    fill(q.link, () => new Uint8Array(0));
    const drained = once(q.link, 'drain');
    q.resume();
    await drained;
    q.raw.socket.setInterest(false, false);
    const n = fill(q.link, () => new Uint8Array(300_000));
    assert.ok(n >= 1);
    assert.ok(q.link.sendQueue.bytes >= 300_000);
  } finally {
    q.close();
  }
});

test('the leases a peer holds are bounded: send() returns false at half, ERR_LIMIT_REACHED past the bound, drain when released', async () => {
  const [a, b] = await linkPair({ leases: { count: 4 } });
  const kept: HostBuffer[] = [];
  b.on('message', (m) => kept.push(m as HostBuffer));
  try {
    using h = HostBuffer.allocate(4096);
    assert.equal(a.send(h), true);
    assert.equal(a.send(h), false, 'the peer holds 2 of 4: behind');
    a.send(h);
    a.send(h);
    assert.throws(() => a.send({ x: [h] }), limited('ERR_LIMIT_REACHED', 'leases.count'));
    assert.equal(a.leases.count, 4);
    await waitUntil(() => kept.length >= 4, `the four buffers to arrive (${kept.length})`);
    assert.equal(kept.length, 4);
    const drained = once(a, 'drain');
    for (const k of kept.splice(0)) k.close();
    await drained;
    assert.equal(a.leases.count, 0);
    assert.equal(a.send(h), true);
  } finally {
    a.close();
    b.close();
  }
  const [c, d] = await linkPair({ leases: { bytes: 10_000 } });
  try {
    using h = HostBuffer.allocate(4096);
    c.send(h);
    c.send(h);
    assert.throws(() => c.send(h), limited('ERR_LIMIT_REACHED', 'leases.bytes'));
  } finally {
    c.close();
    d.close();
  }
});

test('fds kept open by leases are bounded (leases.fds): a sender of fresh buffers is told to wait before its fds run out', async () => {
  const [a, b] = await linkPair({ leases: { fds: 8 } });
  const kept: HostBuffer[] = [];
  b.on('message', (m) => {
    if (m instanceof HostBuffer) kept.push(m);
  });
  const before = fdCount();
  try {
    const results: boolean[] = [];
    for (let i = 0; i < 8; i++) {
      const h = HostBuffer.allocate(4096); // closed here at once: its lease keeps the memfd open
      results.push(a.send(h));
      h.close();
    }
    assert.deepEqual(results, [true, true, true, false, false, false, false, false], 'behind once the peer holds half of the 8 fds');
    assert.equal(a.leases.count, 8);
    const ninth = HostBuffer.allocate(4096);
    assert.throws(() => a.send(ninth), limited('ERR_LIMIT_REACHED', 'leases.fds'));
    ninth.close();
    let plain = false;
    b.on('message', (m) => { if ((m as { plain?: string })?.plain === 'no fds') plain = true; });
    assert.ok(a.send({ plain: 'no fds' }) === false, 'a message without fds still goes (the link stays behind)');
    await waitUntil(() => plain, 'the message without fds, sent after the buffers, to arrive');
    assert.equal(kept.length, 8);
    const drained = once(a, 'drain');
    for (const k of kept.splice(0)) k.close();
    await drained;
    assert.equal(a.leases.count, 0);
    assert.ok(fdCount() <= before + 1, 'the sender closed the fds its leases kept');
    // One buffer leased many times keeps one fd open: it counts once.
    using same = HostBuffer.allocate(4096);
    for (let i = 0; i < 20; i++) assert.equal(a.send(same), true);
    assert.equal(a.leases.count, 20);
    await waitUntil(() => kept.length === 20, `the 20 buffers to arrive (${kept.length})`);
    for (const k of kept.splice(0)) k.close();
  } finally {
    a.close();
    b.close();
  }
});

test('leases.fds defaults to half the process fd limit (ulimit -n)', () => {
  const program = `import('${new URL('../../src/link/connection/link-options.js', import.meta.url).href}').then((m) => console.log(m.DEFAULT_LINK_LIMITS.leases.fds))`;
  const r = spawnSync('/bin/sh', ['-c', 'ulimit -n 256 && exec "$0" --input-type=module -e "$1"', process.execPath, program], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout.trim(), '128');
});

test('flush() waits for the queue to empty, and gives up on timeout or abort', async () => {
  const p = await stalledPeer();
  try {
    fill(p.link, () => ({ n: 1 }));
    await assert.rejects(p.link.flush({ timeout: 20 }), (e: unknown) => e instanceof IpcError && e.code === 'ERR_TIMEOUT');
    const ac = new AbortController();
    const f = p.link.flush({ signal: ac.signal });
    ac.abort('enough');
    await assert.rejects(f, (e: unknown) => (e as Error).name === 'AbortError' && (e as Error).cause === 'enough');
    const flushed = p.link.flush({ timeout: 5000 });
    p.resume();
    await flushed;
    assert.equal(p.link.pendingSends, 0);
  } finally {
    p.close();
  }
});

test('link options are checked like Node checks options: TypeError / RangeError with codes', async () => {
  const { spawn } = await import('../../src/link/connect/spawn.js');
  // An existing module: a missing one is refused first (spawn-args.test.ts); nothing starts either way.
  const child = new URL('../fixtures/idle-child.js', import.meta.url);
  await assert.rejects(spawn(child, [], { sendQueue: { messages: 0 } }), (e: unknown) => e instanceof RangeError && (e as { code?: string }).code === 'ERR_OUT_OF_RANGE');
  await assert.rejects(spawn(child, [], { maxMessageBytes: '1' as unknown as number }), (e: unknown) => e instanceof TypeError && (e as { code?: string }).code === 'ERR_INVALID_ARG_TYPE');
  await assert.rejects(spawn(child, [], { leases: 5 as never }), (e: unknown) => e instanceof TypeError && (e as { code?: string }).code === 'ERR_INVALID_ARG_TYPE');
});
