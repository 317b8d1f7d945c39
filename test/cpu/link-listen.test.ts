import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { chmodSync, existsSync, lstatSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { HostBuffer } from '../../src/host/index.js';
import { connect, defaultSocketDirectory, listen, spawn, type Link } from '../../src/link/index.js';
import { addon } from '../../src/native/addon.js';
import { argError } from '../helpers/arg-error.js';
import { waitUntil } from '../helpers/wait.js';

const CONNECT_CHILD = new URL('../fixtures/connect-child.js', import.meta.url);
const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;

const recv = (link: Link): Promise<unknown> => link.receive({ signal: AbortSignal.timeout(10_000) });

function tempDir(): string {
  return mkdtempSync(join(tmpdir(), 'cuda-ipc-listen-'));
}

test('listen/connect between two processes, through the private default directory', async () => {
  const runtime = tempDir();
  const saved = process.env.XDG_RUNTIME_DIR;
  process.env.XDG_RUNTIME_DIR = runtime;  // the child inherits it
  try {
    using listener = listen('two-procs');
    const dir = defaultSocketDirectory();
    assert.equal(listener.path, join(dir, 'two-procs.sock'));
    assert.equal(statSync(dir).mode & 0o777, 0o700);
    assert.equal(statSync(listener.path).mode & 0o777, 0o600);

    const { child, link } = await spawn(CONNECT_CHILD, ['two-procs']);
    try {
      assert.deepEqual(await recv(link), { connected: true });
      const conn: Link = await listener.accept();
      assert.equal(conn.peer.pid, child.pid);
      using buffer = HostBuffer.allocate(4096);
      buffer.fill(3);
      conn.send({ hello: 'over the named socket', buffer });
      const relayed = (await recv(link)) as { hello: string; buffer: HostBuffer };
      assert.equal(relayed.hello, 'over the named socket');
      assert.equal(relayed.buffer.bytes[4095], 3, 'the fd went listener -> child -> parent');
      relayed.buffer.close();
      link.send('back the other way');
      assert.equal(await recv(conn), 'back the other way');
      conn.close();
      assert.deepEqual(await recv(link), { connectionClosed: true });
    } finally {
      await link.end();
      await once(child, 'exit');
    }
  } finally {
    if (saved === undefined) delete process.env.XDG_RUNTIME_DIR;
    else process.env.XDG_RUNTIME_DIR = saved;
    rmSync(runtime, { recursive: true, force: true });
  }
});

test('connections arrive as events and through async iteration; close() ends both', async () => {
  const dir = tempDir();
  try {
    const listener = listen('events', { directory: dir });
    const viaEvent = new Promise<Link>((resolve) => listener.once('connection', resolve));
    const a = await connect('events', { directory: dir });
    const server = await viaEvent;
    a.send(1);
    assert.equal(await recv(server), 1);
    listener.removeAllListeners('connection');
    const taken: Link[] = [];
    const iterated = (async () => {
      for await (const l of listener) taken.push(l);
      return taken;
    })();
    const b = await connect('events', { directory: dir });
    await waitUntil(() => taken.length > 0, 'the iterator to take the connection');
    listener.close();
    assert.equal(existsSync(join(dir, 'events.sock')), false, 'close() removes the socket file');
    const got = await iterated;
    assert.equal(got.length, 1);
    await assert.rejects(listener.accept(), code('ERR_LINK_CLOSED'));
    for (const l of [a, b, server, ...got]) l.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a directory option that names a file: ENOTDIR from listen, naming the path (connect: listener-connect.test.ts)', () => {
  const dir = tempDir();
  try {
    const file = join(dir, 'not-a-dir');
    writeFileSync(file, 'x');
    assert.throws(() => listen('x', { directory: file }),
      (e: unknown) => code('ENOTDIR')(e) && (e as Error).message.startsWith(`listen: ${JSON.stringify(file)} is not a directory`));
    assert.equal(readFileSync(file, 'utf8'), 'x', 'the file untouched');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a stale socket file: connect says nobody listens, listen replaces it', async () => {
  const dir = tempDir();
  try {
    const path = join(dir, 'stale.sock');
    const fd = addon.socket();
    addon.bind(fd, path);
    addon.listen(fd, 1);
    addon.close(fd);  // the file stays, nobody answers
    assert.ok(existsSync(path));
    await assert.rejects(connect('stale', { directory: dir, timeout: 0 }), (e: unknown) => code('ERR_NO_LISTENER')(e) && /stale/.test((e as Error).message));
    // Waiting (the default) for one that never comes ends in ERR_TIMEOUT, naming why.
    await assert.rejects(connect('stale', { directory: dir, timeout: 60 }), (e: unknown) => code('ERR_TIMEOUT')(e) && /stale/.test((e as Error).message));
    using listener = listen('stale', { directory: dir });
    const link = await connect('stale', { directory: dir });
    const server = await listener.accept();
    link.send('fresh');
    assert.equal(await recv(server), 'fresh');
    link.close();
    server.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a live listener is not stolen, and its liveness probe is not reported as refused', async () => {
  const dir = tempDir();
  try {
    using first = listen('taken', { directory: dir });
    let refused = 0;
    first.on('refused', () => refused++);
    assert.throws(() => listen('taken', { directory: dir }), code('ERR_ADDRESS_IN_USE'));
    const link = await connect('taken', { directory: dir });
    const server = await first.accept();
    link.send('still mine');
    assert.equal(await recv(server), 'still mine');
    assert.equal(refused, 0);
    link.close();
    server.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the socket file appears with its final mode, nothing planted at the name is followed, close() removes only its own file', () => {
  const dir = tempDir();
  try {
    const victim = join(dir, 'victim');
    writeFileSync(victim, 'mine', { mode: 0o600 });
    symlinkSync(victim, join(dir, 'planted.sock'));
    assert.throws(() => listen('planted', { directory: dir, allowUids: [12345] }), (e: unknown) => code('ERR_ADDRESS_IN_USE')(e) && /symbolic link of uid \d+, not a socket this user left/.test((e as Error).message));
    assert.equal(statSync(victim).mode & 0o777, 0o600, 'the symlink was not followed');
    const l = listen('open', { directory: dir, allowUids: [12345] });
    assert.equal(lstatSync(l.path).mode & 0o777, 0o666);
    assert.deepEqual(readdirSync(dir).sort(), ['open.sock', 'planted.sock', 'victim'], 'no private folder left behind');
    // Someone else's file at the name by the time it closes: left alone.
    unlinkSync(l.path);
    writeFileSync(l.path, 'theirs');
    l.close();
    assert.equal(readFileSync(l.path, 'utf8'), 'theirs');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('timeout: 0 tries once, and a listener that is there gets the default time for its handshake', async () => {
  const dir = tempDir();
  const listener = listen('once', { directory: dir });
  const { child, link } = await spawn(new URL('../fixtures/connect-once-child.js', import.meta.url));
  try {
    const accepted = listener.accept({ timeout: 30_000 });
    link.send({ name: 'once', directory: dir });
    // This process, the listener, answers the handshake only after a stall: an allowance of what
    // is left of a 0 ms timeout (as there was) runs out meanwhile; the default one does not.
    const stallUntil = Date.now() + 300;
    while (Date.now() < stallUntil) { /* busy: the listener cannot answer */ }
    assert.deepEqual(await recv(link), { connected: true });
    const peer = await accepted;
    link.send('through the link');
    assert.equal(await peer.receive({ signal: AbortSignal.timeout(10_000) }), 'through the link');
    peer.close();
  } finally {
    link.close();
    if (child.exitCode === null) await once(child, 'exit');
    listener.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('bad names, missing listeners and unsafe directories give clear errors', async () => {
  for (const bad of ['', 'a/b', '../x', '.hidden', 'a b', 'x'.repeat(101), 'nul\0']) {
    assert.throws(() => listen(bad), argError('ERR_INVALID_ARG_VALUE'), JSON.stringify(bad));
    await assert.rejects(connect(bad), argError('ERR_INVALID_ARG_VALUE'));
  }
  assert.throws(() => listen('ok', { directory: '/tmp/' + 'd'.repeat(120) }), argError('ERR_INVALID_ARG_VALUE'));
  const dir = tempDir();
  try {
    await assert.rejects(connect('nobody-here', { directory: dir, timeout: 0 }), code('ERR_NO_LISTENER'));
    const saved = process.env.XDG_RUNTIME_DIR;
    process.env.XDG_RUNTIME_DIR = dir;
    try {
      const shared = defaultSocketDirectory();
      listen('probe').close();
      chmodSync(shared, 0o755);
      assert.throws(() => listen('probe'), code('ERR_SOCKET_DIR_UNSAFE'));
    } finally {
      if (saved === undefined) delete process.env.XDG_RUNTIME_DIR;
      else process.env.XDG_RUNTIME_DIR = saved;
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
