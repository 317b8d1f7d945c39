// TCP links and dying peers, and what many links leave behind: a peer SIGKILLed while a large
// message is on its way gives ERR_PEER_GONE with nothing of that message delivered; a receiver
// killed mid-message gives its sender ERR_PEER_GONE; opening and closing hundreds of TCP links
// brings the process's fds and RSS back to where they were.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { setTimeout as sleep } from 'node:timers/promises';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import { listen, connect } from '../../src/link/index.js';
import type { Link } from '../../src/link/connection/link.js';
import { fdCount } from '../fixtures/fd-count.js';
import { TOKEN } from '../fixtures/tcp-peer.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const MiB = 2 ** 20;

const CHILD = fileURLToPath(new URL('../fixtures/tcp-child.js', import.meta.url));

/** Starts the TCP child playing `mode` against `url`; resolves with it once it printed its first line. */
async function startChild(url: string, mode: string): Promise<{ child: ChildProcess; line: string }> {
  const child = spawn(process.execPath, [CHILD, url, mode], { stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
  const r = await lines.next();
  if (r.done) throw new Error('the child exited before saying anything');
  return { child, line: r.value };
}

async function kill(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGKILL');
  await once(child, 'exit');
}

test('a peer SIGKILLed while a large message is on its way: ERR_PEER_GONE, and nothing of that message is delivered', { timeout: 60_000 }, async () => {
  // The receiver's inbox holds one message: once 'first' is in, it stops reading, so most of the
  // 64 MiB is still in the sender's process when it dies.
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, inbox: { messages: 1 } });
  const accepted = listener.accept();
  const { child, line } = await startChild(listener.url, 'big');
  let link: Link | undefined;
  try {
    assert.equal(line, 'sent');
    link = await accepted;
    for (let i = 0; i < 200 && !link.receiveQueue.paused; i++) await sleep(10);
    assert.equal(link.receiveQueue.paused, true, 'the receiver stopped reading with the large message on its way');
    const closed = new Promise<IpcError | undefined>((r) => link!.on('close', r));
    await kill(child);
    assert.equal(await link.receive(), 'first', 'what came whole before is delivered');
    // The next receive gets the close, not a message: nothing of the message cut short.
    await assert.rejects(link.receive(), (e: unknown) => (e as IpcError).code === 'ERR_PEER_GONE');
    assert.equal((await closed)?.code, 'ERR_PEER_GONE');
  } finally {
    link?.close();
    await kill(child);
    listener.close();
  }
});

test('a receiver SIGKILLed while a large message is on its way to it: the sender gets ERR_PEER_GONE', { timeout: 60_000 }, async () => {
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN });
  const accepted = listener.accept();
  const { child, line } = await startChild(listener.url, 'receive');
  let link: Link | undefined;
  try {
    assert.equal(line, 'ready');
    link = await accepted;
    const closed = new Promise<IpcError | undefined>((r) => link!.on('close', r));
    link.send(new Uint8Array(64 * MiB));
    await kill(child);
    const reason = await closed;
    assert.equal(reason?.code, 'ERR_PEER_GONE', String(reason));
    assert.equal(link.leases.count, 0);
  } finally {
    link?.close();
    await kill(child);
    listener.close();
  }
});

/** Waits (at most 10 s) until the process's fds are back to `n`: closed TCP sockets linger until their peer closed too. */
async function fdsBackTo(n: number): Promise<number> {
  for (let i = 0; i < 200 && fdCount() !== n; i++) await sleep(50);
  return fdCount();
}

test('hundreds of TCP links opened, used and closed: fds and RSS come back to where they were', { timeout: 120_000 }, async (t) => {
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN });
  const round = async (n: number): Promise<void> => {
    for (let i = 0; i < n; i++) {
      const [a, b] = await Promise.all([listener.accept(), connect(listener.url, { token: TOKEN })]);
      using h = HostBuffer.allocate(64 * 1024);
      b.send({ i, h, big: new Uint8Array(MiB) });
      const got = (await a.receive()) as { h: HostBuffer };
      got.h.close();
      if (i % 2) await b.end();
      b.close();
      a.close();
    }
  };
  try {
    // A first run takes what is opened lazily and what the allocator keeps of freed buffers.
    await round(100);
    // Closed sockets linger until their peer closed too: the count once it stopped changing.
    let fds0 = fdCount();
    for (let i = 0; i < 60; i++) {
      await sleep(50);
      const now = fdCount();
      if (now === fds0) break;
      fds0 = now;
    }
    await sleep(100);
    gc();
    const rss0 = process.memoryUsage().rss;
    await round(300);
    const fds1 = await fdsBackTo(fds0);
    gc();
    const grew = process.memoryUsage().rss - rss0;
    t.diagnostic(`fds ${fds0} before, ${fds1} after 300 more links; RSS ${grew >= 0 ? '+' : ''}${(grew / MiB).toFixed(1)} MiB`);
    assert.equal(fds1, fds0, 'every socket and memfd was closed');
    // 300 links carried 320 MiB: a leak of their messages would show many times over.
    assert.ok(grew < 48 * MiB, `RSS grew by ${(grew / MiB).toFixed(1)} MiB`);
  } finally {
    listener.close();
  }
});
