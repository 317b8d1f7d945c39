// NCCL between processes on this machine's GPUs, on NCCL's own choice of path (NVLink here):
// 1 GiB each way and both ways at once with every value checked, a peer SIGKILLed while a recv
// from it is queued, and a broadcast to three receivers. This process is rank 0; the other ranks
// are child processes (test/fixtures/nccl-gpu-child.ts), each on its own GPU: NCCL refuses two
// ranks on one GPU of one host, so these skip, saying so, on fewer GPUs. The socket path, where
// each rank is an NCCL host of its own and one GPU serves them all: test/gpu/nccl-net.test.ts;
// Node <-> Python: test/gpu/nccl-python.test.ts.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Device } from '../../src/cuda/device.js';
import { fewerGpusThan, ncclDebugLogs, ncclOrReason, GiB } from '../helpers/nccl-ranks.js';
import { bothWays, broadcastToThree, peerKilled } from '../helpers/nccl-scenarios.js';

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
    await broadcastToThree(t, library!, [0, 1, 2, 3].map((i) => Device.get(i)));
  });

  // Last: a kernel that touched the dead peer's memory may leave this process's context lost.
  test('a peer SIGKILLed while a recv from it is queued: noticed, aborted, the stream still usable (or the error typed)', { skip: skipPair }, async (t) => {
    await peerKilled(t, library!, [Device.get(0), Device.get(1)]);
  });
});
