// Sharded sync groups on the CPU (issue 37): whole groups of processes on host memory (HostArrays
// travel as memfd host buffers in the 'sources' tensor sets, so the 'ipc' path is real here). This
// process is the hub and rank 0 (a source); ranks 1.. are children (test/fixtures/shard-member.ts).
// FSDP Shard(0) sources -> tensor-parallel destinations (fused qkv, row-parallel o_proj: strided
// runs, a padded vocabulary), values compared with whole tensors sliced, over a Unix name and over
// tcp:// with a token; repeated syncs with changed values; a source and a destination killed
// mid-sync (every other rank: ERR_SHARD_PEER_LOST, the version kept, nothing written), a
// replacement joining (epoch + 1); relayout; timeouts; refused layouts; bad control messages.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { listen, connect, type Link } from '../../src/link/index.js';
import { IpcError } from '../../src/errors.js';
import { HostArray } from '../../src/tensors/index.js';
import { LayoutBuilder, ShardGroup, encodeLayout } from '../../src/tensors/sharded/index.js';
import { parseShardMessage } from '../../src/tensors/sharded/group-wire.js';
import { hostRunCopier } from '../../src/tensors/sharded/host-copy.js';
import { allocate, checkDestinations, fillSources, scenarioLayout } from '../helpers/shard-group.js';
import { fdCount } from '../fixtures/fd-count.js';
import { waitUntil, within } from '../helpers/wait.js';
import { startMember, type Member, type Reply } from '../helpers/shard-members.js';

const SCENARIO = { sources: 2, tp: 2 };
async function member(rank: number, connectTo: string, token?: string): Promise<{ m: Member; joined: Promise<Reply> }> {
  return startMember(rank, connectTo, { scenario: SCENARIO, ...(token && { token }) });
}

interface Hub { group: ShardGroup; sources: HostArray[]; layout: ReturnType<typeof scenarioLayout> }

async function hostGroup(listenOn: string, token?: string): Promise<Hub & { members: Member[] }> {
  const layout = scenarioLayout(0, SCENARIO);
  const sources = allocate(layout.sources);
  const group = await ShardGroup.host({ listen: listenOn, size: 4, layout, sources, destinations: [], ...(token && { token }) });
  const started = await Promise.all([1, 2, 3].map((r) => member(r, group.address, token)));
  for (const { joined } of started) assert.equal((await joined).ok, true, 'a member joined');
  await group.ready({ timeout: 60_000 });
  return { group, sources, layout, members: started.map((s) => s.m) };
}

async function syncAll(hub: Hub, members: Member[], version: number): Promise<Reply[]> {
  fillSources(hub.layout, hub.sources, version);
  const [mine, ...theirs] = await Promise.all([
    hub.group.sync({ timeout: 60_000 }).then((r) => ({ ok: true, version: r.version } as Reply)),
    ...members.map((m) => m.ask('sync', { version, timeout: 60_000 })),
  ]);
  return [mine!, ...theirs];
}

async function checkAll(members: Member[], version: number): Promise<void> {
  for (const m of members) {
    const r = await m.ask('check', { version });
    assert.deepEqual(r.problems, [], `rank ${m.rank}'s destinations hold version ${version} exactly`);
  }
}

async function closeAll(hub: Hub, members: Member[]): Promise<void> {
  await Promise.all(members.map((m) => m.ask('close')));
  await hub.group.close();
  for (const s of hub.sources) s.close();
}

for (const transport of ['unix', 'tcp'] as const) {
  test(`a group over ${transport === 'unix' ? 'a Unix name' : 'tcp:// with a token'}: FSDP Shard(0) -> TP2, repeated syncs land each version exactly`, async () => {
    const before = fdCount();
    const token = transport === 'tcp' ? randomBytes(24).toString('hex') : undefined;
    const hub = await hostGroup(transport === 'unix' ? `shard-hub-${process.pid}-${randomBytes(3).toString('hex')}` : 'tcp://127.0.0.1:0', token);
    const { members } = hub;
    assert.equal(hub.group.epoch, 1);
    assert.ok(hub.group.plan!.pairs.some((p) => p.path === 'ipc'), 'rank 0 serves over ipc');
    for (const version of [1, 2, 3]) {
      const replies = await syncAll(hub, members, 100 + version);
      for (const r of replies) assert.deepEqual([r.ok, r.version, r.code], [true, version, undefined], `every rank's sync ${version}`);
      await checkAll(members.slice(1), 100 + version);
    }
    assert.equal(hub.group.version, 3);
    await closeAll(hub, members);
    await waitUntil(() => fdCount() <= before, `this process's fds back to ${before} (now ${fdCount()})`);
  });
}

for (const killed of [1, 3] as const) {
  test(`a ${killed === 1 ? 'source' : 'destination'} killed mid-sync: every other rank gets ERR_SHARD_PEER_LOST, the version kept, then a replacement joins and the group re-plans`, async () => {
    const before = fdCount();
    const hub = await hostGroup(`shard-kill-${process.pid}-${randomBytes(3).toString('hex')}`);
    const { members } = hub;
    const replies = await syncAll(hub, members, 7);
    assert.ok(replies.every((r) => r.ok));
    const fdsBefore = new Map(await Promise.all(members.map(async (m) => [m.rank, (await m.ask('state')).fds!] as const)));
    const victim = members[killed - 1]!;
    const others = members.filter((m) => m !== victim);
    // Everyone but the victim syncs version 2; the victim never does, then dies.
    fillSources(hub.layout, hub.sources, 8);
    const mine = hub.group.sync({ timeout: 60_000 }).then(() => ({ ok: true } as Reply), (e: IpcError & { detail?: any }) => ({ ok: false, code: e.code, detail: e.detail } as Reply));
    const theirs = others.map((m) => m.ask('sync', { version: 8, timeout: 60_000 }));
    if (killed === 3) assert.equal((await theirs[1]!).ok, true, 'rank 2 took its bytes before rank 3 died');
    await victim.kill();
    const results = [await mine, ...(await Promise.all(theirs))];
    const failedRanks = killed === 1 ? [0, 2, 3] : [0, 1];
    const byRank = new Map([[0, results[0]!], ...others.map((m, i) => [m.rank, results[i + 1]!] as const)]);
    for (const r of failedRanks) {
      const got = byRank.get(r)!;
      assert.equal(got.code, 'ERR_SHARD_PEER_LOST', `rank ${r}: ${got.message ?? ''}`);
      assert.deepEqual(got.detail.ranks, [killed], `rank ${r} names the lost rank`);
      assert.deepEqual(got.detail.halfWritten, [], `rank ${r}: no copy had started, nothing is half-written`);
      assert.equal(got.detail.version, 1, `rank ${r} keeps version 1`);
    }
    assert.equal(hub.group.version, 1);
    // Destinations still hold version 1's values where the failed sync never copied.
    for (const m of others.filter((o) => o.rank >= 2 && failedRanks.includes(o.rank))) assert.deepEqual((await m.ask('check', { version: 7 })).problems, []);
    // A later sync fails at once with the same error.
    await assert.rejects(hub.group.sync(), (e: IpcError) => e.code === 'ERR_SHARD_PEER_LOST');
    // The replacement: a fresh process with the same rank.
    const { m: fresh, joined } = await member(killed, hub.group.address);
    assert.equal((await joined).ok, true);
    await waitUntil(() => hub.group.state === 'ready' && hub.group.epoch === 2, 'the hub to re-plan to epoch 2');
    const all = members.map((m) => (m === victim ? fresh : m));
    const again = await syncAll(hub, all, 9);
    for (const [i, r] of again.entries()) assert.equal(r.ok, true, `rank ${i} syncs after the re-plan: ${r.message ?? ''}`);
    assert.equal(again[killed]!.version, 1, 'the replacement starts its own count');
    assert.equal(hub.group.version, 2, 'versions continue where each rank was');
    await checkAll(all.slice(1), 9);
    // The survivors hold what they held in epoch 1, no more: the dead rank's links and mappings are gone.
    for (const m of others) assert.equal((await m.ask('state')).fds, fdsBefore.get(m.rank), `rank ${m.rank}'s fds after the re-plan`);
    await closeAll(hub, all);
    await waitUntil(() => fdCount() <= before, `this process's fds back to ${before} (now ${fdCount()})`);
  });
}

test('a sync that times out names the ranks it waited for; relayout re-plans (a strided source) and the group syncs again', async () => {
  const hub = await hostGroup(`shard-relayout-${process.pid}-${randomBytes(3).toString('hex')}`);
  const { members } = hub;
  await assert.rejects(hub.group.sync({ timeout: 300 }), (e: IpcError & { detail?: any }) => {
    assert.equal(e.code, 'ERR_TIMEOUT', e.message);
    assert.deepEqual(e.detail.waitingFor, [2, 3], 'rank 0 serves ranks 2 and 3 and neither said done');
    assert.equal(e.detail.version, 0);
    return true;
  });
  assert.equal(hub.group.state, 'failed');
  // Rank 0's sources now live in rows padded to twice their length: new strides, a new plan.
  const b = new LayoutBuilder({ rank: 0, node: 'n', gpu: 0 });
  const strided: HostArray[] = [];
  for (const local of hub.layout.sources) {
    const piece = local.pieces[0]!;
    const global = hub.layout.tensors.find((t) => t.name === piece.tensor)!;
    const strides = local.strides.map((s, i) => (i === 0 && local.shape.length > 1 ? s * 2 : s));
    const bytes = local.shape[0]! * (strides[0]!) * (local.shape.length > 1 ? 1 : 1);
    const buf = HostArray.allocate('uint8', [bytes]).buffer;
    strided.push(new HostArray(buf, { dtype: local.dtype, shape: local.shape, strides }));
    b.hold(local.name, { dtype: local.dtype, shape: global.shape, tensor: piece.tensor, start: piece.start, length: piece.length, strides });
  }
  const layout = b.build();
  await hub.group.relayout(layout, strided, []);
  assert.equal(hub.group.epoch, 2);
  const moved = { group: hub.group, layout, sources: strided };
  const replies = await syncAll(moved, members, 42);
  for (const r of replies) assert.equal(r.ok, true, r.message);
  await checkAll(members.slice(1), 42);
  await closeAll(moved, members);
  for (const s of hub.sources) s.close();
});

test('a layout the hub refuses (a byte no source holds) gives the joiner the LayoutError code; nothing else changes', async () => {
  const name = `shard-refuse-${process.pid}-${randomBytes(3).toString('hex')}`;
  const src = new LayoutBuilder({ rank: 0, node: 'n', gpu: 0 }).hold('w', { dtype: 'float32', shape: [4, 4], length: [2, 4] }).build();
  const srcMem = allocate(src.sources);
  const group = await ShardGroup.host({ listen: name, size: 2, layout: src, sources: srcMem });
  const dst = new LayoutBuilder({ rank: 1, node: 'n', gpu: 1 }).need('w', { dtype: 'float32', shape: [4, 4] }).build();
  const dstMem = allocate(dst.destinations);
  await assert.rejects(ShardGroup.join({ connect: name, layout: dst, destinations: dstMem, timeout: 30_000 }), (e: IpcError) => {
    assert.equal(e.code, 'ERR_LAYOUT_UNCOVERED', e.message);
    assert.match(e.message, /tensor w: \[2:4, 0:4\]/);
    return true;
  });
  assert.deepEqual(group.ranks, [0], 'the refused join was dropped');
  assert.equal(group.epoch, 0);
  // A good joiner completes the group.
  const ok = new LayoutBuilder({ rank: 1, node: 'n', gpu: 1 }).need('w', { dtype: 'float32', shape: [4, 4], length: [2, 4] }).build();
  const okMem = allocate(ok.destinations);
  const joiner = await ShardGroup.join({ connect: name, layout: ok, destinations: okMem, timeout: 30_000 });
  fillSources(src, srcMem, 5);
  const [a, b] = await Promise.all([group.sync(), joiner.sync()]);
  assert.deepEqual([a.version, b.version, b.paths.ipc], [1, 1, 32]);
  assert.deepEqual(checkDestinations(ok, okMem, 5), []);
  // A relayout the hub refuses leaves the group as it was: the same epoch, syncs go on.
  const badMem = allocate(dst.destinations);
  await assert.rejects(joiner.relayout(dst, [], badMem), (e: IpcError) => e.code === 'ERR_LAYOUT_UNCOVERED');
  assert.equal(joiner.epoch, 1);
  fillSources(src, srcMem, 6);
  const [c, d] = await Promise.all([group.sync(), joiner.sync()]);
  assert.deepEqual([c.version, d.version], [2, 2]);
  assert.deepEqual(checkDestinations(ok, okMem, 6), []);
  badMem[0]!.close();
  // The hub's close ends the group: a member's next sync names the hub's rank.
  await group.close();
  await assert.rejects(joiner.sync({ timeout: 30_000 }), (e: IpcError & { detail?: any }) => {
    assert.equal(e.code, 'ERR_SHARD_PEER_LOST', e.message);
    assert.deepEqual(e.detail.ranks, [0]);
    assert.equal(e.detail.version, 2);
    return true;
  });
  await joiner.close();
  for (const m of [...srcMem, ...dstMem, ...okMem]) m.close();
});

test('bad control messages: the parser refuses them (ERR_SHARD_PROTOCOL); a hub refuses and closes such a link; a member refuses such a hub', async () => {
  const bad: unknown[] = [
    null, 7, 'join', [], {}, { shard: 'nope' }, { shard: 'join', rank: -1, layout: new Uint8Array(4), serve: null },
    { shard: 'join', rank: 1, layout: 'text', serve: null }, { shard: 'join', rank: 1, layout: new Uint8Array(4), serve: 3 },
    { shard: 'plan', epoch: 0, layouts: [new Uint8Array(1)], serve: [null], chunkBytes: 1 },
    { shard: 'plan', epoch: 1, layouts: [new Uint8Array(1)], serve: [], chunkBytes: 1 },
    { shard: 'planned', epoch: 1, fingerprint: 'xyz', nccl: false }, { shard: 'planned', epoch: 1, fingerprint: 'a'.repeat(64), nccl: 'yes' },
    { shard: 'ready', epoch: 1, nccl: { id: new Uint8Array(16), ranks: [0] } }, { shard: 'ready', epoch: 1, nccl: { id: new Uint8Array(128), ranks: [1, 0] } },
    { shard: 'go', epoch: 1, version: 0 }, { shard: 'done', epoch: 1.5, version: 1 }, { shard: 'lost', epoch: 1, rank: 'x', reason: '' },
    { shard: 'sources', epoch: 1, rank: 0, tensors: {} },
  ];
  for (const v of bad) assert.throws(() => parseShardMessage(v), (e: IpcError) => e.code === 'ERR_SHARD_PROTOCOL', JSON.stringify(v, (_, x) => (x instanceof Uint8Array ? `<${x.length} bytes>` : x)));
  assert.deepEqual(parseShardMessage({ shard: 'go', epoch: 2, version: 3, later: 'ignored' }), { shard: 'go', epoch: 2, version: 3 });

  // A hub: a link that sends junk is refused with ERR_SHARD_PROTOCOL and closed.
  const name = `shard-bad-${process.pid}-${randomBytes(3).toString('hex')}`;
  const layout = new LayoutBuilder({ rank: 0, node: 'n', gpu: 0 }).hold('w', { dtype: 'float32', shape: [4] }).build();
  const mem = allocate(layout.sources);
  const group = await ShardGroup.host({ listen: name, size: 2, layout, sources: mem });
  const raw = await connect(name);
  const closed = new Promise<void>((r) => raw.once('close', () => r()));
  raw.send({ shard: 'join', rank: 1, layout: 'not a layout', serve: null });
  const answer = parseShardMessage(await within(raw.receive(), 'the hub\'s refusal'));
  assert.equal(answer.shard, 'refused');
  assert.equal((answer as { code: string }).code, 'ERR_SHARD_PROTOCOL');
  await within(closed, 'the hub to close the link');
  // A rank already in the group cannot join on a second link.
  const twice = await connect(name);
  twice.send({ shard: 'join', rank: 0, layout: encodeLayout(layout), serve: null });
  const refusal = parseShardMessage(await within(twice.receive(), 'the refusal of a second rank 0'));
  assert.equal((refusal as { code: string }).code, 'ERR_SHARD_PROTOCOL');
  twice.close();
  // A member that plans from other layouts (its fingerprint differs): ERR_SHARD_PLAN to every rank, naming it.
  const other = await connect(name);
  const need = new LayoutBuilder({ rank: 1, node: 'n', gpu: 1 }).need('w', { dtype: 'float32', shape: [4] }).build();
  other.send({ shard: 'join', rank: 1, layout: encodeLayout(need), serve: null });
  const plan = parseShardMessage(await within(other.receive(), 'the plan')) as { shard: string; epoch: number };
  assert.equal(plan.shard, 'plan');
  const failedAtHub = group.ready({ timeout: 30_000 }).then(() => assert.fail('ready with a rank that planned otherwise'), (e: IpcError & { detail?: any }) => e);
  other.send({ shard: 'planned', epoch: plan.epoch, fingerprint: 'f'.repeat(64), nccl: false });
  const verdict = parseShardMessage(await within(other.receive(), 'the verdict')) as unknown as { shard: string; code: string; ranks: number[] };
  assert.deepEqual([verdict.shard, verdict.code, verdict.ranks], ['failed', 'ERR_SHARD_PLAN', [1]]);
  const atHub = await failedAtHub;
  assert.equal(atHub.code, 'ERR_SHARD_PLAN');
  assert.deepEqual(atHub.detail.ranks, [1]);
  other.close();
  await group.close();
  mem[0]!.close();

  // A member: a "hub" that answers a join with junk makes join() reject with ERR_SHARD_PROTOCOL.
  const fakeName = `shard-fakehub-${process.pid}-${randomBytes(3).toString('hex')}`;
  using fake = listen(fakeName);
  fake.on('connection', (l: Link) => { l.once('message', () => l.send({ shard: 'plan', epoch: 'one' })); });
  const dst = new LayoutBuilder({ rank: 1, node: 'n', gpu: 0 }).need('w', { dtype: 'float32', shape: [4] }).build();
  const dmem = allocate(dst.destinations);
  await assert.rejects(ShardGroup.join({ connect: fakeName, layout: dst, destinations: dmem, timeout: 30_000 }), (e: IpcError) => e.code === 'ERR_SHARD_PROTOCOL');
  dmem[0]!.close();
});

test('a rank lost while the group forms: the others keep waiting, a replacement completes it (epoch 2), and it syncs', async () => {
  const name = `shard-forming-${process.pid}-${randomBytes(3).toString('hex')}`;
  const src = new LayoutBuilder({ rank: 0, node: 'n', gpu: 0 }).hold('w', { dtype: 'float32', shape: [4, 4] }).build();
  const need = (rank: number) => new LayoutBuilder({ rank, node: 'n', gpu: rank }).need('w', { dtype: 'float32', shape: [4, 4], start: [rank - 1, 0], length: [1, 4] }).build();
  const srcMem = allocate(src.sources);
  const group = await ShardGroup.host({ listen: name, size: 3, layout: src, sources: srcMem });
  const doomed = await connect(name);
  doomed.send({ shard: 'join', rank: 2, layout: encodeLayout(need(2)), serve: null });
  const mem1 = allocate(need(1).destinations);
  const joining = ShardGroup.join({ connect: name, layout: need(1), destinations: mem1, timeout: 30_000 });
  assert.equal((parseShardMessage(await within(doomed.receive(), 'the plan of epoch 1')) as { epoch: number }).epoch, 1);
  doomed.close(); // gone before it said 'planned'
  await waitUntil(() => group.state === 'waiting' && group.ranks!.length === 2, 'the hub to drop rank 2 and wait');
  const mem2 = allocate(need(2).destinations);
  const [one, two] = await Promise.all([joining, ShardGroup.join({ connect: name, layout: need(2), destinations: mem2, timeout: 30_000 })]);
  assert.deepEqual([group.epoch, one.epoch, two.epoch], [2, 2, 2]);
  fillSources(src, srcMem, 11);
  const results = await Promise.all([group.sync(), one.sync(), two.sync()]);
  assert.deepEqual(results.map((r) => r.version), [1, 1, 1]);
  assert.deepEqual([...checkDestinations(need(1), mem1, 11), ...checkDestinations(need(2), mem2, 11)], []);
  await Promise.all([one.close(), two.close()]);
  await group.close();
  for (const m of [...srcMem, ...mem1, ...mem2]) m.close();
});

test('a destination whose copy fails: its sync rejects with the copy\'s error as the cause; its source fails at once naming it, not at its timeout', async () => {
  const name = `shard-copyfail-${process.pid}-${randomBytes(3).toString('hex')}`;
  const src = new LayoutBuilder({ rank: 0, node: 'n', gpu: 0 }).hold('w', { dtype: 'float32', shape: [4, 4] }).build();
  const srcMem = allocate(src.sources);
  const group = await ShardGroup.host({ listen: name, size: 2, layout: src, sources: srcMem });
  const dst = new LayoutBuilder({ rank: 1, node: 'n', gpu: 1 }).need('w', { dtype: 'float32', shape: [4, 4] }).build();
  const dstMem = allocate(dst.destinations);
  // What the device copier meets when its kernel faults (a mapping made for the wrong GPU), from the second sync on.
  const fault = new Error('cuStreamSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)');
  const real = hostRunCopier();
  let faulty = false;
  const joiner = await ShardGroup.join({
    connect: name, layout: dst, destinations: dstMem, timeout: 30_000,
    executors: { host: () => ({ copy: (b) => (faulty ? Promise.reject(fault) : real.copy(b)), close: () => real.close() }) },
  });
  fillSources(src, srcMem, 2);
  assert.deepEqual((await Promise.all([group.sync(), joiner.sync()])).map((r) => r.version), [1, 1]);
  assert.deepEqual(checkDestinations(dst, dstMem, 2), []);
  faulty = true;
  fillSources(src, srcMem, 3);
  const [mine, theirs] = await Promise.allSettled([group.sync({ timeout: 60_000 }), joiner.sync({ timeout: 60_000 })]);
  assert.equal(theirs.status, 'rejected');
  const e1 = (theirs as PromiseRejectedResult).reason as IpcError & { detail?: any; cause?: unknown };
  assert.equal(e1.code, 'ERR_SHARD_COPY', e1.message);
  assert.match(e1.message, /rank 1's copy of version 2 failed: .*ILLEGAL_ADDRESS/);
  assert.equal(e1.cause, fault);
  assert.deepEqual([e1.detail.ranks, e1.detail.halfWritten, e1.detail.version], [[], ['w'], 1], 'the version kept');
  assert.equal(mine.status, 'rejected');
  const e0 = (mine as PromiseRejectedResult).reason as IpcError & { detail?: any };
  assert.equal(e0.code, 'ERR_SHARD_PEER_LOST', `the source learns from the dropped serve link, not its timeout: ${e0.message}`);
  assert.deepEqual([e0.detail.ranks, e0.detail.version], [[1], 1]);
  assert.deepEqual([group.version, joiner.version], [1, 1]);
  await assert.rejects(joiner.sync({ timeout: 5_000 }), (e: IpcError) => e.code === 'ERR_SHARD_COPY', 'failed until a new plan');
  await joiner.close();
  await group.close();
  for (const m of [...srcMem, ...dstMem]) m.close();
});
