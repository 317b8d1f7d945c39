// Lifetimes that survive crashes, on a GPU: leases keep exported memory alive for peers, a killed
// consumer's leases end and its memory is freed, a killed producer leaves the consumer's mappings
// readable.
import { describe, test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { spawnSync, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { noGpu } from '../helpers/gpu.js';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer, deviceMemoryStats } from '../../src/cuda/buffer.js';
import { spawn, type Link } from '../../src/link/index.js';
import { IpcError } from '../../src/errors.js';
import { traceLeaks } from '../../src/leak.js';

const fixture = new URL('../fixtures/gpu-lease-child.js', import.meta.url);
const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const fdCount = () => readdirSync('/proc/self/fd').length;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function closed(link: Link): Promise<IpcError | undefined> {
  if (link.closed) return undefined;
  return new Promise((resolve) => link.once('close', resolve));
}

describe('lifetimes', { skip: noGpu }, () => {
  const children = new Set<ChildProcess>();
  after(() => { for (const c of children) c.kill('SIGKILL'); });

  test('200 cycles of spawn, lease, SIGKILL: no leaked fds, held bytes back to 0, device memory back to start', async (t) => {
    const device = Device.get(0);
    using pool = device.createIpcPool();
    // Warm up (first pool allocations reserve memory the pool then keeps), then take the baseline.
    pool.allocate(1 << 20).close();
    const fdsBefore = fdCount();
    const freeBefore = device.memoryInfo().free;
    const cycles = 200;
    const concurrency = 4;
    const freedMs: number[] = [];
    let next = 0;
    let failed = false;
    const worker = async () => {
      while (next < cycles && !failed) {
        const cycle = next++;
        const { child, link } = await spawn(fixture, ['consumer'], { stdio: 'inherit' });
        children.add(child);
        const sent: DeviceBuffer[] = [];
        const count = 1 + (cycle % 4);
        const killAfter = cycle % (count + 1); // kill before any ack, mid-way, or after all
        for (let i = 0; i < count; i++) {
          const b = i % 2 === 0 ? pool.allocate(1 << 20) : DeviceBuffer.allocate(1 << 20, { device });
          b.write(new Uint32Array([cycle * 10 + i]));
          link.send({ buffer: b });
          sent.push(b);
          b.close(); // only the lease keeps it now
          if (i + 1 === killAfter) break;
          assert.equal(await link.receive(), cycle * 10 + i);
        }
        const gone = closed(link);
        child.kill('SIGKILL');
        const t0 = performance.now();
        const reason = await gone;
        await Promise.all(sent.map((b) => b.released()));
        const ms = performance.now() - t0;
        assert.equal(reason?.code, 'ERR_PEER_GONE');
        freedMs.push(ms);
        await new Promise((r) => (child.exitCode !== null || child.signalCode !== null ? r(null) : child.once('exit', r)));
        children.delete(child);
      }
    };
    await Promise.all(Array.from({ length: concurrency }, () => worker().catch((e) => { failed = true; throw e; })));
    // How fast memory comes back is the benchmark's business; here: it did, for every cycle.
    assert.equal(freedMs.length, cycles);
    freedMs.sort((a, b) => a - b);
    t.diagnostic(`memory freed after the kill: median ${freedMs[cycles >> 1]!.toFixed(1)} ms, max ${freedMs.at(-1)!.toFixed(1)} ms`);
    await sleep(50);
    const stats = deviceMemoryStats();
    assert.equal(stats.heldBytes, 0);
    assert.equal(stats.leased, 0);
    assert.equal(fdCount(), fdsBefore, 'file descriptors back to where they started');
    pool.trimTo(0);
    const freeAfter = device.memoryInfo().free;
    assert.ok(Math.abs(freeAfter - freeBefore) <= 4 << 20, `device free memory moved from ${freeBefore} to ${freeAfter}`);
  });

  test('a killed producer: the consumer gets ERR_PEER_GONE and still reads what it mapped', async () => {
    const { child, link } = await spawn(fixture, ['producer'], { stdio: 'inherit' });
    const { buffer } = (await link.receive()) as { buffer: DeviceBuffer };
    const gone = closed(link);
    child.kill('SIGKILL');
    const reason = await gone;
    assert.equal(reason?.code, 'ERR_PEER_GONE');
    await assert.rejects(link.receive(), (e: unknown) => e instanceof IpcError && (e.code === 'ERR_PEER_GONE' || e.code === 'ERR_LINK_CLOSED'));
    const a = new Uint32Array(1 << 18);
    buffer.read(a);
    assert.equal(a[0], 1000);
    assert.equal(a[(1 << 18) - 1], 1000 + (1 << 18) - 1);
    buffer.close();
  });

  test('forced close frees at once and says what it risks', async () => {
    const { child, link } = await spawn(fixture, ['consumer'], { stdio: 'inherit' });
    try {
      using pool = Device.get(0).createIpcPool();
      const b = pool.allocate(4096);
      link.send({ buffer: b });
      await link.receive();
      assert.equal(b.leases, 1);
      const warnings: string[] = [];
      const onWarning = (w: Error & { code?: string }) => { if (w.code === 'CUDA_IPC_FORCED_CLOSE') warnings.push(w.message); };
      process.on('warning', onWarning);
      b.close({ force: true });
      await b.released();
      await sleep(10);
      process.off('warning', onWarning);
      assert.equal(warnings.length, 1);
      assert.match(warnings[0]!, /1 peer\(s\) still map/);
    } finally {
      child.kill('SIGKILL');
      await new Promise((r) => child.once('exit', r));
    }
  });

  test('device buffers collected without close(): one warning naming kind and size (and, when tracing, where), memory freed', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const device = Device.get(0);
    const leakEight = async (): Promise<Array<Error & { code?: string }>> => {
      const warnings: Array<Error & { code?: string }> = [];
      const onWarning = (w: Error) => warnings.push(w);
      process.on('warning', onWarning);
      try {
        const before = deviceMemoryStats().allocations;
        (() => { for (let i = 0; i < 8; i++) DeviceBuffer.allocate(64 << 20, { device }); })();
        assert.equal(deviceMemoryStats().allocations, before + 8);
        for (let i = 0; i < 6; i++) { gc(); await sleep(5); }
        assert.equal(deviceMemoryStats().allocations, before, 'the backstop freed them');
      } finally {
        process.off('warning', onWarning);
      }
      return warnings.filter((w) => w.code === 'CUDA_IPC_LEAK');
    };
    // Default: no stack per allocation; the warning names the kind and size, and how to trace.
    const plain = await leakEight();
    assert.equal(plain.length, 1);
    assert.match(plain[0]!.message, /A DeviceBuffer \(67108864 bytes\) was garbage-collected without close\(\)[^]*CUDA_IPC_TRACE_LEAKS=1/);
    // Opt-in: the creating line.
    traceLeaks(true);
    try {
      const traced = await leakEight();
      assert.equal(traced.length, 1);
      assert.match(traced[0]!.message, /A DeviceBuffer \(67108864 bytes\) was garbage-collected without close\(\)[^]*Created at:[^]*lifetimes\.test\.js:\d+/);
    } finally {
      traceLeaks(false);
    }
  });

  test('cuda-ipc demo tensors: the consumer reads every dropped tensor correctly', () => {
    const r = spawnSync(process.execPath, [cli, 'demo', 'tensors'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    for (let i = 0; i < 9; i++) assert.match(r.stdout, new RegExp(`tensor ${i}: \\[${i + 1}, ${i + 1}, ${i + 1}, ${i + 1}, ${i + 1}, \\.\\.\\.\\] OK`));
    assert.match(r.stdout, /all 9 tensors freed after the consumer released them/);
    assert.match(r.stdout, /demo tensors: OK/);
  });
});
