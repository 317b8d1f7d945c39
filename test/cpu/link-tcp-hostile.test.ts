// Hostile peers of TCP links (issue 26 with issue 17's rules): a raw node:net socket that speaks
// PROTOCOL.md 2.3 and 3 by hand. Before the token is proved: malformed challenges, wrong and
// reflected proofs, silence, too many pending connections. After it: lying headers, fds and frame
// rings announced on TCP, oversized frames and messages (refused from the header, before the
// payload), records of kinds a TCP link never carries, bad NCCL_ABORTs, and the link frame fuzzer
// through the stream. Each must end in a typed error or the documented refusal, and the listener
// must serve an honest peer afterwards.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes, randomInt } from 'node:crypto';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import { listen, type TcpListener } from '../../src/link/index.js';
import type { Link } from '../../src/link/connection/link.js';
import { buildRecordsFrame, frameCase, frameSeeds } from '../fixtures/link-fuzzer.js';
import {
  RawTcp, TOKEN, authenticateRaw, frameBytes, jsonFrame, parseFrames, specChallenge, specProof, tcpHello, tcpLinkWithRawPeer,
} from '../fixtures/tcp-peer.js';

const seed = process.env.CUDA_IPC_FUZZ_SEED !== undefined ? Number(process.env.CUDA_IPC_FUZZ_SEED) >>> 0 : randomInt(2 ** 32);

/** The listener's 'refused' reports, and a promise of the next one. */
function refusals(listener: TcpListener): { list: IpcError[]; next(): Promise<IpcError> } {
  const list: IpcError[] = [];
  let wake: ((e: IpcError) => void) | undefined;
  listener.on('refused', (e) => {
    const w = wake;
    wake = undefined;
    if (w) w(e);
    else list.push(e);
  });
  return { list, next: () => (list.length ? Promise.resolve(list.shift()!) : new Promise((r) => (wake = r))) };
}

// ---- before the token is proved ------------------------------------------------------------------

interface AuthCase {
  name: string;
  /** What the listener reports ('refused CODE'), or 'nothing' for a connection it drops silently. */
  expect: string;
  run: (raw: RawTcp) => Promise<void>;
}

const AUTH_CASES: AuthCase[] = [
  { name: 'a challenge with a bad magic', expect: 'refused ERR_FRAME_INVALID', run: async (r) => r.send(specChallenge(1, randomBytes(32), (b) => b.write('HTTP', 0))) },
  { name: 'a challenge of authentication version 3', expect: 'refused ERR_FRAME_INVALID', run: async (r) => r.send(specChallenge(1, randomBytes(32), (b) => (b[4] = 3))) },
  { name: 'a challenge claiming the listener\'s role', expect: 'refused ERR_FRAME_INVALID', run: async (r) => r.send(specChallenge(2, randomBytes(32))) },
  { name: 'a challenge whose reserved bytes are not zero', expect: 'refused ERR_FRAME_INVALID', run: async (r) => r.send(specChallenge(1, randomBytes(32), (b) => (b[9] = 1))) },
  { name: 'HTTP instead of a challenge', expect: 'refused ERR_FRAME_INVALID', run: async (r) => r.send(Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'.padEnd(64, ' '))) },
  {
    name: 'a proof made with another token',
    expect: 'refused ERR_AUTH_FAILED',
    run: async (r) => {
      const nonce = randomBytes(32);
      r.send(specChallenge(1, nonce));
      const theirs = await r.take(48);
      r.send(specProof('another-token-of-enough-bytes', 1, theirs.subarray(16), nonce));
    },
  },
  {
    // The listener proves only to a peer whose proof checked out (PROTOCOL.md 2.3): a challenge and no proof gets its challenge, nothing to test guesses of the token against.
    name: 'a challenge and no proof (waiting for the listener to prove first)',
    expect: 'refused ERR_TIMEOUT',
    run: async (r) => {
      r.send(specChallenge(1, randomBytes(32)));
      assert.equal((await r.take(48)).byteLength, 48);
    },
  },
  {
    name: 'a challenge of authentication version 1 (both sides proved at once)',
    expect: 'refused ERR_FRAME_INVALID',
    run: async (r) => r.send(specChallenge(1, randomBytes(32), (b) => (b[4] = 1))),
  },
  {
    name: 'a proof with the right token but the wrong role byte',
    expect: 'refused ERR_AUTH_FAILED',
    run: async (r) => {
      const nonce = randomBytes(32);
      r.send(specChallenge(1, nonce));
      const theirs = await r.take(48);
      r.send(specProof(TOKEN, 2, theirs.subarray(16), nonce));
    },
  },
  { name: 'a challenge, then the connection closed before the proof', expect: 'refused ERR_AUTH_FAILED', run: async (r) => { r.send(specChallenge(1, randomBytes(32))); await r.take(48); r.socket.end(); } },
  { name: 'a connection that sends nothing and closes (a port probe)', expect: 'nothing', run: async (r) => void r.socket.end() },
  { name: 'a connection that sends nothing and waits', expect: 'refused ERR_TIMEOUT', run: async () => {} },
  { name: 'the token proved, then no HELLO', expect: 'refused ERR_TIMEOUT', run: async (r) => assert.ok(await authenticateRaw(r)) },
  { name: 'the token proved, then a MESSAGE before HELLO', expect: 'refused ERR_FRAME_INVALID', run: async (r) => { assert.ok(await authenticateRaw(r)); r.send(jsonFrame('1')); } },
];

test('hostile peers before the token is proved: each is refused with a typed error (a probe silently), gets nothing past the proofs, and an honest peer is served after', { timeout: 120_000 }, async (t) => {
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, handshakeTimeoutMs: 400, refusedIntervalMs: 0 });
  const refused = refusals(listener);
  const rows: string[] = [];
  try {
    for (const c of AUTH_CASES) {
      const raw = await RawTcp.connect(listener.port);
      await c.run(raw);
      let got: string;
      if (c.expect === 'nothing') {
        await raw.closed();
        // An honest peer served after it is the later event by which a report would have come.
        const { connect } = await import('../../src/link/index.js');
        const [x, y] = await Promise.all([listener.accept(), connect(listener.url, { token: TOKEN })]);
        y.send('after');
        assert.equal(await x.receive(), 'after');
        x.close();
        y.close();
        got = refused.list.length ? `refused ${refused.list.map((e) => e.code).join()}` : 'nothing';
      } else {
        got = `refused ${(await refused.next()).code}`;
        await raw.closed();
      }
      // The listener sent at most its challenge (its proof goes only to a peer that proved the token); past a proved token, its HELLO and GOODBYE, never a message.
      if (!c.name.includes('token proved')) assert.ok(raw.totalReceived <= 48, `${c.name}: the listener sent ${raw.totalReceived} bytes`);
      else assert.deepEqual(parseFrames(raw.received).map((f) => f.type).filter((type) => type !== 1 && type !== 3), [], c.name);
      raw.destroy();
      assert.equal(got, c.expect, c.name);
      rows.push(`| ${c.name} | ${got} |`);
      assert.equal(refused.list.length, 0, `${c.name}: one report`);
    }
    // An honest peer after all of them.
    const { connect } = await import('../../src/link/index.js');
    const [a, b] = await Promise.all([listener.accept(), connect(listener.url, { token: TOKEN })]);
    b.send('honest');
    assert.equal(await a.receive(), 'honest');
    a.close();
    b.close();
    t.diagnostic('| case | listener |');
    t.diagnostic('| --- | --- |');
    for (const r of rows) t.diagnostic(r);
  } finally {
    listener.close();
  }
});

test('maxPending bounds the connections still authenticating: the next one is closed at once and reported as ERR_LIMIT_REACHED', async () => {
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, maxPending: 2, handshakeTimeoutMs: 5000 });
  const refused = refusals(listener);
  const held = [await RawTcp.connect(listener.port), await RawTcp.connect(listener.port)];
  try {
    // Each got its challenge: the listener holds both.
    await Promise.all(held.map((h) => h.take(1)));
    const third = await RawTcp.connect(listener.port);
    const e = await refused.next();
    assert.equal(e.code, 'ERR_LIMIT_REACHED');
    assert.equal(e.limit, 'maxPending');
    await third.closed();
    assert.equal(third.received.byteLength, 0, 'it got not even a challenge');
    for (const h of held) h.destroy();
    await sleep(50);
    // Room again: an honest peer gets in.
    const raw = await RawTcp.connect(listener.port);
    assert.ok(await authenticateRaw(raw));
    raw.destroy();
  } finally {
    for (const h of held) h.destroy();
    listener.close();
  }
});

// ---- after the token is proved --------------------------------------------------------------------

function hostData(file: number, offset: number, length: number): Buffer {
  const d = Buffer.alloc(24);
  d.writeBigUInt64LE(BigInt(file), 0);
  d.writeBigUInt64LE(BigInt(offset), 8);
  d.writeBigUInt64LE(BigInt(length), 16);
  return d;
}
function hostBytes(announced: number | bigint, bytes: number): Buffer {
  const d = Buffer.alloc(8 + bytes);
  d.writeBigUInt64LE(BigInt(announced), 0);
  return d;
}
const record = (kind: string, data: Uint8Array, lease = 0, fds = 0) => buildRecordsFrame('null', [{ kind, path: [], fds, lease, data }]);
const ncclAbort = (reason: number, text = 'x', patch?: (v: DataView) => void) => {
  const body = Buffer.from(text);
  const f = frameBytes(9, 0, 24 + body.byteLength, (v) => {
    v.setUint32(16 + 16, reason, true);
    patch?.(v);
  });
  f.set(body, 16 + 24);
  return f;
};

interface FrameCase {
  name: string;
  /** 'closed CODE', 'message error CODE' or 'delivered'. */
  expect: string;
  frames: () => Uint8Array[];
  /** End the connection after the frames (a frame cut short). */
  end?: boolean;
  maxMessageBytes?: number;
}

const FRAME_CASES: FrameCase[] = [
  { name: 'a header announcing an fd', expect: 'closed ERR_FRAME_INVALID', frames: () => [frameBytes(2, 2, 0, undefined, 1)] },
  { name: 'a message flagged as carried in a memfd', expect: 'closed ERR_FRAME_INVALID', frames: () => [frameBytes(2, 0x100, 8, (v) => v.setUint32(16, 200_000, true))] },
  { name: 'RING on TCP', expect: 'closed ERR_FRAME_INVALID', frames: () => [frameBytes(7, 0, 8, (v) => v.setUint32(16, 65536, true))] },
  { name: 'RING_START on TCP', expect: 'closed ERR_FRAME_INVALID', frames: () => [frameBytes(8, 0, 0)] },
  { name: 'a GONE header announcing 200 KiB (no payload sent)', expect: 'closed ERR_FRAME_INVALID', frames: () => [frameBytes(6, 0, 0, (v) => v.setUint32(8, 200 * 1024, true)).subarray(0, 16)] },
  { name: 'a message header over maxMessageBytes (no payload sent)', expect: 'closed ERR_MESSAGE_TOO_LARGE', maxMessageBytes: 1 << 20, frames: () => [frameBytes(2, 0, 0, (v) => v.setUint32(8, 2 << 20, true)).subarray(0, 16)] },
  { name: 'a message header announcing 4 GiB - 1 (no payload sent)', expect: 'closed ERR_MESSAGE_TOO_LARGE', frames: () => [frameBytes(2, 0, 0, (v) => v.setUint32(8, 0xffffffff, true)).subarray(0, 16)] },
  { name: 'unknown frame type 10', expect: 'closed ERR_FRAME_INVALID', frames: () => [frameBytes(10, 0, 0)] },
  { name: 'bad magic', expect: 'closed ERR_FRAME_INVALID', frames: () => [frameBytes(2, 0, 0, (v) => v.setUint32(0, 0x12345678, true))] },
  { name: 'protocol version 3', expect: 'closed ERR_FRAME_INVALID', frames: () => [frameBytes(2, 0, 0, (v) => v.setUint8(4, 3))] },
  { name: 'reserved header bytes set', expect: 'closed ERR_FRAME_INVALID', frames: () => [frameBytes(2, 0, 0, (v) => v.setUint16(14, 1, true))] },
  { name: 'a second HELLO', expect: 'closed ERR_FRAME_INVALID', frames: () => [tcpHello()] },
  { name: 'NCCL_ABORT with reason 0', expect: 'closed ERR_FRAME_INVALID', frames: () => [ncclAbort(0)] },
  { name: 'NCCL_ABORT with reserved bytes set', expect: 'closed ERR_FRAME_INVALID', frames: () => [ncclAbort(2, 'x', (v) => v.setUint32(16 + 20, 1, true))] },
  { name: 'NCCL_ABORT of 23 bytes', expect: 'closed ERR_FRAME_INVALID', frames: () => [frameBytes(9, 0, 23, (v) => v.setUint32(32, 1, true))] },
  { name: 'NCCL_ABORT with 1025 bytes of text', expect: 'closed ERR_FRAME_INVALID', frames: () => [ncclAbort(1, 'y'.repeat(1025))] },
  { name: 'NCCL_ABORT with flags', expect: 'closed ERR_FRAME_INVALID', frames: () => [ncclAbort(1, 'x', (v) => v.setUint16(6, 1, true))] },
  { name: 'a sound NCCL_ABORT (no hook: ignored)', expect: 'delivered', frames: () => [ncclAbort(3, 'the communicator could not be made'), jsonFrame('"after"')] },
  { name: 'a host-buffer record (its fd cannot come)', expect: 'message error ERR_NOT_TRANSFERABLE', frames: () => [record('host-buffer', hostData(4096, 0, 4096))] },
  { name: 'a legacy-buffer record', expect: 'message error ERR_NOT_TRANSFERABLE', frames: () => [record('legacy-buffer', new Uint8Array(128), 3)] },
  { name: 'a tensor-set record', expect: 'message error ERR_NOT_TRANSFERABLE', frames: () => [record('tensor-set', new Uint8Array(32), 4)] },
  { name: 'host-bytes whose length lies', expect: 'message error ERR_DESCRIPTOR_INVALID', frames: () => [record('host-bytes', hostBytes(100, 10))] },
  { name: 'host-bytes of length 0', expect: 'message error ERR_DESCRIPTOR_INVALID', frames: () => [record('host-bytes', hostBytes(0, 0))] },
  { name: 'host-bytes announcing 2^64-1', expect: 'message error ERR_DESCRIPTOR_INVALID', frames: () => [record('host-bytes', hostBytes(2n ** 64n - 1n, 4))] },
  { name: 'host-bytes with a lease', expect: 'message error ERR_DESCRIPTOR_INVALID', frames: () => [record('host-bytes', hostBytes(4, 4), 9)] },
  { name: 'records claiming an fd the frame has not', expect: 'closed ERR_FRAME_INVALID', frames: () => [record('host-bytes', hostBytes(4, 4), 0, 1)] },
  { name: 'NaN in the JSON', expect: 'closed ERR_FRAME_INVALID', frames: () => [jsonFrame('{"x":NaN}')] },
  { name: 'RELEASE of a lease never granted', expect: 'closed ERR_FRAME_INVALID', frames: () => [frameBytes(5, 0, 16, (v) => { v.setUint32(16, 1, true); v.setBigUint64(24, 77n, true); })] },
  { name: 'a frame cut short by the end of the connection', expect: 'closed ERR_PEER_GONE', end: true, frames: () => [jsonFrame('"a string of some length"').subarray(0, 20)] },
  { name: 'a large message cut short by the end of the connection', expect: 'closed ERR_PEER_GONE', end: true, frames: () => [jsonFrame(`"${'z'.repeat(300_000)}"`).subarray(0, 200_000)] },
  { name: 'a large message inline, whole', expect: 'delivered', frames: () => [jsonFrame(`"${'z'.repeat(300_000)}"`)] },
  { name: 'host-bytes, sound', expect: 'delivered', frames: () => [record('host-bytes', Buffer.concat([hostBytes(4, 0), Buffer.from([1, 2, 3, 4])]))] },
];

/** What `link` does next: delivers a message, fails one, or closes (within 5 s). */
async function outcome(link: Link): Promise<string> {
  try {
    const v = await link.receive({ timeout: 5000 });
    if (v instanceof HostBuffer) v.close();
    return 'delivered';
  } catch (e) {
    assert.ok(e instanceof IpcError, String((e as Error)?.stack ?? e));
    assert.notEqual(e.code, 'ERR_TIMEOUT', 'the link neither delivered, failed the message nor closed');
    return `${link.closed ? 'closed' : 'message error'} ${e.code}`;
  }
}

test('hostile frames on an authenticated TCP link: each gets a typed error (oversized ones from the header alone), and an honest peer is served after', { timeout: 120_000 }, async (t) => {
  const rows: string[] = [];
  for (const c of FRAME_CASES) {
    const { listener, raw, link: linkP } = await tcpLinkWithRawPeer(c.maxMessageBytes ? { maxMessageBytes: c.maxMessageBytes } : {});
    let link: Link | undefined;
    try {
      raw.send(tcpHello());
      link = await linkP;
      for (const f of c.frames()) raw.send(f);
      if (c.end) raw.socket.end();
      const got = await outcome(link);
      let served: string;
      if (!link.closed) {
        raw.send(jsonFrame('"honest"'));
        served = (await link.receive({ timeout: 5000 })) === 'honest' ? 'same link' : 'NO';
      } else {
        await raw.closed();
        served = 'closed';
      }
      if (c.expect === 'closed ERR_MESSAGE_TOO_LARGE') {
        // Told why before the close: REFUSE reason 3 (after its HELLO).
        const frames = parseFrames(raw.received);
        const refuse = frames.find((f) => f.type === 4);
        assert.ok(refuse, `${c.name}: no REFUSE came back (${frames.map((f) => f.type)})`);
        assert.equal(refuse.payload.readUInt16LE(0), 3);
      }
      assert.equal(got, c.expect, c.name);
      assert.notEqual(served, 'NO', c.name);
      rows.push(`| ${c.name} | ${got} | ${served} |`);
    } finally {
      link?.close();
      raw.destroy();
      listener.close();
    }
  }
  t.diagnostic('| case | got | then |');
  t.diagnostic('| --- | --- | --- |');
  for (const r of rows) t.diagnostic(r);
});

test(`the link frame fuzzer through a TCP stream: every case closes, fails or delivers with a typed error, never hangs (seed ${seed})`, { timeout: 180_000 }, async (t) => {
  t.diagnostic(`fuzz seed ${seed} (rerun with CUDA_IPC_FUZZ_SEED=${seed})`);
  const seeds = frameSeeds(seed);
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN, handshakeTimeoutMs: 5000 });
  const outcomes: Record<string, number> = {};
  const cases = 300;
  try {
    for (let i = 0; i < cases; i++) {
      const c = frameCase(seed, i, seeds);
      const raw = await RawTcp.connect(listener.port);
      let link: Link | undefined;
      try {
        assert.ok(await authenticateRaw(raw));
        raw.send(tcpHello());
        link = await listener.accept();
        // The case's bytes as they are (its fds cannot come), a sentinel, then the end: a stream
        // that announced more than it sent is cut short, which the link must see as the peer's end.
        raw.send(c.bytes);
        raw.send(jsonFrame('"sentinel"'));
        raw.socket.end();
        // Until it closed: what it delivered (the case, the sentinel), then why it closed.
        const seq: string[] = [];
        for (let k = 0; k < 10; k++) {
          const o = await outcome(link);
          seq.push(o);
          if (o !== 'delivered' && link.closed) break;
        }
        assert.ok(link.closed, `case ${i} (seed ${seed}): the link never closed: ${seq}`);
        const delivered = seq.filter((o) => o === 'delivered').length;
        const got = `${delivered ? `${delivered} delivered, ` : ''}${seq.filter((o) => o !== 'delivered').join(', ')}`;
        outcomes[got] = (outcomes[got] ?? 0) + 1;
      } finally {
        link?.close();
        raw.destroy();
      }
    }
  } finally {
    listener.close();
  }
  t.diagnostic(JSON.stringify(outcomes));
  const total = Object.values(outcomes).reduce((a, b) => a + b, 0);
  assert.equal(total, cases);
  assert.ok((outcomes['closed ERR_FRAME_INVALID'] ?? 0) > cases / 3, 'most cases are refused as invalid');
  assert.ok(Object.keys(outcomes).some((k) => k.startsWith('2 delivered')), 'some cases are delivered');
});

test('a listener of authentication version 1 (both sides proved at once) gets no proof, and connect names both versions', async () => {
  const got: Buffer[] = [];
  let closed!: () => void;
  const ended = new Promise<void>((r) => (closed = r));
  const server = net.createServer((s) => {
    s.on('data', (d) => got.push(d));
    s.on('error', () => {});
    s.on('close', () => closed());
    s.write(specChallenge(2, randomBytes(32), (b) => (b[4] = 1)));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  try {
    const { connect } = await import('../../src/link/index.js');
    await assert.rejects(connect(`tcp://127.0.0.1:${(server.address() as net.AddressInfo).port}`, { token: TOKEN, timeout: 5000 }), (e: unknown) => {
      assert.ok(e instanceof IpcError);
      assert.equal(e.code, 'ERR_FRAME_INVALID');
      assert.match(e.message, /authentication version 1, this build 2 \(version 1, where both sides proved at once, is no longer spoken: update the older side\)/);
      return true;
    });
    await ended;
    assert.equal(Buffer.concat(got).byteLength, 48, 'the connector sent its challenge and no proof');
  } finally {
    server.close();
  }
});
