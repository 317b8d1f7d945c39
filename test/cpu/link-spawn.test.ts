import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { HostBuffer } from '../../src/host/index.js';
import { parentLink, spawn, type Link } from '../../src/link/index.js';

const CHILD = new URL('../fixtures/link-child.js', import.meta.url);
const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  return link.receive({ signal: AbortSignal.timeout(10_000) });
}

test('a host buffer round trip through spawn: the child sees our bytes, we see its writes', async () => {
  const { child, link } = await spawn(CHILD);
  try {
    assert.equal(link.peer.pid, child.pid);
    assert.equal(link.peer.uid, process.getuid!());
    const who = await ask(link, { op: 'whoami' });
    assert.equal(who.pid, child.pid);
    assert.equal(who.peer.pid, process.pid, 'the child sees this process as its peer');

    using buffer = HostBuffer.allocate(1 << 20);
    buffer.fill(0x5a);
    assert.deepEqual(await ask(link, { op: 'verify-and-fill', buffer, expect: 0x5a, fill: 0xa5 }), { ok: true });
    assert.ok(buffer.bytes.every((b) => b === 0xa5), 'the child wrote into our memory');
    assert.deepEqual(await ask(link, { op: 'verify-and-fill', buffer, expect: 0x5a, fill: 0 }), { ok: false });
  } finally {
    await link.end();
    await once(child, 'exit');
  }
});

test('memfds passed both ways map the same memory, views included', async () => {
  const { child, link } = await spawn(CHILD);
  try {
    const got = await ask(link, { op: 'allocate', bytes: 8192, fill: 5 });
    const fromChild = got.buffer as HostBuffer;
    assert.ok(fromChild instanceof HostBuffer);
    assert.equal(fromChild.byteLength, 8192);
    assert.ok(fromChild.bytes.every((b) => b === 5));

    // Hand a view of it back: the child maps the same pages again.
    const view = fromChild.view(4096, 16);
    assert.deepEqual(await ask(link, { op: 'hold', buffer: view }), { held: 1 });
    view.close();
    fromChild.bytes[4096 + 3] = 42;
    assert.deepEqual(await ask(link, { op: 'peek', index: 0, offset: 3 }), { value: 42 });
    await ask(link, { op: 'poke', index: 0, offset: 15, value: 77 });
    assert.equal(fromChild.bytes[4096 + 15], 77);
    await ask(link, { op: 'release' });
    fromChild.close();
  } finally {
    await link.end();
    await once(child, 'exit');
  }
});

test('a peer killed with SIGKILL is seen as ERR_PEER_GONE', async (t) => {
  const delays: number[] = [];
  for (let run = 0; run < 3; run++) {
    const { child, link } = await spawn(CHILD);
    const pending = link.receive();
    const closed = new Promise<unknown>((resolve) => link.once('close', resolve));
    const t0 = performance.now();
    child.kill('SIGKILL');
    const reason = await closed;
    delays.push(performance.now() - t0);
    assert.ok(code('ERR_PEER_GONE')(reason));
    await assert.rejects(pending, code('ERR_PEER_GONE'));
    assert.throws(() => link.send('hello?'), code('ERR_PEER_GONE'));
    link.close();
  }
  delays.sort((a, b) => a - b);
  t.diagnostic(`seen after ${delays.map((d) => d.toFixed(1)).join(', ')} ms`);
});

test('parentLink() outside a spawned child throws ERR_NOT_SPAWNED', () => {
  assert.throws(() => parentLink(), code('ERR_NOT_SPAWNED'));
});

test('spawn rejects when the child dies or never connects, and kills it', async () => {
  await assert.rejects(spawn(new URL('../fixtures/no-such-module.js', import.meta.url), [], { stdio: 'ignore' }), code('ERR_PEER_GONE'));
  const t0 = performance.now();
  await assert.rejects(spawn(new URL('../fixtures/idle-child.js', import.meta.url), [], { handshakeTimeoutMs: 300 }), code('ERR_TIMEOUT'));
  assert.ok(performance.now() - t0 < 5000);
});
