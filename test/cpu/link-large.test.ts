// Messages larger than a frame travel whole in a sealed memfd (PROTOCOL.md 3.1): what a user sees
// (any size up to maxMessageBytes, the same values back, no fd left behind) and what a receiver
// refuses (a memfd that lies, a peer over the limit, a peer that cannot take them).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import '../../src/link/index.js';
import { addon } from '../../src/native/addon.js';
import { fdCount } from '../fixtures/fd-count.js';
import { HELLO, header, linkPair, linkWithRawPeer } from '../fixtures/link-pair.js';
import { ALL_SEALS, OddFiles, memfdWith } from '../fixtures/odd-fds.js';
import { waitUntil } from '../helpers/wait.js';

const { F_SEAL_SHRINK, F_SEAL_GROW } = addon.posixConstants;

const code = (c: string) => (e: unknown) => e instanceof IpcError && e.code === c;

/** The 24-byte frame of a large message (flags = encoding | 0x100) with `fdCount` fds. */
function largeFrame(encoding: number, length: number | bigint, fdCount: number): Uint8Array {
  return header(2, encoding | 0x100, 8, fdCount, (v) => v.setBigUint64(16, BigInt(length), true));
}

test('messages of any size up to maxMessageBytes arrive whole, with their buffers, and leave no fd behind', async () => {
  const before = fdCount();
  const [a, b] = await linkPair();
  try {
    const raw = new Uint8Array(5 * 2 ** 20).map((_, i) => (i * 7) & 255);
    a.send(raw);
    const gotRaw = (await b.receive()) as Uint8Array;
    assert.equal(gotRaw.byteLength, raw.byteLength);
    assert.deepEqual(gotRaw, raw);

    // JSON and records past 128 KiB: 10,000 entries of metadata with host buffers among them.
    using h = HostBuffer.allocate(4096);
    h.write(new Uint8Array([1, 2, 3]));
    const meta = Array.from({ length: 10_000 }, (_, i) => ({ name: `layer.${i}.weight`, shape: [i, 4], offset: i * 64 }));
    a.send({ meta, buffer: h, n: 12345678901234567890n, f: new Float64Array([1.5, -2]) });
    const got = (await b.receive()) as { meta: typeof meta; buffer: HostBuffer; n: bigint; f: Float64Array };
    assert.deepEqual(got.meta, meta);
    assert.deepEqual([...got.buffer.read(0, 3)], [1, 2, 3]);
    assert.equal(got.n, 12345678901234567890n);
    assert.deepEqual([...got.f], [1.5, -2]);
    assert.equal(a.leases.count, 1);
    got.buffer.close();
    await waitUntil(() => a.leases.count === 0, `the lease to end (${a.leases.count} left)`);

    // One byte past a frame, in every encoding, and a string that is mostly multi-byte.
    a.send(new Uint8Array(128 * 1024 - 15));
    a.send({ text: 'é'.repeat(70_000) });
    assert.equal(((await b.receive()) as Uint8Array).byteLength, 128 * 1024 - 15);
    assert.equal(((await b.receive()) as { text: string }).text.length, 70_000);
  } finally {
    a.close();
    b.close();
  }
  assert.equal(fdCount(), before, 'every memfd was closed on both sides');
});

test('a send over maxMessageBytes throws ERR_MESSAGE_TOO_LARGE naming the limit; the link stays open', async () => {
  const [a, b] = await linkPair({ maxMessageBytes: 200_000 });
  try {
    using h = HostBuffer.allocate(64);
    assert.throws(() => a.send({ h, pad: 'x'.repeat(300_000) }), (e: unknown) => {
      assert.ok(e instanceof IpcError && e.code === 'ERR_MESSAGE_TOO_LARGE');
      assert.equal(e.limit, 'maxMessageBytes');
      assert.match(e.message, /maxMessageBytes 200000/);
      return true;
    });
    assert.equal(h.leases, 0, 'the failed send leased nothing');
    a.send({ pad: 'y'.repeat(150_000) });
    assert.equal(((await b.receive()) as { pad: string }).pad.length, 150_000);
  } finally {
    a.close();
    b.close();
  }
});

test('a receiver refuses a message over its own limit: both links close with ERR_MESSAGE_TOO_LARGE', async () => {
  const [a, b] = await linkPair(undefined, { maxMessageBytes: 150_000 });
  // (events.once would reject on the 'error' event that comes first.)
  const closed = (l: typeof a) => new Promise<IpcError>((resolve) => l.on('close', (reason) => resolve(reason!)));
  const closedA = closed(a);
  const closedB = closed(b);
  a.send(new Uint8Array(300_000));
  const reasonA = await closedA;
  const reasonB = await closedB;
  assert.equal(reasonB.code, 'ERR_MESSAGE_TOO_LARGE');
  assert.equal(reasonB.limit, 'maxMessageBytes');
  assert.equal(reasonA.code, 'ERR_MESSAGE_TOO_LARGE', 'the sender learns why from the REFUSE');
  assert.match(reasonA.message, /150000/);
});

test('to a peer whose HELLO does not offer large messages, a send past a frame fails at the sender', async () => {
  const { link, raw } = linkWithRawPeer();
  try {
    raw.send(HELLO(0));
    await waitUntil(() => link.state === 'open', "the link to take the raw peer's HELLO");
    assert.throws(() => link.send(new Uint8Array(200_000)), (e: unknown) => {
      assert.ok(code('ERR_MESSAGE_TOO_LARGE')(e));
      assert.match((e as Error).message, /one frame/);
      return true;
    });
    link.send(new Uint8Array(100_000));
    assert.equal(link.closed, false);
  } finally {
    link.close();
    raw.socket.close();
  }
});

test('this side announces large messages in its HELLO (features bit 0)', async () => {
  const { link, raw } = linkWithRawPeer();
  try {
    await waitUntil(() => raw.records.length > 0, "this side's HELLO to arrive");
    const hello = raw.records[0]!;
    assert.equal(hello.bytes[5], 1);
    assert.equal(new DataView(hello.bytes.buffer).getUint32(16, true) & 1, 1);
  } finally {
    link.close();
    raw.socket.close();
  }
});

test('a hand-made large message is read from its memfd; lies about the memfd close the link with ERR_FRAME_INVALID', async () => {
  const odd = new OddFiles();
  const before = fdCount();
  const payload = Buffer.from(JSON.stringify({ big: 'z'.repeat(200_000) }));
  const cases: Array<{ name: string; fd: () => number; length?: number; outcome: string }> = [
    { name: 'honest', fd: () => memfdWith(payload), outcome: 'delivered' },
    { name: 'unsealed', fd: () => memfdWith(payload, 0), outcome: 'ERR_FRAME_INVALID' },
    { name: 'not sealed against writes', fd: () => memfdWith(payload, F_SEAL_SHRINK | F_SEAL_GROW), outcome: 'ERR_FRAME_INVALID' },
    { name: 'smaller than declared', fd: () => memfdWith(payload, ALL_SEALS, payload.byteLength - 1), length: payload.byteLength, outcome: 'ERR_FRAME_INVALID' },
    { name: 'larger than declared', fd: () => memfdWith(payload, ALL_SEALS, payload.byteLength + 4096), length: payload.byteLength, outcome: 'ERR_FRAME_INVALID' },
    { name: 'a pipe', fd: () => odd.pipe(), outcome: 'ERR_FRAME_INVALID' },
    { name: 'a regular file', fd: () => odd.regularFile(), length: 65536, outcome: 'ERR_FRAME_INVALID' },
    { name: 'small enough for a frame', fd: () => memfdWith(Buffer.from('{}')), length: 2, outcome: 'ERR_FRAME_INVALID' },
    { name: 'over the receiver limit', fd: () => memfdWith(payload), outcome: 'ERR_MESSAGE_TOO_LARGE' },
    { name: 'a length above 2^53', fd: () => memfdWith(payload), length: -1, outcome: 'ERR_FRAME_INVALID' },
  ];
  for (const c of cases) {
    const { link, raw } = linkWithRawPeer(c.name === 'over the receiver limit' ? { maxMessageBytes: 150_000 } : undefined);
    try {
      raw.send(HELLO(1));
      const fd = c.fd();
      try {
        raw.send(largeFrame(0, c.length === -1 ? 2n ** 60n : c.length ?? payload.byteLength, 1), [fd]);
      } finally {
        addon.close(fd);
      }
      let outcome: string;
      try {
        const v = (await link.receive({ timeout: 2000 })) as { big: string };
        assert.equal(v.big.length, 200_000);
        outcome = 'delivered';
      } catch (e) {
        assert.ok(e instanceof IpcError, String(e));
        assert.ok(link.closed, `${c.name}: the link closed`);
        outcome = e.code;
      }
      assert.equal(outcome, c.outcome, c.name);
    } finally {
      link.close();
      raw.socket.close();
    }
  }
  assert.equal(fdCount(), before);
  odd.remove();
});
