// The Unix listener's and connect()'s edges (link/connect/listener.ts) that the mutation run
// (listener group, issue 41) showed untested: URLs routed to TCP, the options' hints and names in
// argument errors, a try that fails for another reason than a busy listener (not retried), the
// errors connect() gives at once with `timeout: 0` and their causes, fds given back on every
// failed try and on an abort during the handshake, and `using`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { mkdtempSync, readdirSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { IpcError } from '../../src/errors.js';
import { connect, listen, type Link } from '../../src/link/index.js';
import { Listener } from '../../src/link/connect/listener.js';
import { TcpListener } from '../../src/link/connect/tcp-listener.js';
import { addon } from '../../src/native/addon.js';
import { header } from '../fixtures/link-pair.js';
import { TOKEN } from '../fixtures/tcp-peer.js';

const code = (c: string) => (e: unknown): boolean => (e as { code?: string })?.code === c;

function tempDir(): string {
  return mkdtempSync(join(tmpdir(), 'cuda-ipc-lconn-'));
}

/**
 * How many of the sockets that addon.socket() made while `body` ran are still open after it: each
 * known by its /proc link ("socket:[inode]"), so that fds other code opens or closes meanwhile
 * (an earlier test's sockets closing) do not count, and a reused fd number is not taken for one.
 */
async function socketsLeftOpen(body: () => Promise<void>): Promise<number> {
  const real = addon.socket;
  const made: string[] = [];
  addon.socket = (() => {
    const fd = real();
    made.push(readlinkSync(`/proc/self/fd/${fd}`));
    return fd;
  }) as typeof addon.socket;
  try {
    await body();
  } finally {
    addon.socket = real;
  }
  const open = new Set<string>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      open.add(readlinkSync(`/proc/self/fd/${fd}`));
    } catch {
      // closed while listing (readdir's own fd)
    }
  }
  return made.filter((link) => open.has(link)).length;
}

test('listen() and connect() given a tcp:// URL go to TCP', async () => {
  const pending = listen('tcp://127.0.0.1:0' as const, { token: TOKEN });
  assert.ok(pending instanceof Promise, 'a URL: listen() resolves once bound');
  const listener = await pending;
  try {
    assert.ok(listener instanceof TcpListener);
    const [a, b] = await Promise.all([listener.accept({ timeout: 30_000 }), connect(listener.url, { token: TOKEN })]);
    assert.equal(b.remote?.tls, false);
    b.send('over TCP');
    assert.equal(await a.receive({ timeout: 30_000 }), 'over TCP');
    a.close();
    b.close();
  } finally {
    listener.close();
  }
});

test('a Listener is made by listen() only', () => {
  assert.throws(() => new Listener(Symbol('not the key') as never, 'x', '/nonexistent/x.sock', -1, {} as never, {}), (e: unknown) =>
    code('ERR_INVALID_ARG_VALUE')(e) && /use listen\(\) to create a Listener/.test((e as Error).message));
});

test('argument errors: the options listen() and connect() do not take say what to use instead; a bad timeout names the option given', async () => {
  assert.throws(() => listen('x', { timeout: 5 } as never), (e: unknown) =>
    code('ERR_INVALID_ARG_VALUE')(e) && /^listen: unknown option 'timeout': listen\(\) does not wait; pass it to listener\.accept\(\{ signal, timeout \}\)/.test((e as Error).message));
  assert.throws(() => listen('x', { signal: AbortSignal.abort() } as never), (e: unknown) =>
    code('ERR_INVALID_ARG_VALUE')(e) && /unknown option 'signal': listen\(\) does not wait/.test((e as Error).message));
  await assert.rejects(connect('x', { handshakeTimeoutMs: 5 } as never), (e: unknown) =>
    code('ERR_INVALID_ARG_VALUE')(e) && /^connect: unknown option 'handshakeTimeoutMs': connect\(\) takes timeout \(ms\) for the whole wait, handshake included;/.test((e as Error).message));
  await assert.rejects(connect('x', { timeout: -1 }), (e: unknown) => code('ERR_OUT_OF_RANGE')(e) && /^The value of "options\.timeout" is out of range/.test((e as Error).message));
  await assert.rejects(connect('x', { timeoutMs: -1 }), (e: unknown) => code('ERR_OUT_OF_RANGE')(e) && /^The value of "options\.timeoutMs" is out of range/.test((e as Error).message));
});

test('connect() with timeout 0: nobody there, a stale socket, a full backlog: each its error at once, with its cause; no socket left open', async () => {
  const dir = tempDir();
  const held: number[] = [];
  try {
    // A socket file whose listener is gone (bound, never listened, closed).
    const stale = addon.socket();
    addon.bind(stale, join(dir, 'stale.sock'));
    addon.close(stale);
    const left = await socketsLeftOpen(async () => {
      for (let i = 0; i < 3; i++) {
        await assert.rejects(connect('absent', { directory: dir, timeout: 0 }), (e: unknown) => code('ERR_NO_LISTENER')(e) && code('ENOENT')((e as Error).cause));
      }
      await assert.rejects(connect('stale', { directory: dir, timeout: 0 }), (e: unknown) =>
        code('ERR_NO_LISTENER')(e) && /is a stale socket left by a process that is gone$/.test((e as Error).message) && code('ECONNREFUSED')((e as Error).cause));
    });
    assert.equal(left, 0, 'every failed try closed its socket');
    // A full backlog: the wait's own error, saying it waited 0 ms.
    const full = addon.socket();
    held.push(full);
    addon.bind(full, join(dir, 'full.sock'));
    addon.listen(full, 0);
    for (let i = 0; i < 64; i++) {
      const c = addon.socket();
      held.push(c);
      try {
        addon.connect(c, join(dir, 'full.sock'));
      } catch {
        break;
      }
    }
    await assert.rejects(connect('full', { directory: dir, timeout: 0 }), (e: unknown) =>
      code('ERR_TIMEOUT')(e) && /^connect: the listener 'full' is too busy to accept a connection \(its backlog is full\), and none appeared within 0 ms/.test((e as Error).message));
  } finally {
    for (const fd of held) addon.close(fd);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('connect(): an error that is not the listener being busy is not retried', async () => {
  const dir = tempDir();
  try {
    // A directory that is a file: the system's error, at once (not a wait for a listener).
    writeFileSync(join(dir, 'file'), '');
    await assert.rejects(connect('x', { directory: join(dir, 'file'), timeout: 60_000 }),
      (e: unknown) => !(e instanceof IpcError) && code('ENOTDIR')(e) && (e as Error).message.startsWith(`connect: ${JSON.stringify(join(dir, 'file'))} is not a directory`));
    // A listening socket that goes away while the connection waits in its backlog: the peer is
    // gone, said at once, though the socket file is still there to try again.
    const raw = addon.socket();
    addon.bind(raw, join(dir, 'raw.sock'));
    addon.listen(raw, 4);
    const connecting = connect('raw', { directory: dir, timeout: 60_000 });
    // connect() reached the socket before it returned (its first step runs synchronously).
    addon.close(raw);
    await assert.rejects(connecting, code('ERR_PEER_GONE'));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('connect(): an abort during the handshake is an AbortError, and its socket is closed', async () => {
  const dir = tempDir();
  const raw = addon.socket();
  try {
    // Listens and never accepts: the connection waits in the backlog for a HELLO that never comes.
    addon.bind(raw, join(dir, 'silent.sock'));
    addon.listen(raw, 4);
    const left = await socketsLeftOpen(async () => {
      const ac = new AbortController();
      const connecting = connect('silent', { directory: dir, signal: ac.signal, timeout: 60_000 });
      ac.abort(new Error('no longer wanted'));
      await assert.rejects(connecting, (e: unknown) => (e as Error).name === 'AbortError' && code('ABORT_ERR')(e));
    });
    assert.equal(left, 0, 'the aborted connection\'s socket was closed');
  } finally {
    addon.close(raw);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('`using` closes the listener at the end of its block', () => {
  const dir = tempDir();
  let outer: Listener | undefined;
  try {
    {
      using l = listen('scoped', { directory: dir });
      outer = l;
      assert.equal(l.closed, false);
    }
    assert.equal(outer.closed, true);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** A connection to `path` whose first frame is a MESSAGE (before any HELLO): the listener refuses it as soon as it reads it. */
function junkConnection(path: string): () => void {
  const fd = addon.socket();
  addon.connect(fd, path);
  const s = new addon.Socket(fd, 1 << 17, () => {}, () => {});
  const junk = header(2, 0, 0, 0);
  s.send(junk, junk.byteLength, null, null);
  return () => s.close();
}

test('links waiting for accept() are taken in order, before a \'connection\' listener added meanwhile gets any', async () => {
  const dir = tempDir();
  const links: Link[] = [];
  const junk: Array<() => void> = [];
  try {
    using l = listen('order', { directory: dir, refusedIntervalMs: 0 });
    const refusals: IpcError[] = [];
    let wake: (() => void) | undefined;
    l.on('refused', (e) => {
      refusals.push(e);
      wake?.();
    });
    // A junk connection after each connect(), refused once read: the listener read that link's HELLO before.
    const settled = async (): Promise<void> => {
      const seen = refusals.length;
      const next = new Promise<void>((resolve) => (wake = resolve));
      junk.push(junkConnection(l.path));
      if (refusals.length === seen) await next;
      assert.equal(refusals[seen]!.code, 'ERR_FRAME_INVALID');
    };
    const first = await connect('order', { directory: dir });
    links.push(first);
    await settled();
    const events: Link[] = [];
    l.on('connection', (link) => events.push(link));
    const second = await connect('order', { directory: dir });
    links.push(second);
    await settled();
    assert.equal(events.length, 0, 'the second waits behind the first, not handed to the listener');
    const a = await l.accept();
    const b = await l.accept();
    links.push(a, b);
    first.send('first');
    second.send('second');
    assert.equal(await a.receive({ timeout: 30_000 }), 'first');
    assert.equal(await b.receive({ timeout: 30_000 }), 'second');
    // The queue empty, the next goes to the listener.
    const viaEvent = once(l, 'connection');
    links.push(await connect('order', { directory: dir }));
    await viaEvent;
    assert.equal(events.length, 1);
    links.push(events[0]!);
  } finally {
    for (const close of junk) close();
    for (const link of links) link.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('connect() sends its HELLO as the connection exists, without waiting for the listener\'s (PROTOCOL.md 2.2)', async () => {
  const dir = tempDir();
  const fd = addon.socket();
  const open: Array<{ close(): void }> = [];
  try {
    // A listener that accepts and only reads: the first frame it gets must be the connecting side's HELLO.
    addon.bind(fd, join(dir, 'quiet.sock'));
    addon.listen(fd, 4);
    const firstFrame = new Promise<number>((resolve, reject) => {
      const acceptor = new addon.Acceptor(fd, (conn) => {
        if (conn < 0) return reject(new Error(`accept failed (errno ${-conn})`));
        const s = new addon.Socket(conn, 1 << 17, () => resolve(new Uint8Array(s.recvBuffer)[5]!), (what) => {
          if (what !== 'writable') reject(new Error(`the connection ended (${what}) before any frame`));
        });
        open.push(s);
      });
      open.push(acceptor);
    });
    const connecting = connect('quiet', { directory: dir, timeout: 60_000 });
    assert.equal(await firstFrame, 1, 'a HELLO');
    for (const o of open.splice(0)) o.close();
    await assert.rejects(connecting, (e: unknown) => e instanceof IpcError);
  } finally {
    for (const o of open) o.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
