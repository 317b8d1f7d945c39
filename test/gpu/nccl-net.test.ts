// NCCL between processes forced onto its network path: P2P and shared memory off, the socket
// transport over loopback (what two machines without InfiniBand would use), set here before NCCL
// reads its environment and inherited by the child ranks; each rank an NCCL host of its own
// (asOwnHost: NCCL_HOSTID), so that with one GPU both ranks sit on it as two machines would. 1 GiB
// each way and both ways at once with every value checked (the child's NCCL debug log must show
// NET/Socket connections), a broadcast to three receivers, and a peer SIGKILLed while a recv from
// it is queued.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { asOwnHost, ncclDebugLogs, ncclOrReason, netRankDevice, GiB } from '../helpers/nccl-ranks.js';
import { bothWays, broadcastToThree, peerKilled } from '../helpers/nccl-scenarios.js';

// Before any NCCL call in this process (NCCL reads each variable once).
Object.assign(process.env, { NCCL_NVLS_ENABLE: '0' }, asOwnHost(0));
const there = asOwnHost(1);  // the child rank's host
const nccl = await ncclOrReason();
const skip = typeof nccl === 'string' ? nccl : undefined;
const library = typeof nccl === 'string' ? undefined : nccl;

describe('NCCL between processes on the socket transport (loopback)', { skip }, () => {
  test('1 GiB each way and both ways at once over NET/Socket, every value checked', async (t) => {
    const logs = ncclDebugLogs();
    await bothWays(t, library!, [netRankDevice(0), netRankDevice(1)], GiB, { ...there, ...logs.env });
    const text = logs.text();
    assert.match(text, /via NET\/Socket/, 'the child\'s NCCL connected through the socket transport');
    assert.doesNotMatch(text, /via P2P\/|via SHM\//, 'not through P2P or shared memory');
  });

  test('broadcast of 256 MiB from rank 0 to three receivers, each its own NCCL host, every value checked', async (t) => {
    await broadcastToThree(t, library!, [0, 1, 2, 3].map(netRankDevice), (i) => asOwnHost(`receiver-${i}`));
  });

  test('a peer SIGKILLed while a recv from it is queued: noticed, aborted, the stream still usable (or the error typed)', async (t) => {
    await peerKilled(t, library!, [netRankDevice(0), netRankDevice(1)], there);
  });
});
