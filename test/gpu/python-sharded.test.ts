// The Python sync group on device memory: two Python ranks (python/tests/sharded_member.py with
// torch CUDA tensors), each holding Shard(0) of w and b and needing w's columns 3r..3r+2 and the
// whole b, on GPUs 0 and 1 (both on GPU 0 where there is one): each destination maps the other's
// tensor set (peer access between the GPUs) and copies its 'local' and 'ipc' runs in one copy_runs
// launch; values checked after every sync. Then the same two ranks on different node ids (GPUs 0
// and 1): their runs to each other go over NCCL (one communicator for the epoch, rounds of chunks,
// staged where a chunk is not one range of memory), on NCCL's own path (two GPUs) and on the forced
// network path with each rank its own NCCL host (both on GPU 0 where there is one). Skips without a
// GPU or PyTorch (NCCL's own path: without two GPUs).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { driver } from '../../src/cuda/driver.js';
import { noGpu } from '../helpers/gpu.js';
import { pythonLacks } from '../helpers/python.js';
import { PythonRank } from '../helpers/python-rank.js';
import { asOwnHost, fewerGpusThan } from '../helpers/nccl-ranks.js';

const skip = noGpu ?? pythonLacks('torch');


async function syncPair(nodes: [string, string], gpus: number[], path: 'ipc' | 'nccl', env?: (rank: number) => Record<string, string>): Promise<void> {
  const name = `shard-py-gpu-${process.pid}-${Date.now().toString(36)}`;
  const hub = new PythonRank({ host: name, size: 2, layout: ['interop', 0, gpus[0], nodes[0]], device: true }, 120_000, env?.(0));
  let member: PythonRank | undefined;
  try {
    assert.equal((await hub.next()).listening, true);
    member = new PythonRank({ join: name, layout: ['interop', 1, gpus[1], nodes[1]], device: true }, 120_000, env?.(1));
    assert.equal((await hub.next()).ready, true);
    assert.equal((await member.next()).ready, true);
    for (const version of [1, 2, 3]) {
      hub.send(`sync ${version}`);
      member.send(`sync ${version}`);
      for (const [who, rank] of [['hub', hub], ['member', member]] as const) {
        const r = await rank.next();
        assert.equal(r.error, undefined, `the ${who}'s sync failed: ${r.message}`);
        assert.deepEqual(r.problems, [], `the ${who}'s destinations at version ${version}`);
        assert.equal(r.version, version);
        assert.ok(r.paths.local > 0 && r.paths[path] > 0, `the ${who} copied its own runs and received the other's over ${path}`);
      }
    }
  } finally {
    await member?.exit();
    await hub.exit();
  }
}

test('two Python ranks sync torch CUDA tensors over IPC, one copy_runs launch each, values exact', { skip, timeout: 240_000 }, async () => {
  await syncPair(['n0', 'n0'], driver.deviceGetCount() >= 2 ? [0, 1] : [0, 0], 'ipc');
});

test('two Python ranks on different nodes sync torch CUDA tensors over NCCL\'s own path (two GPUs), values exact', { skip: skip ?? fewerGpusThan(2), timeout: 240_000 }, async () => {
  await syncPair(['a', 'b'], [0, 1], 'nccl');
});

test('two Python ranks on different nodes sync torch CUDA tensors over NCCL\'s network path (each its own NCCL host), values exact', { skip, timeout: 240_000 }, async () => {
  await syncPair(['a', 'b'], driver.deviceGetCount() >= 2 ? [0, 1] : [0, 0], 'nccl', asOwnHost);
});
