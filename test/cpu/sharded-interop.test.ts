// The sharded sync group between Node and Python on host memory (CPU only): a Node hub with a Python
// member, and a Python hub with a Node member. Each of the two ranks holds Shard(0) of w (8 x 6) and
// b (5) and needs w's columns 3r..3r+2 and the whole b, so each sync moves runs both ways over IPC
// (strided blocks included) and copies a rank's own runs locally. Values are a function of the
// tensor, the element and the version (python/tests/sharded_group_fixture.py computes the same), and
// both sides check theirs after every sync; then the member is killed (and replaced: the hub plans
// again) or leaves, and the hub's next sync fails naming it (the 'lost' message each way). The Python rank is python/tests/sharded_member.py.
// Skips with the reason where there is no python3 (>= 3.10).
import { test } from 'node:test';
import { once } from 'node:events';
import assert from 'node:assert/strict';
import { HostArray, LayoutBuilder, ShardGroup, type RankLayout } from '../../src/index.js';
import { noPython } from '../helpers/python.js';
import { PythonRank } from '../helpers/python-rank.js';

const GLOBALS: Record<string, number[]> = { w: [8, 6], b: [5] };
const skip = noPython;

/** The value of element `flat` of global tensor `tensor` at `version` (sharded_group_fixture.value). */
function value(tensor: string, flat: number, version: number): number {
  let h = 0;
  for (const ch of tensor) h = (h * 31 + ch.charCodeAt(0)) & 0xffff;
  return (h * 1000 + flat + version * 100_000) & 0x3fffffff;
}

/** sharded_group_fixture.interop(rank): the layout the Python side builds for the same rank. */
function interopLayout(rank: number): RankLayout {
  const b = new LayoutBuilder({ rank, node: 'n0', gpu: rank });
  for (const [name, shape] of Object.entries(GLOBALS)) {
    b.hold(name, { dtype: 'int32', shape, mesh: [2], placements: [{ shard: 0 }], coordinate: [rank] });
  }
  b.need('w_cols', { dtype: 'int32', shape: GLOBALS.w!, start: [0, 3 * rank], length: [8, 3], tensor: 'w' });
  b.need('b', { dtype: 'int32', shape: GLOBALS.b! });
  return b.build();
}

function* indices(shape: readonly number[]): Generator<number[]> {
  const n = shape.reduce((a, x) => a * x, 1);
  for (let i = 0; i < n; i++) {
    const idx: number[] = [];
    let rest = i;
    for (let d = shape.length - 1; d >= 0; d--) {
      idx.unshift(rest % shape[d]!);
      rest = Math.floor(rest / shape[d]!);
    }
    yield idx;
  }
}

function flat(shape: readonly number[], idx: readonly number[]): number {
  return idx.reduce((f, x, d) => f * shape[d]! + x, 0);
}

/** Each local tensor's expected values (C order): its pieces at `version`, -1 where none is. */
function expected(local: RankLayout['sources'][number], version: number): number[] {
  const out = new Array<number>(local.shape.reduce((a, x) => a * x, 1)).fill(-1);
  for (const p of local.pieces) {
    for (const idx of indices(p.length)) {
      const g = idx.map((x, d) => x + p.start[d]!);
      const at = idx.map((x, d) => x + p.at[d]!);
      out[flat(local.shape, at)] = value(p.tensor, flat(GLOBALS[p.tensor]!, g), version);
    }
  }
  return out;
}

function tensors(layout: RankLayout): { sources: HostArray<'int32'>[]; destinations: HostArray<'int32'>[] } {
  return {
    sources: layout.sources.map((t) => HostArray.allocate('int32', t.shape)),
    destinations: layout.destinations.map((t) => HostArray.allocate('int32', t.shape)),
  };
}

function fill(layout: RankLayout, sources: HostArray<'int32'>[], version: number): void {
  layout.sources.forEach((t, i) => sources[i]!.write(Int32Array.from(expected(t, version))));
}

function check(layout: RankLayout, destinations: HostArray<'int32'>[], version: number): void {
  layout.destinations.forEach((t, i) => {
    assert.deepEqual(Array.from(destinations[i]!.read()), expected(t, version), `Node rank ${layout.rank}'s ${t.name} at version ${version}`);
  });
}


function uniqueName(what: string): string {
  return `shard-interop-${process.pid}-${what}-${Date.now().toString(36)}`;
}

/** Two syncs with changing values; both sides check their destinations. */
async function syncTwice(group: ShardGroup, py: PythonRank, layout: RankLayout, t: ReturnType<typeof tensors>): Promise<void> {
  for (const version of [1, 2]) {
    fill(layout, t.sources, 10 + version);
    const mine = group.sync({ timeout: 30_000 });
    py.send(`sync ${10 + version}`);
    const theirs = await py.next();
    const r = await mine;
    assert.equal(theirs.error, undefined, `the Python rank's sync failed: ${theirs.message}`);
    assert.deepEqual(theirs.problems, [], 'the Python rank\'s destinations');
    assert.equal(theirs.version, version);
    assert.ok(theirs.paths.local > 0 && theirs.paths.ipc > 0, 'the Python rank copied its own runs and the Node rank\'s');
    assert.equal(r.version, version);
    check(layout, t.destinations, 10 + version);
  }
  assert.equal(group.version, 2);
}

test('a Node hub and a Python member sync host tensors both ways, values exact; the member killed, a replacement joins', { skip, timeout: 120_000 }, async () => {
  const name = uniqueName('node-hub');
  const layout = interopLayout(0);
  const t = tensors(layout);
  fill(layout, t.sources, 0);
  const py = new PythonRank({ join: name, layout: ['interop', 1] });
  let replacement: PythonRank | undefined;
  let group: ShardGroup | undefined;
  try {
    group = await ShardGroup.host({ listen: name, size: 2, layout, sources: t.sources, destinations: t.destinations });
    assert.equal((await py.next()).ready, true);
    await syncTwice(group, py, layout, t);
    // The Python member is killed: the Node hub's next sync fails naming it, the version unchanged;
    // a replacement Python rank 1 joins, the hub plans again (epoch 2) and the group syncs on.
    py.child.kill('SIGKILL');
    await once(py.child, 'exit');
    await assert.rejects(group.sync({ timeout: 30_000 }), (e: any) => {
      assert.equal(e.code, 'ERR_SHARD_PEER_LOST', e.message);
      assert.deepEqual(e.detail.ranks, [1]);
      return true;
    });
    assert.equal(group.version, 2, 'the version stays');
    replacement = new PythonRank({ join: name, layout: ['interop', 1] });
    const joined = await replacement.next();
    assert.deepEqual([joined.ready, joined.epoch], [true, 2]);
    fill(layout, t.sources, 20);
    const mine = group.sync({ timeout: 30_000 });
    replacement.send('sync 20');
    const theirs = await replacement.next();
    assert.deepEqual([theirs.error, theirs.problems, theirs.version, theirs.epoch], [undefined, [], 1, 2], theirs.message);
    assert.equal((await mine).version, 3, 'versions continue from where each rank was');
    check(layout, t.destinations, 20);
  } finally {
    await py.exit();
    await replacement?.exit();
    await group?.close();
  }
});

test('a Python hub and a Node member sync host tensors both ways, values exact', { skip, timeout: 120_000 }, async () => {
  const name = uniqueName('python-hub');
  const layout = interopLayout(1);
  const t = tensors(layout);
  fill(layout, t.sources, 0);
  const py = new PythonRank({ host: name, size: 2, layout: ['interop', 0] });
  let group: ShardGroup | undefined;
  try {
    assert.equal((await py.next()).listening, true);
    group = await ShardGroup.join({ connect: name, layout, sources: t.sources, destinations: t.destinations });
    assert.equal((await py.next()).ready, true);
    await syncTwice(group, py, layout, t);
    // The Node member leaves: the Python hub's next sync fails naming it, the version unchanged.
    await group.close();
    py.send('sync 13');
    const lost = await py.next();
    assert.deepEqual([lost.error, lost.detail.ranks, lost.detail.version], ['ERR_SHARD_PEER_LOST', [1], 2], lost.message);
  } finally {
    await group?.close();
    await py.exit();
  }
});
