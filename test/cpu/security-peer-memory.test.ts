// Issue 40.2: what authenticated peers can make this process hold. Three TCP peers (processes of
// their own) each send 24 messages of 8 MiB to an application that does not read. The process's
// bound across links (setMaxReceivedBytes, here 64 MiB instead of the 1 GiB default, so that the
// test stays small on a 2-core CI machine; the mechanism does not depend on the size) stops every
// link from reading once it is reached: memory held for unconsumed messages peaks within the bound
// plus one message, and RSS within that plus a fixed allowance, against 576 MiB sent. Then the
// application reads: every message arrives, in order, none lost. And one message may not be larger
// than the inbox bound: a larger one is refused with ERR_MESSAGE_TOO_LARGE (the link closes, both
// sides told), and maxMessageBytes above inbox.bytes is a RangeError.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn as spawnProcess, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { IpcError } from '../../src/errors.js';
import { listen, receivedMemory, setMaxReceivedBytes, type Link } from '../../src/link/index.js';
import { resetReceivedPeak, DEFAULT_MAX_RECEIVED_BYTES } from '../../src/link/transport/received-memory.js';
import { linkLimits } from '../../src/link/connection/link-options.js';
import { TOKEN, tcpPair } from '../fixtures/tcp-peer.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const MiB = 2 ** 20;
const SENDER = fileURLToPath(new URL('../fixtures/flood-sender.js', import.meta.url));
const LINKS = 3;
const MESSAGES = 24;
const MESSAGE = 8 * MiB;
const BOUND = 64 * MiB;
/** RSS beyond the bound that is not message memory: the three links' buffers, heap growth, malloc arenas. */
const RSS_ALLOWANCE = 64 * MiB;

interface Sender {
  child: ChildProcess;
  lines: Array<Record<string, number>>;
  next(): Promise<Record<string, number>>;
}

function startSender(url: string): Sender {
  const child = spawnProcess(process.execPath, [SENDER, url, String(MESSAGES), String(MESSAGE)], { stdio: ['ignore', 'pipe', 'inherit'] });
  const lines: Array<Record<string, number>> = [];
  const waiting: Array<(l: Record<string, number>) => void> = [];
  createInterface({ input: child.stdout! }).on('line', (line) => {
    const l = JSON.parse(line) as Record<string, number>;
    const w = waiting.shift();
    if (w) w(l);
    else lines.push(l);
  });
  return {
    child,
    lines,
    next: () => (lines.length ? Promise.resolve(lines.shift()!) : new Promise((resolve, reject) => {
      waiting.push(resolve);
      child.once('exit', (code) => reject(new Error(`the sender exited (code ${code}) before its next line`)));
    })),
  };
}

test('three authenticated TCP peers flooding an application that does not read: held memory and RSS stay within the process bound; nothing is lost', { timeout: 300_000 }, async (t) => {
  assert.equal(receivedMemory().limit, DEFAULT_MAX_RECEIVED_BYTES, 'the documented default');
  setMaxReceivedBytes(BOUND);
  const senders: Sender[] = [];
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, maxMessageBytes: MESSAGE, inbox: { bytes: MESSAGE * 8 } });
  // A link of this process whose application waits for its messages: it reads whatever the bound,
  // and its round trips are the later events after which "nothing more was taken" is checked.
  const ping = await tcpPair();
  let peakRss = 0;
  const sample = setInterval(() => { peakRss = Math.max(peakRss, process.memoryUsage().rss); }, 20);
  try {
    gc();
    const rss0 = process.memoryUsage().rss;
    resetReceivedPeak();
    const links: Link[] = [];
    for (let i = 0; i < LINKS; i++) {
      senders.push(startSender(listener.url));
      links.push(await listener.accept());
    }
    // Steady state: every sender is waiting for 'drain', and no link has room for one more message.
    for (const s of senders) assert.ok('blocked' in (await s.next()), 'each sender is told to wait');
    const deadline = Date.now() + 120_000;
    // (A message reserves its frame: 16 bytes of header more than its payload.)
    while (receivedMemory().held < BOUND - MESSAGE) {
      assert.ok(Date.now() < deadline, `held ${receivedMemory().held} bytes and still reading after 120 s`);
      await new Promise((r) => setTimeout(r, 20));
    }
    for (let i = 0; i < 200; i++) {
      const answer = ping.a.receive({ timeout: 30_000 }).then((m) => ping.a.send(m));
      ping.b.send(i);
      await answer;
      assert.equal(await ping.b.receive({ timeout: 30_000 }), i);
    }
    const { held, peak } = receivedMemory();
    peakRss = Math.max(peakRss, process.memoryUsage().rss);
    const grew = peakRss - rss0;
    t.diagnostic(`sent up to ${(LINKS * MESSAGES * MESSAGE) / MiB} MiB on ${LINKS} links; held ${(held / MiB).toFixed(0)} MiB, peak ${(peak / MiB).toFixed(0)} MiB (bound ${BOUND / MiB} MiB + one ${MESSAGE / MiB} MiB message); RSS +${(grew / MiB).toFixed(0)} MiB at most`);
    assert.ok(peak <= BOUND + MESSAGE, `held at most the bound plus one message (peak ${peak})`);
    assert.ok(grew <= BOUND + 2 * MESSAGE + RSS_ALLOWANCE, `RSS grew by ${(grew / MiB).toFixed(0)} MiB, more than the bound (${BOUND / MiB}) + two messages + ${RSS_ALLOWANCE / MiB} MiB`);

    // The application reads: every message, in order, on every link.
    await Promise.all(links.map(async (link) => {
      for (let i = 0; i < MESSAGES; i++) {
        const m = (await link.receive({ timeout: 120_000 })) as Uint8Array;
        assert.equal(m.byteLength, MESSAGE);
        assert.ok(m[0] === (i & 255) && m[MESSAGE - 1] === (i & 255), `message ${i} intact`);
      }
    }));
    for (const s of senders) {
      let line: Record<string, number>;
      do line = await s.next(); while (!('done' in line));
      assert.equal(line.done, MESSAGES);
    }
    await Promise.all(senders.map((s) => (s.child.exitCode === null ? once(s.child, 'exit') : undefined)));
    for (const link of links) link.close();
    assert.equal(receivedMemory().held, 0, 'nothing left counted');
  } finally {
    clearInterval(sample);
    for (const s of senders) if (s.child.exitCode === null) s.child.kill();
    await listener.close();
    ping.a.close();
    ping.b.close();
    await ping.listener.close();
    setMaxReceivedBytes(DEFAULT_MAX_RECEIVED_BYTES);
  }
});

test('one message larger than the receiver\'s inbox bound is refused with ERR_MESSAGE_TOO_LARGE on both sides; maxMessageBytes above inbox.bytes is a RangeError', async () => {
  assert.equal(linkLimits(undefined, 'options').maxMessageBytes, 256 * MiB, 'the default is the inbox bound');
  assert.equal(linkLimits({ inbox: { bytes: 4 * MiB } }, 'options').maxMessageBytes, 4 * MiB, 'it follows inbox.bytes');
  assert.throws(() => linkLimits({ maxMessageBytes: 2 * MiB, inbox: { bytes: MiB } }, 'options'),
    (e: unknown) => e instanceof RangeError && (e as { code?: string }).code === 'ERR_OUT_OF_RANGE' && /maxMessageBytes \(2097152\) is larger than options\.inbox\.bytes \(1048576\)/.test(e.message));
  const { a, b, listener } = await tcpPair({ inbox: { bytes: MiB } }, { inbox: { bytes: 8 * MiB } });
  try {
    const closedA = new Promise<IpcError | undefined>((r) => a.on('close', r));
    assert.equal(b.send(new Uint8Array(2 * MiB)), true);
    const reasonA = await closedA;
    assert.equal(reasonA?.code, 'ERR_MESSAGE_TOO_LARGE');
    await assert.rejects(b.receive({ timeout: 30_000 }), (e: unknown) => {
      assert.ok(e instanceof IpcError);
      assert.equal(e.code, 'ERR_MESSAGE_TOO_LARGE');
      assert.match(e.message, /more than this link accepts \(maxMessageBytes 1048576\)/);
      return true;
    });
  } finally {
    a.close();
    b.close();
    await listener.close();
  }
});
