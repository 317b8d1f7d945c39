// The sync group's NCCL orchestration on the CPU (issue 37): two ranks on different nodes with
// device memory (the driver faked in JavaScript, test/helpers/fake-cuda.ts: device memory is host
// memory) and NCCL by the fake libnccl (test/fixtures/fake-nccl.c). What runs is the group's own
// code: the 'nccl' flags of 'planned', the hub's unique id in 'ready', one NcclCommunicator per
// epoch over the ranks with NCCL pairs (comm rank = index), the mover called with this rank's
// sends and receives and the plan's chunkBytes, the device copier for the 'local' pair, versions;
// a rank lost while the NCCL move waits: the communicator aborted, the move failing, halfWritten
// naming the tensor the receive was writing. The data paths are the test's (s2's device copier and
// NCCL mover run on GPUs: test/gpu/sharded-*.test.ts): a copier over the fake's memory and a mover
// that hands bytes between the two ranks in this process. Mixing host and device memory in one
// rank, and NCCL pairs on host memory, are typed errors.
import { installFakeCuda } from '../helpers/fake-cuda.js'; // first: before anything loads the driver
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { DeviceArray } from '../../src/arrays/device-array.js';
import { Device } from '../../src/cuda/device.js';
import { Stream } from '../../src/cuda/stream.js';
import { NCCL_LIBRARY_ENV } from '../../src/nccl/discovery.js';
import type { NcclCommunicator } from '../../src/nccl/communicator.js';
import { HostArray } from '../../src/tensors/index.js';
import { IpcError } from '../../src/errors.js';
import {
  LayoutBuilder, RUN_FIELDS, ShardGroup, type CopyBatch, type PlanPair, type ExecutorFactory, type NcclPairs, type RunMemory, type RankLayout,
} from '../../src/tensors/sharded/index.js';
import { copyHostRuns } from '../../src/tensors/sharded/host-copy.js';
import { fakeNccl, noFakeNccl } from '../helpers/fake-nccl.js';
import { forgetDiscoveries, openCommunicators } from '../helpers/nccl-testing.js';
import { waitUntil } from '../helpers/wait.js';

if (fakeNccl) {
  Object.assign(process.env, { [NCCL_LIBRARY_ENV]: fakeNccl.lib, FAKE_NCCL_LOG: fakeNccl.log });
  forgetDiscoveries();
}
const fake = await installFakeCuda();
after(() => fakeNccl?.cleanup());

/** The fake's host bytes behind a device RunMemory. */
function bytesOf(m: RunMemory): Uint8Array {
  if (m.kind === 'host') return m.bytes;
  for (const [base, hb] of fake.allocations) {
    if (m.pointer >= base && m.pointer + BigInt(m.extent) <= base + BigInt(hb.byteLength)) return hb.bytes.subarray(Number(m.pointer - base), Number(m.pointer - base) + m.extent);
  }
  throw new Error(`no fake allocation holds 0x${m.pointer.toString(16)}`);
}
const asHost = (ms: readonly RunMemory[]): RunMemory[] => ms.map((m) => ({ kind: 'host', bytes: bytesOf(m) }));

interface MoveCall { rank: number; nranks: number; commRanks: number[]; sends: string[]; recvs: string[]; chunkBytes: number }

/**
 * Data paths for the test: copies through the fake's memory; NCCL "streams" handed over in this
 * process. `recvFails`: a receive fails at once as NCCL's does when its socket to the peer closes
 * (ncclRemoteError, which names no rank), then calls `afterFailure`.
 */
function executors(calls: MoveCall[], recvFails?: { afterFailure: () => void }): Partial<ExecutorFactory> {
  const mail = new Map<string, Uint8Array>();
  const pack = (pair: { runs: Float64Array }, mem: Uint8Array[]): Uint8Array => {
    const out: number[] = [];
    const r = pair.runs;
    for (let i = 0; i < r.length; i += RUN_FIELDS) for (let c = 0; c < r[i + 5]!; c++) out.push(...mem[r[i]!]!.subarray(r[i + 2]! + c * r[i + 6]!, r[i + 2]! + c * r[i + 6]! + r[i + 4]!));
    return Uint8Array.from(out);
  };
  return {
    device: () => ({ copy: async (b: CopyBatch) => copyHostRuns({ destinations: asHost(b.destinations), pairs: b.pairs.map((p) => ({ pair: p.pair, sources: asHost(p.sources) })) }), close: async () => {} }),
    nccl: () => ({
      async move(comm: NcclCommunicator, commRank: (r: number) => number, pairs: NcclPairs, sources: readonly RunMemory[], destinations: readonly RunMemory[], chunkBytes: number | ((p: PlanPair) => number)) {
        const pair = pairs.sends[0] ?? pairs.recvs[0]!;
        calls.push({ rank: comm.rank, nranks: comm.nranks, commRanks: [0, 1].map(commRank), sends: pairs.sends.map((p) => `${p.src}->${p.dst}`), recvs: pairs.recvs.map((p) => `${p.src}->${p.dst}`), chunkBytes: typeof chunkBytes === 'number' ? chunkBytes : chunkBytes(pair) });
        const src = sources.map(bytesOf);
        for (const p of pairs.sends) mail.set(`${p.src}->${p.dst}`, pack(p, src));
        const dst = destinations.map(bytesOf);
        for (const p of pairs.recvs) {
          if (recvFails) {
            setImmediate(recvFails.afterFailure);
            throw new IpcError('ERR_NCCL', 'ncclGroupEnd failed: ncclRemoteError (6): remote process exited or there was a network error');
          }
          const key = `${p.src}->${p.dst}`;
          // Like NCCL, the receive waits for its peer; an aborted communicator ends the wait.
          const until = Date.now() + 60_000;
          while (!mail.has(key)) {
            if (comm.closed) throw new IpcError('ERR_NCCL', 'the communicator was aborted while a receive waited');
            if (Date.now() > until) throw new Error(`test mover: ${key} never came`);
            await new Promise((r) => setTimeout(r, 2));
          }
          const bytes = mail.get(key)!;
          mail.delete(key);
          let at = 0;
          const r = p.runs;
          for (let i = 0; i < r.length; i += RUN_FIELDS) for (let c = 0; c < r[i + 5]!; c++) { dst[r[i + 1]!]!.set(bytes.subarray(at, at + r[i + 4]!), r[i + 3]! + c * r[i + 7]!); at += r[i + 4]!; }
        }
        return { staging: 0 };
      },
      close: async () => {},
    }),
  };
}

// Rank 0 on node 'a' holds rows 0-1 of w; rank 1 on node 'b' holds rows 2-3 and needs all of w.
const w = { dtype: 'float32' as const, shape: [4, 4] };
const layouts: RankLayout[] = [
  new LayoutBuilder({ rank: 0, node: 'a', gpu: 0 }).hold('w.shard', { ...w, tensor: 'w', mesh: [2], placements: [{ shard: 0 }], coordinate: [0] }).build(),
  new LayoutBuilder({ rank: 1, node: 'b', gpu: 0 }).hold('w.shard', { ...w, tensor: 'w', mesh: [2], placements: [{ shard: 0 }], coordinate: [1] }).need('w', w).build(),
];
const initLines = (): string[] => fakeNccl!.lines().filter((l) => l.startsWith('init '));

async function pair(calls: MoveCall[], chunkBytes = 1024, hubRecvFails?: { afterFailure: () => void }): Promise<{ hub: ShardGroup; member: ShardGroup; shards: DeviceArray[]; out: DeviceArray; name: string }> {
  const shards = [0, 1].map(() => DeviceArray.allocate('float32', [2, 4]));
  const out = DeviceArray.allocate('float32', [4, 4]);
  const name = `shard-nccl-${process.pid}-${randomBytes(3).toString('hex')}`;
  const paths = executors(calls); // one mailbox for both ranks
  const hub = await ShardGroup.host({ listen: name, size: 2, chunkBytes, layout: layouts[1]!, sources: [shards[1]!], destinations: [out], executors: hubRecvFails ? executors(calls, hubRecvFails) : paths });
  const member = await ShardGroup.join({ connect: name, layout: layouts[0]!, sources: [shards[0]!], executors: paths, timeout: 30_000 });
  await hub.ready({ timeout: 30_000 });
  return { hub, member, shards, out, name };
}

test('NCCL pairs: one communicator per epoch over the ranks with NCCL pairs, the mover given each rank\'s sends and receives and chunkBytes; values exact', { skip: noFakeNccl }, async () => {
  const before = initLines().length;
  const calls: MoveCall[] = [];
  const { hub, member, shards, out } = await pair(calls, 4096);
  assert.equal(initLines().length - before, 2, 'one communicator: two ranks of it');
  for (const step of [1, 2]) {
    shards.forEach((a, r) => a.write(Float32Array.from({ length: 8 }, (_, i) => 10 * step + 8 * r + i)));
    const [a, b] = await Promise.all([hub.sync(), member.sync()]);
    assert.deepEqual([a.version, b.version], [step, step]);
    assert.deepEqual(a.paths, { local: 32, ipc: 0, nccl: 32 }, 'rank 1: its own rows locally, rank 0\'s over NCCL');
    assert.deepEqual(Array.from(out.read() as Float32Array), Array.from({ length: 16 }, (_, i) => 10 * step + i));
  }
  // sync({ stream }): each rank waits for the stream its sources were written on, not the whole device.
  const streams = [hub, member].map(() => Stream.create(Device.get(0)));
  const syncsBefore = fake.calls.get('ctxSynchronize') ?? 0;
  shards.forEach((a, r) => a.write(Float32Array.from({ length: 8 }, (_, i) => 30 + 8 * r + i)));
  const [s3] = await Promise.all([hub.sync({ stream: streams[0]! }), member.sync({ stream: streams[1]! })]);
  assert.equal(s3.version, 3);
  assert.deepEqual(Array.from(out.read() as Float32Array), Array.from({ length: 16 }, (_, i) => 30 + i));
  assert.equal((fake.calls.get('ctxSynchronize') ?? 0) - syncsBefore, 0, 'no device-wide synchronise');
  await assert.rejects(hub.sync({ stream: 5 as unknown as Stream }), (e: Error & { code?: string }) => e.code === 'ERR_INVALID_ARG_TYPE' && /options.stream must be a Stream/.test(e.message));
  for (const st of streams) st.close();
  const mine = calls.filter((c) => c.recvs.length > 0);
  const theirs = calls.filter((c) => c.sends.length > 0);
  assert.equal(mine.length, 3);
  assert.deepEqual(mine[0], { rank: 1, nranks: 2, commRanks: [0, 1], sends: [], recvs: ['0->1'], chunkBytes: 4096 });
  assert.deepEqual(theirs[0], { rank: 0, nranks: 2, commRanks: [0, 1], sends: ['0->1'], recvs: [], chunkBytes: 4096 });
  // A re-plan: a new epoch, a new communicator; the old one ended.
  await hub.relayout();
  await waitUntil(() => member.epoch === 2 && member.state === 'ready', 'the member at epoch 2');
  assert.equal(initLines().length - before, 4, 'epoch 2 made one more communicator (two ranks)');
  const [a] = await Promise.all([hub.sync(), member.sync()]);
  assert.equal(a.version, 4);
  await member.close();
  await hub.close();
  assert.equal(openCommunicators(), 0, 'every communicator ended');
  for (const m of [...shards, out]) m.close();
});

test('a rank lost while the NCCL receive waits: the communicator aborted, ERR_SHARD_PEER_LOST naming the half-written tensor, the version kept', { skip: noFakeNccl }, async () => {
  const calls: MoveCall[] = [];
  const { hub, member, shards, out } = await pair(calls);
  const pending = hub.sync().then(() => assert.fail('the sync succeeded without its sender'), (e: unknown) => e);
  await waitUntil(() => calls.length > 0, 'the mover to start');
  await member.close();
  await assert.rejects(pending.then((e) => { throw e; }), (e: IpcError & { detail?: any }) => {
    assert.equal(e.code, 'ERR_SHARD_PEER_LOST', e.message);
    assert.deepEqual(e.detail.ranks, [0]);
    assert.deepEqual(e.detail.halfWritten, ['w'], 'the NCCL receive into w had begun');
    assert.equal(e.detail.version, 0);
    return true;
  });
  assert.equal(hub.version, 0);
  await hub.close();
  assert.equal(openCommunicators(), 0, 'the aborted communicator is gone');
  for (const m of [...shards, out]) m.close();
});

// NCCL notices a dead peer through its own socket, often before the hub hears of it: the rank waits
// for the hub's verdict and names the rank it gives, or, with none, its own NCCL peers.
test('NCCL fails before the hub learns of the loss: the sync waits for the verdict and fails ERR_SHARD_PEER_LOST naming the lost rank, NCCL\'s error its cause', { skip: noFakeNccl }, async () => {
  const calls: MoveCall[] = [];
  let member: ShardGroup | undefined;
  const g = await pair(calls, 1024, { afterFailure: () => void member!.close() });
  member = g.member;
  const e = await g.hub.sync().then(() => assert.fail('the sync succeeded'), (x: IpcError & { detail?: any }) => x);
  assert.equal(e.code, 'ERR_SHARD_PEER_LOST', e.message);
  assert.deepEqual(e.detail.ranks, [0]);
  assert.deepEqual(e.detail.halfWritten, ['w'], 'the NCCL receive into w had begun');
  assert.equal(e.detail.version, 0);
  assert.match(e.message, /rank 0 was lost/, 'the hub\'s verdict, not a guess');
  await g.hub.close();
  assert.equal(openCommunicators(), 0);
  for (const m of [...g.shards, g.out]) m.close();
});

test('NCCL fails and no rank is lost (the network between them): ERR_SHARD_PEER_LOST naming this rank\'s NCCL peers after the verdict wait, NCCL\'s error its cause', { skip: noFakeNccl }, async () => {
  const calls: MoveCall[] = [];
  const g = await pair(calls, 1024, { afterFailure: () => {} });
  const [mine, theirs] = await Promise.allSettled([g.hub.sync(), g.member.sync()]);
  assert.equal(theirs.status, 'fulfilled', 'the sender\'s side of the fake finished');
  assert.equal(mine.status, 'rejected');
  const e = (mine as PromiseRejectedResult).reason as IpcError & { detail?: any; cause?: any };
  assert.equal(e.code, 'ERR_SHARD_PEER_LOST', e.message);
  assert.deepEqual(e.detail.ranks, [0], 'rank 1\'s only NCCL peer');
  assert.deepEqual(e.detail.halfWritten, ['w']);
  assert.equal(e.detail.version, 0);
  assert.equal(e.cause?.code, 'ERR_NCCL');
  assert.match(e.message, /NCCL transfers failed \(ncclGroupEnd failed: ncclRemoteError/);
  assert.equal(g.hub.version, 0);
  await g.member.close();
  await g.hub.close();
  assert.equal(openCommunicators(), 0);
  for (const m of [...g.shards, g.out]) m.close();
});

test('a rank mixing host and device memory, or with NCCL pairs on host memory: ERR_SHARD_MEMORY', async () => {
  const mixed = new LayoutBuilder({ rank: 1, node: 'b', gpu: 0 }).hold('w.shard', { ...w, tensor: 'w', length: [2, 4] }).need('w', w).build();
  const dev = DeviceArray.allocate('float32', [2, 4]);
  const host = HostArray.allocate('float32', [4, 4]);
  await assert.rejects(ShardGroup.host({ listen: `shard-mixed-${process.pid}`, size: 2, layout: mixed, sources: [dev], destinations: [host] }), (e: IpcError) => e.code === 'ERR_SHARD_MEMORY' && /mixes host and device/.test(e.message));
  // Host memory on two nodes: the plan's NCCL pair cannot run on it.
  const name = `shard-hostnccl-${process.pid}-${randomBytes(3).toString('hex')}`;
  const hs = [HostArray.allocate('float32', [2, 4]), HostArray.allocate('float32', [2, 4])];
  const hub = await ShardGroup.host({ listen: name, size: 2, layout: layouts[1]!, sources: [hs[1]!], destinations: [host] });
  await assert.rejects(ShardGroup.join({ connect: name, layout: layouts[0]!, sources: [hs[0]!], timeout: 30_000 }), (e: IpcError) => e.code === 'ERR_SHARD_MEMORY' && /NCCL/.test(e.message));
  await hub.close();
  for (const m of [dev, host, ...hs]) m.close();
});
