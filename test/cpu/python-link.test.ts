// The Python companion on links, CPU only: a Python child started with spawnPython, host buffers
// both ways with their values checked, connect() to a Node listen(), a Python peer killed with
// SIGKILL, and the Python package's own unit tests. Runs with the machine's python3 (>= 3.10,
// standard library only); skips with the reason where there is none.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { spawn as spawnProcess, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { HostBuffer } from '../../src/host/index.js';
import { listen, spawnPython, type Link } from '../../src/link/index.js';
import { PYTHON, PYTHON_HOT_PATHS, PYTHON_PACKAGE_DIR, noPython, pythonFixture } from '../helpers/python.js';

const CHILD = pythonFixture('link_child.py');
const skip = noPython;

/** The reason the link closes with ('close' event; events.once would reject on 'error'). */
function closeReason(link: Link): Promise<{ code?: string } | undefined> {
  return new Promise((resolve) => link.once('close', (reason) => resolve(reason)));
}

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  return link.receive({ signal: AbortSignal.timeout(10_000) });
}

/** `h.released()`, failing instead of hanging when it does not come within `ms`. */
function releasedSoon(h: HostBuffer, ms = 3000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`not released within ${ms} ms (${h.leases} leases left)`)), ms);
  });
  return Promise.race([h.released(), late]).finally(() => clearTimeout(timer));
}

test('a Python child on a link: the same handshake, credentials and message types as Node', { skip }, async () => {
  const { child, link } = await spawnPython(CHILD);
  try {
    assert.equal(link.peer.pid, child.pid);
    const who = await ask(link, { op: 'whoami' });
    assert.equal(who.pid, child.pid);
    assert.deepEqual(who.peer, { pid: process.pid, uid: process.getuid!(), gid: process.getgid!() });

    const value = {
      text: 'héllo ✓', n: 3.5, neg: -7, big: 123456789012345678901234567890n, small: 42n, flag: true, none: null,
      list: [1, 'two', [3, { four: 4 }]], f32: new Float32Array([1.5, -2.25]), i64: new BigInt64Array([-5n, 1n << 62n]),
      u8: new Uint8Array([0, 255, 7]), u16: new Uint16Array([65535, 1]), f64: new Float64Array([Math.PI]),
    };
    const { value: back } = await ask(link, { op: 'echo', value });
    assert.deepEqual(back.f32, value.f32);
    assert.deepEqual(back.i64, value.i64);
    assert.deepEqual(back.f64, value.f64);
    assert.deepEqual(back.u16, value.u16);
    assert.deepEqual(back.u8, value.u8);
    assert.equal(back.big, value.big, 'a bigint beyond 2^53 comes back as a bigint');
    assert.equal(back.small, 42, 'a small bigint becomes a Python int and comes back as a JSON number');
    assert.deepEqual({ ...back, f32: 0, i64: 0, f64: 0, u16: 0, u8: 0, big: 0, small: 0 },
      { ...value, f32: 0, i64: 0, f64: 0, u16: 0, u8: 0, big: 0, small: 0 });
    const { types } = await ask(link, { op: 'types', value });
    assert.deepEqual(types, {
      text: 'str', n: 'float', neg: 'int', big: 'int', small: 'int', flag: 'bool', none: 'NoneType', list: 'list',
      f32: 'array', i64: 'array', u8: 'bytes', u16: 'array', f64: 'array',
    });
    // A Uint8Array alone is a raw frame: it comes back as the same bytes.
    const raw = randomBytes(1000);
    assert.deepEqual(Buffer.from((await ask(link, { op: 'echo', value: raw })).value), raw);
  } finally {
    await link.end();
    await once(child, 'exit');
  }
});

test('messages over a frame (128 KiB) cross whole both ways between Node and Python, records and fds included', { skip }, async () => {
  const { child, link } = await spawnPython(CHILD);
  const h = HostBuffer.allocate(4096);
  try {
    // The metadata of 10,000 tensors: far over a frame, in one message each way.
    const table = Object.fromEntries(Array.from({ length: 10_000 }, (_, i) => [`layer.${i}.weight`, { shape: [i % 7 + 1, 64], offset: i * 4096 }]));
    const { value: back } = await ask(link, { op: 'echo', value: table });
    assert.deepEqual(back, table);
    const raw = randomBytes(3 * 2 ** 20 + 5);
    assert.deepEqual(Buffer.from((await ask(link, { op: 'echo', value: raw })).value), raw);
    h.fill(7);
    const { ok } = await ask(link, { op: 'verify-and-fill', buffer: h, expect: 7, fill: 9, padding: 'p'.repeat(300_000) });
    assert.equal(ok, true, 'the host buffer record arrived with its fd beside the payload memfd');
    assert.equal(h.read(0, 1)[0], 9);
  } finally {
    await link.end();
    await once(child, 'exit');
    h.close();
  }
});

test('host buffers both ways: Python reads and writes ours, we read and write its, leases end', { skip }, async () => {
  const { child, link } = await spawnPython(CHILD);
  const exited = once(child, 'exit');
  try {
    // Ours to Python: it checks every byte, fills, closes; the lease then ends.
    const mine = HostBuffer.allocate(1 << 20);
    mine.fill(0x5a);
    assert.deepEqual(await ask(link, { op: 'verify-and-fill', buffer: mine, expect: 0x5a, fill: 0xa5 }), { ok: true });
    assert.ok(mine.bytes.every((b) => b === 0xa5), 'Python wrote into our memory');
    mine.close();
    await releasedSoon(mine);

    // Typed values through a view of ours.
    const floats = HostBuffer.allocate(4096 * 4);
    const f = new Float32Array(floats.bytes.buffer, floats.bytes.byteOffset, 4096);
    for (let i = 0; i < f.length; i++) f[i] = i * 0.5;
    const view = floats.view(4 * 100, 4 * 1000);
    const { sum } = await ask(link, { op: 'float32-double', buffer: view });
    assert.equal(sum, Array.from({ length: 1000 }, (_, i) => (i + 100) * 0.5).reduce((a, b) => a + b, 0));
    for (let i = 0; i < f.length; i++) assert.equal(f[i], i >= 100 && i < 1100 ? i : i * 0.5, `element ${i}`);
    view.close();
    floats.close();
    await releasedSoon(floats);

    // Python's to us: we see its fill, write ours, it sees ours; closing ours releases its lease.
    const { buffer } = await ask(link, { op: 'produce', bytes: 65536, fill: 9 });
    assert.ok(buffer instanceof HostBuffer);
    assert.equal(buffer.byteLength, 65536);
    assert.ok(buffer.bytes.every((b: number) => b === 9));
    buffer.fill(200);
    assert.deepEqual(await ask(link, { op: 'check', index: 0, expect: 200 }), { ok: true });
    let leases = await ask(link, { op: 'leases' });
    assert.deepEqual(leases, { count: 1, bytes: 65536, received: 0 });
    buffer.close();
    // Our RELEASE goes out on a microtask: asked again (in order behind it) until Python saw it.
    for (const until = Date.now() + 30_000; (leases = await ask(link, { op: 'leases' })).count !== 0 && Date.now() < until;);
    assert.deepEqual(leases, { count: 0, bytes: 0, received: 0 }, 'our close reached Python as a RELEASE');

    // A view from Python arrives with its offset.
    const { buffer: pv } = await ask(link, { op: 'produce-view', bytes: 8192, offset: 1000, length: 300 });
    assert.equal(pv.byteLength, 300);
    assert.deepEqual(Array.from(pv.bytes.subarray(0, 4)), [1000 & 255, 1001 & 255, 1002 & 255, 1003 & 255]);
    pv.close();

    // Held buffers come back when Python closes them.
    const held = [1, 2, 3].map((i) => { const h = HostBuffer.allocate(4096 * i); h.fill(i); return h; });
    for (const h of held) await ask(link, { op: 'take', buffer: h });
    for (const h of held) h.close();
    assert.equal(link.leases.count, 3);
    assert.deepEqual(await ask(link, { op: 'drop' }), { dropped: 3 });
    await Promise.all(held.map((h) => releasedSoon(h)));
    assert.equal(link.leases.count, 0);
  } finally {
    await link.end();
    await exited;
  }
  assert.equal(child.exitCode, 0, 'the child ends cleanly when we close the link');
});

test('a Python process connects to a Node listen() by name', { skip }, async () => {
  const name = `py-connect-${process.pid}-${randomBytes(3).toString('hex')}`;
  using listener = listen(name);
  const p = spawnProcess(PYTHON, [pythonFixture('connect_child.py'), name, '8192'], {
    stdio: ['ignore', 'inherit', 'inherit'], env: { ...process.env, PYTHONPATH: PYTHON_PACKAGE_DIR },
  });
  const exited = once(p, 'exit');
  const link = await Promise.race([
    listener.accept(),
    exited.then(([code]) => { throw new Error(`the Python process exited (${code}) before connecting`); }),
  ]);
  try {
    assert.equal(link.peer.pid, p.pid);
    const hello = await link.receive({ signal: AbortSignal.timeout(10_000) }) as { hello: string; pid: number; peerPid: number; buffer: HostBuffer };
    assert.equal(hello.hello, 'from python');
    assert.equal(hello.pid, p.pid);
    assert.equal(hello.peerPid, process.pid, 'Python sees the listener as its peer');
    assert.ok(hello.buffer.bytes.every((b) => b === 7));
    hello.buffer.fill(42);
    assert.deepEqual(await ask(link, { fill: 42 }), { ok: true });
    hello.buffer.close();
  } finally {
    await link.end();
    await exited;
  }
  assert.equal(p.exitCode, 0);
});

test('a Python peer killed with SIGKILL: ERR_PEER_GONE, and every lease it held ends', { skip }, async () => {
  const { child, link } = await spawnPython(CHILD);
  const exited = once(child, 'exit');
  const buffers = [4096, 65536, 1 << 20].map((n, i) => { const h = HostBuffer.allocate(n); h.fill(i + 1); return h; });
  for (const h of buffers) await ask(link, { op: 'take', buffer: h });
  for (const h of buffers) h.close();  // only the leases keep them mapped now
  assert.equal(link.leases.count, 3);
  const closed = closeReason(link);
  child.kill('SIGKILL');
  assert.equal((await closed)?.code, 'ERR_PEER_GONE');
  await assert.rejects(link.receive(), (e: { code?: string }) => e.code === 'ERR_PEER_GONE');
  assert.throws(() => link.send({ op: 'whoami' }), (e: { code?: string }) => e.code === 'ERR_PEER_GONE');
  await Promise.all(buffers.map((h) => releasedSoon(h)));
  assert.equal(link.leases.count, 0);
  await exited;
});

test('a Python child that exits without closing its link shows as ERR_PEER_GONE', { skip }, async () => {
  const { child, link } = await spawnPython(CHILD);
  const closed = closeReason(link);
  link.send({ op: 'exit', code: 3 });
  assert.equal((await closed)?.code, 'ERR_PEER_GONE');
  if (child.exitCode === null) await once(child, 'exit');
  assert.equal(child.exitCode, 3);
});

test('spawnPython reports a child that fails before parent_link()', { skip }, async () => {
  await assert.rejects(spawnPython('cuda_ipc_no_such_module_here', [], { stdio: 'ignore' }),
    (e: { code?: string }) => e.code === 'ERR_PEER_GONE');
  await assert.rejects(spawnPython('not a module!'), (e: { code?: string }) => e.code === 'ERR_INVALID_ARG_VALUE' && e instanceof TypeError);
  await assert.rejects(spawnPython(CHILD, [], { python: '/nonexistent/python3', stdio: 'ignore' }),
    (e: { code?: string; message: string }) => e.code === 'ERR_PEER_GONE' && e.message.includes('/nonexistent/python3'));
});

for (const path of PYTHON_HOT_PATHS) test(`the Python package's own unit tests pass (python3 -m unittest; hot path: ${path.name})`, { skip: path.skip }, () => {
  const r = spawnSync(PYTHON, ['-m', 'unittest', 'discover', '-s', 'tests', '-t', '.'], {
    cwd: PYTHON_PACKAGE_DIR, encoding: 'utf8', env: { ...process.env, PYTHONPATH: PYTHON_PACKAGE_DIR, ...path.env }, timeout: 120_000,
  });
  assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
});
