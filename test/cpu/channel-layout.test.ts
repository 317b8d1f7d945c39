// The control block's layout checks, hostile contents, the native primitives' argument checks,
// and doorbells under worker termination and process exit.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Worker } from 'node:worker_threads';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { addon } from '../../src/native/addon.js';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import { ChannelHub } from '../../src/channel/index.js';
import { controlBytesOf } from '../helpers/channel-internals.js';
import { waitUntil, within } from '../helpers/wait.js';
import { Doorbells } from '../../src/channel/doorbells.js';
import { spawn } from '../../src/link/index.js';
import { computeLayout, readHeader, writeHeader, H, S, P, Kind, HEADER_BYTES } from '../../src/channel/layout.js';

const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;
const WORKER = new URL('../fixtures/channel-worker.js', import.meta.url);

function validBlock(params = { slotCount: 8, slotBytes: 4096, metaBytes: 64, maxParticipants: 4, device: false, broadcast: false }) {
  const l = computeLayout(params);
  const bytes = new Uint8Array(l.totalBytes);
  writeHeader(new DataView(bytes.buffer), l, 1, 1);
  return { l, bytes };
}

test('readHeader accepts what writeHeader wrote and refuses every single-field change', () => {
  const { l, bytes } = validBlock();
  const got = readHeader(new DataView(bytes.buffer), bytes.byteLength);
  assert.equal(got.slotCount, 8);
  assert.equal(got.totalBytes, l.totalBytes);
  assert.throws(() => readHeader(new DataView(bytes.buffer), l.totalBytes - 1), code('ERR_DESCRIPTOR_INVALID'));
  assert.throws(() => readHeader(new DataView(bytes.buffer, 0, 100), 100), code('ERR_DESCRIPTOR_INVALID'));
  const mutate = (off: number, f: (v: DataView) => void) => {
    const b = bytes.slice();
    f(new DataView(b.buffer));
    return () => readHeader(new DataView(b.buffer), b.byteLength);
  };
  for (const version of [2, 3, 5]) assert.throws(mutate(H.version, (v) => v.setUint16(H.version, version, true)), code('ERR_DESCRIPTOR_VERSION'));
  // A block of the previous layout (3) is refused with both versions named.
  assert.throws(mutate(H.version, (v) => v.setUint16(H.version, 3, true)), /layout version 3; this cuda-ipc reads version 4/);
  for (const [off, val] of [[H.magic, 1], [H.flags, 4], [H.slotCount, 0], [H.slotCount, 9], [H.metaBytes, 7], [H.maxParticipants, 1],
    [H.maxParticipants, 33], [H.ringOffset, 0], [H.slotRecordsOffset, 1], [H.slotRecordBytes, 64], [H.participantsOffset, 0],
    [96, 1], [150, 1], [216, 1], [250, 1], [300, 1], [H.expectProducers, 99], [H.expectConsumers, 0], [H.fencesOffset, 64]] as const) {
    assert.throws(mutate(off, (v) => v.setUint32(off, val, true)), code('ERR_DESCRIPTOR_INVALID'), `offset ${off} = ${val}`);
  }
  assert.throws(mutate(H.totalBytes, (v) => v.setBigUint64(H.totalBytes, 1n << 62n, true)), code('ERR_DESCRIPTOR_INVALID'));
  assert.throws(mutate(H.slotBytes, (v) => v.setBigUint64(H.slotBytes, 1n << 60n, true)), code('ERR_DESCRIPTOR_INVALID'));
});

test('readHeader on random bytes and random mutations only ever throws IpcError', () => {
  const { bytes } = validBlock();
  let seed = 12345;
  const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
  for (let i = 0; i < 20000; i++) {
    const b = bytes.slice();
    if (i % 10 === 0) for (let j = 0; j < HEADER_BYTES; j++) b[j] = (rand() * 256) | 0;
    else for (let j = 0; j < 1 + (i % 4); j++) b[(rand() * HEADER_BYTES) | 0] = (rand() * 256) | 0;
    try {
      const l = readHeader(new DataView(b.buffer), b.byteLength);
      assert.ok(l.totalBytes <= b.byteLength && l.slotCount >= 1);
    } catch (e) {
      assert.ok(e instanceof IpcError, String(e));
    }
  }
});

test('native shared words: alignment, bounds, sizes and types are checked, never trusted', () => {
  using hb = HostBuffer.allocate(4096);
  const w = new addon.SharedWords(hb.fd, 4096);
  for (const off of [1, 2, 3, -4, 4096, 4094, 1.5, Number.NaN, 2 ** 60]) assert.throws(() => w.load32(off), RangeError, String(off));
  for (const off of [4, 4092, 4089]) assert.throws(() => w.load64(off), RangeError, String(off));
  assert.throws(() => w.load32('8' as never), TypeError);
  assert.throws(() => w.store64(8, 2 ** 54), RangeError);
  assert.throws(() => w.store64(8, -1), RangeError);
  assert.equal(w.cas32(0, 0, 5), 0);
  assert.equal(w.cas32(0, 0, 6), 5, 'a failed swap returns the value seen');
  assert.equal(w.add32(0, -6), 5);
  assert.equal(w.load32(0), 0xffffffff, '32-bit add wraps');
  assert.equal(w.and32(0, 0xff), 0xffffffff);
  assert.equal(w.or32(0, 0x100), 0xff);
  assert.equal(w.load32(0), 0x1ff);
  new DataView(hb.bytes.buffer).setBigUint64(8, 1n << 60n, true);
  assert.equal(w.load64(8), -1, 'a value past 2^53 reads as -1');
  assert.equal(w.claimFirst32(64, 64, 4, 2, 0xff, 0, 9), 2);
  assert.equal(w.claimFirst32(64, 64, 4, 2, 0xff, 0, 9), 3);
  assert.throws(() => w.claimFirst32(64, 64, 100, 0, 0xff, 0, 9), RangeError, 'a scan past the end');
  assert.throws(() => w.claimFirst32(64, 6, 4, 0, 0xff, 0, 9), RangeError, 'an unaligned stride');
  assert.equal(w.spinWait32(16, 0, 200), false, 'nothing changed within 200 us');
  assert.equal(w.spinWait32(16, 1, 200), true);
  w.close();
  assert.throws(() => w.load32(0), (e: unknown) => (e as { code?: string }).code === 'EBADF');
  w.close();
  assert.throws(() => new addon.SharedWords(hb.fd, 8192), (e: unknown) => (e as { code?: string }).code === 'EINVAL', 'a file shorter than asked');
  const unsealed = addon.memfdCreate('unsealed');
  try {
    addon.ftruncate(unsealed, 4096);
    assert.throws(() => new addon.SharedWords(unsealed, 4096), (e: unknown) => (e as { code?: string }).code === 'EPERM', 'a file that could shrink under us');
  } finally {
    addon.close(unsealed);
  }
  const [a, b] = addon.socketpair();
  try {
    assert.throws(() => new addon.SharedWords(a, 4096), (e: unknown) => (e as { code?: string }).code === 'EINVAL', 'not a regular file');
  } finally {
    addon.close(a);
    addon.close(b);
  }
});

test('eventfd doorbells: ring, drain, poll on the event loop, close; received fds must be eventfds', async () => {
  const fd = addon.eventfdCreate();
  try {
    assert.equal(addon.isEventfd(fd), true);
    assert.equal(addon.eventfdDrain(fd), 0, 'a fresh eventfd holds nothing');
    addon.eventfdRing(fd);
    addon.eventfdRing(fd);
    assert.equal(addon.eventfdDrain(fd), 2);
    assert.equal(addon.eventfdDrain(fd), 0);
    const calls: number[] = [];
    let woke: () => void = () => {};
    const bell = new addon.Doorbell(fd, (status) => { calls.push(status); woke(); });
    bell.ref();
    await new Promise<void>((resolve) => { woke = resolve; setTimeout(() => addon.eventfdRing(fd), 5); });
    assert.deepEqual(calls, [0]);
    assert.equal(addon.eventfdDrain(fd), 0, 'the doorbell drained what woke it');
    // Rung twice before the loop runs: one call (a level, not a count) that drains both; a third
    // ring after it is the later event that shows no second call came between.
    addon.eventfdRing(fd);
    addon.eventfdRing(fd);
    await within(new Promise<void>((resolve) => { woke = resolve; }), 'the doorbell to call for two rings');
    assert.equal(addon.eventfdDrain(fd), 0, 'the one call drained both rings');
    await within(new Promise<void>((resolve) => { woke = resolve; addon.eventfdRing(fd); }), 'the doorbell to call for a third ring');
    assert.deepEqual(calls, [0, 0, 0]);
    bell.close();
    bell.close();
    assert.equal(bell.closed, true);
    // The closed doorbell's fd rung first, then a second doorbell's: once the second called and
    // the loop's poll phase ended (setImmediate), a call of the first would have come.
    addon.eventfdRing(fd);
    const fd2 = addon.eventfdCreate();
    let second: () => void = () => {};
    const bell2 = new addon.Doorbell(fd2, () => second());
    bell2.ref();
    try {
      await within(new Promise<void>((resolve) => { second = resolve; addon.eventfdRing(fd2); }), 'the second doorbell to call');
      await new Promise((r) => setImmediate(r));
    } finally {
      bell2.close();
      addon.close(fd2);
    }
    assert.deepEqual(calls, [0, 0, 0], 'a closed doorbell calls nobody');
    assert.throws(() => new addon.Doorbell(fd, 5 as never), TypeError);
    assert.throws(() => new addon.Doorbell(-1, () => {}), TypeError);
  } finally {
    addon.close(fd);
  }
  using hb = HostBuffer.allocate(4096);
  assert.equal(addon.isEventfd(hb.fd), false);
  assert.throws(() => Doorbells.adopt([hb.fd]), code('ERR_DESCRIPTOR_INVALID'));
  const [a, b] = addon.socketpair();
  try {
    assert.equal(addon.isEventfd(a), false);
  } finally {
    addon.close(a);
    addon.close(b);
  }
  assert.throws(() => addon.eventfdRing(-1), TypeError);
});

test('a hostile control block: garbage in the ring, positions, lengths or meta is ERR_CHANNEL_CORRUPT, never a crash', () => {
  const fresh = () => {
    const hub = ChannelHub.create({ slots: 4, slotBytes: 64, metaBytes: 64 });
    const ch = hub.consumer();
    const bytes = controlBytesOf(ch);
    const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const l = computeLayout({ slotCount: 4, slotBytes: 64, metaBytes: 64, maxParticipants: 16, device: false, broadcast: false });
    // A well-formed message in slot 1 at position 0, published by a made-up producer 1.
    const so = l.slotRecordsOffset + 1 * l.slotRecordBytes;
    v.setUint32(so + S.state, Kind.Published | (1 << 8), true);
    v.setBigUint64(so + S.position, 0n, true);
    v.setBigUint64(so + S.length, 8n, true);
    v.setUint32(l.ringOffset, 1, true);
    v.setBigUint64(H.tail, 1n, true);
    return { ch, hub, v, l, so };
  };
  {
    const { ch, hub } = fresh();
    const m = ch.tryReceive();
    assert.equal(m?.index, 1);
    assert.equal(m?.length, 8);
    m!.release();
    hub.close();
  }
  const cases: Array<[string, (x: ReturnType<typeof fresh>) => void]> = [
    ['ring entry out of range', ({ v, l }) => v.setUint32(l.ringOffset, 999, true)],
    ['tail past 2^53', ({ v }) => v.setBigUint64(H.tail, 1n << 60n, true)],
    ['head past 2^53', ({ v }) => v.setBigUint64(H.head, 1n << 60n, true)],
    ['tail far ahead of head', ({ v }) => v.setBigUint64(H.tail, 1000n, true)],
    ['length past the slot', ({ v, so }) => v.setBigUint64(so + S.length, 65n, true)],
    ['meta length past the area', ({ v, so }) => { v.setUint32(so + S.metaLength, 65, true); v.setUint32(so + S.metaKind, 1, true); }],
    ['meta kind unknown', ({ v, so }) => { v.setUint32(so + S.metaKind, 9, true); }],
    ['meta not JSON', ({ v, so }) => { v.setUint32(so + S.metaLength, 3, true); v.setUint32(so + S.metaKind, 1, true); v.setUint8(so + S.meta, 0x7b); }],
  ];
  for (const [what, corrupt] of cases) {
    const x = fresh();
    corrupt(x);
    assert.throws(() => x.ch.tryReceive(), code('ERR_CHANNEL_CORRUPT'), what);
    x.hub.close();
  }
  // Random garbage over the whole block after the header: errors are IpcErrors, nothing worse.
  let seed = 7;
  const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
  for (let i = 0; i < 300; i++) {
    const { ch, hub, v } = fresh();
    for (let j = 0; j < 40; j++) {
      const off = HEADER_BYTES - 192 + Math.floor(rand() * (v.byteLength - HEADER_BYTES + 192 - 4));
      if (off >= H.producersAttached && off < HEADER_BYTES) continue;
      v.setUint32(off & ~3, (rand() * 2 ** 32) >>> 0, true);
    }
    try {
      for (let k = 0; k < 3; k++) ch.tryReceive()?.release();
    } catch (e) {
      assert.ok(e instanceof IpcError, String(e));
    }
    hub.close();
  }
});

test('acceptChannel refuses forged attaches: bad header, wrong entry, short slots, wrong types', async () => {
  const c = await spawn(new URL('../fixtures/channel-child.js', import.meta.url), ['accept-report']);
  using doorbells = Doorbells.create(4);
  using fewBells = Doorbells.create(3);
  const attach = (control: unknown, slots: unknown, extra: object = {}) => ({
    '@cuda-ipc/channel': 'attach', version: 4, index: 1, role: 'consumer', control, slots, doorbells, ...extra,
  });
  const ask = async (m: unknown) => {
    c.link.send(m);
    const refused = await c.link.receive({ signal: AbortSignal.timeout(5000) }) as Record<string, unknown>;
    if (refused['@cuda-ipc/channel'] === 'refused') return (await c.link.receive({ signal: AbortSignal.timeout(5000) }) as { error: string }).error;
    return (refused as { error?: string }).error ?? 'accepted?';
  };
  try {
    const { l, bytes } = validBlock();
    using control = HostBuffer.allocate(l.totalBytes);
    control.write(bytes);
    using slots = HostBuffer.allocate(8 * 4096);
    using small = HostBuffer.allocate(4096);
    // The entry the hub names is empty (state 0), not waiting for this peer.
    assert.equal(await ask(attach(control, slots)), 'ERR_DESCRIPTOR_INVALID');
    new DataView(control.bytes.buffer).setUint32(l.participantsOffset + 64 + P.state, 4, true);
    new DataView(control.bytes.buffer).setUint32(l.participantsOffset + 64 + P.role, 2, true);
    assert.equal(await ask(attach(control, small)), 'ERR_DESCRIPTOR_INVALID', 'slots shorter than the header says');
    assert.equal(await ask(attach(control, slots, { role: 'observer' })), 'ERR_DESCRIPTOR_INVALID');
    assert.equal(await ask(attach(control, slots, { index: 99 })), 'ERR_DESCRIPTOR_INVALID');
    assert.equal(await ask(attach(control, slots, { version: 2 })), 'ERR_DESCRIPTOR_VERSION');
    assert.equal(await ask(attach(control, slots, { version: 3 })), 'ERR_DESCRIPTOR_VERSION');
    assert.equal(await ask(attach(control, slots, { doorbells: fewBells })), 'ERR_DESCRIPTOR_INVALID', 'a doorbell missing');
    assert.equal(await ask(attach(control, slots, { doorbells: undefined })), 'ERR_DESCRIPTOR_INVALID', 'no doorbells');
    assert.equal(await ask(attach(control, slots, { role: 'producer' })), 'ERR_DESCRIPTOR_INVALID', 'the entry waits for a consumer');
    assert.equal(await ask(attach(new Uint8Array(8), slots)), 'ERR_DESCRIPTOR_INVALID', 'a control block that is not shared memory');
    using garbage = HostBuffer.allocate(l.totalBytes);
    garbage.fill(0xa5);
    assert.equal(await ask(attach(garbage, slots)), 'ERR_DESCRIPTOR_INVALID');
    using tiny = HostBuffer.allocate(64);
    assert.equal(await ask(attach(tiny, slots)), 'ERR_DESCRIPTOR_INVALID');
    // The well-formed attach is answered 'ready'; 'active' completes it.
    assert.equal(await ask(attach(control, slots)), 'accepted?');
    c.link.send({ '@cuda-ipc/channel': 'active', index: 1 });
    assert.deepEqual(await c.link.receive({ signal: AbortSignal.timeout(5000) }), { accepted: true, role: 'consumer' });
  } finally {
    await c.link.end();
    if (c.child.exitCode === null) await new Promise((r) => c.child.once('exit', r));
  }
});

test('terminating a worker thread parked in channel waits does not crash or hang', async () => {
  for (let i = 0; i < 4; i++) {
    const worker = new Worker(WORKER, { workerData: 'stay' });
    await new Promise<void>((resolve, reject) => {
      worker.once('message', () => resolve());
      worker.once('error', reject);
    });
    // A hang fails here, loudly; how long joining the waiter threads takes is the bench's business.
    assert.equal(typeof await within(worker.terminate(), 'worker.terminate() to join the parked waiter threads', 60_000), 'number');
  }
});

test('a process that exits while parked in channel waits exits cleanly', () => {
  const r = spawnSync(process.execPath, [fileURLToPath(WORKER), 'exit'], { encoding: 'utf8', timeout: 10_000 });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /parked/);
});

test('a publish lock held by someone else defers publishes in order; a closed end never hangs the process on it', async () => {
  const hub = ChannelHub.create({ slots: 4, slotBytes: 64 });
  const ch = hub.producer();
  const v = new DataView(controlBytesOf(ch).buffer, controlBytesOf(ch).byteOffset);
  v.setUint32(H.lock, 9, true);  // "participant 8" holds the lock
  for (let i = 0; i < 3; i++) {
    const slot = await ch.acquire();
    slot.bytes[0] = i;
    ch.publish(slot, { length: 1 });
  }
  assert.equal(ch.stats().published, 0, 'nothing published while the lock is held');
  // Node fires timers of one duration in the order they were set: once this one fired, the
  // producer's retry (set at the first deferred publish, same 2 ms) ran under the held lock.
  await new Promise((r) => setTimeout(r, 2));
  assert.equal(ch.stats().published, 0, 'still nothing published after a retry under the held lock');
  v.setUint32(H.lock, 0, true);
  await waitUntil(() => ch.stats().published === 3, 'the deferred publishes to go out once the lock was free');
  const l = computeLayout({ slotCount: 4, slotBytes: 64, metaBytes: 256, maxParticipants: 16, device: false, broadcast: false });
  const order = [0, 1, 2].map((p) => v.getUint32(l.ringOffset + p * 4, true));
  assert.deepEqual(order, [0, 1, 2]);
  v.setUint32(H.lock, 9, true);
  hub.close();  // the leaves cannot take the lock: they finish (or give up) in the background; returning at all is the check
  assert.ok(ch.closed);
});
