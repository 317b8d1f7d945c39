// Tensor sets, in-place updates and safetensors on a GPU, Node to a Node child: device tensors in
// legacy and pool allocations (views, a transposed one) cross in one message and read back right;
// a repeated send opens no handle; closing lets the mappings go at once (no idle mapping holds the
// sender's memory); the child's updateInPlace is one copy_runs launch plus one strided launch;
// thousands of odd-sized, oddly aligned pairs copy right in one launch and a repeat uploads nothing; a
// checkpoint loads into one pool allocation through small staging chunks; a child killed while
// holding a set leaks nothing. Skips without a GPU, saying why.
import { describe, test, after } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { noGpu } from '../helpers/gpu.js';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer, deviceMemoryStats } from '../../src/cuda/buffer.js';
import { DeviceArray } from '../../src/arrays/device-array.js';
import '../../src/ipc/pool.js';
import { spawn, type Link } from '../../src/link/index.js';
import { TensorMap, loadSafetensors, updateInPlace, writeSafetensors, type SafetensorsInput } from '../../src/tensors/index.js';
import { collectStatus, type ProcessStatus } from '../../src/observe/reader.js';

/** The child's `cuda-ipc status` record once `ok` holds for it (records are rewritten a few times a second). */
async function statusOf(pid: number, what: string, ok: (p: ProcessStatus) => boolean): Promise<ProcessStatus> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const p = collectStatus().processes.find((x) => x.pid === pid);
    if (p && ok(p)) return p;
    if (Date.now() > deadline) assert.fail(`status never showed ${what} for pid ${pid}; last: ${JSON.stringify(p)}`);
    await sleep(50);
  }
}

const CHILD = new URL('../fixtures/tensor-gpu-child.js', import.meta.url);
const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-gpu-tensors-'));
after(() => rmSync(dir, { recursive: true, force: true }));

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  return link.receive({ signal: AbortSignal.timeout(30_000) });
}

const numbers = (a: DeviceArray): number[] => Array.from(a.read() as ArrayLike<number | bigint>, Number);

/** Seven tensors: four in one plain allocation (one transposed), three in a pool allocation. */
function deviceTensors(device: Device): { plain: DeviceBuffer; pooled: DeviceBuffer; map: TensorMap<DeviceArray>; close(): void } {
  const plain = DeviceBuffer.allocate(1 << 16, { device });
  plain.write(Float32Array.from({ length: 1 << 14 }, (_, i) => i * 0.25));
  const pool = device.createIpcPool();
  const pooled = pool.allocate(1 << 14);
  pool.close();
  pooled.write(Int32Array.from({ length: 1 << 12 }, (_, i) => -i));
  const map = new TensorMap<DeviceArray>([
    ['layers.0.q', new DeviceArray(plain.view(0, 4096), { dtype: 'float32', shape: [16, 64] })],
    ['layers.0.k', new DeviceArray(plain.view(4096, 4096), { dtype: 'float32', shape: [32, 32] })],
    ['layers.0.k.T', new DeviceArray(plain.view(8192, 256), { dtype: 'float32', shape: [16, 4], strides: [4, 64] })],
    ['layers.1.every-other', new DeviceArray(plain.view(16384, 4096), { dtype: 'float32', shape: [64], strides: [8] })],
    ['pool.a', new DeviceArray(pooled.view(0, 1024), { dtype: 'int32', shape: [256] })],
    ['pool.b', new DeviceArray(pooled.view(1024, 2048), { dtype: 'int32', shape: [8, 64] })],
    ['pool.bf16', new DeviceArray(pooled.view(4096, 64), { dtype: 'bfloat16', shape: [32] })],
  ]);
  return { plain, pooled, map, close: () => { map.close(); plain.close(); pooled.close(); } };
}

describe('tensor sets on a GPU', { skip: noGpu }, () => {
  test('device tensors cross in one message; a repeated send opens no handle; closing leaves no mapping', async () => {
    const device = Device.get(0);
    const t = deviceTensors(device);
    const expected = Object.fromEntries([...t.map].map(([n, a]) => [n, numbers(a)]));
    const { child, link } = await spawn(CHILD);
    const exited = once(child, 'exit');
    try {
      const first = await ask(link, { op: 'read', weights: t.map });
      assert.deepEqual(first.values, expected);
      assert.equal(first.legacy.opened, 1, 'one handle for the four tensors of the plain allocation');
      assert.equal(first.memory.imports, 2, 'two allocations mapped: the plain one and the pool one');
      const second = await ask(link, { op: 'read', weights: t.map });
      assert.deepEqual(second.values, expected);
      assert.equal(second.legacy.opened, 1, 'the repeated send opened no handle');
      // The first set's RELEASE follows the reply; its pool allocation's import stays (the second
      // set shares it), yet its lease ends: leases do not pile up over repeated syncs.
      for (let waited = 0; t.plain.leases !== 1 || t.pooled.leases !== 1; waited += 10) {
        if (waited > 2000) assert.fail(`the first set's leases never ended: plain ${t.plain.leases}, pooled ${t.pooled.leases} (1 each expected)`);
        await sleep(10);
      }
      await statusOf(child.pid!, 'the set mapped', (p) => p.device.imports === 2);
      const dropped = await ask(link, { op: 'drop' });
      assert.equal(dropped.legacy.mappings, 0, 'no idle mapping left holding our memory');
      assert.equal(dropped.memory.imports, 0);
      // `cuda-ipc status` says the same of the child.
      const st = await statusOf(child.pid!, 'nothing mapped', (p) => p.device.imports === 0);
      assert.equal(st.importCache.mappings, 0);
      await sleep(50);
      assert.equal(t.plain.leases, 0);
      assert.equal(t.pooled.leases, 0);
      // Freed here now: nothing anywhere holds it.
      const before = deviceMemoryStats().allocations;
      const released = Promise.all([t.plain.released(), t.pooled.released()]);
      t.close();
      await released;
      assert.equal(deviceMemoryStats().allocations, before - 2);
    } finally {
      await link.end();
      await exited;
    }
  });

  test('updateInPlace in the child: one copy_runs launch for the contiguous pairs and one launch for the strided ones', async () => {
    const device = Device.get(0);
    const t = deviceTensors(device);
    const expected = Object.fromEntries([...t.map].map(([n, a]) => [n, numbers(a)]));
    const { child, link } = await spawn(CHILD);
    const exited = once(child, 'exit');
    try {
      const r = await ask(link, { op: 'update', weights: t.map });
      assert.deepEqual(r.values, expected);
      assert.equal(r.result.copied, 7);
      assert.equal(r.result.method, 'kernel');
      assert.equal(r.result.operations, 2, 'one copy_runs launch + one copy_strided launch');
    } finally {
      await link.end();
      await exited;
      t.close();
    }
  });

  test('updateInPlace: 3000 odd-sized pairs at odd offsets in one copy_runs launch, values right, a repeat uploads nothing', async () => {
    const device = Device.get(0);
    // Sizes from 1 byte to a few chunks (64 KiB each); offsets that share a misalignment with their
    // destination (split off on the host), that differ (narrower loads), and 16-aligned ones.
    const n = 3000;
    const sizes = Array.from({ length: n }, (_, i) => (i % 211 === 0 ? 200_000 + i : 1 + ((i * 7919) % 3001)));
    const srcOffsets: number[] = [];
    const dstOffsets: number[] = [];
    let s = 0;
    let d = 0;
    sizes.forEach((size, i) => {
      s += i % 7;
      d += i % 3 === 0 ? (s - d) & 15 : i % 5;
      srcOffsets.push(s);
      dstOffsets.push(d);
      s += size;
      d += size;
    });
    const srcBuf = DeviceBuffer.allocate(s + 64, { device });
    const dstBuf = DeviceBuffer.allocate(d + 64, { device });
    const pattern = (seed: number) => Uint8Array.from({ length: s + 64 }, (_, k) => (k * 31 + seed) & 255);
    srcBuf.write(pattern(1));
    dstBuf.write(new Uint8Array(d + 64));
    const src = new Map(sizes.map((size, i) => [`t${i}`, new DeviceArray(srcBuf.view(srcOffsets[i]!, size), { dtype: 'uint8', shape: [size] })]));
    const dst = new Map(sizes.map((size, i) => [`t${i}`, new DeviceArray(dstBuf.view(dstOffsets[i]!, size), { dtype: 'uint8', shape: [size] })]));
    const check = (seed: number) => {
      const want = pattern(seed);
      const got = dstBuf.read() as Uint8Array;
      const gaps = new Uint8Array(d + 64);
      sizes.forEach((size, i) => {
        const a = got.subarray(dstOffsets[i]!, dstOffsets[i]! + size);
        const b = want.subarray(srcOffsets[i]!, srcOffsets[i]! + size);
        assert.ok(Buffer.compare(a, b) === 0, `t${i} (${size} bytes, src at ${srcOffsets[i]}, dst at ${dstOffsets[i]}) differs`);
        gaps.fill(1, dstOffsets[i]!, dstOffsets[i]! + size);
      });
      got.forEach((v, k) => { if (!gaps[k]) assert.equal(v, 0, `byte ${k} between tensors was written`); });
    };
    try {
      const r1 = await updateInPlace(dst, src);
      assert.equal(r1.method, 'kernel');
      assert.equal(r1.operations, 1, 'one launch for 3000 pairs');
      assert.equal(r1.copied, n);
      check(1);
      srcBuf.write(pattern(2));  // the next training step, same memory
      const r2 = await updateInPlace(dst, src);
      assert.equal(r2.timings?.uploaded, 0, 'the same pairs: the device keeps the table');
      check(2);
      srcBuf.write(pattern(3));
      const r3 = await updateInPlace(dst, src, { method: 'batch' });
      assert.equal(r3.method, 'batch');
      check(3);
    } finally {
      srcBuf.close();
      dstBuf.close();
    }
  });

  test('updateInPlace here with a stream, strided destinations, and mismatches named before anything is copied', async () => {
    const device = Device.get(0);
    const src = new TensorMap<DeviceArray>([
      ['w', DeviceArray.allocate('float32', [8, 4], { device })],
      ['b', DeviceArray.allocate('int64', [5], { device })],
    ]);
    src.get('w')!.write(Float32Array.from({ length: 32 }, (_, i) => i));
    src.get('b')!.write(BigInt64Array.from({ length: 5 }, (_, i) => BigInt(i) << 40n));
    const wT = DeviceBuffer.allocate(128, { device });
    const dst = new TensorMap<DeviceArray>([
      ['w', new DeviceArray(wT, { dtype: 'float32', shape: [8, 4], strides: [4, 32] })],  // column-major
      ['b', DeviceArray.allocate('int64', [5], { device })],
    ]);
    const { Stream } = await import('../../src/cuda/stream.js');
    using stream = Stream.create(device);
    const r = await updateInPlace(dst, src, { stream });
    assert.deepEqual({ copied: r.copied, operations: r.operations }, { copied: 2, operations: 2 });
    assert.deepEqual(numbers(dst.get('w')!), Array.from({ length: 32 }, (_, i) => i));
    assert.deepEqual(numbers(dst.get('b')!), Array.from({ length: 5 }, (_, i) => Number(BigInt(i) << 40n)));
    const bad = new TensorMap<DeviceArray>([['w', DeviceArray.allocate('float16', [8, 4], { device })]]);
    await assert.rejects(updateInPlace(bad, src), /ERR_TENSOR_MISMATCH|"w": dtype float32 received, float16 here/);
    bad.close();
    src.close();
    dst.close();
  });

  test('a checkpoint loads into one pool allocation through small staging chunks and reads back right, here and in a child', async () => {
    const n = 1 << 18;
    const big = Float32Array.from({ length: n }, (_, i) => Math.sin(i));
    const ids = BigInt64Array.from({ length: 1000 }, (_, i) => BigInt(i) * 3n);
    const bf = Uint16Array.from({ length: 4099 }, (_, i) => i);
    const entries: Array<[string, SafetensorsInput]> = [
      ['embed', { dtype: 'float32', shape: [512, 512], data: big }],
      ['ids', { dtype: 'int64', shape: [1000], data: ids }],
      ['norm', { dtype: 'bfloat16', shape: [4099], data: bf }],
    ];
    const a = join(dir, 'a.safetensors');
    const b = join(dir, 'b.safetensors');
    writeSafetensors(a, entries.slice(0, 2));
    writeSafetensors(b, entries.slice(2));
    // 64 KiB staging: the 1 MiB tensor crosses in 16 chunks, alternating halves.
    const map = await loadSafetensors([a, b], { stagingBytes: 64 << 10 });
    const { child, link } = await spawn(CHILD);
    const exited = once(child, 'exit');
    try {
      assert.deepEqual(numbers(map.get('embed')!), Array.from(big));
      assert.deepEqual(numbers(map.get('ids')!), Array.from(ids, Number));
      assert.deepEqual(numbers(map.get('norm')!), Array.from(bf));
      const memories = new Set([...map.values()].map((x) => x.buffer.memory));
      assert.equal(memories.size, 1, 'one allocation for both files');
      assert.equal(map.get('embed')!.buffer.kind, 'pool');
      const got = await ask(link, { op: 'read', weights: map });
      assert.deepEqual(got.values.norm, Array.from(bf));
      assert.equal(got.memory.imports, 1);
      await ask(link, { op: 'drop' });
    } finally {
      await link.end();
      await exited;
      map.close();
    }
  });

  test('misaligned tensors (packed back to back) load to the device, each aligned, across staging chunks', async () => {
    const odd = Uint8Array.from({ length: 5001 }, (_, i) => i & 0xff);
    const f64 = Float64Array.from({ length: 3000 }, (_, i) => i / 7);
    const f32 = Float32Array.from({ length: 2001 }, (_, i) => -i);
    const entries: Array<[string, SafetensorsInput]> = [
      ['odd', { dtype: 'uint8', shape: [5001], data: odd }],
      ['f64', { dtype: 'float64', shape: [3000], data: f64 }],  // starts at 5001
      ['one', { dtype: 'uint8', shape: [1], data: Uint8Array.from([7]) }],
      ['f32', { dtype: 'float32', shape: [2001], data: f32 }],  // starts at 29002
    ];
    const path = join(dir, 'misaligned.safetensors');
    writeSafetensors(path, entries);
    const map = await loadSafetensors(path, { stagingBytes: 4096 });
    try {
      for (const [name, t] of entries) {
        const a = map.get(name)!;
        const itemsize = t.data.byteLength / t.shape[0]!;
        assert.equal(a.buffer.devicePointer % BigInt(itemsize), 0n, `${name} is aligned to its ${itemsize}-byte elements`);
        assert.deepEqual(numbers(a), Array.from(t.data as unknown as ArrayLike<number>), name);
      }
    } finally {
      map.close();
    }
  });

  test('a child killed while it holds a set leaks nothing here', async () => {
    const device = Device.get(0);
    const t = deviceTensors(device);
    const { child, link } = await spawn(CHILD);
    const exited = once(child, 'exit');
    await ask(link, { op: 'read', weights: t.map });
    assert.equal(t.plain.leases, 1);
    child.kill('SIGKILL');
    await exited;
    const released = Promise.all([t.plain.released(), t.pooled.released()]);
    t.close();
    await released;
    link.close();
  });
});
