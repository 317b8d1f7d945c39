// Leases inside one process: two links joined by a socketpair, or a link facing a raw socket that
// plays the peer byte by byte.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import { leaseStats, type ReceivedLease } from '../../src/link/index.js';
import { MessageEncoder } from '../../src/link/messages/message-encoder.js';
import { FrameType, encodeRelease, writeHeader } from '../../src/link/transport/frame.js';
import { kRingState, type Link } from '../../src/link/connection/link.js';
import { Probe, setProbe } from '../../src/link/transport/probe.js';
import { registerTransferHandler, unregisterTransferHandler } from '../../src/link/transfers/transfer.js';
import { addon } from '../../src/native/addon.js';
import { HELLO, header, linkPair, linkWithRawPeer, type RawPeer } from '../fixtures/link-pair.js';
import { tcpPair } from '../fixtures/tcp-peer.js';
import { argError } from '../helpers/arg-error.js';
import { waitUntil } from '../helpers/wait.js';

const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;

/** `h.released()`, failing the test instead of hanging when it does not come within `ms`. */
function releasedSoon(h: HostBuffer, ms = 30_000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the HostBuffer was not released within ${ms} ms (${h.leases} leases left)`)), ms);
  });
  return Promise.race([h.released(), late]).finally(() => clearTimeout(timer));
}
/** The next message, failing instead of hanging when none comes (e.g. the link did not close). */
const recv = (link: Link): Promise<unknown> => link.receive({ signal: AbortSignal.timeout(2000) });
const tick = (ms = 5): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A transferable whose sender-side hold counts its releases; the receiver gets a Ticket. */
class Token {
  released = 0;
  constructor(readonly n: number, readonly bytes = 100) {}
}
class Ticket {
  constructor(readonly n: number, readonly lease: ReceivedLease | undefined) {}
  close(): void {
    this.lease?.end();
  }
}
registerTransferHandler<Token>({
  kind: 'test-token',
  canTransfer: (v): v is Token => v instanceof Token,
  encode: (t) => ({ data: new Uint8Array([t.n]), hold: { release: () => void t.released++, bytes: t.bytes } }),
  decode: (data, _fds, _link, lease) => {
    if (data[0] === 255) throw new IpcError('ERR_DESCRIPTOR_INVALID', 'token 255 is refused');
    return new Ticket(data[0]!, lease);
  },
});

/** A MESSAGE frame for `value` as the raw peer sends it, and the lease ids inside. */
function messageFrame(value: unknown): { bytes: Uint8Array; fds: number[]; ids: number[] } {
  const enc = new MessageEncoder();
  const m = enc.encode(value, undefined as unknown as Link);
  writeHeader(enc.view, FrameType.Message, m.encoding, m.headLength - 16, m.fds.length);
  return { bytes: enc.scratch.slice(0, m.headLength), fds: [...m.fds], ids: m.holds.map((h) => h.id) };
}

/** Lease ids in the records of a MESSAGE frame, per the layout documented in codec.ts. */
function leaseIdsIn(frame: Uint8Array): number[] {
  const v = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
  let at = 16;
  at += 4 + v.getUint32(at, true);
  const count = v.getUint16(at, true);
  at += 2;
  const ids: number[] = [];
  for (let i = 0; i < count; i++) {
    at += 1 + v.getUint8(at);
    const segments = v.getUint8(at++);
    for (let s = 0; s < segments; s++) at += v.getUint8(at) === 0 ? 5 : 3 + v.getUint16(at + 1, true);
    ids.push(Number(v.getBigUint64(at + 1, true)));
    at += 13 + v.getUint32(at + 9, true);
  }
  return ids;
}

/** The RELEASE frames the raw peer received, as lists of ids. */
function releasesSeen(raw: RawPeer): number[][] {
  return raw.records
    .filter((r) => r.bytes[5] === FrameType.Release)
    .map((r) => {
      const v = new DataView(r.bytes.buffer, r.bytes.byteOffset, r.bytes.byteLength);
      assert.equal(v.getUint32(8, true), r.bytes.byteLength - 16);
      const n = v.getUint32(16, true);
      assert.equal(v.getUint32(20, true), 0);
      assert.equal(r.bytes.byteLength, 24 + 8 * n);
      return Array.from({ length: n }, (_, i) => Number(v.getBigUint64(24 + 8 * i, true)));
    });
}

test('a sent value is leased until the receiver closes it; link.leases, leaseStats() and hold.release() agree', async () => {
  const [a, b] = await linkPair();
  try {
    const t1 = new Token(1, 1000);
    const t2 = new Token(2, 24);
    a.send({ t1, list: [t2, 5n] });
    assert.deepEqual(a.leases, { count: 2, bytes: 1024 });
    assert.deepEqual(b.leases, { count: 0, bytes: 0 }, 'leases count what this side holds for the peer');
    assert.deepEqual(leaseStats(), { count: 2, bytes: 1024, links: [{ linkId: a.id, peerPid: process.pid, count: 2, bytes: 1024 }] });
    const got = (await recv(b)) as { t1: Ticket; list: [Ticket, bigint] };
    assert.ok(got.t1.lease && got.list[0].lease);
    assert.notEqual(got.t1.lease.id, got.list[0].lease.id);
    assert.equal(got.t1.lease.ended, false);
    got.t1.close();
    got.t1.close();  // end() is idempotent
    assert.equal(got.t1.lease.ended, true);
    await waitUntil(() => t1.released > 0, 't1 to be released');
    assert.equal(t1.released, 1);
    assert.equal(t2.released, 0);
    assert.deepEqual(a.leases, { count: 1, bytes: 24 });
    got.list[0].close();
    await waitUntil(() => t2.released > 0, 't2 to be released');
    assert.equal(t2.released, 1);
    assert.deepEqual(a.leases, { count: 0, bytes: 0 });
    assert.deepEqual(leaseStats(), { count: 0, bytes: 0, links: [] });
    assert.equal(a.state, 'open');
  } finally {
    a.close();
    b.close();
  }
});

test('a send that fails releases the holds it took at once; nothing is leased', async () => {
  const [a, b] = await linkPair({ maxMessageBytes: 100_000 });
  try {
    const closed = HostBuffer.allocate(16);
    closed.close();
    const t = new Token(1);
    assert.throws(() => a.send({ t, later: closed }), code('ERR_CLOSED'));
    assert.equal(t.released, 1);
    assert.throws(() => a.send([t, new Uint8Array(200_000)]), code('ERR_MESSAGE_TOO_LARGE'));
    assert.equal(t.released, 2);
    using h = HostBuffer.allocate(4096);
    assert.throws(() => a.send([h, closed]), code('ERR_CLOSED'));
    assert.equal(h.leases, 0, 'the host buffer\'s lease was returned');
    assert.deepEqual(a.leases, { count: 0, bytes: 0 });

    registerTransferHandler<Date>({
      kind: 'test-bad-hold',
      canTransfer: (v): v is Date => v instanceof Date,
      encode: () => ({ data: new Uint8Array(1), hold: { release: 1 } as never }),
      decode: () => ({}),
    });
    try {
      assert.throws(() => a.send({ t, d: new Date() }), argError('ERR_INVALID_ARG_TYPE'));
      assert.equal(t.released, 3);
    } finally {
      unregisterTransferHandler('test-bad-hold');
    }

    // The peer is gone but its GOODBYE not read yet: sendmsg fails, and nothing is leased.
    b.close();
    assert.throws(() => a.send({ t }), code('ERR_LINK_CLOSED'));
    assert.equal(t.released, 4);
    assert.deepEqual(a.leases, { count: 0, bytes: 0 });
  } finally {
    a.close();
    b.close();
  }
});

test('a message queued behind a full socket is leased; closing the link ends every lease exactly once', async () => {
  const [a, b] = await linkPair();
  const pad = 'x'.repeat(4000);
  while (a.pendingSends === 0) a.send(pad);
  const tokens = [new Token(1), new Token(2), new Token(3)];
  for (const t of tokens) a.send({ t });
  assert.equal(a.leases.count, 3, 'queued messages are committed');
  a.close();  // the queued messages are dropped with the link
  assert.deepEqual(tokens.map((t) => t.released), [1, 1, 1]);
  assert.deepEqual(a.leases, { count: 0, bytes: 0 });
  b.close();

  // The peer closing cleanly ends them as well, by the time 'close' fires.
  const [c, d] = await linkPair();
  const t = new Token(4);
  c.send({ t });
  const ticket = ((await recv(d)) as { t: Ticket }).t;
  const closedSeen = new Promise<void>((resolve) => c.once('close', () => resolve()));
  d.close();
  await closedSeen;
  assert.equal(t.released, 1);
  assert.deepEqual(c.leases, { count: 0, bytes: 0 });
  assert.equal(ticket.lease!.ended, true, 'a lease from a closed link reads as ended');
  ticket.close();  // nothing to send: the link is closed
  assert.equal(t.released, 1);
  c.close();
});

test('leases ended in one tick go back in one RELEASE frame with exactly those ids', async () => {
  const { link, raw } = linkWithRawPeer();
  try {
      raw.send(HELLO());
      const f = messageFrame({ tokens: [1, 2, 3, 4, 5].map((n) => new Token(n)), plain: 7n });
      assert.equal(f.ids.length, 5);
      assert.deepEqual(leaseIdsIn(f.bytes), [...f.ids, 0], 'the bigint record carries lease id 0');
      raw.send(f.bytes);
      const got = (await recv(link)) as { tokens: Ticket[] };
      assert.deepEqual(got.tokens.map((t) => t.lease!.id), f.ids);
      got.tokens[3]!.close();
      got.tokens[0]!.close();
      got.tokens[1]!.close();
      got.tokens[0]!.close();
      await waitUntil(() => releasesSeen(raw).length > 0, 'the first RELEASE');
      assert.deepEqual(releasesSeen(raw), [[f.ids[3], f.ids[0], f.ids[1]]]);
      got.tokens[4]!.close();
      await waitUntil(() => releasesSeen(raw).length > 1, 'the second RELEASE');
      assert.deepEqual(releasesSeen(raw), [[f.ids[3], f.ids[0], f.ids[1]], [f.ids[4]]]);
      link.close();
      got.tokens[2]!.close();
      // The link's GOODBYE is the last frame it writes: a RELEASE after the close would come before it.
      await waitUntil(() => raw.records.some((r) => r.bytes[5] === FrameType.Goodbye), "the link's GOODBYE");
      assert.equal(releasesSeen(raw).length, 2, 'nothing is sent once the link is closed');
  } finally {
    link.close();
    raw.socket.close();
  }
});

test('a reply sent in the tick that closed what came takes the RELEASE behind it: one send of two records, the reply first', async () => {
  const { link, raw } = linkWithRawPeer();
  const points: Probe[] = [];
  try {
    raw.send(HELLO());
    const f = messageFrame({ tokens: [1, 2].map((n) => new Token(n)) });
    raw.send(f.bytes);
    const got = (await recv(link)) as { tokens: Ticket[] };
    await waitUntil(() => raw.records.some((r) => r.bytes[5] === FrameType.Hello), "the link's HELLO");
    const before = raw.records.length;
    setProbe((p) => points.push(p));
    got.tokens[1]!.close();
    got.tokens[0]!.close();
    link.send('reply');
    await tick();  // (the turn's release flush has run: it found nothing left to send)
    setProbe(undefined);
    await waitUntil(() => releasesSeen(raw).length > 0, 'the RELEASE');
    const after = raw.records.slice(before);
    assert.deepEqual(after.map((r) => r.bytes[5]), [FrameType.Message, FrameType.Release], 'the reply, then its RELEASE');
    assert.deepEqual(releasesSeen(raw), [[f.ids[1], f.ids[0]]]);
    assert.equal(points.filter((p) => p === Probe.SocketSend).length, 1, 'both records in one sendmmsg');
    link.send('nothing waits');  // no release waiting: a send of its own
    await waitUntil(() => raw.records.length > before + 2, 'the second reply');
    assert.deepEqual(raw.records.slice(before + 2).map((r) => r.bytes[5]), [FrameType.Message]);
  } finally {
    setProbe(undefined);
    link.close();
    raw.socket.close();
  }
});

test('a reply and the RELEASE behind it arrive on frame rings and on TCP too: the reply, and the lease ends', async () => {
  class Fare {
    released = 0;
    constructor(readonly n: number) {}
  }
  registerTransferHandler<Fare>({
    kind: 'test-fare',
    transports: ['unix', 'tcp'],
    canTransfer: (v): v is Fare => v instanceof Fare,
    encode: (t) => ({ data: new Uint8Array([t.n]), hold: { release: () => void t.released++, bytes: 1 } }),
    decode: (data, _fds, _link, lease) => new Ticket(data[0]!, lease),
  });
  try {
    for (const kind of ['frame rings', 'tcp'] as const) {
      const tcp = kind === 'tcp' ? await tcpPair() : undefined;
      const [a, b] = tcp ? [tcp.a, tcp.b] : await linkPair({ frameRing: true });
      try {
        if (!tcp) assert.deepEqual(a[kRingState](), { sending: true, receiving: true });
        const fares = [new Fare(4), new Fare(5)];
        a.send(fares);
        const got = (await recv(b)) as Ticket[];
        assert.deepEqual(got.map((t) => t.n), [4, 5]);
        for (const t of got) t.close();
        b.send({ reply: kind });
        assert.deepEqual(await recv(a), { reply: kind }, kind);
        await waitUntil(() => fares.every((f) => f.released === 1), `${kind}: the leases to end`);
        assert.deepEqual(a.leases, { count: 0, bytes: 0 });
      } finally {
        a.close();
        b.close();
        tcp?.listener.close();
      }
    }
  } finally {
    unregisterTransferHandler('test-fare');
  }
});

test('a RELEASE for a lease the link did not grant, or already ended, closes it with ERR_FRAME_INVALID', async () => {
  // The link leases a host buffer to the raw peer, which releases it twice.
  {
    const { link, raw } = linkWithRawPeer();
    try {
      raw.send(HELLO());
      await waitUntil(() => link.state === 'open', "the link to take the raw peer's HELLO");
      const h = HostBuffer.allocate(4096);
      link.send({ h });
      h.close();
      await waitUntil(() => raw.records.some((r) => r.bytes[5] === FrameType.Message), 'the message to reach the raw peer');
      const record = raw.records.find((r) => r.bytes[5] === FrameType.Message)!;
      for (const fd of record.fds) addon.close(fd);
      const [id] = leaseIdsIn(record.bytes);
      assert.ok(id! > 0);
      assert.equal(link.leases.count, 1);
      raw.send(encodeRelease([id!]));
      await releasedSoon(h);
      assert.equal(link.state, 'open');
      assert.deepEqual(link.leases, { count: 0, bytes: 0 });
      raw.send(encodeRelease([id!]));
      await assert.rejects(recv(link), (e: unknown) => code('ERR_FRAME_INVALID')(e) && /never granted or had already ended/.test((e as Error).message));
    } finally {
      link.close();
      raw.socket.close();
    }
  }
  const cases: Array<[string, Uint8Array, boolean]> = [
    ['an id never granted', encodeRelease([987_654_321]), true],
    ['an id twice in one frame', encodeRelease([5, 5]), true],
    ['id 0', encodeRelease([0]), true],
    ['no ids', header(5, 0, 8, 0), true],
    ['a count that does not match the length', header(5, 0, 16, 0, (v) => v.setUint32(16, 2, true)), true],
    ['reserved bytes set', header(5, 0, 16, 0, (v) => (v.setUint32(16, 1, true), v.setUint32(20, 1, true), v.setUint32(24, 9, true))), true],
    ['an id above 2^53', header(5, 0, 16, 0, (v) => (v.setUint32(16, 1, true), v.setUint32(28, 0x20_0000, true))), true],
    ['flags on a RELEASE', header(5, 1, 16, 0, (v) => (v.setUint32(16, 1, true), v.setUint32(24, 9, true))), true],
    ['a RELEASE before the handshake', encodeRelease([1]), false],
  ];
  for (const [what, frame, hello] of cases) {
    const { link, raw } = linkWithRawPeer();
    try {
      if (hello) raw.send(HELLO());
      raw.send(frame);
      await assert.rejects(recv(link), code('ERR_FRAME_INVALID'), what);
      assert.equal(link.closed, true, what);
    } finally {
      link.close();
      raw.socket.close();
    }
  }
});

test('a peer granting a lease id that is already held is a protocol error', async () => {
  for (const twiceInOneMessage of [true, false]) {
    const { link, raw } = linkWithRawPeer();
    try {
      raw.send(HELLO());
      const f = messageFrame([new Token(1), new Token(2)]);
      const v = new DataView(f.bytes.buffer);
      if (twiceInOneMessage) {
        // Give the second record the first record's id.
        const at = f.bytes.byteLength - 1 - 4 - 8;  // the last record: ... leaseId u64, u32 length, 1 byte
        v.setBigUint64(at, BigInt(f.ids[0]!), true);
        raw.send(f.bytes);
      } else {
        raw.send(f.bytes);
        const first = (await recv(link)) as Ticket[];
        assert.equal(first.length, 2);
        raw.send(f.bytes);  // the same ids again, while still held
      }
      await assert.rejects(recv(link), (e: unknown) => code('ERR_FRAME_INVALID')(e) && /lease id/.test((e as Error).message));
    } finally {
      link.close();
      raw.socket.close();
    }
  }
});

test('a message that cannot be fully decoded ends the leases of all its values', async () => {
  const [a, b] = await linkPair();
  try {
    using h = HostBuffer.allocate(4096);
    const first = new Token(1);
    const refused = new Token(255);
    const after = new Token(3);
    a.send([first, h, refused, after]);
    assert.equal(a.leases.count, 4);
    await assert.rejects(recv(b), code('ERR_DESCRIPTOR_INVALID'));
    await waitUntil(() => first.released + refused.released + after.released >= 3, 'the three tokens to be released');
    assert.deepEqual([first.released, refused.released, after.released], [1, 1, 1]);
    assert.equal(h.leases, 0, 'the decoded host buffer was disposed and its lease ended');
    assert.deepEqual(a.leases, { count: 0, bytes: 0 });
    assert.equal(a.state, 'open');
  } finally {
    a.close();
    b.close();
  }
});

test('a host buffer passed on (A to B to C) stays leased by A until C lets go too', async () => {
  const [a, b] = await linkPair();
  const [b2, c] = await linkPair();
  try {
    const h = HostBuffer.allocate(4096);
    h.fill(3);
    a.send({ h });
    h.close();
    const atB = ((await recv(b)) as { h: HostBuffer }).h;
    b2.send({ h: atB });
    atB.close();
    const atC = ((await recv(c)) as { h: HostBuffer }).h;
    // A message from B to A after B closed its copy: a RELEASE B sent A would arrive before it.
    b.send('after the close');
    assert.equal(await recv(a), 'after the close');
    assert.equal(h.leases, 1, 'B closed its copy but leased it on to C');
    assert.equal(atB.leases, 1);
    assert.equal(atC.bytes[100], 3);
    atC.close();
    await releasedSoon(h);
    assert.equal(atB.leases, 0);
    assert.deepEqual(a.leases, { count: 0, bytes: 0 });
    assert.deepEqual(b2.leases, { count: 0, bytes: 0 });
  } finally {
    for (const l of [a, b, b2, c]) l.close();
  }
});

test('a received host buffer dropped without close() ends its lease once garbage-collected', async () => {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  // Expect one CUDA_IPC_LEAK warning on stderr: this test leaks a HostBuffer on purpose.
  const [a, b] = await linkPair();
  try {
    const h = HostBuffer.allocate(4096);
    a.send({ h });
    h.close();
    await (async () => {
      const got = (await recv(b)) as { h: HostBuffer };
      assert.equal(got.h.byteLength, 4096);
    })();  // the received buffer is unreachable from here on
    for (let i = 0; i < 10 && h.leases > 0; i++) {
      gc();
      await tick(10);
    }
    assert.equal(h.leases, 0);
    await releasedSoon(h);
  } finally {
    a.close();
    b.close();
  }
});
