// The sharded sync's device data paths run for real on the CPU: the driver faked in JavaScript
// (test/helpers/fake-cuda.ts: device memory is host memory, copy_runs runs on the CPU from the
// table the copier uploaded) and NCCL by the fake libnccl moving bytes between two processes
// through files (FAKE_NCCL_MOVE_DIR). The device copier in this process: every destination byte of
// the planner's scenarios and of the small model as the reference says, one launch per copy, the
// same batch again uploading nothing. The NCCL mover between two child ranks
// (test/fixtures/sharded-fake-child.ts): the GPU test's syncs (test/gpu/sharded-paths.test.ts),
// staged and direct chunks, both directions in each round. Skips the mover where no C compiler
// builds the fake libnccl.
import { installFakeCuda } from '../helpers/fake-cuda.js';  // first: before anything loads the driver
import { describe, test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { NCCL_LIBRARY_ENV } from '../../src/nccl/discovery.js';
import { planSharded, type PlanPair, type RankLayout } from '../../src/tensors/sharded/index.js';
import type { CopyBatch, RunMemory } from '../../src/tensors/sharded/execute-types.js';
import { deviceRunCopier } from '../../src/tensors/sharded/device-copy.js';
import { ncclRunMover } from '../../src/tensors/sharded/nccl-runs.js';
import { fakeNccl, noFakeNccl } from '../helpers/fake-nccl.js';
import { endRanks } from '../helpers/nccl-ranks.js';
import { differences, expectedDestinations, extentOf, pathLayouts, sourceBytes, SENTINEL } from '../helpers/sharded-paths.js';
import { moverSyncs, twoRanks } from '../helpers/sharded-ranks.js';
import { scenarios } from './sharded-scenarios.js';

const fake = await installFakeCuda();
const moveDir = mkdtempSync(join(tmpdir(), 'cuda-ipc-sharded-move-'));
after(() => {
  rmSync(moveDir, { recursive: true, force: true });
  fakeNccl?.cleanup();
});

describe('the device copier on the fake driver', () => {
  const cases: Array<{ name: string; layouts: RankLayout[] }> = [
    ...scenarios(),
    { name: 'small model, FSDP halves -> TP halves on one node', layouts: pathLayouts(4, ['n', 'n', 'n', 'n']) },
  ];
  for (const c of cases) {
    test(`${c.name}: one launch per copy, every destination byte as the reference says, the same batch again uploads nothing`, async () => {
      const device = Device.get(0);
      const buffers = new Map<number, { src: DeviceBuffer[]; dst: DeviceBuffer[] }>();
      const mem = (b: DeviceBuffer, n: number): RunMemory => ({ kind: 'device', device, pointer: b.devicePointer, extent: n });
      for (const l of c.layouts) {
        buffers.set(l.rank, {
          src: l.sources.map((t) => DeviceBuffer.allocate(Math.max(1, extentOf(t)))),
          dst: l.destinations.map((t) => DeviceBuffer.allocate(Math.max(1, extentOf(t)))),
        });
      }
      const plan = planSharded(c.layouts);
      const batches = c.layouts.filter((l) => l.destinations.length > 0).map((l) => {
        const pairs = plan.pairs.filter((p) => p.dst === l.rank).map((p) => ({
          pair: { ...p, path: 'local' } as PlanPair,
          sources: buffers.get(p.src)!.src.map((b, i) => mem(b, extentOf(c.layouts.find((x) => x.rank === p.src)!.sources[i]!))),
        }));
        return { l, batch: { pairs, destinations: buffers.get(l.rank)!.dst.map((b, i) => mem(b, extentOf(l.destinations[i]!))) } as CopyBatch };
      });
      const copier = deviceRunCopier(device);
      try {
        for (const seed of [1, 2]) {
          for (const l of c.layouts) {
            sourceBytes(l, seed).forEach((bytes, i) => buffers.get(l.rank)!.src[i]!.write(bytes));
            for (const b of buffers.get(l.rank)!.dst) b.fill(SENTINEL);
          }
          for (const { l, batch } of batches) {
            const launches = fake.launches.length;
            const uploads = fake.calls.get('memcpyHtoDAsync') ?? 0;
            await copier.copy(batch);
            // Two destinations alternate in one copier: each copy plans and uploads its own table.
            assert.equal(fake.launches.length, launches + 1, `rank ${l.rank}: one copy_runs launch`);
            assert.equal(fake.calls.get('memcpyHtoDAsync') ?? 0, uploads + (batches.length > 1 || seed === 1 ? 1 : 0), `rank ${l.rank}: the table uploaded once per new batch`);
            const got = buffers.get(l.rank)!.dst.map((b, i) => b.read().subarray(0, extentOf(l.destinations[i]!)));
            const d = differences(got, expectedDestinations(c.layouts, plan, l.rank, seed), l.destinations.map((t) => t.name));
            assert.equal(d.count, 0, `seed ${seed}, rank ${l.rank}: ${d.first.join('; ')}`);
          }
        }
        // The same batch twice in a row: the second copy uploads nothing and gives the same bytes.
        const { l, batch } = batches[0]!;
        await copier.copy(batch);
        for (const b of buffers.get(l.rank)!.dst) b.fill(SENTINEL);
        const uploads = fake.calls.get('memcpyHtoDAsync') ?? 0;
        await copier.copy(batch);
        assert.equal(fake.calls.get('memcpyHtoDAsync') ?? 0, uploads, 'nothing uploaded for a repeated batch');
        // The same pairs and memories in new objects: nothing uploaded either.
        const rewrapped: CopyBatch = {
          pairs: batch.pairs.map((x) => ({ pair: x.pair, sources: x.sources.map((m) => ({ ...m })) })),
          destinations: batch.destinations.map((m) => ({ ...m })),
        };
        await copier.copy(rewrapped);
        assert.equal(fake.calls.get('memcpyHtoDAsync') ?? 0, uploads, 'nothing uploaded for the same pairs and memories in a new batch');
        // A memory of another extent makes another batch: checked and uploaded again.
        const shorter: CopyBatch = { pairs: rewrapped.pairs, destinations: rewrapped.destinations.map((m) => (m.kind === 'device' ? { ...m, extent: m.extent + 1 } : m)) };
        await copier.copy(shorter);
        assert.equal(fake.calls.get('memcpyHtoDAsync') ?? 0, uploads + 1, 'a batch of other memories is planned and uploaded');
        const got = buffers.get(l.rank)!.dst.map((b, i) => b.read().subarray(0, extentOf(l.destinations[i]!)));
        assert.equal(differences(got, expectedDestinations(c.layouts, plan, l.rank, 2), l.destinations.map((t) => t.name)).count, 0);
      } finally {
        await copier.close();
        for (const r of buffers.values()) for (const b of [...r.src, ...r.dst]) b.close();
      }
    });
  }
});

describe('the NCCL mover between two processes on the fake driver and libnccl', { skip: noFakeNccl }, () => {
  test('both directions in each round, staged and direct chunks, repeated syncs and two chunk sizes exact', async (t) => {
    const env = { [NCCL_LIBRARY_ENV]: fakeNccl!.lib, FAKE_NCCL_MOVE: '1', FAKE_NCCL_MOVE_DIR: moveDir, FAKE_NCCL_MOVE_TIMEOUT_MS: '20000' };
    const ranks = await twoRanks(new URL('../fixtures/sharded-fake-child.js', import.meta.url), env);
    try {
      await moverSyncs(t, ranks);
    } finally {
      await endRanks(ranks);
    }
  });

  test('one staging slot (slots: 1): the same syncs exact, staging one round\'s chunks', async (t) => {
    const env = { [NCCL_LIBRARY_ENV]: fakeNccl!.lib, FAKE_NCCL_MOVE: '1', FAKE_NCCL_MOVE_DIR: moveDir, FAKE_NCCL_MOVE_TIMEOUT_MS: '20000', SHARDED_MOVER_SLOTS: '1' };
    const ranks = await twoRanks(new URL('../fixtures/sharded-fake-child.js', import.meta.url), env);
    try {
      await moverSyncs(t, ranks, 1);
    } finally {
      await endRanks(ranks);
    }
  });

  test('ncclRunMover refuses a slot count other than 1 or 2', () => {
    assert.throws(() => ncclRunMover(Device.get(0), { slots: 3 as 1 }), (e: Error & { code?: string }) => e.code === 'ERR_INVALID_ARG_VALUE' && /slots is 1 or 2/.test(e.message));
  });
});
