// The sharded sync's device data paths on GPUs, driven directly (without the group): the device
// copier on one GPU (every rank's memories of the planner's scenarios and of a small model with
// strided, misaligned and column-major runs; every destination byte compared with the reference;
// the same batch again reuses its table and gives the same bytes for new source values; a run past
// a memory refused with nothing written) and with its sources on a second GPU (peer access); and
// the NCCL mover between two GPUs (two child ranks, test/fixtures/sharded-nccl-child.ts, each
// sending and receiving in the same rounds, staged and direct chunks, repeated syncs, two chunk
// sizes), on NCCL's own path (two GPUs) and on the forced network path (sockets over loopback,
// each rank its own NCCL host, so one GPU serves both). Skips with the reason where there is no GPU
// or too few. The same paths on the fake driver and
// libnccl: test/cpu/sharded-paths-fake.test.ts.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { planSharded, type PlanPair, type RankLayout } from '../../src/tensors/sharded/index.js';
import type { CopyBatch, RunMemory } from '../../src/tensors/sharded/execute-types.js';
import { deviceRunCopier } from '../../src/tensors/sharded/device-copy.js';
import { noGpu } from '../helpers/gpu.js';
import { asOwnHost, endRanks, fewerGpusThan, ncclDebugLogs, ncclOrReason, netRankDevice, within } from '../helpers/nccl-ranks.js';
import { moverSyncs, twoRanks } from '../helpers/sharded-ranks.js';
import { differences, expectedDestinations, extentOf, pathLayouts, sourceBytes, SENTINEL } from '../helpers/sharded-paths.js';
import { scenarios } from '../cpu/sharded-scenarios.js';

process.env.NCCL_NVLS_ENABLE = '0';  // inherited by the children: never NVLink SHARP (cuMulticastCreate)
const nccl = await ncclOrReason();
const noNccl = typeof nccl === 'string' ? nccl : undefined;
const CHILD = new URL('../fixtures/sharded-nccl-child.js', import.meta.url);

/** Why the peer-access case skips here, or undefined. */
function peerSkip(): string | undefined {
  const few = fewerGpusThan(2);
  if (few) return few;
  return Device.get(0).canAccessPeer(Device.get(1)) ? undefined : 'GPU 0 cannot access GPU 1\'s memory (no peer access between them)';
}

/**
 * Every rank's memories of `layouts` (sources on `srcDevice`, destinations on `device`), and a copy
 * batch per destination rank (every pair into it, as 'local').
 */
function materialise(layouts: readonly RankLayout[], device: Device, srcDevice = device) {
  const buffers: DeviceBuffer[] = [];
  const mem = (n: number, on: Device): RunMemory => {
    const b = DeviceBuffer.allocate(Math.max(n, 1), { device: on });
    buffers.push(b);
    return { kind: 'device', device: on, pointer: b.devicePointer, extent: n };
  };
  const byRank = new Map(layouts.map((l) => [l.rank, {
    layout: l,
    src: l.sources.map((t) => mem(extentOf(t), srcDevice)),
    dst: l.destinations.map((t) => mem(extentOf(t), device)),
  }]));
  const plan = planSharded(layouts);
  const batches = layouts.filter((l) => l.destinations.length > 0).map((l) => {
    const pairs = plan.pairs.filter((p) => p.dst === l.rank).map((p) => ({ pair: { ...p, path: 'local' } as PlanPair, sources: byRank.get(p.src)!.src }));
    return { rank: l.rank, batch: { pairs, destinations: byRank.get(l.rank)!.dst } as CopyBatch };
  });
  const buffer = (m: RunMemory): DeviceBuffer => buffers.find((b) => m.kind === 'device' && b.devicePointer === m.pointer)!;
  return {
    plan, batches,
    fill(seed: number): void {
      for (const r of byRank.values()) {
        sourceBytes(r.layout, seed).forEach((bytes, i) => buffer(r.src[i]!).write(bytes));
        for (const m of r.dst) buffer(m).write(new Uint8Array(m.kind === 'device' ? m.extent : 0).fill(SENTINEL));
      }
      device.synchronize();
      srcDevice.synchronize();
    },
    read(rank: number): Uint8Array[] {
      return byRank.get(rank)!.dst.map((m) => buffer(m).read().subarray(0, m.kind === 'device' ? m.extent : 0));
    },
    close(): void {
      for (const b of buffers) b.close();
    },
  };
}

describe('sharded device copier', { skip: noGpu }, () => {
  const cases = [
    ...scenarios(),
    { name: 'small model, FSDP halves -> TP halves on one node', layouts: pathLayouts(4, ['n', 'n', 'n', 'n']) },
  ];
  for (const c of cases) {
    test(`${c.name}: every destination byte as the reference says; the same batch again, new values, same table`, async () => {
      const device = Device.get(0);
      const copier = deviceRunCopier(device);
      const m = materialise(c.layouts, device);
      try {
        for (const seed of [1, 2]) {
          m.fill(seed);
          for (const { rank, batch } of m.batches) await within(copier.copy(batch), 60_000, `the copy into rank ${rank}`);
          for (const { rank } of m.batches) {
            const l = c.layouts.find((x) => x.rank === rank)!;
            const d = differences(m.read(rank), expectedDestinations(c.layouts, m.plan, rank, seed), l.destinations.map((t) => t.name));
            assert.equal(d.count, 0, `seed ${seed}, rank ${rank}: ${d.first.join('; ')}`);
          }
        }
        // A new batch object with the same content: planned and uploaded again, the same bytes.
        m.fill(3);
        for (const { rank, batch } of m.batches) await copier.copy({ pairs: [...batch.pairs], destinations: [...batch.destinations] });
        for (const { rank } of m.batches) {
          const l = c.layouts.find((x) => x.rank === rank)!;
          assert.equal(differences(m.read(rank), expectedDestinations(c.layouts, m.plan, rank, 3), l.destinations.map((t) => t.name)).count, 0, `rank ${rank}, a new batch`);
        }
      } finally {
        await copier.close();
        m.close();
      }
    });
  }

  test('sources on GPU 1 read through peer access (as a mapping of another GPU\'s memory is): every byte as the reference says', { skip: peerSkip() }, async () => {
    const [device, other] = [Device.get(0), Device.get(1)];
    device.enablePeerAccess(other);
    const layouts = pathLayouts(4, ['n', 'n', 'n', 'n']);
    const copier = deviceRunCopier(device);
    const m = materialise(layouts, device, other);
    try {
      m.fill(7);
      for (const { batch } of m.batches) await within(copier.copy(batch), 60_000, 'a copy from GPU 1');
      for (const { rank } of m.batches) {
        const l = layouts.find((x) => x.rank === rank)!;
        const d = differences(m.read(rank), expectedDestinations(layouts, m.plan, rank, 7), l.destinations.map((t) => t.name));
        assert.equal(d.count, 0, `rank ${rank}: ${d.first.join('; ')}`);
      }
    } finally {
      await copier.close();
      m.close();
    }
  });

  test('a run past a destination\'s extent: ERR_OUT_OF_RANGE naming tensor and range, nothing written; the copier still works', async () => {
    const device = Device.get(0);
    const layouts = pathLayouts(4, ['n', 'n', 'n', 'n']);
    const copier = deviceRunCopier(device);
    const m = materialise(layouts, device);
    try {
      m.fill(5);
      const { rank, batch } = m.batches[0]!;
      const short = batch.destinations.map((d, i) => (i === 1 && d.kind === 'device' ? { ...d, extent: d.extent - 1 } : d));
      await assert.rejects(copier.copy({ pairs: batch.pairs, destinations: short }), { name: 'IpcError', code: 'ERR_OUT_OF_RANGE', message: /of destination tensor #1, past its \d+ bytes/ });
      for (const bytes of m.read(rank)) assert.ok(bytes.every((b) => b === SENTINEL), 'no destination byte written');
      await copier.copy(batch);
      assert.equal(differences(m.read(rank), expectedDestinations(layouts, m.plan, rank, 5), layouts.find((l) => l.rank === rank)!.destinations.map((t) => t.name)).count, 0);
    } finally {
      await copier.close();
      m.close();
    }
  });
});

describe('sharded NCCL mover between two ranks', { skip: noNccl }, () => {
  test('NCCL\'s own path (two GPUs): both directions in each round, staged and direct chunks, repeated syncs exact', { skip: fewerGpusThan(2) }, async (t) => {
    const ranks = await twoRanks(CHILD, {}, [Device.get(0), Device.get(1)]);
    try {
      await moverSyncs(t, ranks);
    } finally {
      await endRanks(ranks);
    }
  });

  // Each rank an NCCL host of its own: with one GPU both sit on it, as two machines would.
  test('the forced network path (P2P and SHM off, sockets over loopback, each rank its own NCCL host): the same syncs exact', async (t) => {
    const logs = ncclDebugLogs();
    const ranks = await twoRanks(CHILD, (i) => ({ ...asOwnHost(i), ...logs.env }), [netRankDevice(0), netRankDevice(1)]);
    try {
      await moverSyncs(t, ranks);
    } finally {
      await endRanks(ranks);
    }
    const text = logs.text();
    assert.match(text, /via NET\/Socket/, 'NCCL connected through the socket transport');
    assert.doesNotMatch(text, /via P2P\/|via SHM\//, 'not through P2P or shared memory');
  });

  test('one staging slot (slots: 1) on the network path: gathers wait for the previous scatter, the same syncs exact', async (t) => {
    const ranks = await twoRanks(CHILD, (i) => ({ ...asOwnHost(`slot-${i}`), SHARDED_MOVER_SLOTS: '1' }), [netRankDevice(0), netRankDevice(1)]);
    try {
      await moverSyncs(t, ranks, 1);
    } finally {
      await endRanks(ranks);
    }
  });
});
