// A peer that stops reading is visible in `cuda-ipc status`: the sender's record lists what waits
// in its queue (messages, bytes, fds), the receiver's record what it has not consumed and that it
// paused reading. Both sides here are links of this process, which publishes its own record.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

const runtime = mkdtempSync(join(tmpdir(), 'cuda-ipc-backlog-'));
process.env.XDG_RUNTIME_DIR = runtime;
after(() => rmSync(runtime, { recursive: true, force: true }));

const { collectStatus } = await import('../../src/observe/reader.js');
const { formatStatus } = await import('../../src/cli/status.js');
const { HELLO, linkPair, linkWithRawPeer } = await import('../fixtures/link-pair.js');
const { addon } = await import('../../src/native/addon.js');

async function until<T>(what: string, get: () => T | undefined): Promise<T> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const v = get();
    if (v !== undefined) return v;
    if (Date.now() > deadline) assert.fail(`status never showed ${what}`);
    await sleep(50);
  }
}

test('a peer that stops reading shows in status: the sender queue per link, and a receiver that paused', async () => {
  const { link, raw } = linkWithRawPeer();
  raw.send(HELLO(1));
  await until("the link to take the raw peer's HELLO", () => (link.state === 'open' ? true : undefined));
  raw.socket.setInterest(false, false);
  let n = 0;
  while (link.send({ n: n++, pad: 'x'.repeat(100) }));
  for (let i = 0; i < 4; i++) link.send({ more: i });
  const me = () => collectStatus().processes.find((p) => p.pid === process.pid);
  const entry = await until('the send queue', () => me()?.links.find((l) => l.id === link.id && (l.sendQueue?.messages ?? 0) >= 5));
  assert.equal(entry.sendQueue!.messages, link.sendQueue.messages);
  assert.equal(entry.sendQueue!.bytes, link.sendQueue.bytes);
  const text = formatStatus(collectStatus()).join('\n');
  assert.match(text, new RegExp(`#${link.id}[^:]*: 5 messages \\(.*\\) queued to send: the peer is not reading`));

  // The receiving side: an inbox bound of 4 pauses reading; status says so.
  const [a, b] = await linkPair(undefined, { inbox: { messages: 4 } });
  for (let i = 0; i < 10; i++) a.send({ i });
  const paused = await until('the paused reader', () => me()?.links.find((l) => l.id === b.id && l.receiveQueue?.paused));
  assert.equal(paused.receiveQueue!.messages, 4);
  assert.match(formatStatus(collectStatus()).join('\n'), new RegExp(`#${b.id}.*: 4 messages .* received, not yet consumed; reading paused until they are`));
  for (let i = 0; i < 10; i++) assert.deepEqual(await b.receive({ timeout: 2000 }), { i });
  await until('the backlog gone', () => (me()?.links.find((l) => l.id === b.id)?.receiveQueue ? undefined : true));

  link.close();
  raw.socket.close();
  for (const r of raw.records) for (const fd of r.fds) addon.close(fd);
  a.close();
  b.close();
});
