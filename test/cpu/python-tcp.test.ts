// TCP links between Node and Python on 127.0.0.1 (docs/PROTOCOL.md 1.1, 2.3): a Python listener and a
// Node connector, a Node listener and a Python connector, messages and host buffers (copies) both
// ways, the token (Python reads CUDA_IPC_TOKEN), a wrong token refused on both sides, a Python peer
// SIGKILLed. Written against the package's TCP API (`listen('tcp://127.0.0.1:0', { token })`,
// `listener.url`, `connect(url, { token })`): where dist/src/index.js has no TCP links yet (before the
// Node side of issue 26 is merged) every test skips with that reason. Python<->Python TCP tests are
// in python/tests/test_tcp*.py (run by python-link.test.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { spawn as spawnProcess, type ChildProcessByStdio } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';
import type { Readable } from 'node:stream';
import * as pkg from '../../src/index.js';
import { HostBuffer, type Link } from '../../src/index.js';
import { PYTHON, PYTHON_PACKAGE_DIR, noPython, pythonFixture } from '../helpers/python.js';

const PEER = pythonFixture('tcp_peer.py');
const TOKEN = randomBytes(16).toString('hex');

/** The TCP part of the package's API, as issue 26 specifies it (typed here so that this file
 * compiles before the Node side exists). */
interface TcpListener {
  readonly url: string;
  accept(options?: { signal?: AbortSignal }): Promise<Link>;
  close(): unknown;
}
interface TcpApi {
  listen(address: string, options: { token: string }): TcpListener | Promise<TcpListener>;
  connect(address: string, options: { token: string; timeout?: number }): Promise<Link>;
}
const tcp = pkg as unknown as TcpApi;

async function noNodeTcp(): Promise<string | undefined> {
  try {
    const listener = await tcp.listen('tcp://127.0.0.1:0', { token: TOKEN });
    const url = listener.url;
    await listener.close();
    if (typeof url === 'string' && url.startsWith('tcp://127.0.0.1:')) return undefined;
    return `listen('tcp://127.0.0.1:0') returned no listener.url (got ${String(url)})`;
  } catch (e) {
    return `dist/src/index.js has no TCP links yet (listen('tcp://127.0.0.1:0') threw ${(e as { code?: string }).code ?? String(e)}): ` +
      'these tests run once the Node side of issue 26 is merged';
  }
}

const skip = noPython ?? await noNodeTcp();

type Peer = ChildProcessByStdio<null, Readable, null>;

/** Starts tcp_peer.py with CUDA_IPC_TOKEN=token; resolves with it and its first line (JSON). */
async function startPeer(args: string[], token = TOKEN): Promise<{ child: Peer; first: Record<string, unknown> }> {
  const child = spawnProcess(PYTHON, [PEER, ...args], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, PYTHONPATH: PYTHON_PACKAGE_DIR, CUDA_IPC_TOKEN: token },
  });
  const lines = createInterface({ input: child.stdout });
  const [line] = (await Promise.race([once(lines, 'line'), once(child, 'exit').then(() => [undefined])])) as [string | undefined];
  lines.close();
  if (line === undefined) throw new Error(`tcp_peer.py ${args.join(' ')} exited before it printed a line (code ${child.exitCode})`);
  return { child, first: JSON.parse(line) };
}

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  return link.receive({ signal: AbortSignal.timeout(10_000) });
}

function closeReason(link: Link): Promise<{ code?: string } | undefined> {
  return new Promise((resolve) => link.once('close', (reason) => resolve(reason)));
}

/** What the link's peer says about the link, messages both ways, and host buffers as copies. */
async function exercise(link: Link): Promise<void> {
  const where = await ask(link, { op: 'where' });
  assert.equal(where.transport, 'tcp');
  assert.equal(where.tls, false);
  assert.equal(where.peer, 'ERR_UNSUPPORTED', 'link.peer on a TCP link points at link.remote');
  assert.deepEqual(where.remote.slice(0, 1).concat(where.remote.slice(2)), ['127.0.0.1', 'IPv4']);

  const value = {
    text: 'héllo ✓', n: 3.5, neg: -7, big: 123456789012345678901234567890n, flag: true, none: null,
    list: [1, 'two', [3, { four: 4 }]], f32: new Float32Array([1.5, -2.25]), u8: new Uint8Array([0, 255, 7]),
  };
  const { value: back } = await ask(link, { op: 'echo', value });
  assert.deepEqual(back.f32, value.f32);
  assert.deepEqual(Uint8Array.from(back.u8), value.u8);
  assert.equal(back.big, value.big);
  assert.deepEqual({ ...back, f32: 0, u8: 0 }, { ...value, f32: 0, u8: 0 });
  // Past a frame (128 KiB): inline on TCP, both ways.
  const big = randomBytes(3 << 20);
  assert.deepEqual(Buffer.from((await ask(link, { op: 'echo', value: big })).value), big);

  const h = HostBuffer.allocate(200_000);
  const bytes = h.bytes;
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 3) & 255;
  const reply = await ask(link, { op: 'host', buffer: h, expect: 3, n: 70_000 });
  assert.equal(reply.ok, true, 'Python got a HostBuffer holding the bytes');
  assert.equal(reply.length, 200_000);
  assert.equal(h.leases, 0, 'a copy: nothing leased');
  h.close();
  const got = reply.buffer as HostBuffer;
  assert.ok(got instanceof HostBuffer);
  assert.equal(got.byteLength, 70_000);
  assert.ok(got.bytes.every((b, i) => b === (i & 255)), 'Node got a HostBuffer holding the bytes');
  got.close();
}

test('a Python TCP listener and a Node connector: messages and host buffers both ways', { skip }, async () => {
  const { child, first } = await startPeer(['listen']);
  try {
    const url = first.url as string;
    assert.match(url, /^tcp:\/\/127\.0\.0\.1:[0-9]+$/);
    const link = await tcp.connect(url, { token: TOKEN });
    await exercise(link);
    await link.end();
    await once(child, 'exit');
    assert.equal(child.exitCode, 0);
  } finally {
    child.kill('SIGKILL');
  }
});

test('a Node TCP listener and a Python connector; a wrong token is refused on both sides', { skip }, async () => {
  const listener = await tcp.listen('tcp://127.0.0.1:0', { token: TOKEN });
  try {
    const wrong = await startPeer(['connect', listener.url], 'not-the-token-' + randomBytes(8).toString('hex'));
    assert.deepEqual(wrong.first, { error: 'ERR_AUTH_FAILED' });
    await once(wrong.child, 'exit');

    const accepted = listener.accept({ signal: AbortSignal.timeout(20_000) });
    const { child, first } = await startPeer(['connect', listener.url]);
    try {
      assert.deepEqual(first, { connected: true });
      const link = await accepted;
      await exercise(link);
      await link.end();
      await once(child, 'exit');
      assert.equal(child.exitCode, 0);
    } finally {
      child.kill('SIGKILL');
    }
  } finally {
    await listener.close();
  }
});

test('a Node connector with a wrong token gets ERR_AUTH_FAILED from a Python listener', { skip }, async () => {
  const { child, first } = await startPeer(['listen']);
  try {
    await assert.rejects(tcp.connect(first.url as string, { token: 'not-the-token-' + randomBytes(8).toString('hex') }),
      (e: { code?: string }) => e.code === 'ERR_AUTH_FAILED');
  } finally {
    child.kill('SIGKILL');
    await once(child, 'exit');
  }
});

test('a Python peer SIGKILLed on a TCP link: ERR_PEER_GONE', { skip }, async () => {
  const { child, first } = await startPeer(['listen']);
  try {
    const link = await tcp.connect(first.url as string, { token: TOKEN });
    assert.deepEqual((await ask(link, { op: 'echo', value: 1 })).value, 1);
    const closed = closeReason(link);
    child.kill('SIGKILL');
    assert.equal((await closed)?.code, 'ERR_PEER_GONE');
  } finally {
    child.kill('SIGKILL');
    if (child.exitCode === null && child.signalCode === null) await once(child, 'exit');
  }
});
