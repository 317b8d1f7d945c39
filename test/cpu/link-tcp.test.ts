// Links over TCP (issue 26, PROTOCOL.md 1.1 and 2.3), Node to Node on the loopback interface: the
// same Link as on a Unix socket (messages of every encoding, large ones inline, backpressure,
// bounds), host buffers arriving as copies, the token both sides must prove (a wrong or missing
// one refused on both sides with nothing delivered), what a TCP link refuses to carry, NCCL_ABORT,
// IPv6 and TLS, and what status and stats() say of TCP links.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { IpcError } from '../../src/errors.js';
import { HostBuffer } from '../../src/host/index.js';
import { listen, connect, registerTransferHandler, unregisterTransferHandler } from '../../src/link/index.js';
import type { Link } from '../../src/link/connection/link.js';
import { HostArray, TensorMap } from '../../src/tensors/index.js';
import { stats } from '../../src/stats.js';
import { collectStatus } from '../../src/observe/reader.js';
import { formatStatus } from '../../src/cli/status.js';
import { linkPair } from '../fixtures/link-pair.js';
import { fdCount } from '../fixtures/fd-count.js';
import { TOKEN, tcpPair } from '../fixtures/tcp-peer.js';
import { waitUntil, within } from '../helpers/wait.js';

// This process's status records go to a folder of its own.
const runtime = mkdtempSync(join(tmpdir(), 'cuda-ipc-tcp-'));
process.env.XDG_RUNTIME_DIR = runtime;
after(() => rmSync(runtime, { recursive: true, force: true }));

const code = (c: string) => (e: unknown) => {
  assert.ok(e instanceof IpcError, String((e as Error)?.stack ?? e));
  assert.equal(e.code, c, e.message);
  return true;
};

function closeAll(...things: Array<{ close(): void } | undefined>): void {
  for (const t of things) t?.close();
}

test('listen binds exactly the URL\'s address: port 0 picks one and listener.url names it; bad URLs are TypeErrors that say what to write', async () => {
  const l = await listen('tcp://127.0.0.1:0', { token: TOKEN });
  try {
    assert.match(l.url, /^tcp:\/\/127\.0\.0\.1:\d+$/);
    assert.ok(l.port > 0);
    assert.equal(l.url, `tcp://127.0.0.1:${l.port}`);
    assert.equal(l.address, '127.0.0.1');
    await assert.rejects(listen(l.url, { token: TOKEN }), code('ERR_ADDRESS_IN_USE'));
  } finally {
    l.close();
  }
  for (const [url, why] of [
    ['tcp://localhost:0', /binds an IP address exactly/],
    ['tcp://127.0.0.1', /has no port/],
    ['tcp://127.0.0.1:70000', /port 70000/],
    ['tcp://::1:5000', /goes in brackets/],
    ['tcp://[127.0.0.1]:5000', /brackets hold an IPv6 address/],
    ['tcp://127.0.0.1:5000/path', /not a link URL/],
  ] as const) {
    await assert.rejects(listen(url as `tcp://${string}`, { token: TOKEN }), (e: unknown) => {
      assert.ok(e instanceof TypeError, String(e));
      assert.match((e as Error).message, why);
      return true;
    });
  }
  await assert.rejects(connect('tcp://127.0.0.1:0', { token: TOKEN }), /port 0, which is not 1\.\.65535/);
  await assert.rejects(listen('tcp://127.0.0.1:0', { token: TOKEN, tls: {} }), /write tls:\/\//);
});

test('connect to a port nobody listens on: ERR_NO_LISTENER naming the address, at once with timeout 0 and after its retries with a timeout', async () => {
  const free = net.createServer();
  await new Promise<void>((r) => free.listen(0, '127.0.0.1', r));
  const port = (free.address() as net.AddressInfo).port;
  await new Promise<void>((r) => free.close(() => r()));
  await assert.rejects(connect(`tcp://127.0.0.1:${port}`, { token: TOKEN, timeout: 0 }), code('ERR_NO_LISTENER'));
  await assert.rejects(connect(`tcp://127.0.0.1:${port}`, { token: TOKEN, timeout: 200 }), (e: unknown) => {
    code('ERR_NO_LISTENER')(e);
    assert.match((e as Error).message, new RegExp(`nothing listens at tcp://127\\.0\\.0\\.1:${port} \\(connection refused\\)`));
    return true;
  });
});

test('connect gives up on its signal (AbortError) or its timeout (ERR_TIMEOUT) while the other side never answers, leaving nothing open', async () => {
  const silent: net.Socket[] = [];
  const server = net.createServer((s) => silent.push(s)); // accepts, never says a word
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `tcp://127.0.0.1:${(server.address() as net.AddressInfo).port}` as const;
  const fds0 = fdCount();
  try {
    const ac = new AbortController();
    setTimeout(() => ac.abort(new Error('enough')), 50);
    await assert.rejects(connect(url, { token: TOKEN, signal: ac.signal }), (e: unknown) => {
      assert.equal((e as Error).name, 'AbortError');
      assert.equal((e as { code?: string }).code, 'ABORT_ERR');
      return true;
    });
    await assert.rejects(connect(url, { token: TOKEN, timeout: 100 }), code('ERR_TIMEOUT'));
    await assert.rejects(connect(url, { token: TOKEN, signal: AbortSignal.abort() }), { name: 'AbortError' });
    for (const s of silent) s.destroy();
    await waitUntil(() => fdCount() <= fds0, `the connections given up to be closed (${fdCount()} fds, ${fds0} before)`);
    assert.equal(fdCount(), fds0, 'the connections given up were closed');
  } finally {
    for (const s of silent) s.destroy();
    server.close();
  }
});

test('messages of every encoding cross a TCP link both ways, large ones inline', async () => {
  const { a, b, listener } = await tcpPair();
  try {
    assert.equal(a.transport, 'tcp');
    assert.equal(b.transport, 'tcp');
    const values: unknown[] = [
      undefined,
      null,
      42,
      'héllo ✓',
      { op: 'take', list: [1, 'two', { three: null }], ok: true },
      new Uint8Array([1, 2, 3]),
      { n: 12345678901234567890n, neg: -5n, f: new Float64Array([1.5, -2]), i: [new Int16Array([-1, 7])], d: new DataView(new ArrayBuffer(3)) },
    ];
    for (const v of values) {
      b.send(v);
      assert.deepEqual(await a.receive(), v);
      a.send(v);
      assert.deepEqual(await b.receive(), v);
    }
    // Larger than a frame (128 KiB): inline in the stream, raw, JSON and records.
    const raw = new Uint8Array(5 * 2 ** 20).map((_, i) => i % 251);
    const json = { rows: Array.from({ length: 60_000 }, (_, i) => [i, `row ${i}`]) };
    const records = { pad: 'p'.repeat(300_000), big: new Float32Array(200_000).fill(0.25), n: 7n };
    for (const v of [raw, json, records]) {
      b.send(v);
      assert.deepEqual(await a.receive(), v);
    }
    assert.equal(a.state, 'open');
  } finally {
    closeAll(a, b, listener);
  }
});

test('maxMessageBytes bounds a TCP link on both sides: the sender refuses, and a receiver refuses from the header with REFUSE reason 3', async () => {
  const { a, b, listener } = await tcpPair({ maxMessageBytes: 200_000 }, { maxMessageBytes: 10_000_000 });
  try {
    assert.throws(() => a.send(new Uint8Array(300_000)), code('ERR_MESSAGE_TOO_LARGE'));
    assert.equal(a.state, 'open', 'a send refused at the sender leaves the link open');
    const closedA = new Promise((r) => a.on('close', r));
    const closedB = new Promise((r) => b.on('close', r));
    b.send(new Uint8Array(300_000));
    const [reasonA, reasonB] = await Promise.all([closedA, closedB]);
    assert.equal((reasonA as IpcError).code, 'ERR_MESSAGE_TOO_LARGE');
    assert.equal((reasonB as IpcError).code, 'ERR_MESSAGE_TOO_LARGE', 'the sender was told why (REFUSE reason 3)');
    assert.equal((reasonB as IpcError).limit, 'maxMessageBytes');
  } finally {
    closeAll(a, b, listener);
  }
});

test('a HostBuffer on a TCP link arrives as a new HostBuffer holding a copy: right bytes, no lease, neither side sees the other\'s writes', async () => {
  const { a, b, listener } = await tcpPair();
  const sent = HostBuffer.allocate(65536);
  try {
    for (let i = 0; i < 65536; i += 4096) sent.write(new Uint8Array([i / 4096, 0xaa]), i);
    const view = sent.view(4096, 100);
    const before = stats().traffic;
    b.send({ whole: sent, view, after: 'x' });
    view.close();
    const got = (await a.receive()) as { whole: HostBuffer; view: HostBuffer; after: string };
    try {
      assert.ok(got.whole instanceof HostBuffer && got.view instanceof HostBuffer);
      assert.equal(got.whole.byteLength, 65536);
      assert.equal(got.view.byteLength, 100);
      assert.deepEqual(got.whole.read(0, 65536), sent.read(0, 65536));
      assert.deepEqual(got.view.read(0, 2), new Uint8Array([1, 0xaa]));
      assert.equal(got.after, 'x');
      assert.equal(b.leases.count, 0, 'a copy is not leased');
      assert.equal(sent.leases, 0);
      // Two memories now: a write on either side stays there.
      got.whole.write(new Uint8Array([99]), 0);
      sent.write(new Uint8Array([77]), 1);
      assert.equal(sent.read(0, 1)[0], 0);
      assert.equal(got.whole.read(1, 1)[0], 0xaa);
      assert.notEqual(got.whole.fd, sent.fd);
      // Counted as copied, per link and for the process.
      assert.deepEqual(b.bytesCopied, { sent: 65536 + 100, received: 0 });
      assert.deepEqual(a.bytesCopied, { sent: 0, received: 65536 + 100 });
      const after = stats().traffic;
      assert.equal(after.copiedSent - before.copiedSent, 65636);
      assert.equal(after.copiedReceived - before.copiedReceived, 65636);
      assert.equal(after.ncclSent, 0);
      const perLink = after.links.find((l) => l.linkId === a.id);
      assert.deepEqual(perLink, { linkId: a.id, copiedSent: 0, copiedReceived: 65636, ncclSent: 0, ncclReceived: 0 });
      // The sender may close its buffer at once: the receiver's copy is its own.
      sent.close();
      assert.equal(got.whole.read(2, 1)[0], 0);
    } finally {
      got.whole.close();
      got.view.close();
    }
    // On a Unix-socket link the same buffer is shared, not copied.
    const [u1, u2] = await linkPair();
    using shared = HostBuffer.allocate(4096);
    u1.send(shared);
    const there = (await u2.receive()) as HostBuffer;
    there.write(new Uint8Array([5]), 0);
    assert.equal(shared.read(0, 1)[0], 5);
    assert.deepEqual(u1.bytesCopied, { sent: 0, received: 0 });
    assert.equal(u1.transport, 'unix');
    assert.equal(u1.remote, undefined);
    there.close();
    closeAll(u1, u2);
  } finally {
    closeAll(a, b, listener);
    if (!sent.closed) sent.close();
  }
});

test("backpressure on TCP: send() false once the socket's write buffer is full, 'drain' while the kernel takes more, queued once the peer stopped reading; nothing lost", async () => {
  // The receiver's inbox holds 4 messages: then it stops reading, the kernel's buffers fill, and
  // the sender's socket stops draining.
  const { a, b, listener } = await tcpPair({ inbox: { messages: 4 } }, { sendQueue: { messages: 100_000, bytes: 2 ** 30 } });
  try {
    const chunk = new Uint8Array(64 * 1024);
    let n = 0;
    let falses = 0;
    let drains = 0;
    b.on('drain', () => drains++);
    // Written as to a stream. First the receiver reads along (its kernel buffers empty), so the
    // 'drain' after a false comes for sure; then it stops reading: its inbox fills to the bound, it
    // pauses, the kernel's buffers fill, and what follows waits in the sender's queue. Each wait is
    // for an event ('drain', or the receiver's pause), never a guess that none will come.
    let read = 0;
    const take = async (): Promise<void> => {
      const m = (await a.receive()) as { i: number; chunk: Uint8Array };
      assert.equal(m.i, read++, 'in order');
      assert.equal(m.chunk.byteLength, chunk.byteLength);
    };
    while (b.send({ i: n++, chunk }));
    falses++;
    // Every message sent passes through the queue that returned false: once they are all read, it
    // has emptied and its 'drain' came (if not before).
    while (drains === 0) {
      if (read < n) await take();
      else await within(once(b, 'drain'), "'drain' once the receiver read everything");
    }
    for (;;) {
      if (b.send({ i: n++, chunk })) continue;
      falses++;
      if (a.receiveQueue.paused) break;
      const before = drains;
      await waitUntil(() => drains > before || a.receiveQueue.paused,
        `'drain' or the receiver's pause (${n} messages sent, ${drains} drains)`);
    }
    assert.ok(falses > 1, 'send() said to wait');
    assert.ok(drains >= 1, "'drain' said to go on while the kernel took more");
    assert.equal(a.receiveQueue.paused, true, 'the receiver stopped reading at its inbox bound');
    assert.ok(b.sendQueue.messages >= 1, 'what the socket would not take waits in the queue');
    assert.ok(n * chunk.byteLength < 256 * 2 ** 20, `the sender stopped after ${n} messages, before its memory grew without bound`);
    const drained = once(b, 'drain');
    while (read < n) await take();
    await drained;
    assert.deepEqual(b.sendQueue, { messages: 0, bytes: 0, fds: 0 });
    assert.equal(b.send('after'), true);
    assert.equal(await a.receive(), 'after');
  } finally {
    closeAll(a, b, listener);
  }
});

test('the send queue of a TCP link is bounded: ERR_SEND_QUEUE_FULL at its bound, nothing dropped', async () => {
  const { a, b, listener } = await tcpPair({ inbox: { messages: 1 } }, { sendQueue: { messages: 3 } });
  try {
    const chunk = new Uint8Array(256 * 1024);
    let n = 0;
    let refused: unknown;
    // Past false (no waiting for 'drain'): the queue fills once the peer's kernel buffers are full.
    for (; n < 4096; n++) {
      try {
        b.send(chunk);
      } catch (e) {
        refused = e;
        break;
      }
      if (b.sendQueue.messages > 0) await sleep(20); // let the kernel take what it will
    }
    assert.ok(refused, `the queue took ${n} messages`);
    assert.ok(code('ERR_SEND_QUEUE_FULL')(refused) && (refused as IpcError).limit === 'sendQueue.messages');
    assert.equal(b.sendQueue.messages, 3);
    assert.equal(b.state, 'open');
    for (let i = 0; i < n; i++) assert.equal(((await a.receive()) as Uint8Array).byteLength, chunk.byteLength);
  } finally {
    closeAll(a, b, listener);
  }
});

test('a wrong token: ERR_AUTH_FAILED on both sides before any message is read; nothing is delivered', async () => {
  const listener = await listen('tcp://127.0.0.1:0', { token: TOKEN });
  const refused: IpcError[] = [];
  listener.on('refused', (e) => refused.push(e));
  const connections: Link[] = [];
  listener.on('connection', (l) => connections.push(l));
  try {
    await assert.rejects(connect(listener.url, { token: 'another-token-of-enough-bytes' }), (e: unknown) => {
      code('ERR_AUTH_FAILED')(e);
      assert.match((e as Error).message, /did not prove the token: the two sides hold different tokens/);
      return true;
    });
    await waitUntil(() => refused.length > 0, "the listener's 'refused' report");
    assert.equal(refused.length, 1);
    assert.equal(refused[0]!.code, 'ERR_AUTH_FAILED');
    assert.deepEqual(connections, [], 'no link was made');
    await assert.rejects(listener.accept({ timeout: 100 }), code('ERR_TIMEOUT'));
    // The right token still gets in afterwards.
    const [l, c] = await Promise.all([once(listener, 'connection'), connect(listener.url, { token: TOKEN })]);
    c.send('ok');
    assert.equal(await (l[0] as Link).receive(), 'ok');
    closeAll(c, l[0] as Link);
  } finally {
    listener.close();
  }
});

test('no token, or one too short: ERR_AUTH_FAILED at once and nothing sent (not even a connection)', async () => {
  const saved = process.env.CUDA_IPC_TOKEN;
  delete process.env.CUDA_IPC_TOKEN;
  const server = net.createServer();
  let connections = 0;
  server.on('connection', (s) => {
    connections++;
    s.destroy();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `tcp://127.0.0.1:${(server.address() as net.AddressInfo).port}` as const;
  try {
    await assert.rejects(connect(url), (e: unknown) => code('ERR_AUTH_FAILED')(e) && /needs a token and none was given.*CUDA_IPC_TOKEN/.test((e as Error).message));
    await assert.rejects(connect(url, { token: 'short' }), (e: unknown) => code('ERR_AUTH_FAILED')(e) && /is 5 bytes; a token is at least 16 bytes/.test((e as Error).message));
    process.env.CUDA_IPC_TOKEN = 'fifteen-bytes!!';
    await assert.rejects(connect(url), /\(CUDA_IPC_TOKEN\) is 15 bytes/);
    await assert.rejects(listen('tcp://127.0.0.1:0', {}), code('ERR_AUTH_FAILED'));
    delete process.env.CUDA_IPC_TOKEN;
    await assert.rejects(listen('tcp://127.0.0.1:0'), code('ERR_AUTH_FAILED'));
    await assert.rejects(connect(url, { token: 42 as unknown as string }), TypeError);
    // A later connection of our own must arrive after any the refused calls had opened.
    const probe = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
    probe.on('error', () => {});
    await waitUntil(() => connections > 0, 'the probe connection to reach the listening socket');
    probe.destroy();
    assert.equal(connections, 1, 'nothing but the probe reached the listening socket');
    // The environment variable is the token when no option is given.
    process.env.CUDA_IPC_TOKEN = TOKEN;
    const { a, b, listener } = await tcpPair({ token: undefined } as object);
    b.send('from the environment');
    assert.equal(await a.receive(), 'from the environment');
    closeAll(a, b, listener);
  } finally {
    if (saved === undefined) delete process.env.CUDA_IPC_TOKEN;
    else process.env.CUDA_IPC_TOKEN = saved;
    server.close();
  }
});

test('link.peer on a TCP link throws ERR_UNSUPPORTED pointing at link.remote; link.remote names each side', async () => {
  const { a, b, listener } = await tcpPair();
  try {
    assert.throws(() => a.peer, (e: unknown) => code('ERR_UNSUPPORTED')(e) && /link\.remote/.test((e as Error).message));
    assert.deepEqual(b.remote, { address: '127.0.0.1', port: listener.port, family: 'IPv4', tls: false });
    assert.equal(a.remote!.address, '127.0.0.1');
    assert.ok(a.remote!.port > 0 && a.remote!.port !== listener.port);
  } finally {
    closeAll(a, b, listener);
  }
});

test('what needs fds is refused on a TCP link with ERR_NOT_TRANSFERABLE naming what to send; a handler serving TCP is used there', async () => {
  const { a, b, listener } = await tcpPair();
  using arr = HostArray.allocate('float32', [4]);
  try {
    assert.throws(() => b.send({ weights: new TensorMap({ w: arr }) }), (e: unknown) => {
      code('ERR_NOT_TRANSFERABLE')(e);
      // Tensor sets cross TCP links over NCCL: device memory only.
      assert.match((e as Error).message, /tensor "w" is in host memory; a tensor set crosses a TCP link over NCCL, device memory only/);
      return true;
    });
    class Token { constructor(readonly n: number) {} }
    registerTransferHandler<Token>({ kind: 'test-token', canTransfer: (v): v is Token => v instanceof Token, encode: (t) => ({ data: new Uint8Array([t.n]) }), decode: (d) => new Token(d[0]!) });
    try {
      assert.throws(() => b.send(new Token(3)), /travels as 'test-token', which only a Unix-socket link/);
    } finally {
      unregisterTransferHandler('test-token');
    }
    registerTransferHandler<Token>({ kind: 'test-token', transports: ['unix', 'tcp'], canTransfer: (v): v is Token => v instanceof Token, encode: (t) => ({ data: new Uint8Array([t.n]) }), decode: (d) => new Token(d[0]!) });
    try {
      b.send([new Token(9)]);
      assert.deepEqual(await a.receive(), [new Token(9)]);
    } finally {
      unregisterTransferHandler('test-token');
    }
    assert.throws(() => registerTransferHandler({ kind: 'bad', transports: ['udp' as 'tcp'], canTransfer: (v): v is object => false, encode: () => ({ data: new Uint8Array() }), decode: () => 0 }), /transports must be/);
    assert.equal(b.state, 'open', 'a refused send leaves the link open');
  } finally {
    closeAll(a, b, listener);
  }
});

test('NCCL_ABORT: the peer takes NCCL on TCP (HELLO bit 3), a sent abort reaches the hooks, and with no hook it is ignored', async () => {
  const { a, b, listener } = await tcpPair();
  try {
    assert.equal(a.peerTakesNccl, true);
    assert.equal(b.peerTakesNccl, true);
    const id = new Uint8Array(16).map((_, i) => i + 1);
    // No hook: ignored, the link goes on.
    assert.equal(b.sendNcclAbort(id, 2, 'nobody listens'), true);
    b.send('still open');
    assert.equal(await a.receive(), 'still open');
    const got: unknown[] = [];
    const off = a.onNcclAbort((x) => got.push(x));
    b.sendNcclAbort(id, 1, 'the receiver could not take it: ✗ '.padEnd(2000, 'x'));
    b.send('after');
    assert.equal(await a.receive(), 'after');
    assert.equal(got.length, 1);
    const abort = got[0] as { id: Uint8Array; reason: number; text: string };
    assert.deepEqual(abort.id, id);
    assert.equal(abort.reason, 1);
    assert.equal(Buffer.byteLength(abort.text), 1024, 'the text is cut to 1024 bytes');
    assert.ok(abort.text.startsWith('the receiver could not take it: ✗'));
    off();
    assert.throws(() => b.sendNcclAbort(new Uint8Array(15), 1, ''), TypeError);
    assert.throws(() => b.sendNcclAbort(id, 4 as 1, ''), RangeError);
    // A Unix-socket link has no NCCL: nothing is sent.
    const [u1, u2] = await linkPair();
    assert.equal(u1.peerTakesNccl, false);
    assert.equal(u1.sendNcclAbort(id, 2, 'x'), false);
    closeAll(u1, u2);
  } finally {
    closeAll(a, b, listener);
  }
});

test('a clean end() on a TCP link reads as ERR_LINK_CLOSED on the other side; messages sent before it are delivered', async () => {
  const { a, b, listener } = await tcpPair();
  try {
    for (let i = 0; i < 100; i++) b.send({ i, pad: 'x'.repeat(5000) });
    await b.end();
    for (let i = 0; i < 100; i++) assert.equal(((await a.receive()) as { i: number }).i, i);
    await assert.rejects(a.receive(), code('ERR_LINK_CLOSED'));
  } finally {
    closeAll(a, b, listener);
  }
});

const ipv6 = await new Promise<boolean>((resolve) => {
  const s = net.createServer();
  s.once('error', () => resolve(false));
  s.listen(0, '::1', () => s.close(() => resolve(true)));
});

test('IPv6 loopback: tcp://[::1]:0', { skip: ipv6 ? false : 'this machine has no IPv6 loopback (::1 cannot be bound)' }, async () => {
  const { a, b, listener } = await tcpPair({}, {}, '::1');
  try {
    assert.match(listener.url, /^tcp:\/\/\[::1\]:\d+$/);
    assert.deepEqual(b.remote, { address: '::1', port: listener.port, family: 'IPv6', tls: false });
    b.send({ over: 'v6' });
    assert.deepEqual(await a.receive(), { over: 'v6' });
  } finally {
    closeAll(a, b, listener);
  }
});

/** A self-signed certificate for 127.0.0.1 made by openssl, or why there is none. */
function makeCertificate(dir: string): { cert: string; key: string } | string {
  try {
    execFileSync('openssl', [
      'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '2',
      '-subj', '/CN=cuda-ipc test', '-addext', 'subjectAltName=IP:127.0.0.1',
      '-keyout', join(dir, 'key.pem'), '-out', join(dir, 'cert.pem'),
    ], { stdio: 'ignore' });
  } catch (e) {
    return `openssl could not make a test certificate (${(e as Error).message.split('\n')[0]})`;
  }
  return { cert: readFileSync(join(dir, 'cert.pem'), 'utf8'), key: readFileSync(join(dir, 'key.pem'), 'utf8') };
}

const certDir = mkdtempSync(join(tmpdir(), 'cuda-ipc-tls-'));
after(() => rmSync(certDir, { recursive: true, force: true }));
const certificate = makeCertificate(certDir);

test('tls://: the same link inside TLS; a certificate its CA does not sign is ERR_AUTH_FAILED', { skip: typeof certificate === 'string' ? certificate : false }, async () => {
  const { cert, key } = certificate as { cert: string; key: string };
  const listener = await listen('tls://127.0.0.1:0', { token: TOKEN, tls: { cert, key } });
  const refused: IpcError[] = [];
  listener.on('refused', (e) => refused.push(e));
  try {
    assert.match(listener.url, /^tls:\/\/127\.0\.0\.1:\d+$/);
    const [a, b] = await Promise.all([listener.accept(), connect(listener.url, { token: TOKEN, tls: { ca: cert } })]);
    assert.equal(b.remote!.tls, true);
    const h = HostBuffer.allocate(4096);
    h.fill(3);
    b.send({ h, big: new Uint8Array(300_000).fill(1) });
    const got = (await a.receive()) as { h: HostBuffer; big: Uint8Array };
    assert.equal(got.h.read(4095, 1)[0], 3);
    assert.equal(got.big.byteLength, 300_000);
    closeAll(got.h, h, a, b);
    // No CA given: the system's CAs do not know a self-signed certificate.
    await assert.rejects(connect(listener.url, { token: TOKEN, timeout: 0 }), code('ERR_AUTH_FAILED'));
    // TLS options need a tls:// URL, and a listener needs its certificate.
    await assert.rejects(listen('tls://127.0.0.1:0', { token: TOKEN, tls: {} }), /needs options\.tls\.cert/);
  } finally {
    listener.close();
  }
});

test('status and stats() list a TCP link by its remote address with what it copied, and a 0 for NCCL', async () => {
  const { a, b, listener } = await tcpPair();
  try {
    using h = HostBuffer.allocate(8192);
    b.send(h);
    ((await a.receive()) as HostBuffer).close();
    let mine;
    for (let i = 0; i < 100; i++) {
      await sleep(30);
      mine = collectStatus().processes.find((p) => p.pid === process.pid);
      const l = mine?.links.find((x) => x.id === b.id);
      if (l?.traffic?.copiedSent === 8192) break;
    }
    const rec = mine!.links.find((x) => x.id === b.id)!;
    assert.equal(rec.transport, 'tcp');
    assert.equal(rec.peerPid, 0);
    assert.deepEqual(rec.remote, { address: '127.0.0.1', port: listener.port, family: 'IPv4', tls: false });
    assert.deepEqual(rec.traffic, { copiedSent: 8192, copiedReceived: 0, ncclSent: 0, ncclReceived: 0 });
    const text = formatStatus(collectStatus()).join('\n');
    assert.match(text, new RegExp(`#${b.id} tcp 127\\.0\\.0\\.1:${listener.port} open`));
    assert.match(text, /\n  over TCP +#\d+ tcp /);
    assert.match(text, new RegExp(` #${b.id} tcp 127\\.0\\.0\\.1:${listener.port}: host memory copied 8\\.0 KiB sent, 0 B received; device memory over NCCL 0 B sent, 0 B received\\n`));
  } finally {
    closeAll(a, b, listener);
  }
});
