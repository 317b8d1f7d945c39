// Ordering GPU work across processes: interprocess events, stream memory operations, and the
// two demos.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { noGpu } from '../helpers/gpu.js';
import { Device } from '../../src/cuda/device.js';
import { Stream } from '../../src/cuda/stream.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { IpcError } from '../../src/errors.js';
import { Event } from '../../src/cuda/event.js';
import { BuiltinKernels } from '../../src/cuda/builtins.js';
import { spawn, type Link } from '../../src/link/index.js';

const fixture = new URL('../fixtures/order-child.js', import.meta.url);
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

describe('ordering across processes', { skip: noGpu }, () => {
  const n = 1 << 22;

  // The producer's stream: a gate (a GPU-side wait on a flag only this test opens), then the kernel
  // that writes the pattern, then the event. While the gate is shut the event is pending on any
  // machine, however fast; the test opens it once the child's work is queued (or done).
  function produce(seed: number) {
    const device = Device.get(0);
    const pool = device.createIpcPool();
    const stream = Stream.create(device);
    const gateStream = Stream.create(device);
    const gate = DeviceBuffer.allocate(4, { device }); // memory operations need non-pool memory
    gate.fill(0);
    const buffer = pool.allocate(n * 4);
    const event = Event.create(device, { interprocess: true });
    const kernels = BuiltinKernels.for(device);
    // Launched once before the gate shuts, so that loading the kernel (which may synchronise the
    // context) never waits on the gated stream; it writes zeros, as the race test expects.
    kernels.fillPattern(buffer, 'u32', 0, 0, stream);
    stream.waitValue32(gate, 0, 1, 'geq');
    kernels.fillPattern(buffer, 'u32', seed, 1, stream);
    event.record(stream);
    let opened = false;
    const open = () => { if (!opened) { opened = true; gateStream.writeValue32(gate, 0, 1); } };
    return {
      buffer, event, open,
      done: async () => {
        open();
        await stream.synchronize();
        await gateStream.synchronize();
        for (const r of [buffer, event, gate, stream, gateStream, pool]) r.close();
      },
    };
  }

  test('the consumer waits on the producer\'s IPC event and its kernel sees every element', async () => {
    const p = produce(1000);
    try {
      const r = await withChild(async (link) => {
        link.send({ op: 'verify', buffer: p.buffer, event: p.event, wait: true, a: 1000, b: 1 });
        const queued = (await link.receive()) as any;
        assert.equal(queued.pendingAtStart, true, 'the gate holds the event pending');
        p.open(); // only now can the producer's kernel write the pattern
        return link.receive() as any;
      });
      assert.equal(r.mismatches, 0);
    } finally {
      await p.done();
    }
  });

  test('without the wait, the consumer races: its kernel runs before the producer writes', async () => {
    const p = produce(2000);
    try {
      const r = await withChild(async (link) => {
        link.send({ op: 'verify', buffer: p.buffer, event: p.event, wait: false, a: 2000, b: 1 });
        await link.receive(); // queued
        return link.receive() as any; // done, with the gate still shut
      });
      // Nothing ordered the consumer after the producer, so it read the zeros under the pattern.
      assert.equal(r.mismatches, n);
    } finally {
      await p.done();
    }
  });

  test('waitValue/writeValue ping-pong between two processes for 10,000 rounds', async () => {
    const device = Device.get(0);
    using flags = DeviceBuffer.allocate(16, { device }); // sent by legacy handle: pools refuse memops
    flags.fill(0);
    using stream = Stream.create(device);
    const rounds = 10_000;
    const r = await withChild(async (link) => {
      link.send({ op: 'pingpong', flags, rounds });
      for (let i = 1; i <= rounds; i++) {
        stream.writeValue32(flags, 0, i);
        stream.waitValue32(flags, 8, i, 'geq');
      }
      await stream.synchronize();
      return link.receive() as any;
    });
    assert.equal(r.pong, rounds);
    const both = new Uint32Array(3);
    flags.read(both);
    assert.deepEqual(Array.from(both), [rounds, 0, rounds]);
  });

  test('stream memory operations on pool memory are refused with a clear error', () => {
    const device = Device.get(0);
    using pool = device.createIpcPool();
    using b = pool.allocate(16);
    using stream = Stream.create(device);
    assert.throws(() => stream.writeValue32(b, 0, 1), (e: unknown) => e instanceof IpcError && e.code === 'ERR_UNSUPPORTED' && /DeviceBuffer\.allocate/.test(e.message));
  });

  test('cuda-ipc demo events', () => {
    const r = spawnSync(process.execPath, [cli, 'demo', 'events', '--ms', '400'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /fork\(\)/);
    assert.match(r.stdout, /child \d+: waited \d+ ms/);
    assert.match(r.stdout, /demo events: OK/);
  });

  test('cuda-ipc demo transform', () => {
    const r = spawnSync(process.execPath, [cli, 'demo', 'transform', '--elements', '1000000'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /initialised 1000000 float32 with a kernel: 100, 101, 102, 103, 104/);
    assert.match(r.stdout, /after the child: 200, 202, 204, 206, 208/);
    assert.match(r.stdout, /demo transform: OK/);
  });
});
