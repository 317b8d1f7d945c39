import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import '../../src/link/index.js'; // registers the transfer handlers
import { MessageEncoder } from '../../src/link/messages/message-encoder.js';
import { decodeMessage } from '../../src/link/messages/message-decoder.js';
import { FrameType, parseHeader, writeHeader, type FrameHeader } from '../../src/link/transport/frame.js';
import type { Link } from '../../src/link/connection/link.js';
import { registerTransferHandler, unregisterTransferHandler } from '../../src/link/transfers/transfer.js';
import { addon } from '../../src/native/addon.js';
import { fdCount, fdIsOpen } from '../fixtures/fd-count.js';
import { HELLO, header, linkFds, linkPair, linkWithRawPeer } from '../fixtures/link-pair.js';
import { argError } from '../helpers/arg-error.js';
import { waitUntil } from '../helpers/wait.js';

const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;
const out = (): FrameHeader => ({ type: 0 as FrameType, flags: 0, payloadLength: 0, fdCount: 0 });

test('frame headers round-trip', () => {
  const buf = new Uint8Array(16 + 5);
  const view = new DataView(buf.buffer);
  writeHeader(view, FrameType.Message, 2, 5, 3);
  const h = parseHeader(view, 21, 3, out());
  assert.deepEqual({ ...h }, { type: FrameType.Message, flags: 2, payloadLength: 5, fdCount: 3 });
  writeHeader(view, FrameType.Goodbye, 0, 0, 0);
  assert.equal(parseHeader(view, 16, 0, out()).type, FrameType.Goodbye);
});

test('malformed frame headers are rejected with ERR_FRAME_INVALID', () => {
  const cases: Array<[string, Uint8Array, number, number]> = [
    ['short', new Uint8Array(10), 10, 0],
    ['bad magic', header(2, 0, 0, 0, (v) => v.setUint32(0, 0xdeadbeef, true)), 16, 0],
    ['a version 1 peer', header(2, 0, 0, 0, (v) => v.setUint8(4, 1)), 16, 0],
    ['bad version', header(2, 0, 0, 0, (v) => v.setUint8(4, 3)), 16, 0],
    ['unknown type', header(9, 0, 0, 0), 16, 0],
    ['length mismatch', header(2, 0, 4, 0, (v) => v.setUint32(8, 5, true)), 20, 0],
    ['fd count mismatch', header(2, 2, 0, 1), 16, 2],
    ['fds on a message without records', header(2, 0, 2, 1), 18, 1],
    ['reserved not zero', header(2, 0, 0, 0, (v) => v.setUint16(14, 1, true)), 16, 0],
    ['unknown encoding', header(2, 3, 0, 0), 16, 0],
    ['flags on a control frame', header(3, 1, 0, 0), 16, 0],
    ['GOODBYE with payload', header(3, 0, 1, 0), 17, 0],
    ['HELLO wrong size', header(1, 0, 4, 0), 20, 0],
    ['fds on a control frame', header(1, 0, 8, 1), 24, 1],
  ];
  for (const [what, bytes, length, fds] of cases) {
    assert.throws(() => parseHeader(new DataView(bytes.buffer), length, fds, out()), code('ERR_FRAME_INVALID'), what);
  }
});

function roundTrip(value: unknown): unknown {
  const enc = new MessageEncoder();
  const m = enc.encode(value, undefined as unknown as Link);
  assert.equal(m.fds.length, 0);
  const bytes = Buffer.concat([enc.scratch.subarray(0, m.headLength), m.body ?? new Uint8Array(0)]);
  const d = decodeMessage(m.encoding, bytes, 16, bytes.byteLength, undefined, undefined as unknown as Link, undefined);
  assert.ok(d.ok, d.ok ? '' : d.error.message);
  return d.value;
}

test('messages round-trip: JSON, raw bytes, bigints and typed arrays anywhere', () => {
  assert.equal(roundTrip(undefined), undefined);
  assert.equal(roundTrip(null), null);
  assert.equal(roundTrip('héllo ✓'), 'héllo ✓');
  assert.deepEqual(roundTrip({ a: [1, { b: 'c' }], d: true }), { a: [1, { b: 'c' }], d: true });
  const raw = roundTrip(new Uint8Array([1, 2, 3]));
  assert.ok(raw instanceof Uint8Array && !Buffer.isBuffer(raw));
  assert.deepEqual([...(raw as Uint8Array)], [1, 2, 3]);
  const value = {
    ptr: 0xffff_ffff_ffff_ffffn,
    neg: -5n,
    list: [new Float32Array([1.5, -2]), { deep: [new BigInt64Array([3n]), 'x'] }],
    handle: new Uint8Array(64).fill(9),
    view: new DataView(new Uint8Array([4, 5]).buffer),
    'key/with "odd" chars': new Int16Array([-1]),
    __proto__key: 1,
  };
  const back = roundTrip(value) as typeof value;
  assert.equal(back.ptr, value.ptr);
  assert.equal(back.neg, -5n);
  assert.ok(back.list[0] instanceof Float32Array);
  assert.deepEqual([...(back.list[0] as Float32Array)], [1.5, -2]);
  assert.deepEqual((back.list[1] as { deep: unknown[] }).deep[0], new BigInt64Array([3n]));
  assert.deepEqual(back.handle, value.handle);
  assert.ok(back.view instanceof DataView && back.view.getUint8(1) === 5);
  assert.deepEqual(back['key/with "odd" chars'], new Int16Array([-1]));
  assert.deepEqual(value.list[0], new Float32Array([1.5, -2]), 'the sender\'s value is not modified');
});

test('values that cannot travel are refused with ERR_NOT_TRANSFERABLE before anything is sent', () => {
  const enc = new MessageEncoder();
  const link = undefined as unknown as Link;
  class Thing {}
  for (const bad of [{ x: new Thing() }, [() => 1], Symbol('s'), { m: new Map() }, new Date()]) {
    assert.throws(() => enc.encode(bad, link), code('ERR_NOT_TRANSFERABLE'));
  }
  assert.throws(() => enc.encode({ big: 'x'.repeat(200_000) }, link), code('ERR_MESSAGE_TOO_LARGE'));
  assert.throws(() => enc.encode(new Uint8Array(200_000), link), code('ERR_MESSAGE_TOO_LARGE'));
  const cyclic: Record<string, unknown> = {};
  cyclic.self = { n: 1n, cyclic };
  assert.throws(() => enc.encode(cyclic, link), argError('ERR_INVALID_ARG_VALUE'));
});

test('malformed message payloads are fatal (ERR_FRAME_INVALID) and close the fds that came with them', () => {
  const fd = addon.memfdCreate('t');
  const payload = Buffer.from('\x05\x00\x00\x00{"a":null}');
  const d = decodeMessage(2, payload, 0, payload.byteLength, [fd], undefined as unknown as Link, undefined);
  assert.ok(!d.ok && d.fatal && d.error.code === 'ERR_FRAME_INVALID');
  assert.equal(fdIsOpen(fd), false);
  const notJson = Buffer.from('{oops');
  const d2 = decodeMessage(0, notJson, 0, notJson.byteLength, undefined, undefined as unknown as Link, undefined);
  assert.ok(!d2.ok && d2.fatal);
});

test('a link closes with ERR_FRAME_INVALID on garbage and closes the fds that arrived', async () => {
  for (const bad of [
    header(2, 0, 0, 0, (v) => v.setUint32(0, 1, true)),
    header(1, 0, 8, 0, (v) => v.setUint8(4, 7)),
    header(2, 2, 3, 1),
  ]) {
    const { link, raw } = linkWithRawPeer();
    raw.send(HELLO());
    const fd = addon.memfdCreate('t');
    const before = fdCount();
    raw.send(bad, [fd]);
    addon.close(fd);
    await assert.rejects(link.receive(), code('ERR_FRAME_INVALID'));
    assert.equal(link.closed, true);
    assert.equal(fdCount(), before - 2, 'the received copy and the link socket were closed');
    raw.socket.close();
  }
});

test('a message before the handshake is a protocol error', async () => {
  const { link, raw } = linkWithRawPeer();
  raw.send(header(2, 0, 4, 0, (v) => new Uint8Array(v.buffer).set(Buffer.from('null'), 16)));
  await assert.rejects(link.receive(), code('ERR_FRAME_INVALID'));
  raw.socket.close();
});

test('a handler failing to decode fails that message only; its fds are closed and the link goes on', async () => {
  class Widget {
    constructor(readonly fd: number) {}
  }
  registerTransferHandler<Widget>({
    kind: 'test-widget',
    canTransfer: (v): v is Widget => v instanceof Widget,
    encode: (w) => ({ data: new Uint8Array([1]), fds: [w.fd] }),
    decode: () => {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', 'widget refused');
    },
  });
  const [a, b] = await linkPair();
  const fd = addon.memfdCreate('w');
  try {
    const before = fdCount();
    a.send({ w: new Widget(fd) });
    await assert.rejects(b.receive(), code('ERR_DESCRIPTOR_INVALID'));
    assert.equal(fdCount(), before, 'the received fd was closed');
    a.send('still alive');
    assert.equal(await b.receive(), 'still alive');
    // Encoded while the handler exists, decoded after it is gone: as if the receiver lacked it.
    a.send({ w: new Widget(fd) });
    unregisterTransferHandler('test-widget');
    await assert.rejects(b.receive(), code('ERR_NOT_TRANSFERABLE'));
    assert.equal(fdCount(), before);
  } finally {
    unregisterTransferHandler('test-widget');
    addon.close(fd);
    a.close();
    b.close();
  }
});

test('transfer handlers get per-link identity and close hooks', async () => {
  const [a, b] = await linkPair();
  assert.notEqual(a.id, b.id);
  const closed: Array<[number, unknown]> = [];
  a.onClose((link, reason) => closed.push([link.id, reason]));
  const off = a.onClose(() => closed.push([-1, undefined]));
  off();
  b.close();
  await assert.rejects(a.receive(), code('ERR_LINK_CLOSED'));
  assert.deepEqual(closed, [[a.id, undefined]]);
  assert.throws(() => a.send(1), code('ERR_LINK_CLOSED'));
  a.close();
  assert.throws(() => registerTransferHandler({ kind: 'host-buffer', canTransfer: (v): v is object => false, encode: () => ({ data: new Uint8Array() }), decode: () => 1 }), argError('ERR_INVALID_ARG_VALUE'));
  assert.throws(() => registerTransferHandler({ kind: '@x', canTransfer: (v): v is object => false, encode: () => ({ data: new Uint8Array() }), decode: () => 1 }), argError('ERR_INVALID_ARG_VALUE'));
});

test('a burst larger than the socket queue waits in the outbox and arrives in order, fds included', async () => {
  const [a, b] = await linkPair();
  const buffers = Array.from({ length: 50 }, (_, i) => {
    const h = HostBuffer.allocate(4096);
    h.fill(i);
    return h;
  });
  const n = 3000;
  for (let i = 0; i < n; i++) a.send(i % 60 === 0 ? { i, buffer: buffers[i / 60]! } : { i, pad: 'x'.repeat(200) });
  assert.ok(a.pendingSends > 0, 'the socket filled up');
  for (const h of buffers) h.close();  // the outbox holds its own dups
  const flushed = a.flush();
  for (let i = 0; i < n; i++) {
    const m = (await b.receive()) as { i: number; buffer?: HostBuffer };
    assert.equal(m.i, i);
    if (m.buffer) {
      assert.equal(m.buffer.bytes[4095], i / 60);
      m.buffer.close();
    }
  }
  await flushed;
  assert.equal(a.pendingSends, 0);
  a.close();
  b.close();
});

test('close() releases unread messages; end() delivers everything before a clean close', async () => {
  const [a, b] = await linkPair();
  const h = HostBuffer.allocate(4096);
  const before = fdCount();
  a.send({ buffer: h });
  a.send('last');
  await a.end();
  const got = (await b.receive()) as { buffer: HostBuffer };
  assert.equal(got.buffer.byteLength, 4096);
  got.buffer.close();
  assert.equal(await b.receive(), 'last');
  await assert.rejects(b.receive(), (e: unknown) => code('ERR_LINK_CLOSED')(e) && /closed the link/.test((e as Error).message));
  b.close();

  const [c, d] = await linkPair();
  const base = fdCount();
  c.send({ buffer: h });
  await waitUntil(() => d.pendingReceives >= 1, 'the buffer to wait in the inbox');
  assert.equal(d.pendingReceives, 1);
  assert.equal(fdCount(), base + 1, 'the received buffer holds an fd');
  const held = linkFds(d);
  d.close();
  assert.equal(fdCount(), base - held, 'closing released the unread buffer and the link\'s fds');
  c.close();
  h.close();
  assert.ok(fdCount() < before);
});

test('receive can be aborted, and async iteration ends on a clean close', async () => {
  const [a, b] = await linkPair();
  await assert.rejects(b.receive({ timeout: 10 }), code('ERR_TIMEOUT'));
  // An abort is Node's AbortError, with the signal's reason as its cause.
  const ac = new AbortController();
  const reason = new Error('my reason');
  const pending = b.receive({ signal: ac.signal });
  ac.abort(reason);
  await assert.rejects(pending, (e: unknown) => e instanceof Error && e.name === 'AbortError' && (e as { code?: string }).code === 'ABORT_ERR' && e.cause === reason);
  // A receive that gave up takes nothing: the next message goes to the next receive.
  a.send(1);
  a.send(2);
  void a.end();
  const seen: unknown[] = [];
  for await (const m of b) seen.push(m);
  assert.deepEqual(seen, [1, 2]);
  b.close();
});

test('message listeners get what arrives, including what waited in the inbox', async () => {
  const [a, b] = await linkPair();
  a.send('early');
  await waitUntil(() => b.pendingReceives === 1, "'early' to wait in the inbox before a listener exists");
  const got: unknown[] = [];
  const done = new Promise<void>((resolve) =>
    b.on('message', (m) => {
      got.push(m);
      if (got.length === 2) resolve();
    }),
  );
  a.send('late');
  await done;
  assert.deepEqual(got, ['early', 'late']);
  a.close();
  b.close();
});

test('per-link handler state: an fd sent once per link, recorded on commit, dropped on close', async () => {
  // A miniature of what IPC pools do: the pool fd travels once per link, later only its id.
  class Pool {
    constructor(readonly id: number, readonly fd: number) {}
  }
  const sentOn = new WeakMap<Link, Set<number>>();
  const imported = new WeakMap<Link, Map<number, number>>();
  registerTransferHandler<Pool>({
    kind: 'test-pool',
    canTransfer: (v): v is Pool => v instanceof Pool,
    encode(pool, link) {
      const sent = sentOn.get(link);
      if (sent?.has(pool.id)) return { data: new Uint8Array([pool.id, 0]) };
      return {
        data: new Uint8Array([pool.id, 1]),
        fds: [pool.fd],
        onCommit: () => {
          if (!sentOn.has(link)) link.onClose(() => sentOn.delete(link));
          sentOn.set(link, (sentOn.get(link) ?? new Set()).add(pool.id));
        },
      };
    },
    decode(data, fds, link) {
      let pools = imported.get(link);
      if (!pools) {
        const map = new Map<number, number>();
        imported.set(link, (pools = map));
        link.onClose(() => {
          for (const fd of map.values()) addon.close(fd);
          map.clear();
        });
      }
      if (data[1] === 1) pools.set(data[0]!, fds[0]!);
      const fd = pools.get(data[0]!);
      if (fd === undefined) throw new IpcError('ERR_DESCRIPTOR_INVALID', `unknown pool ${data[0]}`);
      return { poolId: data[0], fd };
    },
  });
  const [a, b] = await linkPair();
  const poolFd = addon.memfdCreate('pool');
  try {
    const pool = new Pool(7, poolFd);
    const base = fdCount();
    const closed = HostBuffer.allocate(16);
    closed.close();
    // The pool is encoded first, then the closed buffer fails the whole message.
    assert.throws(() => a.send({ pool, later: closed }), code('ERR_CLOSED'));
    a.send({ pool });  // the failed send did not count: this one carries the fd
    a.send({ pool });
    const first = (await b.receive()) as { pool: { fd: number } };
    const second = (await b.receive()) as { pool: { fd: number } };
    assert.equal(first.pool.fd, second.pool.fd);
    assert.equal(fdCount(), base + 1, 'one imported fd for two messages');
    const held = linkFds(b);
    b.close();
    assert.equal(fdCount(), base + 1 - 1 - held, 'the close hook released the import (and the link\'s fds went)');
    assert.equal(imported.get(b)?.size, 0);
  } finally {
    unregisterTransferHandler('test-pool');
    addon.close(poolFd);
    a.close();
    b.close();
  }
});

test('messages up to the frame limit travel over a real link; one byte more needs a large message', async () => {
  const [a, b] = await linkPair({ maxMessageBytes: 128 * 1024 - 16 });
  const big = new Uint8Array(128 * 1024 - 16).map((_, i) => i & 255);
  a.send(big);
  a.send({ text: 'é'.repeat(60_000) });
  const got = (await b.receive()) as Uint8Array;
  assert.equal(got.byteLength, big.byteLength);
  assert.deepEqual(got, big);
  assert.equal(((await b.receive()) as { text: string }).text.length, 60_000);
  assert.throws(() => a.send(new Uint8Array(128 * 1024 - 15)), code('ERR_MESSAGE_TOO_LARGE'));
  a.close();
  b.close();
});
