import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { HostBuffer } from '../../src/host/index.js';
import { spawn, type Link } from '../../src/link/index.js';
import { fdCount } from '../fixtures/fd-count.js';

const CHILD = new URL('../fixtures/link-child.js', import.meta.url);

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  return link.receive({ signal: AbortSignal.timeout(10_000) });
}

test('no fd is leaked over 1,000 transfers each way, in either process', async () => {
  const { child, link } = await spawn(CHILD);
  try {
    using buffer = HostBuffer.allocate(4096);
    const cycle = async (i: number): Promise<void> => {
      const r = await ask(link, { op: 'verify-and-fill', buffer, expect: i & 255, fill: (i + 1) & 255 });
      assert.deepEqual(r, { ok: true });
      const back = await ask(link, { op: 'allocate', bytes: 4096, fill: 1 });
      assert.equal(back.buffer.bytes[4095], 1);
      back.buffer.close();
    };
    for (let i = 0; i < 20; i++) await cycle(i);  // warm up lazily opened fds
    buffer.fill(0);
    const parentBefore = fdCount();
    const childBefore = (await ask(link, { op: 'fd-count' })).fds as number;

    for (let i = 0; i < 1000; i++) await cycle(i);

    // A burst that overflows the socket queue: frames wait in the outbox with dup'ed fds.
    const burst = 200;
    for (let i = 0; i < burst; i++) link.send({ op: 'hold', buffer });
    for (let i = 0; i < burst; i++) assert.deepEqual(await link.receive(), { held: i + 1 });
    assert.equal((await ask(link, { op: 'fd-count' })).fds, childBefore + burst, 'the child holds one fd per buffer');
    await ask(link, { op: 'release' });

    assert.equal(fdCount(), parentBefore, 'parent fds');
    assert.equal((await ask(link, { op: 'fd-count' })).fds, childBefore, 'child fds');
  } finally {
    await link.end();
    await once(child, 'exit');
  }
});
