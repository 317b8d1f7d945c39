// The Unix listener's bounds on connections not yet handed out (maxPending, maxPendingPerUid),
// counted as links enter and leave its care: handed to accept(), to a 'connection' listener, to
// a waiting accept(), closed by their peer, or closed by close(). Issue 41: the mutation run
// (listener group) showed the accounting untested; every test here fails if a place is not given
// back, or if this process's own uid is held to the per-uid bound.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { IpcError } from '../../src/errors.js';
import { connect, listen, spawn, type Link } from '../../src/link/index.js';
import { addon } from '../../src/native/addon.js';
import { startLinkedChild } from '../../src/link/connect/spawn.js';
import { cannotRunAsNobody, lookupUser } from '../fixtures/users.js';

const code = (c: string) => (e: unknown) => e instanceof IpcError && e.code === c;

function tempDir(): string {
  return mkdtempSync(join(tmpdir(), 'cuda-ipc-pending-'));
}

test('maxPendingPerUid does not bind this process\'s own uid: maxPending alone does', async () => {
  const dir = tempDir();
  try {
    using l = listen('own', { directory: dir, maxPending: 3, maxPendingPerUid: 1 });
    const refused: IpcError[] = [];
    l.on('refused', (e) => refused.push(e));
    // Three of our own, none accepted yet: all get in.
    const links = [];
    for (let i = 0; i < 3; i++) links.push(await connect('own', { directory: dir }));
    // The fourth is past maxPending: refused, and still refused when its connect() gives up
    // (the error says so; its cause is the listener's refusal).
    await assert.rejects(connect('own', { directory: dir, timeout: 200 }), (e: unknown) =>
      code('ERR_LISTENER_BUSY')(e) && /^connect: .*3 connections are already waiting .*\(maxPending\).*; it stayed so for 200 ms \(the timeout option\)$/.test((e as Error).message) &&
      code('ERR_LISTENER_BUSY')((e as Error).cause));
    // timeout 0: one try, and the listener's own refusal at once (its handshake has the time to say so).
    await assert.rejects(connect('own', { directory: dir, timeout: 0 }), (e: unknown) =>
      code('ERR_LISTENER_BUSY')(e) && /3 connections are already waiting/.test((e as Error).message) && !/stayed so for/.test((e as Error).message));
    assert.ok(refused.length >= 1);
    assert.equal(refused[0]!.code, 'ERR_LIMIT_REACHED');
    assert.equal(refused[0]!.limit, 'maxPending');
    const accepted = [await l.accept(), await l.accept(), await l.accept()];
    for (const x of [...links, ...accepted]) x.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a place is given back when the link is accepted, handed to a waiting accept() or a listener, or its peer hangs up', async () => {
  const dir = tempDir();
  try {
    using l = listen('places', { directory: dir, maxPending: 1 });
    const opts = { directory: dir };
    const busy = { directory: dir, timeout: 200 };
    const done: Link[] = [];
    // accept() after it arrived.
    done.push(await connect('places', opts));
    await assert.rejects(connect('places', busy), code('ERR_LISTENER_BUSY'));
    done.push(await l.accept());
    // accept() waiting before it arrives.
    const waiting = l.accept();
    done.push(await connect('places', opts));
    done.push(await waiting);
    // A 'connection' listener.
    const viaEvent = once(l, 'connection');
    done.push(await connect('places', opts));
    done.push(((await viaEvent) as [Link])[0]);
    l.removeAllListeners('connection');
    // A peer that hangs up while its link waits for accept(): its place comes back (connect()
    // tries again while the listener is busy, until its timeout).
    const gone = await connect('places', opts);
    gone.close();
    const next = await connect('places', { directory: dir, timeout: 60_000 });
    const server = await l.accept();
    next.send('after the hang-up');
    assert.equal(await server.receive(), 'after the hang-up');
    for (const x of [...done, next, server]) x.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('close() closes the links in their handshake or not yet accepted, rejects accept(), and keeps those handed out', async () => {
  const dir = tempDir();
  try {
    const l = listen('closing', { directory: dir });
    const handedOut = await connect('closing', { directory: dir });
    const server = await l.accept();
    const unaccepted = await connect('closing', { directory: dir });
    const closedUnaccepted = once(unaccepted, 'close');
    let closes = 0;
    l.on('close', () => closes++);
    l.close();
    l.close(); // idempotent
    assert.equal(closes, 1);
    assert.equal(l.closed, true);
    await closedUnaccepted;
    assert.equal(unaccepted.closed, true, 'the connection nobody accepted was closed');
    await assert.rejects(l.accept(), (e: unknown) => code('ERR_LINK_CLOSED')(e) && /the listener 'closing' is closed/.test((e as Error).message));
    // ref() and unref() on a closed listener: nothing to do, and chainable.
    assert.equal(l.ref().unref(), l);
    handedOut.send('still open');
    assert.equal(await server.receive(), 'still open');
    handedOut.close();
    server.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

const CHILD = new URL('../fixtures/link-child.js', import.meta.url);
const HOLDER = new URL('../fixtures/pending-holder.js', import.meta.url);
const skip = cannotRunAsNobody(CHILD);
const nobody = lookupUser('nobody') ?? { uid: 65534, gid: 65534 };

test('another uid holds at most maxPendingPerUid places; the rest (and this uid) still get in', { skip }, async () => {
  // A directory 'nobody' can reach; the default one is private to this user.
  const dir = tempDir();
  chmodSync(dir, 0o755);
  try {
    using l = listen('per-uid', { directory: dir, allowUids: [nobody.uid], maxPending: 10, maxPendingPerUid: 2, handshakeTimeoutMs: 60_000 });
    const refused: Array<[IpcError, unknown]> = [];
    const firstRefusal = new Promise<void>((resolve) => l.on('refused', (e, report) => (refused.push([e, report]), resolve())));
    // The child (as nobody) opens connections that never send their HELLO, one after another,
    // and reports each one's outcome: 'held' once the next one was answered, or 'refused'.
    const { child, link } = await spawn(HOLDER, [join(dir, 'per-uid.sock'), '3'], { uid: nobody.uid, gid: nobody.gid, allowUids: [nobody.uid] });
    try {
      const report = (await link.receive()) as { refusedAt: number | null };
      await firstRefusal;
      assert.equal(report.refusedAt, 3, 'the third silent connection of uid nobody was refused');
      const [e, r] = refused[0]!;
      assert.equal(e.code, 'ERR_LIMIT_REACHED');
      assert.equal(e.limit, 'maxPendingPerUid');
      assert.match(e.message, new RegExp(`refused a connection from uid ${nobody.uid}: 2 connections of uid ${nobody.uid} are already waiting`));
      assert.deepEqual((r as { bySource: Record<string, number> }).bySource, { [`uid ${nobody.uid}`]: 1 });
      // This uid is not held to nobody's count.
      const mine = await connect('per-uid', { directory: dir });
      const server = await l.accept();
      mine.send('mine');
      assert.equal(await server.receive(), 'mine');
      mine.close();
      server.close();
      // Once nobody's connections hang up, its places come back.
      link.send('release');
      const again = (await link.receive()) as { refusedAt: number | null };
      assert.equal(again.refusedAt, null, 'two more silent connections of uid nobody were held');
      // One of them hangs up: one place comes back, not the uid's whole count.
      link.send('one');
      const one = (await link.receive()) as { next: number };
      assert.equal(one.next, 4, 'after taking the place given back, the next of uid nobody was refused (REFUSE)');
    } finally {
      await link.end();
      await once(child, 'exit');
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/**
 * Runs `body` against the EMFILE child (test/fixtures/listener-fd-child.ts) under `ulimit -n 200`,
 * listening as `name` in a fresh directory, once it filled its fd table; then ends the child and
 * removes the directory.
 */
async function withFdChild(name: string, mode: 'silent' | undefined, body: (dir: string, link: Link) => Promise<void>): Promise<void> {
  const dir = tempDir();
  const child = fileURLToPath(new URL('../fixtures/listener-fd-child.js', import.meta.url));
  const { child: proc, link } = await startLinkedChild('/bin/sh', ['-c', 'ulimit -n 200 && exec "$0" "$@"', process.execPath, child, dir, name, ...(mode ? [mode] : [])], { stdio: 'inherit' }, 'listener fd child');
  try {
    const full = (await link.receive({ timeout: 60_000 })) as { full: number };
    assert.ok(full.full > 50, `the child filled its fd table (${full.full} fds)`);
    await body(dir, link);
  } finally {
    link.close();
    if (proc.exitCode === null) proc.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
}

test('out of fds while accepting: \'error\' says ERR_FD_LIMIT (EMFILE), and the listener accepts once fds are back', { timeout: 120_000 }, async () => {
  await withFdChild('fd-child', undefined, async (dir, link) => {
    const connecting = connect('fd-child', { directory: dir, timeout: 60_000 });
    const reported = (await link.receive({ timeout: 60_000 })) as { error: { code: string; message: string } };
    assert.equal(reported.error.code, 'ERR_FD_LIMIT');
    assert.match(reported.error.message, /listener 'fd-child' cannot accept a connection: no file descriptor left \(EMFILE; see `ulimit -n`\)/);
    const conn = await connecting;
    assert.equal(await conn.receive({ timeout: 60_000 }), 'accepted');
    assert.deepEqual(await link.receive({ timeout: 60_000 }), { accepted: true, errors: 1 });
    conn.close();
  });
});

test('out of fds while accepting with no \'error\' listener: nothing is thrown, and the listener accepts once fds are back', { timeout: 120_000 }, async () => {
  await withFdChild('fd-silent', 'silent', async (dir, link) => {
    const connecting = connect('fd-silent', { directory: dir, timeout: 60_000 });
    link.send({ connecting: true });
    assert.deepEqual(await link.receive({ timeout: 60_000 }), { freed: true });
    const conn = await connecting;
    assert.equal(await conn.receive({ timeout: 60_000 }), 'accepted');
    assert.deepEqual(await link.receive({ timeout: 60_000 }), { accepted: true, errors: 0 });
    conn.close();
  });
});

test('connect(): a full backlog is waited on until the timeout (ERR_TIMEOUT saying so); an abort during a pause is an AbortError', async () => {
  const dir = tempDir();
  const held: number[] = [];
  try {
    // A socket that listens and never accepts, its backlog filled by raw connections.
    const path = join(dir, 'full.sock');
    const fd = addon.socket();
    held.push(fd);
    addon.bind(fd, path);
    addon.listen(fd, 0);
    for (let i = 0; i < 64; i++) {
      const c = addon.socket();
      held.push(c);
      try {
        addon.connect(c, path);
      } catch (e) {
        assert.equal((e as { code?: string }).code, 'EAGAIN');
        break;
      }
    }
    await assert.rejects(connect('full', { directory: dir, timeout: 100 }), (e: unknown) =>
      code('ERR_TIMEOUT')(e) && /the listener 'full' is too busy to accept a connection \(its backlog is full\), and none appeared within 100 ms/.test((e as Error).message) &&
      code('ERR_TIMEOUT')((e as Error).cause) && ((e as Error).cause as Error & { cause: { code: string } }).cause.code === 'EAGAIN');

    // Nobody listens: connect() pauses between tries; an abort then ends it.
    const ac = new AbortController();
    const waiting = connect('absent', { directory: dir, signal: ac.signal, timeout: 60_000 });
    ac.abort(new Error('no longer wanted'));
    await assert.rejects(waiting, (e: unknown) => (e as Error).name === 'AbortError' && (e as { code?: string }).code === 'ABORT_ERR');
    // Aborted before the call: rejected at once, same error.
    await assert.rejects(connect('absent', { directory: dir, signal: ac.signal }), (e: unknown) => (e as Error).name === 'AbortError');
    // Nobody there and no time to wait: ERR_NO_LISTENER, not a timeout.
    await assert.rejects(connect('absent', { directory: dir, timeout: 0 }), (e: unknown) => code('ERR_NO_LISTENER')(e) && /no listener named 'absent': .* does not exist; start the listening process first$/.test((e as Error).message) && ((e as Error).cause as { code?: string }).code === 'ENOENT');
    await assert.rejects(connect('absent', { directory: dir, timeout: 30 }), (e: unknown) => code('ERR_TIMEOUT')(e) && /^connect: no listener named 'absent': .* does not exist, and none appeared within 30 ms \(the timeout option\)$/.test((e as Error).message) && code('ERR_NO_LISTENER')((e as Error).cause));
  } finally {
    for (const fd of held) addon.close(fd);
    rmSync(dir, { recursive: true, force: true });
  }
});
