// NCCL between processes on this machine's GPUs, on NCCL's own choice of path (NVLink here):
// 1 GiB each way and both ways at once with every value checked, a peer SIGKILLed while a recv
// from it is queued, and a broadcast to three receivers. This process is rank 0; the other ranks
// are child processes (test/fixtures/nccl-gpu-child.ts), each on its own GPU: NCCL refuses two
// ranks on one GPU, so these skip, saying so, on fewer GPUs. The socket path is
// test/gpu/nccl-net.test.ts, Node <-> Python test/gpu/nccl-python.test.ts.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { Stream } from '../../src/cuda/stream.js';
import { BuiltinKernels } from '../../src/cuda/builtins.js';
import { ask, endRanks, fewerGpusThan, ncclDebugLogs, ncclOrReason, rate, spawnRanks, within, GiB, MiB } from '../helpers/nccl-ranks.js';
import { bothWays, initAll, peerKilled } from '../helpers/nccl-scenarios.js';

process.env.NCCL_NVLS_ENABLE = '0';  // in this process and every child: never NVLink SHARP (cuMulticastCreate)
const nccl = await ncclOrReason();
const noNccl = typeof nccl === 'string' ? nccl : undefined;
const library = typeof nccl === 'string' ? undefined : nccl;
const skipPair = noNccl ?? fewerGpusThan(2);
const skipFour = noNccl ?? fewerGpusThan(4);

describe('NCCL between processes (NVLink or whatever NCCL picks)', () => {
  test('the library found', { skip: noNccl }, (t) => {
    t.diagnostic(`NCCL ${library!.version} from ${library!.path} (${library!.source})`);
    assert.match(library!.version, /^\d+\.\d+\.\d+$/);
  });

  test('1 GiB each way and both ways at once, every value checked', { skip: skipPair }, async (t) => {
    const logs = ncclDebugLogs();
    await bothWays(t, library!, [Device.get(0), Device.get(1)], GiB, logs.env);
    const via = [...new Set(logs.text().match(/via [A-Za-z0-9/_ ]+/g) ?? [])];
    t.diagnostic(`the child's NCCL connected ${via.join('; ') || '(no transport line in its debug log)'}`);
  });

  test('broadcast of 256 MiB from rank 0 to three receivers, every value checked', { skip: skipFour }, async (t) => {
    const devices = [0, 1, 2, 3].map((i) => Device.get(i));
    const ranks = await spawnRanks(devices.slice(1));
    try {
      const comm = await initAll(library!, devices[0]!, ranks);
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
  });

  // Last: a kernel that touched the dead peer's memory may leave this process's context lost.
  test('a peer SIGKILLed while a recv from it is queued: noticed, aborted, the stream still usable (or the error typed)', { skip: skipPair }, async (t) => {
    await peerKilled(t, library!, [Device.get(0), Device.get(1)]);
  });
});
