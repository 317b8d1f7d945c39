import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomInt } from 'node:crypto';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import { MessageEncoder } from '../../src/link/messages/message-encoder.js';
import { readFrame } from '../../src/link/connection/inbound.js';
import type { Link } from '../../src/link/connection/link.js';
import { addon } from '../../src/native/addon.js';
import { fdCount } from '../fixtures/fd-count.js';
import { HELLO, header, linkWithRawPeer } from '../fixtures/link-pair.js';
import { FdTemplates, FrameFuzzFailure, Rng, buildRecordsFrame, frameCase, frameSeeds, runFrameFuzz } from '../fixtures/link-fuzzer.js';

// CUDA_IPC_FUZZ_SEED reproduces a failed run; otherwise each run explores a new seed.
const seed = process.env.CUDA_IPC_FUZZ_SEED !== undefined ? Number(process.env.CUDA_IPC_FUZZ_SEED) >>> 0 : randomInt(2 ** 32);

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

test(`mutated and random link frames are rejected with IpcErrors, leak no fd and end every lease (seed ${seed})`, { timeout: 120_000 }, (t) => {
  t.diagnostic(`fuzz seed ${seed} (rerun with CUDA_IPC_FUZZ_SEED=${seed})`);
  const cases = 30_000;
  gc();
  const heapBefore = process.memoryUsage().heapUsed;
  const fdsBefore = fdCount();
  const started = performance.now();
  const stats = runFrameFuzz({ cases, seed });
  const ms = performance.now() - started;
  gc();
  const heapGrowth = process.memoryUsage().heapUsed - heapBefore;
  t.diagnostic(`${JSON.stringify(stats)} in ${Math.round(ms)} ms, heap ${heapGrowth >= 0 ? '+' : ''}${(heapGrowth / 2 ** 20).toFixed(1)} MiB`);
  assert.equal(stats.cases, cases);
  assert.deepEqual(stats.failures, {});
  assert.equal(fdCount(), fdsBefore, 'the run left no fd open');
  assert.ok(heapGrowth < 32 * 2 ** 20, `the heap grew by ${heapGrowth} bytes`);
  // The slowest case's time is printed above (a diagnostic, not a check: timings belong in the bench).
  // The cases reach every frame type, deep payload checks, handler failures and leased values.
  const seen = (key: string): number => stats.outcomes[key] ?? 0;
  for (const type of ['HELLO', 'GOODBYE', 'REFUSE', 'RELEASE', 'GONE', 'MESSAGE', 'NCCL_ABORT']) assert.ok(seen(`accepted ${type}`) > 0, `no ${type} accepted`);
  assert.ok(seen('rejected ERR_FRAME_INVALID') > cases / 2);
  assert.ok(seen('message error ERR_DESCRIPTOR_INVALID') > 0 && seen('message error ERR_NOT_TRANSFERABLE') > 0);
  assert.ok(stats.leasesOpened > 0, 'some leased values were decoded (and their leases ended on disposal)');
  assert.ok(seen('accepted MESSAGE (large)') > 0 && seen('rejected ERR_FRAME_INVALID (large)') > 0, 'large messages were decoded and refused');
  assert.ok(stats.casesWithFds > cases / 10 && stats.wrongFdCount > cases / 50);
});

test(`decoded as a TCP link decodes (host-bytes taken, fd kinds refused): no untyped error, no leak (seed ${seed})`, { timeout: 120_000 }, () => {
  const stats = runFrameFuzz({ cases: 10_000, seed, transport: 'tcp', stopAtFirstFailure: false });
  assert.deepEqual(Object.keys(stats.failures), [], Object.values(stats.failures).map((f) => f.first).join('\n'));
  assert.ok((stats.outcomes['message error ERR_NOT_TRANSFERABLE'] ?? 0) > 0, 'fd kinds are refused on TCP');
  assert.ok((stats.outcomes['message error ERR_DESCRIPTOR_INVALID'] ?? 0) > 0, 'malformed host-bytes fail their message');
  assert.ok((stats.outcomes['accepted MESSAGE'] ?? 0) > 0);
});

test('device-kind records never leak their fds', () => {
  const stats = runFrameFuzz({ cases: 5_000, seed, deviceKinds: true, stopAtFirstFailure: false });
  assert.deepEqual(Object.keys(stats.failures), [], Object.values(stats.failures).map((f) => f.first).join('\n'));
});

test('the fuzzer reports a decoder that throws anything but an IpcError, or leaks an fd', () => {
  const throwing: typeof readFrame = (buf, view, length, fds, ctx) => {
    if (length > 20 && length < 40) throw new RangeError('Offset is outside the bounds of the DataView');
    return readFrame(buf, view, length, fds, ctx);
  };
  assert.throws(() => runFrameFuzz({ cases: 5_000, seed: 1, read: throwing }), (e: unknown) => {
    assert.ok(e instanceof FrameFuzzFailure);
    assert.match(e.message, /threw RangeError[\s\S]*\n  input: [0-9a-f]+.*\n  reproduce: .*--seed 1 --first \d+ --cases 1$/);
    return true;
  });
  const leaking: typeof readFrame = (buf, view, length, fds, ctx) => {
    if (fds?.length === 1) fds[0] = -1;  // "taken", then dropped
    return readFrame(buf, view, length, fds, ctx);
  };
  assert.throws(() => runFrameFuzz({ cases: 5_000, seed: 2, read: leaking }), /fds \d+ were neither closed nor owned/);
});

test('the documented record layout is what the encoder writes', () => {
  const enc = new MessageEncoder();
  const m = enc.encode({ a: [1, 12345678901234567890n], 'k€y': { x: new Int16Array([-2]) } }, undefined as unknown as Link);
  const byEncoder = Buffer.from(enc.scratch.subarray(16, m.headLength));
  const byLayout = buildRecordsFrame('{"a":[1,null],"k€y":{"x":null}}', [
    { kind: '@bigint', path: ['a', 1], fds: 0, lease: 0, data: Buffer.from('12345678901234567890') },
    { kind: '@typed-array', path: ['k€y', 'x'], fds: 0, lease: 0, data: new Uint8Array([4, 0xfe, 0xff]) },
  ]).subarray(16);
  assert.deepEqual(byEncoder, Buffer.from(byLayout));
  // A leased value: the record carries the id the link will be asked to release.
  using h = HostBuffer.allocate(4096);
  const leased = enc.encode([h], undefined as unknown as Link);
  const id = leased.holds[0]!.id;
  for (const { hold } of leased.holds) hold.release();
  const data = Buffer.alloc(24);
  data.writeBigUInt64LE(4096n, 0);
  data.writeBigUInt64LE(4096n, 16);
  const expected = buildRecordsFrame('[null]', [{ kind: 'host-buffer', path: [0], fds: 1, lease: id, data }]).subarray(16);
  assert.deepEqual(Buffer.from(enc.scratch.subarray(16, leased.headLength)), Buffer.from(expected));
});

test('garbage through a real socket pair: the link closes or delivers, always with a typed error, never hangs', { timeout: 60_000 }, async (t) => {
  const before = fdCount();
  const seeds = frameSeeds(seed);
  const templates = new FdTemplates();
  const rng = new Rng(seed);
  const outcomes: Record<string, number> = {};
  const cases = 400;
  try {
    for (let i = 0; i < cases; i++) {
      const c = frameCase(seed, i, seeds);
      const { link, raw } = linkWithRawPeer();
      try {
        raw.send(HELLO());
        const fds = templates.makeFor(c, rng);
        try {
          // An empty record reads as the peer's EOF on SEQPACKET: the link then reports ERR_PEER_GONE.
          raw.send(c.bytes, fds);
        } finally {
          for (const fd of fds) addon.close(fd);  // the kernel gave the link its own copies
        }
        // A control frame the link accepts without a word (a sound GONE) lets this through.
        if (c.bytes.byteLength > 0) {
          try {
            raw.send(SENTINEL);
          } catch {
            // The link closed its end already.
          }
        }
        let outcome: string;
        try {
          const value = await link.receive({ timeout: 2000 });
          outcome = value === 'sentinel' ? 'accepted quietly' : 'delivered';
          disposeAll(value);
        } catch (e) {
          assert.ok(e instanceof IpcError, `case ${i}: ${String(e)}`);
          assert.notEqual(e.code, 'ERR_TIMEOUT', `case ${i} (seed ${seed}): the link neither closed nor delivered`);
          outcome = `${link.closed ? 'closed' : 'message error'} ${e.code}`;
        }
        outcomes[outcome] = (outcomes[outcome] ?? 0) + 1;
      } finally {
        link.close();
        raw.socket.close();
      }
    }
  } finally {
    templates.close();
  }
  t.diagnostic(JSON.stringify(outcomes));
  assert.equal(fdCount(), before, 'every fd sent, received and decoded was released');
  assert.ok((outcomes['closed ERR_FRAME_INVALID'] ?? 0) > cases / 2);
  assert.ok((outcomes.delivered ?? 0) > 0);
});

/** A Json MESSAGE holding "sentinel". */
const SENTINEL = ((): Uint8Array => {
  const body = Buffer.from('"sentinel"');
  const f = header(2, 0, body.byteLength, 0);
  f.set(body, 16);
  return f;
})();

/** Closes every HostBuffer (or other closable) inside a delivered value. */
function disposeAll(value: unknown, depth = 0): void {
  if (typeof value !== 'object' || value === null || depth > 300) return;
  if (typeof (value as { close?: unknown }).close === 'function') {
    (value as { close(): void }).close();
    return;
  }
  for (const v of Object.values(value)) disposeAll(v, depth + 1);
}
