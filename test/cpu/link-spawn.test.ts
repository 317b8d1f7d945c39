import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { HostBuffer } from '../../src/host/index.js';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { IpcError } from '../../src/errors.js';
import { connect, listen, parentLink, spawn, spawnPython, type Link } from '../../src/link/index.js';
import { noPython, PYTHON } from '../helpers/python.js';
import { within } from '../helpers/wait.js';

const CHILD = new URL('../fixtures/link-child.js', import.meta.url);
const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  return link.receive({ signal: AbortSignal.timeout(10_000) });
}

test('a host buffer round trip through spawn: the child sees our bytes, we see its writes', async () => {
  const { child, link } = await spawn(CHILD);
  try {
    assert.equal(link.peer.pid, child.pid);
    assert.equal(link.peer.uid, process.getuid!());
    const who = await ask(link, { op: 'whoami' });
    assert.equal(who.pid, child.pid);
    assert.equal(who.peer.pid, process.pid, 'the child sees this process as its peer');

    using buffer = HostBuffer.allocate(1 << 20);
    buffer.fill(0x5a);
    assert.deepEqual(await ask(link, { op: 'verify-and-fill', buffer, expect: 0x5a, fill: 0xa5 }), { ok: true });
    assert.ok(buffer.bytes.every((b) => b === 0xa5), 'the child wrote into our memory');
    assert.deepEqual(await ask(link, { op: 'verify-and-fill', buffer, expect: 0x5a, fill: 0 }), { ok: false });
  } finally {
    await link.end();
    await once(child, 'exit');
  }
});

test('memfds passed both ways map the same memory, views included', async () => {
  const { child, link } = await spawn(CHILD);
  try {
    const got = await ask(link, { op: 'allocate', bytes: 8192, fill: 5 });
    const fromChild = got.buffer as HostBuffer;
    assert.ok(fromChild instanceof HostBuffer);
    assert.equal(fromChild.byteLength, 8192);
    assert.ok(fromChild.bytes.every((b) => b === 5));

    // Hand a view of it back: the child maps the same pages again.
    const view = fromChild.view(4096, 16);
    assert.deepEqual(await ask(link, { op: 'hold', buffer: view }), { held: 1 });
    view.close();
    fromChild.bytes[4096 + 3] = 42;
    assert.deepEqual(await ask(link, { op: 'peek', index: 0, offset: 3 }), { value: 42 });
    await ask(link, { op: 'poke', index: 0, offset: 15, value: 77 });
    assert.equal(fromChild.bytes[4096 + 15], 77);
    await ask(link, { op: 'release' });
    fromChild.close();
  } finally {
    await link.end();
    await once(child, 'exit');
  }
});

test('a peer killed with SIGKILL is seen as ERR_PEER_GONE', async (t) => {
  const delays: number[] = [];
  for (let run = 0; run < 3; run++) {
    const { child, link } = await spawn(CHILD);
    const pending = link.receive();
    const closed = new Promise<unknown>((resolve) => link.once('close', resolve));
    const t0 = performance.now();
    child.kill('SIGKILL');
    const reason = await closed;
    delays.push(performance.now() - t0);
    assert.ok(code('ERR_PEER_GONE')(reason));
    await assert.rejects(pending, code('ERR_PEER_GONE'));
    assert.throws(() => link.send('hello?'), code('ERR_PEER_GONE'));
    link.close();
  }
  delays.sort((a, b) => a - b);
  t.diagnostic(`seen after ${delays.map((d) => d.toFixed(1)).join(', ')} ms`);
});

test('parentLink() outside a spawned child throws ERR_NOT_SPAWNED', () => {
  assert.throws(() => parentLink(), code('ERR_NOT_SPAWNED'));
});

/** Resolves once no process has this pid (the one an error message names). */
async function gone(message: string): Promise<void> {
  const pid = Number(/\(pid (\d+)\)/.exec(message)?.[1]);
  assert.ok(pid > 0, `no pid in: ${message}`);
  for (;;) {
    try {
      process.kill(pid, 0);
    } catch {
      return;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}

test('spawn and spawnPython take { timeout } as every wait does: ERR_TIMEOUT naming the option, the child killed', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-spawn-timeout-'));
  try {
    const idlePy = join(dir, 'idle.py');
    writeFileSync(idlePy, 'import time\ntime.sleep(60)\n');
    const starts: Array<[string, () => Promise<unknown>]> = [
      ['spawn', () => spawn(new URL('../fixtures/idle-child.js', import.meta.url), [], { timeout: 300 })],
      ...(noPython ? [] : [['spawnPython', () => spawnPython(idlePy, [], { timeout: 300, python: PYTHON })] as [string, () => Promise<unknown>]]),
    ];
    for (const [what, start] of starts) {
      let message = '';
      await assert.rejects(start(), (e: unknown) => {
        assert.ok(e instanceof IpcError, `${what}: ${String(e)}`);
        assert.equal(e.code, 'ERR_TIMEOUT', what);
        assert.match(e.message, /did not call parentLink\(\) .*within 300 ms \(the timeout option\); it was killed/, what);
        message = e.message;
        return true;
      });
      await gone(message);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('spawn, spawnPython, connect, listen and parentLink refuse options they do not know, saying what was meant', async () => {
  const unknown = (pattern: RegExp) => (e: unknown) => {
    assert.ok(e instanceof TypeError, String(e));
    assert.equal((e as { code?: string }).code, 'ERR_INVALID_ARG_VALUE');
    assert.match(e.message, pattern);
    return true;
  };
  const idle = new URL('../fixtures/idle-child.js', import.meta.url);
  await assert.rejects(spawn(idle, [], { timout: 300 } as never), unknown(/^spawn: unknown option 'timout' \(did you mean 'timeout'\?\); the options are .*timeout/));
  await assert.rejects(spawnPython('pkg.worker', [], { execArgv: ['-X'] } as never), unknown(/spawnPython: unknown option 'execArgv': arguments for the interpreter go in pythonArgs/));
  await assert.rejects(connect('x', { handshakeTimeoutMs: 5 } as never), unknown(/connect: unknown option 'handshakeTimeoutMs': connect\(\) takes timeout/));
  assert.throws(() => listen('x', { timeout: 5 } as never), unknown(/listen: unknown option 'timeout': listen\(\) does not wait; pass it to listener.accept/));
  assert.throws(() => parentLink({ timeout: 5 } as never), unknown(/parentLink: unknown option 'timeout': parentLink\(\) does not wait/));
  // An option set to undefined is no option (objects built with spreads carry such keys).
  assert.throws(() => parentLink({ timeout: undefined } as never), code('ERR_NOT_SPAWNED'));
});

test('spawn rejects when the child dies or never connects, and kills it', async () => {
  // A missing module is refused before anything starts (spawn-args.test.ts); a child that dies
  // before parentLink(): node refusing a flag.
  await assert.rejects(spawn(new URL('../fixtures/no-such-module.js', import.meta.url), [], { stdio: 'ignore' }), code('ERR_INVALID_ARG_VALUE'));
  await assert.rejects(spawn(new URL('../fixtures/idle-child.js', import.meta.url), [], { stdio: 'ignore', execArgv: ['--no-such-flag-for-this-test'] }), code('ERR_PEER_GONE'));
  // The 300 ms bound is the subject: the rejection is ERR_TIMEOUT and the child it names is gone
  // (how long that took is not checked; a hang fails the test's own deadline).
  let message = '';
  await assert.rejects(spawn(new URL('../fixtures/idle-child.js', import.meta.url), [], { handshakeTimeoutMs: 300 }), (e: unknown) => {
    assert.equal((e as { code?: string }).code, 'ERR_TIMEOUT', String(e));
    message = (e as Error).message;
    return true;
  });
  await within(gone(message), `the child named in "${message}" to be gone`);
});
