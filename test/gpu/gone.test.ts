// Freed memory is never kept alive by a peer's cache (issue 17): a process that frees an
// allocation it sent by legacy handle tells the peer (GONE), which closes its idle mapping at
// once, also where the allocation went inside a tensor set; a destroyed pool's import goes too. And exportPointer's table forgets freed allocations.
import { describe, test, after } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { noGpu } from '../helpers/gpu.js';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { driver } from '../../src/cuda/driver.js';
import { exportPointer, legacyCacheStats } from '../../src/ipc/legacy.js';
import { spawn, type Link } from '../../src/link/index.js';
import { DeviceArray } from '../../src/arrays/device-array.js';
import { TensorMap } from '../../src/tensors/index.js';

const fixture = new URL('../fixtures/gone-child.js', import.meta.url);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Report {
  value?: number;
  cache: { mappings: number; idle: number };
  fds: number;
  /** GONE notices for legacy allocations the child got. */
  gone: number;
}

async function until(link: Link, what: string, ok: (r: Report) => boolean): Promise<Report> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    link.send({ op: 'report' });
    const r = (await link.receive({ timeout: 10_000 })) as Report;
    if (ok(r)) return r;
    if (Date.now() > deadline) assert.fail(`the child never showed ${what}: ${JSON.stringify(r)}`);
    await sleep(50);
  }
}

describe('allocation gone', { skip: noGpu }, () => {
  const children = new Set<ChildProcess>();
  after(() => { for (const c of children) c.kill('SIGKILL'); });

  test('a legacy buffer freed by its sender leaves no idle mapping in the receiver', async () => {
    const { child, link } = await spawn(fixture, [], { stdio: 'inherit' });
    children.add(child);
    try {
      const device = Device.get(0);
      const b = DeviceBuffer.allocate(1 << 20, { device });
      b.write(new Uint32Array([4242]));
      link.send({ buffer: b });
      const r = (await link.receive({ timeout: 10_000 })) as Report;
      assert.equal(r.value, 4242);
      assert.equal(r.cache.idle, 1, 'the receiver keeps the mapping idle, so that a resend is free');
      // A resend while it lives opens no new mapping.
      link.send({ buffer: b });
      const again = (await link.receive({ timeout: 10_000 })) as Report;
      assert.equal(again.cache.mappings, 1);
      const freeBefore = device.memoryInfo().free;
      b.close();  // the last user: freed here, GONE to the child
      const after = await until(link, 'its idle mapping closed', (x) => x.cache.mappings === 0);
      assert.equal(after.cache.idle, 0);
      // The memory is really back: nothing maps it any more (1 MiB, within the allocator's granularity).
      await sleep(50);
      assert.ok(device.memoryInfo().free >= freeBefore, 'the allocation is not kept resident by the peer');
    } finally {
      link.close();
      child.kill('SIGKILL');
    }
  });

  test('a legacy allocation sent only inside a tensor set: freed by its sender, it is announced GONE as when sent alone', async () => {
    const { child, link } = await spawn(fixture, [], { stdio: 'inherit' });
    children.add(child);
    try {
      const b = DeviceBuffer.allocate(1 << 20, { device: Device.get(0) });
      b.write(new Uint32Array([5151]));
      const map = new TensorMap([['w', new DeviceArray(b.view(0, 64), { dtype: 'uint32', shape: [16] })]]);
      link.send({ set: map });
      const r = (await link.receive({ timeout: 10_000 })) as Report;
      assert.equal(r.value, 5151);
      assert.equal(r.gone, 0, 'nothing is gone while the sender has it');
      map.close();
      b.close();  // the last user here: freed once the child's lease ended, GONE to the child
      await until(link, 'the GONE notice of the tensor set\'s legacy allocation', (x) => x.gone === 1);
    } finally {
      link.close();
      child.kill('SIGKILL');
    }
  });

  test('a pool destroyed by its sender is dropped by the receiver (its fd closed)', async () => {
    const { child, link } = await spawn(fixture, [], { stdio: 'inherit' });
    children.add(child);
    try {
      link.send({ op: 'report' });
      const before = (await link.receive({ timeout: 10_000 })) as Report;
      const pool = Device.get(0).createIpcPool();
      const b = pool.allocate(1 << 20);
      b.write(new Uint32Array([77]));
      link.send({ buffer: b });
      const r = (await link.receive({ timeout: 10_000 })) as Report;
      assert.equal(r.value, 77);
      assert.ok(r.fds > before.fds, 'the imported pool holds its fd while the sender has the pool');
      link.send({ op: 'report' });
      assert.equal(((await link.receive({ timeout: 10_000 })) as Report).fds, r.fds, 'and keeps it while nobody said it is gone');
      b.close();
      pool.close();  // destroyed once its buffer's lease ended: GONE 'ipc-pool'
      // (Counting from before the pool came would count the driver's own fds, opened with it.)
      await until(link, `the imported pool closed (its fd: fewer than ${r.fds})`, (x) => x.fds < r.fds);
    } finally {
      link.close();
      child.kill('SIGKILL');
    }
  });

  test("exportPointer's table forgets allocations that were freed", () => {
    const device = Device.get(0);
    device.activate();
    const before = legacyCacheStats().exports;
    for (let i = 0; i < 70; i++) {
      const p = driver.memAlloc(4096);
      exportPointer(p, 4096, { device });
      driver.memFree(p);
    }
    // exportPointer sweeps as the table grows, and legacyCacheStats() sweeps before it counts.
    assert.equal(legacyCacheStats().exports, before);
    const live = DeviceBuffer.allocate(4096, { device });
    exportPointer(live.devicePointer, 4096, { device });
    assert.equal(legacyCacheStats().exports, before + 1, 'a live export stays');
    live.close();
  });
});
