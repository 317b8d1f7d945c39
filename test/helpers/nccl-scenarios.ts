// The NCCL GPU scenarios, run on NVLink (test/gpu/nccl.test.ts) and on NCCL's socket transport
// (test/gpu/nccl-net.test.ts): this process is rank 0, child processes the other ranks.
import assert from 'node:assert/strict';
import type { TestContext } from 'node:test';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { Stream } from '../../src/cuda/stream.js';
import { BuiltinKernels } from '../../src/cuda/builtins.js';
import { CudaError, IpcError } from '../../src/errors.js';
import { NcclCommunicator, type NcclLibrary } from '../../src/nccl/index.js';
import { ask, endRanks, rate, spawnRanks, within, HANG, MiB, type Rank } from './nccl-ranks.js';

/** Creates one communicator over this process (rank 0, on `device`) and `ranks` (1..n), all at once. */
export async function initAll(library: NcclLibrary, device: Device, ranks: readonly Rank[]): Promise<NcclCommunicator> {
  const id = library.uniqueId();
  const nranks = ranks.length + 1;
  const [comm, ...replies] = await within(Promise.all([
    NcclCommunicator.init({ uniqueId: id, nranks, rank: 0, device, library, timeout: 120_000 }),
    ...ranks.map((r, i) => ask(r.link, { op: 'init', id, nranks, rank: i + 1 })),
  ]), 180_000, 'creating the communicator');
  assert.deepEqual([comm.rank, comm.nranks], [0, nranks]);
  assert.equal(comm.cudaDevice, device.ordinal, 'NCCL works on the device asked for (its primary context was current)');
  replies.forEach((reply, i) => {
    assert.deepEqual([reply.rank, reply.nranks, reply.cudaDevice], [i + 1, nranks, ranks[i]!.device.ordinal]);
    assert.equal(reply.version, library.version, 'every rank loaded the same NCCL');
  });
  return comm;
}

async function mismatches(kernels: BuiltinKernels, b: DeviceBuffer, seed: number, stream: Stream): Promise<number> {
  return Number((await kernels.verifyPattern(b, 'u32', seed >>> 0, 1, stream)).mismatches);
}

/**
 * `bytes` from this process to a child and back (send/recv), then both ways at once (one group),
 * values checked on the receiving GPU each time; then a collective close.
 */
export async function bothWays(t: TestContext, library: NcclLibrary, devices: [Device, Device], bytes: number, env: NodeJS.ProcessEnv = {}): Promise<void> {
  const [here, there] = devices;
  const ranks = await spawnRanks([there], env);
  try {
    const { link } = ranks[0]!;
    const comm = await initAll(library, here, ranks);
    const kernels = BuiltinKernels.for(here);
    using stream = Stream.create(here);
    using out = DeviceBuffer.allocate(bytes, { device: here });
    using into = DeviceBuffer.allocate(bytes, { device: here });

    kernels.fillPattern(out, 'u32', 11, 1, stream);
    await stream.synchronize();
    let t0 = performance.now();
    const [, received] = await within(Promise.all([
      comm.send(out, bytes, 1, { stream }).then(() => stream.synchronize()),
      ask(link, { op: 'recv', bytes, peer: 0, seed: 11 }),
    ]), 300_000, 'send to the child');
    t.diagnostic(`rank 0 -> 1, ${bytes} bytes: ${rate(bytes, performance.now() - t0)}; the receiver's own view: ${rate(bytes, received.ms)}`);
    assert.equal(received.mismatches, 0, 'the child received every value');

    into.fill(0, { stream });
    await stream.synchronize();
    t0 = performance.now();
    await within(Promise.all([
      comm.recv(into, bytes, 1, { stream }).then(() => stream.synchronize()),
      ask(link, { op: 'send', bytes, peer: 0, seed: 12 }),
    ]), 300_000, 'receive from the child');
    t.diagnostic(`rank 1 -> 0, ${bytes} bytes: ${rate(bytes, performance.now() - t0)}`);
    assert.equal(await mismatches(kernels, into, 12, stream), 0, 'this process received every value');

    kernels.fillPattern(out, 'u32', 14, 1, stream);
    into.fill(0, { stream });
    await stream.synchronize();
    t0 = performance.now();
    const [, exchanged] = await within(Promise.all([
      comm.group([{ op: 'send', buffer: out, bytes, peer: 1 }, { op: 'recv', buffer: into, bytes, peer: 1 }], { stream }).then(() => stream.synchronize()),
      ask(link, { op: 'exchange', bytes, peer: 0, seed: 13, peerSeed: 14 }),
    ]), 300_000, 'the exchange');
    t.diagnostic(`both ways at once (one group), ${bytes} bytes each: ${rate(2 * bytes, performance.now() - t0)}`);
    assert.equal(exchanged.mismatches, 0);
    assert.equal(await mismatches(kernels, into, 13, stream), 0);

    await within(Promise.all([comm.close({ timeout: 120_000 }), ask(link, { op: 'close' })]), 180_000, 'the collective close');
    assert.equal(comm.closed, true);
  } finally {
    await endRanks(ranks);
  }
}

/**
 * A child rank is SIGKILLed while this process's recv from it is queued: this process notices
 * (the link closes with ERR_PEER_GONE; NCCL's own asyncError is reported), abort() settles (a
 * hang fails after 60 s; a typed NcclError is an answer), and the stream finishes and runs new
 * work, or says why not with a typed error (a kernel that touched the dead peer's memory may have
 * lost this context: CUDA_ERROR_CONTAINED). Run it last in a file: the context may be gone after.
 */
export async function peerKilled(t: TestContext, library: NcclLibrary, devices: [Device, Device], env: NodeJS.ProcessEnv = {}): Promise<void> {
  const [here, there] = devices;
  const ranks = await spawnRanks([there], env);
  const bytes = 64 * MiB;
  const stream = Stream.create(here);
  const into = DeviceBuffer.allocate(bytes, { device: here });
  try {
    const { link, child } = ranks[0]!;
    const comm = await initAll(library, here, ranks);
    const kernels = BuiltinKernels.for(here);
    // One transfer first: NCCL connects peers on their first operation, which needs both alive.
    await within(Promise.all([
      comm.recv(into, bytes, 1, { stream }).then(() => stream.synchronize()),
      ask(link, { op: 'send', bytes, peer: 0, seed: 21 }),
    ]), 120_000, 'the first transfer');
    assert.equal(await mismatches(kernels, into, 21, stream), 0);

    await comm.recv(into, bytes, 1, { stream });  // queued; its sender is about to die
    const gone = new Promise<IpcError | undefined>((resolve) => link.once('close', resolve));
    child.kill('SIGKILL');
    const why = await within(gone, 60_000, 'noticing the death through the link');
    assert.equal(why?.code, 'ERR_PEER_GONE');
    t.diagnostic(`NCCL's asyncError once the link closed: ${comm.asyncError()}`);

    const t0 = performance.now();
    try {
      await within(comm.abort(), 60_000, 'abort()');
      t.diagnostic(`abort() returned after ${(performance.now() - t0).toFixed(1)} ms`);
    } catch (e) {
      if ((e as { code?: string }).code === HANG) throw e;
      assert.equal((e as { code?: string }).code, 'ERR_NCCL', `abort() failed untyped: ${String(e)}`);
      t.diagnostic(`abort() answered ${(e as Error).message} after ${(performance.now() - t0).toFixed(1)} ms`);
    }
    assert.equal(comm.closed, true);

    // cuStreamQuery, not a host function: a lost context may never run one.
    const q0 = performance.now();
    for (;;) {
      let done: boolean;
      try {
        done = stream.query();
      } catch (e) {
        assert.ok(e instanceof CudaError, `untyped error from the stream: ${String(e)}`);
        t.diagnostic(`the stream reports ${e.code} after the abort`);
        return;
      }
      if (done) break;
      assert.ok(performance.now() - q0 < 60_000, 'the stream of the abandoned recv never finished');
      await new Promise((r) => setTimeout(r, 10));
    }
    kernels.fillPattern(into, 'u32', 22, 1, stream);
    assert.equal(await mismatches(kernels, into, 22, stream), 0, 'the stream runs new work after the abort');
  } finally {
    await endRanks(ranks);
    for (const r of [into, stream]) {
      try {
        r.close();
      } catch (e) {
        if (!(e instanceof CudaError)) throw e;  // the context was lost (reported above)
      }
    }
  }
}

/**
 * A broadcast of 256 MiB from this process (rank 0, on devices[0]) to three child ranks on
 * devices[1..3] (with env(i) added to the i-th child's environment), every value checked on each
 * receiver, the root's buffer untouched; then a collective close.
 */
export async function broadcastToThree(t: TestContext, library: NcclLibrary, devices: readonly Device[], env?: (i: number) => NodeJS.ProcessEnv): Promise<void> {
  const ranks = await spawnRanks(devices.slice(1), env);
  try {
    const comm = await initAll(library, devices[0]!, ranks);
    const bytes = 256 * MiB;
    const kernels = BuiltinKernels.for(devices[0]!);
    using stream = Stream.create(devices[0]!);
    using b = DeviceBuffer.allocate(bytes, { device: devices[0]! });
    kernels.fillPattern(b, 'u32', 31, 1, stream);
    await stream.synchronize();
    const t0 = performance.now();
    const [, ...replies] = await within(Promise.all([
      comm.broadcast(b, bytes, 0, { stream }).then(() => stream.synchronize()),
      ...ranks.map((r) => ask(r.link, { op: 'broadcast', bytes, root: 0, seed: 31 })),
    ]), 300_000, 'the broadcast');
    t.diagnostic(`broadcast of ${bytes} bytes to 3 ranks: ${rate(bytes, performance.now() - t0)} per receiver`);
    assert.deepEqual(replies.map((r) => r.mismatches), [0, 0, 0], 'each receiver got every value');
    assert.equal(Number((await kernels.verifyPattern(b, 'u32', 31, 1, stream)).mismatches), 0, 'the root\'s buffer is untouched');
    await within(Promise.all([comm.close({ timeout: 120_000 }), ...ranks.map((r) => ask(r.link, { op: 'close' }))]), 180_000, 'the collective close');
  } finally {
    await endRanks(ranks);
  }
}
