// IPC memory pools over links on a real GPU.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, openSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { noGpu } from '../helpers/gpu.js';
import { u32Pattern } from '../helpers/child.js';
import { Device } from '../../src/cuda/device.js';
import { IpcPool } from '../../src/ipc/pool.js';
import { spawn, type Link } from '../../src/link/index.js';
import { IpcError } from '../../src/errors.js';

const fixture = new URL('../fixtures/pool-child.js', import.meta.url);
const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));

async function withChild<T>(fn: (link: Link) => Promise<T>): Promise<T> {
  const { child, link } = await spawn(fixture, [], { stdio: 'inherit' });
  try {
    return await fn(link);
  } finally {
    link.send({ op: 'exit' });
    await new Promise((r) => (child.exitCode !== null ? r(null) : child.once('exit', r)));
  }
}

async function ask(link: Link, msg: unknown): Promise<any> {
  link.send(msg);
  return link.receive();
}

describe('IPC pools', { skip: noGpu }, () => {
  for (const elements of [1, 65_536, 64 * 1024 * 1024]) {
    test(`cuda-ipc roundtrip --elements ${elements}`, () => {
      const r = spawnSync(process.execPath, [cli, 'roundtrip', '--elements', String(elements)], { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stdout + r.stderr);
      assert.match(r.stdout, /compute capability \d+\.\d+/);
      assert.match(r.stdout, /isMapped true/);
      assert.match(r.stdout, new RegExp(`${elements * 4} bytes`));
      assert.match(r.stdout, /child \d+: received 100(, 101)?/);
      assert.match(r.stdout, /IPC round-trip: OK$/m);
    });
  }

  test('a buffer of a closed pool still travels while it lives; the pool goes with its last buffer', async () => {
    const pool = Device.get(0).createIpcPool();
    const b = pool.allocate(4096);
    b.write(u32Pattern(7, 1024));
    pool.close();  // closed, not destroyed: b still uses it
    assert.throws(() => pool.allocate(16), (e: unknown) => e instanceof IpcError && e.code === 'ERR_CLOSED');
    try {
      await withChild(async (link) => {
        const r = await ask(link, { op: 'check', buffer: b, seed: 7, write: 8 });
        assert.deepEqual(r, { ok: true, bad: -1, isMapped: true, byteLength: 4096, kind: 'pool-import' });
      });
    } finally {
      b.close();
    }
    assert.throws(() => pool.exportFd(), (e: unknown) => e instanceof IpcError && e.code === 'ERR_CLOSED', 'destroyed with its last buffer');
  });

  test('3 pools x 7 buffers to two children, patterns both ways', async () => {
    const device = Device.get(0);
    const pools = [0, 1, 2].map(() => device.createIpcPool());
    const buffers = pools.flatMap((p, i) => Array.from({ length: 7 }, (_, j) => {
      const b = p.allocate((j + 1) * 4096 + i * 4);
      b.write(u32Pattern(i * 100 + j, b.byteLength / 4));
      return b;
    }));
    try {
      await Promise.all([0, 1].map((c) => withChild(async (link) => {
        for (let k = 0; k < buffers.length; k++) {
          const b = buffers[k]!;
          if (k % 2 !== c) continue;
          const seed = Math.floor(k / 7) * 100 + (k % 7);
          const r = await ask(link, { op: 'check', buffer: b, seed, write: seed + 5000 });
          assert.deepEqual(r, { ok: true, bad: -1, isMapped: true, byteLength: b.byteLength, kind: 'pool-import' }, `buffer ${k}`);
          const back = new Uint32Array(b.byteLength / 4);
          b.read(back);
          assert.deepEqual(back, u32Pattern(seed + 5000, back.length));
        }
      })));
    } finally {
      for (const b of buffers) b.close();
      for (const p of pools) p.close();
    }
  });

  test('a buffer re-sent A to B to C', async () => {
    using pool = Device.get(0).createIpcPool();
    using b = pool.allocate(1 << 20);
    b.write(u32Pattern(77, 1 << 18));
    const r = await withChild((link) => ask(link, { op: 'relay', buffer: b, seed: 77, write: 88 }));
    assert.equal(r.ok, true, JSON.stringify(r));
    assert.equal(r.isMapped, true);
    const back = new Uint32Array(1 << 18);
    b.read(back);
    assert.deepEqual(back, u32Pattern(88, 1 << 18));
  });

  test('a buffer sent twice is imported once: closing one copy leaves the other mapped', async () => {
    using pool = Device.get(0).createIpcPool();
    using b = pool.allocate(4096);
    b.write(u32Pattern(42, 1024));
    const r = await withChild((link) => ask(link, { op: 'twice', a: b, b }));
    assert.deepEqual(r, { ok: true, samePointer: true, readAfterClose: 42 });
  });

  test('views of a pool buffer travel with their offset', async () => {
    using pool = Device.get(0).createIpcPool();
    using b = pool.allocate(64 * 1024);
    using v = b.view(8192, 4096);
    v.write(u32Pattern(9, 1024));
    const r = await withChild((link) => ask(link, { op: 'check', buffer: v, seed: 9, write: 10 }));
    assert.equal(r.ok, true);
    assert.equal(r.byteLength, 4096);
    const back = new Uint32Array(1024);
    b.read(back, 8192);
    assert.deepEqual(back, u32Pattern(10, 1024));
  });

  test('an imported pool refuses to allocate; garbage export data fails cleanly', async () => {
    using pool = Device.get(0).createIpcPool();
    const r = await withChild((link) => ask(link, { op: 'imported-pool', pool }));
    assert.deepEqual(r, { ok: true, imported: true, allocate: 'ERR_IMPORTED_POOL', garbage: 'ERR_HANDLE_STALE', shortData: 'ERR_INVALID_ARG_VALUE' });
  });

  test('a bad fd is refused and closed', () => {
    const fd = openSync('/dev/null', 'r');
    assert.throws(() => IpcPool.importFromFd(fd, Device.get(0), '00'.repeat(16), 0), (e: unknown) => e instanceof TypeError && (e as { code?: string }).code === 'ERR_INVALID_ARG_VALUE' && /not a CUDA memory pool handle \(it is character device 1:3\)/.test(e.message));
    assert.equal(existsSync(`/proc/self/fd/${fd}`), false, 'the fd was closed');
  });
});
