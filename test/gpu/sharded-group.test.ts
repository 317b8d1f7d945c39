// Sharded sync groups on GPUs (issue 37): whole groups of processes on device memory, through the
// group's real data paths. CUDA IPC: this process is the hub and rank 0 (an FSDP source on GPU 0),
// ranks 1..3 are children (test/fixtures/shard-member.ts, memory 'device'; spread over two GPUs
// where there are two: peer access), FSDP Shard(0) -> tensor parallel 2 with a fused qkv, a
// row-parallel o_proj (strided runs) and a padded vocabulary, values compared with whole tensors
// sliced, repeated syncs, a source killed mid-sync (ERR_SHARD_PEER_LOST, the version kept) and
// its replacement, then a layout change (an engine stops needing 'norm', in new memory) that
// re-plans. NCCL: two colocated ranks on two node ids (each holds an FSDP shard
// and needs a TP slice: a 'local' pair and an 'nccl' pair each), on NCCL's own path (two GPUs) and
// on the forced network path, each rank an NCCL host of its own (asOwnHost: with one GPU both ranks
// sit on it as two machines would); this process is a hub holding nothing (it never joins the
// communicator); a rank killed mid-sync and its replacement. Then six ranks on six nodes (FSDP
// sources -> two TP2 replicas) on the network path, a destination killed mid-sync. The CPU twin:
// test/cpu/sharded-group.test.ts.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import type { IpcError } from '../../src/errors.js';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { Stream } from '../../src/cuda/stream.js';
import { DeviceArray } from '../../src/arrays/device-array.js';
import { LayoutBuilder, ShardGroup } from '../../src/tensors/sharded/index.js';
import { allocate, fillSources, scenarioLayout, type Scenario } from '../helpers/shard-group.js';
import { noGpu } from '../helpers/gpu.js';
import { asOwnHost, fewerGpusThan, ncclOrReason } from '../helpers/nccl-ranks.js';
import { waitUntil } from '../helpers/wait.js';
import { startMember, type Member, type Reply } from '../helpers/shard-members.js';

process.env.NCCL_NVLS_ENABLE = '0'; // inherited by the children: never NVLink SHARP
async function member(rank: number, connectTo: string, scenario: Scenario, env?: Record<string, string>): Promise<{ m: Member; joined: Promise<Reply> }> {
  return startMember(rank, connectTo, { scenario, memory: 'device', answerMs: 120_000, ...(env && { env }) });
}

async function checkAll(members: readonly Member[], version: number): Promise<void> {
  for (const m of members) {
    const r = await m.ask('check', { version });
    assert.deepEqual(r.problems, [], `rank ${m.rank}'s destinations hold version ${version} exactly`);
  }
}

const gpus = noGpu ? 0 : Device.all().length;

describe('sharded sync group over CUDA IPC on device memory', { skip: noGpu }, () => {
  const scenario: Scenario = { sources: 2, tp: 2, gpus: Math.min(gpus, 2) };

  /** The hub: rank 0, an FSDP source on GPU 0 (DeviceArrays; host mirrors fill them). */
  async function hostGroup(): Promise<{ group: ShardGroup; fill: (v: number) => void; members: Member[]; close: () => Promise<void> }> {
    const layout = scenarioLayout(0, scenario);
    const mirrors = allocate(layout.sources);
    const sources = mirrors.map((h) => new DeviceArray(DeviceBuffer.allocate(h.buffer.bytes.length, { device: Device.get(0) }), { dtype: h.dtype, shape: h.shape, strides: h.strides }));
    const fill = (v: number): void => {
      fillSources(layout, mirrors, v);
      sources.forEach((d, i) => d.buffer.write(mirrors[i]!.buffer.bytes, 0));
    };
    const group = await ShardGroup.host({ listen: `shard-gpu-${process.pid}-${randomBytes(3).toString('hex')}`, size: 4, layout, sources, destinations: [] });
    const started = await Promise.all([1, 2, 3].map((r) => member(r, group.address, scenario)));
    for (const { joined } of started) { const j = await joined; assert.equal(j.ok, true, `a member joined: ${j.message ?? ''}`); }
    await group.ready({ timeout: 120_000 });
    const close = async (): Promise<void> => {
      await group.close();
      for (const s of sources) s.buffer.close();
      for (const h of mirrors) h.close();
    };
    return { group, fill, members: started.map((s) => s.m), close };
  }

  test(`2 FSDP sources -> TP2 on ${scenario.gpus} GPU(s): repeated syncs land each version exactly; a source killed mid-sync, then its replacement; a layout change re-plans`, async () => {
    const hub = await hostGroup();
    const { group, members } = hub;
    assert.ok(group.plan!.pairs.some((p) => p.path === 'ipc'), 'rank 0 serves over CUDA IPC');
    using stream = Stream.create(Device.get(0));
    for (const version of [1, 2, 3]) {
      hub.fill(100 + version);
      const replies = await Promise.all([
        // Version 3: the hub waits for the stream its sources were written on, not the whole GPU.
        group.sync({ timeout: 120_000, ...(version === 3 && { stream }) }).then((r) => ({ ok: true, version: r.version } as Reply)),
        ...members.map((m) => m.ask('sync', { version: 100 + version, timeout: 120_000 })),
      ]);
      for (const r of replies) assert.deepEqual([r.ok, r.version, r.code, r.message], [true, version, undefined, undefined], `every rank's sync ${version}`);
      await checkAll(members.slice(1), 100 + version);
    }
    // Rank 1 (the other source) never syncs version 4 and dies: the others fail, keep version 3.
    const victim = members[0]!;
    hub.fill(104);
    const mine = group.sync({ timeout: 120_000 }).then(() => ({ ok: true } as Reply), (e: IpcError & { detail?: any }) => ({ ok: false, code: e.code, detail: e.detail } as Reply));
    const theirs = members.slice(1).map((m) => m.ask('sync', { version: 104, timeout: 120_000 }));
    await victim.kill();
    for (const [i, r] of [await mine, ...(await Promise.all(theirs))].entries()) {
      assert.equal(r.code, 'ERR_SHARD_PEER_LOST', `rank ${i === 0 ? 0 : i + 1}: ${r.message ?? ''}`);
      assert.deepEqual(r.detail.ranks, [1]);
      assert.equal(r.detail.version, 3, 'the version is kept');
    }
    await checkAll(members.slice(1), 103); // nothing of version 4 was copied
    const { m: fresh, joined } = await member(1, group.address, scenario);
    assert.equal((await joined).ok, true);
    await waitUntil(() => group.state === 'ready' && group.epoch === 2, 'the hub to re-plan to epoch 2', 120_000);
    const all = [fresh, ...members.slice(1)];
    hub.fill(105);
    const again = await Promise.all([group.sync({ timeout: 120_000 }).then((r) => ({ ok: true, version: r.version } as Reply)), ...all.map((m) => m.ask('sync', { version: 105, timeout: 120_000 }))]);
    for (const r of again) assert.equal(r.ok, true, r.message);
    assert.equal(group.version, 4, 'versions continue');
    await checkAll(all.slice(1), 105);
    // A layout change: rank 2 (an engine) no longer needs 'norm', in new memory; the group re-plans.
    const relaid = await all[1]!.ask('relayout', { scenario: { ...scenario, withoutNorm: [2] } });
    assert.deepEqual([relaid.ok, relaid.message], [true, undefined]);
    await waitUntil(() => group.state === 'ready' && group.epoch === 3, 'the hub to re-plan to epoch 3', 120_000);
    hub.fill(106);
    const third = await Promise.all([group.sync({ timeout: 120_000 }).then((r) => ({ ok: true, version: r.version } as Reply)), ...all.map((m) => m.ask('sync', { version: 106, timeout: 120_000 }))]);
    for (const r of third) assert.equal(r.ok, true, r.message);
    await checkAll(all.slice(1), 106);
    await Promise.all(all.map((m) => m.ask('close')));
    await hub.close();
  });
});

/**
 * A hub holding nothing (rank `count`, node 'hub': it plans and coordinates but joins no
 * communicator) and members 0..count-1 of `scenario` (each with envOf(rank)), joined and ready;
 * syncAll(members, v): the hub's sync beside each member's of version v.
 */
async function hubOfNothing(tag: string, scenario: Scenario, count: number, envOf: (rank: number) => Record<string, string> | undefined) {
  const layout = new LayoutBuilder({ rank: count, node: 'hub', gpu: 0 }).build();
  const group = await ShardGroup.host({ listen: `shard-${tag}-${process.pid}-${randomBytes(3).toString('hex')}`, size: count + 1, layout, sources: [], destinations: [] });
  const started = await Promise.all(Array.from({ length: count }, (_, r) => member(r, group.address, scenario, envOf(r))));
  for (const { joined } of started) { const j = await joined; assert.equal(j.ok, true, `a member joined: ${j.message ?? ''}`); }
  await group.ready({ timeout: 120_000 });
  const syncAll = (ms: readonly Member[], v: number): Promise<Reply[]> => Promise.all([
    group.sync({ timeout: 120_000 }).then((r) => ({ ok: true, version: r.version } as Reply)),
    ...ms.map((m) => m.ask('sync', { version: v, timeout: 120_000 })),
  ]);
  return { group, members: started.map((s) => s.m), syncAll };
}

const nccl = await ncclOrReason();
const noNccl = noGpu ?? (typeof nccl === 'string' ? nccl : undefined);

describe('sharded sync group over NCCL between two node ids', { skip: noNccl }, () => {
  const paths = [
    { name: 'NCCL\'s own path', gpus: 2, env: (_: string | number): Record<string, string> | undefined => undefined, skip: fewerGpusThan(2) },
    { name: 'the forced network path (sockets over loopback, each rank its own NCCL host)', gpus: Math.min(gpus, 2), env: asOwnHost, skip: undefined },
  ];
  for (const { name, gpus: onGpus, env: envOf, skip } of paths) {
    const scenario: Scenario = { sources: 2, tp: 2, colocated: true, nodePerRank: true, gpus: onGpus };
    test(`two colocated ranks on ${onGpus} GPU(s), FSDP -> TP2 over ${name}: repeated syncs exact, a rank killed mid-sync, its replacement`, { skip }, async () => {
      const { group, members, syncAll } = await hubOfNothing('nccl', scenario, 2, envOf);
      for (const version of [1, 2]) {
        const replies = await syncAll(members, 200 + version);
        for (const r of replies) assert.deepEqual([r.ok, r.version, r.message], [true, version, undefined]);
        assert.ok(replies.slice(1).every((r) => r.paths?.nccl > 0), `every rank moved bytes over NCCL: ${JSON.stringify(replies.map((r) => r.paths))}`);
        await checkAll(members, 200 + version);
      }
      // Rank 1 never syncs version 3 and dies while rank 0 waits in NCCL: rank 0 fails, never hangs.
      const waiting = members[0]!.ask('sync', { version: 203, timeout: 120_000 });
      const hubSync = group.sync({ timeout: 120_000 }).catch((e: IpcError) => ({ ok: false, code: e.code }));
      await members[1]!.kill();
      const r0 = await waiting;
      assert.equal(r0.code, 'ERR_SHARD_PEER_LOST', r0.message);
      assert.deepEqual(r0.detail.ranks, [1]);
      assert.equal(r0.detail.version, 2, 'rank 0 keeps version 2');
      await hubSync;
      const { m: fresh, joined } = await member(1, group.address, scenario, envOf('1-replacement'));
      assert.equal((await joined).ok, true);
      await waitUntil(() => group.state === 'ready' && group.epoch === 2, 'the hub to re-plan to epoch 2', 120_000);
      const all = [members[0]!, fresh];
      const again = await syncAll(all, 204);
      for (const r of again) assert.equal(r.ok, true, r.message);
      await checkAll(all, 204);
      await Promise.all(all.map((m) => m.ask('close')));
      await group.close();
    });
  }
});

// The four-GPU layouts of issue 37 on NCCL's network path: FSDP sources on ranks 0-1, a TP2 engine
// on ranks 2-3 and a second replica of it (data parallel, each needing everything) on ranks 4-5,
// every rank a node (and an NCCL host) of its own, so every byte crosses NCCL; where there are
// fewer GPUs than ranks they share them. A destination killed mid-sync, then its replacement.
describe('sharded sync group over NCCL: 2 FSDP sources -> 2 replicas of TP2, six nodes', { skip: noNccl }, () => {
  const scenario: Scenario = { sources: 2, tp: 2, replicas: 2, nodePerRank: true, gpus: Math.min(gpus, 6) };
  test(`six ranks on ${scenario.gpus} GPU(s) over the forced network path: repeated syncs exact on both replicas; a destination killed mid-sync, its replacement`, async () => {
    const { group, members, syncAll } = await hubOfNothing('nccl6', scenario, 6, asOwnHost);
    assert.ok(group.plan!.pairs.every((p) => p.path === 'nccl'), 'every pair between two nodes goes over NCCL');
    for (const version of [1, 2]) {
      const replies = await syncAll(members, 300 + version);
      for (const r of replies) assert.deepEqual([r.ok, r.version, r.message], [true, version, undefined]);
      await checkAll(members.slice(2), 300 + version);
    }
    // Destination rank 3 never syncs version 3 and dies: every other rank fails, keeps version 2.
    const victim = members[3]!;
    const others = members.filter((m) => m !== victim);
    const pending = others.map((m) => m.ask('sync', { version: 303, timeout: 120_000 }));
    const hubSync = group.sync({ timeout: 120_000 }).then(() => ({ ok: true } as Reply), (e: IpcError & { detail?: any }) => ({ ok: false, code: e.code, detail: e.detail } as Reply));
    await victim.kill();
    for (const [i, r] of (await Promise.all(pending)).entries()) {
      assert.equal(r.code, 'ERR_SHARD_PEER_LOST', `rank ${others[i]!.rank}: ${r.message ?? ''}`);
      assert.deepEqual(r.detail.ranks, [3], `rank ${others[i]!.rank} names the lost rank`);
      assert.equal(r.detail.version, 2, 'the version is kept');
    }
    await hubSync;  // the hub holds nothing: its sync has nothing to wait for, either way
    const { m: fresh, joined } = await member(3, group.address, scenario, asOwnHost('3-replacement'));
    assert.equal((await joined).ok, true);
    await waitUntil(() => group.state === 'ready' && group.epoch === 2, 'the hub to re-plan to epoch 2', 120_000);
    const all = members.map((m) => (m === victim ? fresh : m));
    const again = await syncAll(all, 304);
    for (const r of again) assert.equal(r.ok, true, r.message);
    await checkAll(all.slice(2), 304);
    await Promise.all(all.map((m) => m.ask('close')));
    await group.close();
  });
});
