// Built-in kernels, modules, NVRTC, events and stream memory operations within one process.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { noGpu } from '../helpers/gpu.js';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { Stream } from '../../src/cuda/stream.js';
import { Event } from '../../src/cuda/event.js';
import { Module, compileCuda } from '../../src/cuda/module.js';
import { BuiltinKernels } from '../../src/cuda/builtins.js';
import { arg } from '../../src/cuda/kernel-args.js';
import { expectedPatternValue, referenceChecksum } from '../../src/cuda/builtin-kernels.js';
import { IpcError } from '../../src/errors.js';
import { argError } from '../helpers/arg-error.js';
import { waitUntil, within } from '../helpers/wait.js';

describe('kernels', { skip: noGpu }, () => {
  test('fill, verify and scale patterns for every element type', async () => {
    const k = BuiltinKernels.for();
    using s = Stream.create();
    const n = 100_003;
    for (const type of ['i32', 'u32', 'f32', 'f64'] as const) {
      using b = DeviceBuffer.allocate(n * (type === 'f64' ? 8 : 4));
      k.fillPattern(b, type, 100, 1, s);
      assert.deepEqual(await k.verifyPattern(b, type, 100, 1, s), { mismatches: 0n, firstMismatch: null }, type);
      k.scale(b, type, 2, s);
      assert.deepEqual(await k.verifyPattern(b, type, 200, 2, s), { mismatches: 0n, firstMismatch: null }, `${type} scaled`);
      // One wrong element is found, at its index.
      b.view(777 * (type === 'f64' ? 8 : 4), 4).fill(0xff);
      const r = await k.verifyPattern(b, type, 200, 2, s);
      assert.equal(r.mismatches, 1n);
      assert.equal(r.firstMismatch, 777n);
    }
    for (const type of ['i64', 'u64'] as const) {
      using b = DeviceBuffer.allocate(n * 8);
      const a0 = type === 'i64' ? -5n : 2n ** 63n;
      k.fillPattern(b, type, a0, 3n, s);
      assert.deepEqual(await k.verifyPattern(b, type, a0, 3n, s), { mismatches: 0n, firstMismatch: null }, type);
      const host = new BigUint64Array(4);
      await b.readAsync(host, { stream: s });
      assert.equal(host[3], BigInt.asUintN(64, expectedPatternValue(type, a0, 3n, 3)));
    }
  });

  test('the byte checksum matches the host reference', async () => {
    const bytes = new Uint8Array(1_000_001).map((_, i) => (i * 31 + 7) & 255);
    using b = DeviceBuffer.allocate(bytes.length);
    b.write(bytes);
    assert.deepEqual(await BuiltinKernels.for().checksum(b), referenceChecksum(bytes));
  });

  test('NVRTC compiles CUDA C that a module loads and launches', () => {
    const ptx = compileCuda('extern "C" __global__ void add(int* x, int n, int v) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += v; }', { name: 'add.cu' });
    using m = Module.load(ptx);
    using b = DeviceBuffer.allocate(1000 * 4);
    b.write(new Int32Array(1000).map((_, i) => i));
    m.getFunction('add').launch({ grid: 4, block: 256 }, [arg.ptr(b), arg.i32(1000), arg.i32(5)]);
    const out = new Int32Array(1000);
    b.read(out);
    assert.deepEqual(out, new Int32Array(1000).map((_, i) => i + 5));
    assert.throws(() => compileCuda('this is not C', { name: 'bad.cu' }), (e: unknown) => e instanceof IpcError && e.code === 'ERR_COMPILE' && /bad\.cu/.test(e.message));
  });

  test('timers keep firing while await ev.synchronize() waits for an event held back on the GPU', async () => {
    // The event waits behind a stream wait on a flag that only this test writes: it stays pending
    // however slow the machine, so what is checked is that the event loop ran (30 timer ticks)
    // while the wait was outstanding, never how late a tick came.
    using flag = DeviceBuffer.allocate(64);
    flag.fill(0);
    using held = Stream.create();
    using writer = Stream.create();
    using ev = Event.create();
    // No kernel is launched behind the wait: its first launch would load it (lazy module loading),
    // which can wait for the context, held by this very wait (the GPU run hung here).
    held.waitValue32(flag, 0, 1, 'eq');
    ev.record(held);
    assert.equal(ev.query(), false, 'the event is pending behind the flag');
    let settled = false;
    const waiting = ev.synchronize().then(() => { settled = true; });
    let ticks = 0;
    const timer = setInterval(() => { ticks++; }, 1);
    try {
      await waitUntil(() => ticks >= 30 || settled, '30 timer ticks while the event is pending');
      assert.equal(settled, false, 'the wait could not end before the flag was written');
      assert.equal(ev.query(), false);
    } finally {
      clearInterval(timer);
      writer.writeValue32(flag, 0, 1);
    }
    await within(waiting, 'ev.synchronize() to resolve once the flag was written');
    assert.equal(ev.query(), true);
  });

  test('stream memory operations: a GPU-side wait released by a GPU-side write', async () => {
    using flag = DeviceBuffer.allocate(64);
    flag.fill(0);
    using data = DeviceBuffer.allocate(4096);
    using other = DeviceBuffer.allocate(4096);
    using waiter = Stream.create();
    using writer = Stream.create();
    waiter.waitValue32(flag, 0, 1, 'eq');
    data.fillUint32(7, { stream: waiter });
    // Later work on another stream finishing is the event after which the waiter must still be blocked.
    other.fillUint32(3, { stream: writer });
    await within(writer.synchronize(), 'work queued on another stream to finish');
    assert.equal(waiter.query(), false, 'the waiting stream is blocked on the flag');
    writer.writeValue32(flag, 0, 1);
    await within(waiter.synchronize(), 'the waiting stream to pass the flag once written');
    const out = new Uint32Array(1024);
    data.read(out);
    assert.ok(out.every((v) => v === 7));
    assert.throws(() => writer.writeValue32(flag, 2, 1), argError('ERR_INVALID_ARG_VALUE'));
    assert.throws(() => writer.writeValue32(flag, 64, 1), argError('ERR_OUT_OF_RANGE'));
  });

  test('an interprocess event can be created and recorded', () => {
    using ev = Event.create(Device.get(0), { interprocess: true });
    assert.equal(ev.interprocess, true);
    ev.record();
  });
});
