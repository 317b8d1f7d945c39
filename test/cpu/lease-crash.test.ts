// Leases across real processes: a child that holds our host buffers dies (SIGKILL) at any point,
// closes what it got, or has the memory pulled from under our own view by a forced close.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { randomInt } from 'node:crypto';
import { HostBuffer } from '../../src/host/index.js';
import { leaseStats, spawn, type Link } from '../../src/link/index.js';
import { fdCount, inodeOf, mappedMemfds, openMemfds } from '../fixtures/fd-count.js';

const CHILD = new URL('../fixtures/lease-child.js', import.meta.url);
const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;

/** `h.released()`, failing the test instead of hanging when it does not come within `ms`. */
function releasedSoon(h: HostBuffer, ms = 30_000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the HostBuffer was not released within ${ms} ms (${h.leases} leases left)`)), ms);
  });
  return Promise.race([h.released(), late]).finally(() => clearTimeout(timer));
}

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  return link.receive({ signal: AbortSignal.timeout(10_000) });
}

/**
 * Waits (polling every few ms) until `ok()` holds, failing after `ms` (a generous deadline, not a
 * bound under test); returns how long it took, for the diagnostic.
 */
async function within(ms: number, ok: () => boolean, what: () => string): Promise<number> {
  const t0 = performance.now();
  for (;;) {
    if (ok()) return performance.now() - t0;
    if (performance.now() - t0 > ms) assert.fail(`not within ${ms} ms: ${what()}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

/** None of `inodes` is open or mapped in this process any more. */
function gone(inodes: ReadonlySet<number>): boolean {
  return !openMemfds().some((i) => inodes.has(i)) && !mappedMemfds().some((i) => inodes.has(i));
}

function stillHeld(inodes: ReadonlySet<number>): string {
  const fds = openMemfds().filter((i) => inodes.has(i));
  const maps = mappedMemfds().filter((i) => inodes.has(i));
  return `memfds still open: [${fds}], still mapped: [${maps}]`;
}

/** mulberry32: the cycles' random choices, reproducible from the printed seed. */
function prng(seed: number): (n: number) => number {
  let s = seed >>> 0;
  return (n) => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = Math.imul(s ^ (s >>> 15), s | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (((t ^ (t >>> 14)) >>> 0) / 2 ** 32) * n | 0;
  };
}

type Phase = 'before the child replies' | 'mid-way through its replies' | 'after it released some';
const PHASES: Phase[] = ['before the child replies', 'mid-way through its replies', 'after it released some'];

/**
 * One cycle: spawn, lease N host buffers to the child, let go of our own handles (only the leases
 * keep the memory mapped), SIGKILL the child at the given point, then check that every lease of
 * the link ended and every memfd of the cycle is unmapped and closed once the child's death was
 * seen (a generous deadline fails loudly; how long it took is printed, not checked). Returns that delay.
 */
async function crashCycle(random: (n: number) => number, phase: Phase): Promise<number> {
  const { child, link } = await spawn(CHILD);
  const exited = once(child, 'exit');
  try {
    const n = 1 + random(6);
    const buffers = Array.from({ length: n }, (_, i) => {
      const h = HostBuffer.allocate(4096 * (1 + random(4)));
      h.fill(i + 1);
      return h;
    });
    const inodeList = buffers.map((h) => inodeOf(h.fd));
    const inodes = new Set(inodeList);
    const bytes = buffers.reduce((sum, h) => sum + h.byteLength, 0);
    const ack = phase !== 'before the child replies';
    for (let i = 0; i < n; i++) link.send({ op: 'take', buffer: buffers[i], i, ack });
    assert.deepEqual(link.leases, { count: n, bytes });
    // Sometimes we keep one buffer open through the crash: it must lose its lease but stay ours.
    const kept = random(3) === 0 ? buffers[random(n)] : undefined;
    for (const h of buffers) if (h !== kept) h.close();

    if (phase === 'mid-way through its replies') {
      const k = random(n);
      for (let i = 0; i < k; i++) assert.deepEqual(await link.receive(), { took: i });
    } else if (phase === 'after it released some') {
      for (let i = 0; i < n; i++) assert.deepEqual(await link.receive(), { took: i });
      const k = 1 + random(n);
      assert.deepEqual(await ask(link, { op: 'drop', count: k }), { dropped: k, held: n - k });
      await within(30_000, () => link.leases.count === n - k, () => `leases ${JSON.stringify(link.leases)}, want ${n - k}`);
      const released = buffers.slice(0, k).filter((h) => h !== kept);
      await Promise.all(released.map((h) => releasedSoon(h)));
      assert.ok(gone(new Set(released.map((h) => inodeList[buffers.indexOf(h)]!))), 'released buffers are unmapped');
    }

    // Not events.once(): it listens for 'error' too, which the link then emits and once() rejects.
    const closed = new Promise<unknown>((resolve) => link.once('close', resolve));
    child.kill('SIGKILL');
    const reason = await closed;
    assert.ok(code('ERR_PEER_GONE')(reason), `closed with ${String(reason)}`);
    const keptInode = kept ? inodeOf(kept.fd) : -1;
    const others = new Set([...inodes].filter((i) => i !== keptInode));
    const delay = await within(
      30_000,
      () => link.leases.count === 0 && link.leases.bytes === 0 && !leaseStats().links.some((l) => l.linkId === link.id) && gone(others),
      () => `leases ${JSON.stringify(link.leases)}; ${stillHeld(others)}`,
    );
    if (kept) {
      assert.equal(kept.leases, 0);
      assert.equal(kept.bytes[0], buffers.indexOf(kept) + 1, 'our own buffer is untouched');
      kept.close();
      await releasedSoon(kept);
      assert.ok(gone(inodes), stillHeld(inodes));
    }
    return delay;
  } finally {
    link.close();
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
  }
}

test('200 children SIGKILLed while holding leased host buffers: no leaked fd, memfd or held byte', { timeout: 120_000 }, async (t) => {
  const seed = process.env.CUDA_IPC_CRASH_SEED !== undefined ? Number(process.env.CUDA_IPC_CRASH_SEED) >>> 0 : randomInt(2 ** 32);
  t.diagnostic(`crash seed ${seed} (rerun with CUDA_IPC_CRASH_SEED=${seed})`);
  // Each cycle draws from its own stream, so that a seed replays every cycle's choices.
  const cycleRandom = (index: number) => prng(seed ^ Math.imul(index + 1, 0x9e3779b9));
  await crashCycle(cycleRandom(-1), 'after it released some');  // warm-up: lazily opened fds, module loads
  const fds = fdCount();
  const memfds = openMemfds().length;
  const maps = mappedMemfds().length;

  // Spawning costs ~85 ms of CPU here, so a few cycles run at once; each checks its own memfds
  // (by inode) and its own link, and the totals are checked once all are done.
  const cycles = 200;
  const concurrency = 4;
  const delays: number[] = [];
  const byPhase = new Map<Phase, number>();
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < cycles) {
        const index = next++;
        const phase = PHASES[index % PHASES.length]!;
        delays.push(await crashCycle(cycleRandom(index), phase));
        byPhase.set(phase, (byPhase.get(phase) ?? 0) + 1);
      }
    }),
  );
  delays.sort((a, b) => a - b);
  t.diagnostic(
    `${cycles} cycles in ${Math.round(performance.now() - started)} ms; lease cleanup after the kill was seen: ` +
      `median ${delays[cycles >> 1]!.toFixed(2)} ms, max ${delays[cycles - 1]!.toFixed(2)} ms; ${JSON.stringify(Object.fromEntries(byPhase))}`,
  );
  assert.equal(delays.length, cycles);
  assert.deepEqual(leaseStats(), { count: 0, bytes: 0, links: [] });
  assert.equal(openMemfds().length, memfds, 'memfds open');
  assert.equal(mappedMemfds().length, maps, 'memfd mappings');
  assert.equal(fdCount(), fds, 'fds open');
});

test('a producer killed while the consumer reads: ERR_PEER_GONE, and the mapped data stays readable', async () => {
  const { child, link } = await spawn(CHILD);
  const exited = once(child, 'exit');
  try {
    const { buffer } = (await ask(link, { op: 'produce', bytes: 1 << 20, fill: 7 })) as { buffer: HostBuffer };
    const inode = inodeOf(buffer.fd);
    const next = link.receive();
    let sum = 0;
    for (let i = 0; i < buffer.byteLength / 2; i++) sum += buffer.bytes[i]!;
    child.kill('SIGKILL');
    await assert.rejects(next, code('ERR_PEER_GONE'));
    await exited;
    for (let i = buffer.byteLength / 2; i < buffer.byteLength; i++) sum += buffer.bytes[i]!;
    assert.equal(sum, 7 * buffer.byteLength, 'every byte readable after the producer died');
    buffer.fill(1);  // and writable: the memory is ours as long as we map it
    assert.equal(buffer.bytes[12345], 1);
    buffer.close();  // ends a lease on a closed link: nothing to do, nothing thrown
    await releasedSoon(buffer);
    assert.ok(gone(new Set([inode])));
  } finally {
    link.close();
  }
});

test('the child closing its imports releases our leases: count, bytes, and memory unmapped', async () => {
  const { child, link } = await spawn(CHILD);
  try {
    const buffers = [1, 2, 3].map((i) => {
      const h = HostBuffer.allocate(8192 * i);
      h.fill(i);
      return h;
    });
    const inodes = buffers.map((h) => inodeOf(h.fd));
    for (const [i, buffer] of buffers.entries()) link.send({ op: 'take', buffer, i, ack: true });
    for (let i = 0; i < 3; i++) await link.receive();
    assert.deepEqual(link.leases, { count: 3, bytes: 8192 * 6 });
    assert.deepEqual(leaseStats().links, [{ linkId: link.id, peerPid: child.pid, count: 3, bytes: 8192 * 6 }]);
    let releasedFirst = false;
    void buffers[0]!.released().then(() => (releasedFirst = true));
    for (const h of buffers) h.close();
    assert.equal(buffers[0]!.leases, 1);
    assert.ok(mappedMemfds().includes(inodes[0]!), 'closed by us, still mapped for the lease');

    await ask(link, { op: 'drop', count: 1 });
    await releasedSoon(buffers[0]!);
    assert.ok(releasedFirst);
    assert.equal(buffers[0]!.leases, 0);
    assert.deepEqual(link.leases, { count: 2, bytes: 8192 * 5 });
    assert.ok(gone(new Set([inodes[0]!])), 'the first buffer is unmapped and its fd closed');
    assert.ok(mappedMemfds().includes(inodes[1]!) && mappedMemfds().includes(inodes[2]!));
    assert.deepEqual(await ask(link, { op: 'read', index: 1, offset: 100 }), { value: 3 });

    await ask(link, { op: 'drop', count: 2 });
    await Promise.all(buffers.map((h) => releasedSoon(h)));
    assert.deepEqual(link.leases, { count: 0, bytes: 0 });
    assert.deepEqual(leaseStats(), { count: 0, bytes: 0, links: [] });
    assert.ok(gone(new Set(inodes)));

    // Many imports closed in one tick come back batched, and all of them count.
    using one = HostBuffer.allocate(4096);
    for (let i = 0; i < 300; i++) link.send({ op: 'take', buffer: one, i, ack: false });
    assert.equal(one.leases, 300);
    assert.deepEqual(await ask(link, { op: 'drop', count: 300 }), { dropped: 300, held: 0 });
    await within(30_000, () => one.leases === 0, () => `${one.leases} leases left`);
    assert.equal(link.state, 'open');
  } finally {
    await link.end();
    await once(child, 'exit');
  }
});

test('a forced close unmaps our view now; the child keeps reading its own mapping', async () => {
  const { child, link } = await spawn(CHILD);
  try {
    const h = HostBuffer.allocate(1 << 16);
    h.fill(9);
    const inode = inodeOf(h.fd);
    const view = h.view(4096, 16);
    assert.deepEqual(await ask(link, { op: 'take', buffer: h, i: 0, ack: true }), { took: 0 });
    assert.equal(h.leases, 1);
    h.close();
    assert.ok(mappedMemfds().includes(inode), 'the lease (and the view) keep it mapped');
    h.close({ force: true });  // already closed: the force still applies to the memory
    await releasedSoon(h);
    assert.ok(gone(new Set([inode])), 'unmapped and closed despite the lease and the open view');
    assert.equal(view.closed, true);
    assert.throws(() => view.bytes, code('ERR_CLOSED'));
    view.close();
    assert.equal(h.leases, 1, 'the lease is still outstanding: the child has the memory');
    assert.deepEqual(await ask(link, { op: 'sum', index: 0 }), { sum: 9 * (1 << 16) });
    await ask(link, { op: 'drop', count: 1 });
    await within(30_000, () => link.leases.count === 0, () => 'lease not released');
    assert.equal(h.leases, 0);
    assert.equal(link.state, 'open', 'a release after a forced close is no protocol error');
  } finally {
    await link.end();
    await once(child, 'exit');
  }
});
