// Legacy IPC handles on a real GPU: cross-process, interior pointers, same process and worker
// threads, the import cache, refusals and stale handles.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Worker } from 'node:worker_threads';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { noGpu } from '../helpers/gpu.js';
import { JsonChild, u32Pattern } from '../helpers/child.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { Device } from '../../src/cuda/device.js';
import { driver } from '../../src/cuda/driver.js';
import { openIpcHandle, exportPointer, legacyCacheStats } from '../../src/ipc/legacy.js';
import { descriptorToJson } from '../../src/ipc/descriptor.js';
import { IpcError } from '../../src/errors.js';

const json = (d: Parameters<typeof descriptorToJson>[0]) => descriptorToJson(d);

describe('legacy IPC handles', { skip: noGpu }, () => {
  let child: JsonChild;
  before(() => { child = new JsonChild('legacy-child'); });
  after(async () => { assert.equal(await child.close(), 0); });

  test('a child imports 1,000 buffers and checks patterns both ways', async () => {
    const buffers: DeviceBuffer[] = [];
    try {
      for (let k = 0; k < 1000; k++) {
        const n = 64 << (k % 8); // 256 B .. 32 KiB
        const b = DeviceBuffer.allocate(n * 4);
        b.write(u32Pattern(k * 1000, n));
        buffers.push(b);
      }
      for (let k = 0; k < buffers.length; k++) {
        const r = await child.request({ op: 'check-and-write', desc: json(buffers[k]!.ipcHandle()), expect: { seed: k * 1000 }, write: { seed: k * 7 + 3 } });
        assert.deepEqual(r, { ok: true }, `buffer ${k}`);
      }
      for (let k = 0; k < buffers.length; k++) {
        const b = buffers[k]!;
        assert.deepEqual(new Uint32Array(b.read().buffer), u32Pattern(k * 7 + 3, b.byteLength / 4), `buffer ${k} after the child wrote`);
      }
    } finally {
      for (const b of buffers) b.close();
    }
  });

  test('interior pointers: the allocation handle plus the offset of the range', async () => {
    using base = DeviceBuffer.allocate(1 << 20);
    base.fill(0);
    using v1 = base.view(4096, 8192);
    using v2 = base.view(12345 * 4, 1000 * 4);
    const d0 = base.ipcHandle();
    const d1 = v1.ipcHandle();
    const d2 = v2.ipcHandle();
    assert.deepEqual(d1.handle, d0.handle);
    assert.deepEqual(d2.handle, d0.handle);
    assert.equal(d1.offset, 4096);
    assert.equal(d1.byteLength, 8192);
    assert.equal(d2.offset, 12345 * 4);
    v1.write(u32Pattern(11, 2048));
    v2.write(u32Pattern(22, 1000));
    assert.deepEqual(await child.request({ op: 'check-and-write', desc: json(d1), expect: { seed: 11 }, write: { seed: 33 } }), { ok: true });
    assert.deepEqual(await child.request({ op: 'check-and-write', desc: json(d2), expect: { seed: 22 }, write: { seed: 44 } }), { ok: true });
    const back = new Uint32Array(2048);
    base.read(back, 4096);
    assert.deepEqual(back, u32Pattern(33, 2048));
    // Bytes next to the view were not touched by the child.
    const edges = new Uint32Array(1);
    base.read(edges, 4092);
    assert.equal(edges[0], 0);
    base.read(edges, 4096 + 8192);
    assert.equal(edges[0], 0);
  });

  test('two opens in one process share one mapping, refcounted', async () => {
    using b = DeviceBuffer.allocate(4096);
    b.write(u32Pattern(5, 1024));
    const r = await child.request({ op: 'open-twice', desc: json(b.ipcHandle()) });
    assert.equal(r.ok, true);
    assert.equal(r.pointers[0], r.pointers[1]);
    assert.equal(r.both.mappings, 1);
    assert.equal(r.both.references, 2);
    assert.equal(r.afterOne.mappings, 1);
    assert.equal(r.first, 5);
    // Unused, the mapping stays cached for the next open, up to the idle limit.
    assert.equal(r.afterBoth.mappings, 1);
    assert.equal(r.afterBoth.idle, 1);
    assert.equal(r.afterBoth.references, 0);
    assert.equal(r.trimmed.mappings, 0, 'idleLimit 0 closes idle mappings');
  });

  test('the import cache is bounded: least recently used idle mappings are closed first', async () => {
    const buffers = Array.from({ length: 5 }, (_, i) => { const b = DeviceBuffer.allocate(4096); b.write(u32Pattern(i, 1024)); return b; });
    try {
      const r = await child.request({ op: 'lru', descs: buffers.map((b) => json(b.ipcHandle())), limit: 3 });
      assert.equal(r.ok, true, r.message);
      assert.deepEqual(r.sizes, [1, 2, 3, 3, 3], 'at most 3 idle mappings');
      assert.equal(r.reopenFirstHit, false, 'the oldest was evicted');
      assert.equal(r.reopenLastHit, true, 'the newest stayed mapped');
    } finally {
      for (const b of buffers) b.close();
    }
  });

  test('an address the exporter reuses for a new allocation reads the new data in the importer', async () => {
    // The importer keeps idle mappings cached by handle bytes: a new allocation at the same
    // address must never be read through a stale mapping of the old one.
    const first = DeviceBuffer.allocate(1 << 20);
    const address = first.devicePointer;
    first.write(u32Pattern(111, 1 << 18));
    const h1 = first.ipcHandle();
    assert.deepEqual(await child.request({ op: 'check-and-write', desc: json(h1), expect: { seed: 111 } }), { ok: true });
    first.close();
    using second = DeviceBuffer.allocate(1 << 20);
    second.write(u32Pattern(222, 1 << 18));
    const h2 = second.ipcHandle();
    const sameAddress = second.devicePointer === address;
    const sameHandle = Buffer.from(h1.handle).equals(Buffer.from(h2.handle));
    console.log(`# reused address: ${sameAddress}, identical handle bytes: ${sameHandle}`);
    assert.deepEqual(await child.request({ op: 'check-and-write', desc: json(h2), expect: { seed: 222 } }), { ok: true });
  });

  test('opening in the exporting process returns a view of the local allocation', () => {
    using b = DeviceBuffer.allocate(4096);
    const d = b.view(1024, 1024).ipcHandle();
    using opened = openIpcHandle(d);
    assert.equal(opened.devicePointer, b.devicePointer + 1024n);
    opened.write(u32Pattern(99, 256));
    const got = new Uint32Array(256);
    b.read(got, 1024);
    assert.deepEqual(got, u32Pattern(99, 256));
    assert.equal(legacyCacheStats().mappings, 0, 'no driver mapping for a local open');
  });

  test('opening in a worker thread of the exporting process maps nothing and reads the data', async () => {
    using b = DeviceBuffer.allocate(4096);
    b.write(u32Pattern(1234, 1024));
    const code = `
      const { parentPort, workerData } = require('node:worker_threads');
      import(workerData.legacy).then(async ({ openIpcHandle, legacyCacheStats }) => {
        const buf = openIpcHandle(workerData.desc);
        const a = new Uint32Array(1024);
        buf.read(a);
        parentPort.postMessage({ pointer: String(buf.devicePointer), first: a[0], last: a[1023], stats: legacyCacheStats() });
        buf.close();
      }).catch((e) => parentPort.postMessage({ error: e.code + ': ' + e.message }));`;
    const legacy = new URL('../../src/ipc/legacy.js', import.meta.url).href;
    const w = new Worker(code, { eval: true, workerData: { legacy, desc: JSON.stringify(json(b.ipcHandle())) } });
    const msg = await new Promise<any>((resolve, reject) => { w.once('message', resolve); w.once('error', reject); });
    await w.terminate();
    assert.equal(msg.error, undefined);
    assert.equal(msg.pointer, String(b.devicePointer));
    assert.equal(msg.first, 1234);
    assert.equal(msg.last, 1234 + 1023);
    assert.equal(msg.stats.mappings, 0);
  });

  test('managed and pinned host memory are refused with ERR_NOT_EXPORTABLE', () => {
    const dev = Device.get(0);
    dev.activate();
    const managed = driver.memAllocManaged(4096);
    try {
      assert.throws(() => exportPointer(managed, 4096), (e: unknown) => e instanceof IpcError && e.code === 'ERR_NOT_EXPORTABLE' && /managed/.test(e.message));
    } finally {
      driver.memFree(managed);
    }
    const pinned = driver.memAllocHost(4096);
    try {
      assert.throws(() => exportPointer(pinned, 4096), (e: unknown) => e instanceof IpcError && e.code === 'ERR_NOT_EXPORTABLE' && /HostBuffer/.test(e.message));
    } finally {
      driver.memFreeHost(pinned);
    }
  });

  test('garbage and zero handles fail cleanly with ERR_HANDLE_STALE', async () => {
    using b = DeviceBuffer.allocate(4096);
    const good = json(b.ipcHandle());
    for (const handle of ['00'.repeat(64), 'a5'.repeat(64), Buffer.from(Array.from({ length: 64 }, (_, i) => (i * 37 + 11) & 255)).toString('hex')]) {
      const r = await child.request({ op: 'open-close', desc: { ...good, handle } });
      assert.equal(r.ok, false);
      assert.equal(r.code, 'ERR_HANDLE_STALE', r.message);
    }
  });

  test('a handle whose exporter exited is stale, and the message says so', async () => {
    const file = fileURLToPath(new URL('../fixtures/legacy-exporter.js', import.meta.url));
    const p = spawn(process.execPath, [file, 'exit'], { stdio: ['ignore', 'pipe', 'inherit'] });
    const line = await new Promise<string>((resolve) => createInterface({ input: p.stdout! }).once('line', resolve));
    await new Promise((resolve) => p.once('exit', resolve));
    assert.throws(() => openIpcHandle(line), (e: unknown) => e instanceof IpcError && e.code === 'ERR_HANDLE_STALE' && /exited/.test(e.message));
  });

  test('an exporter that exits while mapped: the importer still reads the data', async () => {
    const file = fileURLToPath(new URL('../fixtures/legacy-exporter.js', import.meta.url));
    const p = spawn(process.execPath, [file], { stdio: ['pipe', 'pipe', 'inherit'] });
    const line = await new Promise<string>((resolve) => createInterface({ input: p.stdout! }).once('line', resolve));
    using buf = openIpcHandle(line);
    p.stdin!.end();
    await new Promise((resolve) => p.once('exit', resolve));
    const a = new Uint32Array(1024);
    buf.read(a);
    assert.equal(a[0], 7);
    assert.equal(a[1023], 1030);
  });

  test('an unknown device UUID is refused with ERR_UNKNOWN_DEVICE', () => {
    using b = DeviceBuffer.allocate(64);
    const d = json(b.ipcHandle());
    assert.throws(() => openIpcHandle(JSON.stringify({ ...d, deviceUuid: 'GPU-00000000-0000-0000-0000-000000000000' })),
      (e: unknown) => e instanceof IpcError && e.code === 'ERR_UNKNOWN_DEVICE');
  });

  test('a descriptor whose range exceeds the allocation is refused', async () => {
    using b = DeviceBuffer.allocate(4096);
    const d = json(b.ipcHandle());
    const r = await child.request({ op: 'open-close', desc: { ...d, byteLength: 1 << 30 } });
    assert.equal(r.ok, false);
    assert.equal(r.code, 'ERR_OUT_OF_RANGE');
  });
});
