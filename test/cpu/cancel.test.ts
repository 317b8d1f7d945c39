// Cancellation the Node way (issue 17): every call that waits takes `signal` and `timeout`. An
// abort rejects with an AbortError (name 'AbortError', code 'ABORT_ERR', the signal's reason as
// `cause`); a timeout rejects with IpcError ERR_TIMEOUT. A wait given up takes nothing with it:
// the message, the slot or the connection goes to the next caller.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import { connect, listen, spawn } from '../../src/link/index.js';
import { ChannelHub } from '../../src/channel/index.js';
import { linkPair } from '../fixtures/link-pair.js';
import { waitUntil } from '../helpers/wait.js';
import { addon } from '../../src/native/addon.js';

const reason = new Error('my reason');
const isAbort = (e: unknown) => e instanceof Error && e.name === 'AbortError' && (e as { code?: string }).code === 'ABORT_ERR' && e.cause === reason;
const isTimeout = (e: unknown) => e instanceof IpcError && e.code === 'ERR_TIMEOUT';

/** Runs `start(signal)`, aborts with `reason` after `ms`, and checks the AbortError. */
async function aborts(what: string, start: (signal: AbortSignal) => Promise<unknown>, ms = 20): Promise<void> {
  const ac = new AbortController();
  const p = start(ac.signal);
  setTimeout(() => ac.abort(reason), ms);
  await assert.rejects(p, (e: unknown) => isAbort(e) || assert.fail(`${what}: ${String((e as Error)?.stack ?? e)}`));
}

test('spawn: an abort kills the child that has not linked yet; an aborted signal spawns nothing', async () => {
  const idle = new URL('../fixtures/idle-child.js', import.meta.url);
  await aborts('spawn', (signal) => spawn(idle, [], { signal }), 200);
  const ac = new AbortController();
  ac.abort(reason);
  await assert.rejects(spawn(idle, [], { signal: ac.signal }), isAbort);
});

test('connect waits for a listener that comes later, up to its timeout; abort and timeout give up', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-cancel-'));
  try {
    // The listener comes once connect's first attempt found no socket (a refused addon.connect).
    const realConnect = addon.connect;
    let refusedAttempts = 0;
    addon.connect = ((fd: number, path: string) => {
      try {
        return realConnect(fd, path);
      } catch (e) {
        refusedAttempts++;
        throw e;
      }
    }) as typeof addon.connect;
    let late: Promise<Awaited<ReturnType<typeof connect>>>;
    try {
      late = connect('late', { directory: dir, timeout: 5000 });
      await waitUntil(() => refusedAttempts > 0, "connect's first attempt, before the listener exists");
    } finally {
      addon.connect = realConnect;
    }
    const l = listen('late', { directory: dir });
    const [link, server] = await Promise.all([late, l.accept({ timeout: 5000 })]);
    link.send('hi');
    assert.equal(await server.receive({ timeout: 2000 }), 'hi');
    link.close();
    server.close();
    await assert.rejects(connect('never', { directory: dir, timeout: 50 }), (e: unknown) => isTimeout(e) && /never/.test((e as Error).message));
    await aborts('connect', (signal) => connect('never', { directory: dir, signal }));
    // accept() gives up too, and the connection it did not take goes to the next accept().
    await assert.rejects(l.accept({ timeout: 20 }), isTimeout);
    await aborts('accept', (signal) => l.accept({ signal }));
    const c = await connect('late', { directory: dir });
    const s = await l.accept({ timeout: 2000 });
    c.close();
    s.close();
    l.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('link.receive given up takes no message; link.end gives up on a peer that does not read', async () => {
  const [a, b] = await linkPair();
  await aborts('receive', (signal) => b.receive({ signal }));
  await assert.rejects(b.receive({ timeout: 10 }), isTimeout);
  a.send('for the next receive');
  assert.equal(await b.receive({ timeout: 1000 }), 'for the next receive');
  a.close();
  b.close();

  const [c, d] = await linkPair(undefined, { inbox: { messages: 1 } });
  // d stops reading after one message: c's queue fills and end() cannot finish.
  while (c.send({ pad: 'x'.repeat(2000) }));
  await assert.rejects(c.end({ timeout: 50 }), isTimeout);
  assert.equal(c.closed, true, 'a given-up end() closes the link');
  d.close();
});

test('channel acquire, receive and end take signal and timeout; a consumer that holds every slot makes acquire wait', async () => {
  const hub = ChannelHub.create({ slots: 2, slotBytes: 64 });
  const producer = hub.producer();
  const consumer = hub.consumer();
  try {
    const s1 = await producer.acquire();
    producer.publish(s1);
    const s2 = await producer.acquire();
    producer.publish(s2);
    const held = [await consumer.receive({ timeout: 1000 }), await consumer.receive({ timeout: 1000 })];
    // Every slot is held: acquire waits (backpressure) until it gives up.
    await assert.rejects(producer.acquire({ timeout: 30 }), isTimeout);
    await aborts('acquire', (signal) => producer.acquire({ signal }));
    await assert.rejects(consumer.receive({ timeout: 10 }), isTimeout);
    await aborts('receive', (signal) => consumer.receive({ signal }));
    // end() waits for the held messages; it gives up, and the end is closed anyway.
    await assert.rejects(producer.end({ timeout: 30 }), isTimeout);
    for (const m of held) m!.release();
  } finally {
    consumer.close();
    producer.close();
    hub.close();
  }
});

test('released() of a buffer a peer still holds gives up on timeout and abort', async () => {
  const [a, b] = await linkPair();
  const h = HostBuffer.allocate(4096);
  a.send(h);
  const got = (await b.receive({ timeout: 1000 })) as HostBuffer;
  h.close();
  await assert.rejects(h.released({ timeout: 20 }), isTimeout);
  await aborts('released', (signal) => h.released({ signal }));
  got.close();
  await h.released({ timeout: 2000 });
  a.close();
  b.close();
});

test('bad signal and timeout options are TypeError / RangeError with Node codes', async () => {
  const [a, b] = await linkPair();
  await assert.rejects(b.receive({ signal: 'soon' as never }), (e: unknown) => e instanceof TypeError && (e as { code?: string }).code === 'ERR_INVALID_ARG_TYPE');
  await assert.rejects(b.receive({ timeout: -1 }), (e: unknown) => e instanceof RangeError && (e as { code?: string }).code === 'ERR_OUT_OF_RANGE');
  await assert.rejects(b.receive({ timeout: Number.NaN }), (e: unknown) => e instanceof RangeError);
  await assert.rejects(connect('x', { timeout: '1' as never }), (e: unknown) => e instanceof TypeError);
  a.close();
  b.close();
});
