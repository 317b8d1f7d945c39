// The bounds a link keeps on what one peer can make this process hold (issue 17): the inbox in
// messages, bytes and fds (reading pauses; nothing is lost), connections a listener holds before
// accept(), and running out of fds, which fails the one call (or the one received message) that
// needed a descriptor while the process and its links go on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { spawnSync } from 'node:child_process';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import { connect, listen } from '../../src/link/index.js';
import { startLinkedChild } from '../../src/link/connect/spawn.js';
import { fdCount } from '../fixtures/fd-count.js';
import { linkPair } from '../fixtures/link-pair.js';
import { waitUntil } from '../helpers/wait.js';

test('an inbox at its fd bound stops reading; the sender is told to wait; every buffer arrives in order once consumed', async () => {
  const [a, b] = await linkPair(undefined, { inbox: { fds: 3 } });
  try {
    const sent: HostBuffer[] = [];
    for (let i = 0; i < 8; i++) {
      const h = HostBuffer.allocate(4096);
      h.write(new Uint8Array([i]));
      a.send(h);
      sent.push(h);
    }
    await waitUntil(() => b.receiveQueue.paused, 'the inbox to stop reading at its fd bound');
    assert.equal(b.receiveQueue.fds, 3, 'three buffers (three fds) wait unread');
    assert.equal(b.receiveQueue.paused, true);
    for (let i = 0; i < 8; i++) {
      const got = (await b.receive({ timeout: 2000 })) as HostBuffer;
      assert.equal(got.read(0, 1)[0], i);
      got.close();
    }
    assert.equal(b.receiveQueue.paused, false);
    for (const h of sent) h.close();
  } finally {
    a.close();
    b.close();
  }
});

test('an inbox at its byte bound stops reading until consumed', async () => {
  const [a, b] = await linkPair(undefined, { inbox: { bytes: 10_000 } });
  try {
    for (let i = 0; i < 6; i++) a.send({ i, pad: 'x'.repeat(4000) });
    await waitUntil(() => b.receiveQueue.paused, 'the inbox to stop reading at its byte bound');
    assert.equal(b.receiveQueue.messages, 3);
    assert.ok(b.receiveQueue.bytes >= 10_000);
    assert.equal(b.receiveQueue.paused, true);
    for (let i = 0; i < 6; i++) assert.equal(((await b.receive({ timeout: 2000 })) as { i: number }).i, i);
  } finally {
    a.close();
    b.close();
  }
});

test('a listener holds at most maxPending connections before accept(); more are refused, and connect() says the listener is busy', async () => {
  const name = `limits-${process.pid}`;
  const l = listen(name, { maxPending: 2 });
  const refused: IpcError[] = [];
  l.on('refused', (e) => refused.push(e));
  const links = await Promise.all([connect(name), connect(name)]);
  // The third is told the listener is busy (a REFUSE, not a closed connection), tries again until its timeout, and says so.
  await assert.rejects(connect(name, { timeoutMs: 300 }), (e: unknown) => e instanceof IpcError && e.code === 'ERR_LISTENER_BUSY' && /maxPending/.test(e.message));
  assert.ok(refused.length >= 1);
  assert.equal(refused[0]!.code, 'ERR_LIMIT_REACHED');
  assert.equal(refused[0]!.limit, 'maxPending');
  // One that is waiting gets in as soon as accept() makes room.
  const refusedBefore = refused.length;
  const waiting = connect(name, { timeout: 10_000 });
  // It was turned away at least once (it waits and tries again) before accept() makes room.
  await waitUntil(() => refused.length > refusedBefore, 'the waiting connect to be refused once');
  const accepted = await l.accept();
  const ok = await waiting;
  assert.equal(ok.state, 'open', 'accept() made room');
  for (const x of [...links, ok, accepted]) x.close();
  l.close();
});

test('out of fds: HostBuffer.allocate, stats() and a received buffer fail with ERR_FD_LIMIT; the status timer keeps quiet; plain messages, and everything once fds are back, work', { timeout: 60_000 }, async () => {
  const child = fileURLToPath(new URL('../fixtures/fd-limit-child.js', import.meta.url));
  const { child: proc, link } = await startLinkedChild('/bin/sh', ['-c', 'ulimit -n 200 && exec "$0" "$@"', process.execPath, child], { stdio: 'inherit' }, 'fd-limit child');
  try {
    link.send({ op: 'fill' });
    assert.deepEqual(await link.receive({ timeout: 10_000 }), { full: true });
    using lost = HostBuffer.allocate(4096);
    link.send(lost);
    link.send({ plain: 'still flows' });
    assert.deepEqual(await link.receive({ timeout: 10_000 }), { freed: 16 });
    assert.equal(link.leases.count, 0, 'the buffer that could not arrive was released at once');
    using h = HostBuffer.allocate(4096);
    h.write(new Uint8Array([9, 8, 7, 6]));
    link.send(h);
    const report = (await link.receive({ timeout: 10_000 })) as Record<string, unknown>;
    assert.ok((report.filled as number) > 100);
    assert.equal(report.allocate, 'ERR_FD_LIMIT');
    assert.equal(report.bufferWhileFull, 'ERR_FD_LIMIT');
    assert.equal(report.plainWhileFull, '{"plain":"still flows"}');
    assert.equal(report.survivedFullTable, true);
    assert.equal(report.statsWhileFull, 'ERR_FD_LIMIT');
    assert.equal(report.bufferAfterFreeing, '9,8,7,6');
    assert.equal(report.allocateAfterFreeing, 'ok');
  } finally {
    link.close();
    if (proc.exitCode === null) proc.kill('SIGKILL');
  }
});

test('running out of fds is ERR_FD_LIMIT at the call, not a crash elsewhere', () => {
  // In a child under `ulimit -n 256` (this process's limit may be far too high to use up): it uses
  // its fds up by dups of one fd, down to none, then gives them back.
  const child = fileURLToPath(new URL('../fixtures/fd-exhaust-child.js', import.meta.url));
  const r = spawnSync('/bin/sh', ['-c', 'ulimit -n 256 && exec "$0" "$@"', process.execPath, child], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(r.status, 0, `the child failed: ${r.stderr}`);
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as Record<string, unknown>;
  assert.ok((out.held as number) > 100 && (out.held as number) < 256, `the child held ${String(out.held)} dups under a limit of 256`);
  assert.equal(out.allocate, 'ERR_FD_LIMIT');
  assert.match(out.message as string, /ulimit -n/);
  assert.equal(out.fdsBack, true, 'every dup was closed');
  assert.equal(out.allocateAfter, 'ok');
});
