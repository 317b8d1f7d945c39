// What makes handing over a fresh pool buffer cheap, on a real GPU: export data prepared by the
// addon's worker thread after the allocation (src/ipc/prepared-exports.ts), and released blocks
// kept with their export data for the next allocation of the same size (src/ipc/block-stash.ts).
// Each buffer sent is checked by the child (pool-child.ts 'check': it reads our pattern through
// its import), so export data that belonged to another allocation would fail the check.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { noGpu } from '../helpers/gpu.js';
import { u32Pattern } from '../helpers/child.js';
import { Device } from '../../src/cuda/device.js';
import { Stream } from '../../src/cuda/stream.js';
import type { DeviceBuffer } from '../../src/cuda/buffer.js';
import { poolExportStats, type IpcPool } from '../../src/ipc/pool.js';
import { spawn, type Link } from '../../src/link/index.js';

const fixture = new URL('../fixtures/pool-child.js', import.meta.url);
const MiB = 1 << 20;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function withChild<T>(fn: (link: Link) => Promise<T>): Promise<T> {
  const { child, link } = await spawn(fixture, [], { stdio: 'inherit' });
  try {
    return await fn(link);
  } finally {
    link.send({ op: 'exit' });
    await new Promise((r) => (child.exitCode !== null ? r(null) : child.once('exit', r)));
  }
}

/** Fills `b` with pattern `seed`, hands it to the child, which checks it; closes our buffer and waits until the child let go. */
async function handOver(link: Link, b: DeviceBuffer, seed: number): Promise<void> {
  b.write(u32Pattern(seed, b.byteLength / 4));
  link.send({ op: 'check', buffer: b, seed });
  const r = (await link.receive()) as { ok: boolean; bad: number };
  assert.equal(r.ok, true, `the child read pattern ${seed} (first bad word ${r.bad})`);
  b.close();
  await b.released();
}

const owner = (b: DeviceBuffer) => b.memory.owner as unknown as { exportSlot: number; exportData?: Uint8Array; base: bigint };

describe('fresh pool buffers: prepared exports and recycled blocks', { skip: noGpu }, () => {
  test('export data made after the allocation is used by the send; the released block goes to the stash and comes back with it', async () => {
    const device = Device.get(0);
    using pool = device.createIpcPool();
    await withChild(async (link) => {
      const a = pool.allocate(MiB);
      const base = owner(a).base;
      assert.ok(owner(a).exportSlot >= 0, 'an export was requested at allocation');
      await sleep(20);  // the worker thread has made it by now
      const before = poolExportStats();
      await handOver(link, a, 100);
      const after = poolExportStats();
      assert.deepEqual([after.prepared - before.prepared, after.inline - before.inline], [1, 0], 'the send used the prepared data');
      assert.deepEqual(pool.recycled, { blocks: 1, bytes: MiB });
      assert.equal(pool.liveBuffers, 0);

      const b = pool.allocate(MiB);
      assert.equal(owner(b).base, base, 'the same allocation came back');
      assert.equal(owner(b).exportSlot, -1, 'no new export was requested: it has its data');
      assert.deepEqual(pool.recycled, { blocks: 0, bytes: 0 });
      await handOver(link, b, 200);  // the child imports the same export data again, after it let go
      const last = poolExportStats();
      assert.deepEqual([last.kept - after.kept, last.inline - after.inline, last.prepared - after.prepared], [1, 0, 0]);
    });
  });

  test('a block freed for good never lends its export data to the allocation that reuses its address', async (t) => {
    const device = Device.get(0);
    using pool = device.createIpcPool({ recycleBlocks: 0 });
    await withChild(async (link) => {
      let sameAddress = 0;
      let sameData = 0;
      for (let i = 0; i < 50; i++) {
        const a = pool.allocate(MiB);
        const aOwner = owner(a);  // (a closed buffer no longer hands out its memory)
        const aBase = aOwner.base;
        if (i % 2) await sleep(2);  // sometimes prepared by the send, sometimes not
        await handOver(link, a, 1000 + i);
        const aData = aOwner.exportData!;
        assert.deepEqual(pool.recycled, { blocks: 0, bytes: 0 });
        const b = pool.allocate(MiB);
        const bOwner = owner(b);
        if (bOwner.base === aBase) sameAddress++;
        await handOver(link, b, 5000 + i);
        if (Buffer.compare(bOwner.exportData!, aData) === 0) sameData++;
      }
      t.diagnostic(`address reused ${sameAddress}/50 times; identical export data ${sameData}/50 times`);
    });
  });

  test('allocations closed at once, while their exports are being prepared, release cleanly and leave nothing behind', async () => {
    const device = Device.get(0);
    for (const recycleBlocks of [0, 8]) {
      using pool = device.createIpcPool({ recycleBlocks });
      const sizes = [4096, 64 * 1024, MiB, 3 * MiB];
      for (let i = 0; i < 3000; i++) {
        const b = pool.allocate(sizes[i % sizes.length]!);
        if (i % 7 === 3) await new Promise((r) => setImmediate(r));  // sometimes mid-export
        b.close();
      }
      assert.equal(pool.liveBuffers, 0);
      await withChild(async (link) => {
        for (let i = 0; i < 40; i++) await handOver(link, pool.allocate(sizes[i % sizes.length]!), 9000 + i);
      });
      pool.trimTo(0);
      assert.deepEqual(pool.recycled, { blocks: 0, bytes: 0 }, 'trimTo frees the stash');
    }
  });

  test('a forced close frees the block instead of keeping it; allocations on another stream leave the stash alone', async () => {
    const device = Device.get(0);
    using pool = device.createIpcPool();
    using stream = Stream.create(device);
    await withChild(async (link) => {
      const a = pool.allocate(MiB);
      a.write(u32Pattern(1, 1024));
      link.send({ op: 'hold', buffers: [a] });
      await link.receive();
      const warned = new Promise((r) => process.once('warning', r));
      a.close({ force: true });
      await warned;
      assert.deepEqual(pool.recycled, { blocks: 0, bytes: 0 }, 'a forced close does not keep the block');
      // The child exits holding its mapping (as after a crash): unmapping it after our free is not its to do.
    });
    await withChild(async (link) => {
      await handOver(link, pool.allocate(MiB), 2);
      assert.equal(pool.recycled.blocks, 1);
      const kept = pool.recycled;
      const s = pool.allocate(MiB, { stream });
      assert.deepEqual(pool.recycled, kept, 'not taken by an allocation on another stream');
      await stream.synchronize();
      s.close();
    });
  });

  test('closing the pool frees its stash: the pool is destroyed with its last buffer', async () => {
    const device = Device.get(0);
    const pool: IpcPool = device.createIpcPool();
    await withChild(async (link) => {
      for (let i = 0; i < 4; i++) await handOver(link, pool.allocate((i + 1) * MiB), 300 + i);
    });
    assert.equal(pool.recycled.blocks, 4);
    const destroyed = new Promise<void>((r) => pool.afterDestroy.push(r));
    pool.close();
    await destroyed;
    assert.throws(() => pool.allocate(MiB), (e: unknown) => (e as { code?: string }).code === 'ERR_CLOSED');
  });
});
