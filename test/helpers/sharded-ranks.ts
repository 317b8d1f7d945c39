// Two child ranks of the sharded NCCL mover (test/fixtures/sharded-nccl-child.ts, or its wrapper
// on the fake driver and libnccl, sharded-fake-child.ts), one communicator between them, and the
// syncs both the GPU test (test/gpu/sharded-paths.test.ts) and its CPU twin
// (test/cpu/sharded-paths-fake.test.ts) run: every destination byte checked in each rank.
import assert from 'node:assert/strict';
import type { TestContext } from 'node:test';
import type { Device } from '../../src/cuda/device.js';
import { spawn } from '../../src/link/index.js';
import { ask, endRanks, within, type Rank } from './nccl-ranks.js';

/** Two ranks of `child`, on `devices` where given (else no working device), with `env` (or env(rank)) added. */
export async function twoRanks(child: URL, env: NodeJS.ProcessEnv | ((rank: number) => NodeJS.ProcessEnv), devices?: readonly [Device, Device]): Promise<Rank[]> {
  const ranks = await Promise.all([0, 1].map(async (i) => {
    const device = devices?.[i];
    const { child: proc, link } = await spawn(child, [], { ...(device && { device }), stdio: 'inherit', env: { ...process.env, ...(typeof env === 'function' ? env(i) : env) } });
    return { child: proc, link, device: device as Device };
  }));
  try {
    const { id } = await ask(ranks[0]!.link, { op: 'id' });
    await within(Promise.all(ranks.map((r, i) => ask(r.link, { op: 'init', id, nranks: 2, rank: i }))), 180_000, 'creating the communicator');
  } catch (e) {
    await endRanks(ranks);
    throw e;
  }
  return ranks;
}

/**
 * Syncs of pathLayouts(2, ['a', 'b']) (each rank sends and receives over NCCL in the same rounds
 * and copies its local runs): repeated, two chunk sizes (a chunk of 10,000 bytes cuts strided
 * runs mid-block); every destination byte checked in each rank; then a collective close.
 */
export async function moverSyncs(t: TestContext, ranks: readonly Rank[], slots: 1 | 2 = 2): Promise<void> {
  const nodes = ['a', 'b'];
  for (const [seed, chunkBytes] of [[1, 10_000], [2, 10_000], [3, 1 << 20], [4, 10_000]] as const) {
    const replies = await within(Promise.all(ranks.map((r) => ask(r.link, { op: 'sync', nodes, seed, chunkBytes }))), 300_000, `sync ${seed}`);
    replies.forEach((reply, i) => {
      assert.equal(reply.mismatches, 0, `rank ${i}, sync ${seed}: ${reply.first.join('; ')}`);
      assert.ok(reply.nccl.sent > 0 && reply.nccl.received > 0 && reply.local > 0, 'both directions over NCCL, and local runs');
      // One send and one receive per round: a slot holds at most two chunks (each at a 256-byte boundary).
      assert.ok(reply.staging > 0 && reply.staging <= slots * (2 * chunkBytes + 256), `rank ${i}: staging ${reply.staging} bytes in ${slots} slot(s)`);
      if (seed === 1) t.diagnostic(`rank ${i}: ${reply.nccl.sent} bytes sent, ${reply.nccl.received} received over NCCL, ${reply.local} copied locally; staging ${reply.staging} bytes (chunk ${chunkBytes})`);
    });
  }
  await within(Promise.all(ranks.map((r) => ask(r.link, { op: 'close' }))), 180_000, 'the collective close');
}
