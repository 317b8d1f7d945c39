// The sharded sync's device data paths simulated on the CPU: every rank's memories in a byte heap
// (addresses are offsets), local runs as the device copier's rows, NCCL pairs as the mover's rounds
// (chunks, slots, gather rows, the buffers each send and receive names, scatter rows), a send and
// its receive matched by pair and round; every destination compared byte for byte with the
// reference (the whole plan's runs applied). And the checks the copier and the mover make before
// anything is queued: bounds, host memory, the wrong path, a peer outside the communicator.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { planSharded, type PlanPair, type RankLayout } from '../../src/tensors/sharded/index.js';
import { pairChunks, planRounds, roundAddresses, runRows, type CopyRows } from '../../src/tensors/sharded/pair-stream.js';
import { deviceRunCopier } from '../../src/tensors/sharded/device-copy.js';
import { ncclRunMover } from '../../src/tensors/sharded/nccl-runs.js';
import type { RunMemory } from '../../src/tensors/sharded/execute-types.js';
import type { Device } from '../../src/cuda/device.js';
import type { NcclCommunicator } from '../../src/nccl/communicator.js';
import { checkPlan } from './sharded-reference.js';
import { scenarios } from './sharded-scenarios.js';
import { differences, expectedDestinations, extentOf, pathLayouts, sourceBytes, SENTINEL } from '../helpers/sharded-paths.js';

/** A rank's address space: its tensors and two staging slots, at offsets of one heap (base 4096: 0 is no address). */
class Heap {
  bytes = new Uint8Array(0);
  #end = 4096;
  #parts: Array<{ at: number; data: Uint8Array }> = [];
  place(data: Uint8Array): number {
    const at = this.#end;
    this.#parts.push({ at, data });
    this.#end = at + data.length + 1 + (this.#parts.length % 5);  // gaps between parts
    return at;
  }
  seal(): void {
    this.bytes = new Uint8Array(this.#end);
    for (const p of this.#parts) this.bytes.set(p.data, p.at);
  }
  read(at: number, n: number): Uint8Array {
    return this.bytes.slice(at, at + n);
  }
  copy(rows: CopyRows): void {
    rows.dsts.forEach((d, i) => this.bytes.copyWithin(d, rows.srcs[i]!, rows.srcs[i]! + rows.sizes[i]!));
  }
}

interface Rank { layout: RankLayout; heap: Heap; src: number[]; dst: number[]; slots: number[] }

/** One simulated sync of `layouts` with `chunkBytes`: each rank's destinations afterwards. */
function simulate(layouts: RankLayout[], seed: number, chunkBytes: number): Map<number, Uint8Array[]> {
  const plans = new Map(layouts.map((l) => [l.rank, planSharded(layouts, { rank: l.rank })]));
  const ranks = new Map<number, Rank>();
  const streams = new Map<number, Array<{ pair: PlanPair; send: boolean }>>();
  const rounds = new Map<number, ReturnType<typeof planRounds>>();
  for (const l of layouts) {
    const mine = plans.get(l.rank)!.pairs.filter((p) => p.path === 'nccl');
    const s = [...mine.filter((p) => p.src === l.rank).map((pair) => ({ pair, send: true })), ...mine.filter((p) => p.dst === l.rank).map((pair) => ({ pair, send: false }))];
    streams.set(l.rank, s);
    const r = planRounds(s.map((x) => pairChunks(x.pair.runs, x.send ? 'src' : 'dst', chunkBytes)));
    rounds.set(l.rank, r);
    const heap = new Heap();
    const src = sourceBytes(l, seed).map((b) => heap.place(b));
    const dst = l.destinations.map((d) => heap.place(new Uint8Array(extentOf(d)).fill(SENTINEL)));
    const slots = [heap.place(new Uint8Array(r.slotBytes).fill(0x55)), heap.place(new Uint8Array(r.slotBytes).fill(0xaa))];
    heap.seal();
    ranks.set(l.rank, { layout: l, heap, src, dst, slots });
  }
  // local / ipc: the copier's rows, on the destination's heap (sources of another rank copied in as a mapping would show them).
  for (const l of layouts) {
    const me = ranks.get(l.rank)!;
    for (const pair of plans.get(l.rank)!.pairs) {
      if (pair.path === 'nccl' || pair.dst !== l.rank) continue;
      const from = ranks.get(pair.src)!;
      const rows = runRows(pair.runs, (t) => from.src[t]!, (t) => me.dst[t]!);
      rows.dsts.forEach((d, i) => me.heap.bytes.set(from.heap.read(rows.srcs[i]!, rows.sizes[i]!), d));
    }
  }
  // nccl: round by round on every rank: gathers, then each send delivered to its receive, then scatters.
  const count = Math.max(0, ...[...rounds.values()].map((r) => r.rounds.length));
  for (let k = 0; k < count; k++) {
    const inflight = new Map<string, Uint8Array>();
    const recvs: Array<{ rank: Rank; key: string; buffer: number; bytes: number }> = [];
    const scatters: Array<{ rank: Rank; rows: CopyRows }> = [];
    for (const l of layouts) {
      const me = ranks.get(l.rank)!;
      const s = streams.get(l.rank)!;
      const round = rounds.get(l.rank)!.rounds[k];
      if (!round) continue;
      const a = roundAddresses(round, s.map((x) => x.send), (out, t) => (out ? me.src[t]! : me.dst[t]!), me.slots[k % 2]!);
      me.heap.copy(a.gather);
      round.forEach((e, i) => {
        const { pair, send } = s[e.stream]!;
        const key = `${pair.src}->${pair.dst}`;
        if (send) inflight.set(key, me.heap.read(a.buffers[i]!, e.chunk.bytes));
        else recvs.push({ rank: me, key, buffer: a.buffers[i]!, bytes: e.chunk.bytes });
      });
      scatters.push({ rank: me, rows: a.scatter });
    }
    for (const r of recvs) {
      const data = inflight.get(r.key);
      assert.ok(data, `round ${k}: ${r.key} received with no matching send`);
      assert.equal(data.length, r.bytes, `round ${k}: ${r.key} sizes match`);
      r.rank.heap.bytes.set(data, r.buffer);
      inflight.delete(r.key);
    }
    assert.deepEqual([...inflight.keys()], [], `round ${k}: every send received`);
    for (const s of scatters) s.rank.heap.copy(s.rows);
  }
  return new Map(layouts.map((l) => {
    const me = ranks.get(l.rank)!;
    return [l.rank, l.destinations.map((d, t) => me.heap.read(me.dst[t]!, extentOf(d)))];
  }));
}

const cases: Array<{ name: string; layouts: RankLayout[]; chunks?: number[] }> = [
  { name: 'two ranks on two nodes, each holding FSDP half i and needing TP half i', layouts: pathLayouts(2, ['a', 'b']) },
  { name: 'two trainers on one node, two engines on another', layouts: pathLayouts(4, ['a', 'a', 'b', 'b']) },
  { name: 'all four on one node (local and ipc only)', layouts: pathLayouts(4, ['n', 'n', 'n', 'n']) },
  ...scenarios().map((s) => ({ name: `scenario ${s.name}`, layouts: s.layouts, chunks: [7, 64, 1 << 20] })),
];

for (const c of cases) {
  test(`simulated sync, ${c.name}: every destination byte as the reference says, for several chunk sizes`, () => {
    const plan = planSharded(c.layouts);
    assert.deepEqual(checkPlan(c.layouts, [plan]), [], 'the plan itself is right');
    for (const chunk of c.chunks ?? [4096, 10_000, 1 << 20]) {
      for (const seed of [1, 2]) {
        const got = simulate(c.layouts, seed, chunk);
        for (const l of c.layouts) {
          const d = differences(got.get(l.rank)!, expectedDestinations(c.layouts, plan, l.rank, seed), l.destinations.map((x) => x.name));
          assert.equal(d.count, 0, `rank ${l.rank}, chunk ${chunk}: ${d.first.join('; ')}`);
        }
      }
    }
  });
}

test('the GPU test\'s NCCL layout stages on both sides: gathers and scatters, strided runs cut at chunk edges, direct chunks too', () => {
  const layouts = pathLayouts(2, ['a', 'b']);
  const plan = planSharded(layouts);
  const nccl = plan.pairs.filter((p) => p.path === 'nccl');
  assert.deepEqual(nccl.map((p) => [p.src, p.dst]), [[0, 1], [1, 0]]);
  assert.ok(plan.pairs.some((p) => p.path === 'local'));
  for (const side of ['src', 'dst'] as const) {
    const chunks = nccl.flatMap((p) => pairChunks(p.runs, side, 10_000));
    assert.ok(chunks.some((c) => !c.direct && c.pieces.some((x) => x.count > 1)), `${side}: strided pieces staged`);
    assert.ok(chunks.some((c) => c.direct), `${side}: direct chunks`);
  }
});

const device = { ordinal: 0 } as unknown as Device;
const dev = (extent: number): RunMemory => ({ kind: 'device', device, pointer: 0x10000n, extent });
const pairOf = (path: 'local' | 'ipc' | 'nccl', runs: number[]): PlanPair => ({ src: 0, dst: 1, path, bytes: runs[4]! * runs[5]!, runs: Float64Array.from(runs) });

test('device copier: refused before anything is queued (no CUDA touched): a run past an extent, host memory, an nccl pair', async () => {
  const copier = deviceRunCopier(device);
  const run = [0, 0, 0, 8, 16, 4, 32, 16];  // source bytes [0, 112), destination [8, 72)
  await assert.rejects(copier.copy({ pairs: [{ pair: pairOf('ipc', run), sources: [dev(111)] }], destinations: [dev(72)] }),
    { name: 'IpcError', code: 'ERR_OUT_OF_RANGE', message: /rank 0 -> rank 1: run #0 reaches bytes \[0, 112\) of source tensor #0, past its 111 bytes/ });
  await assert.rejects(copier.copy({ pairs: [{ pair: pairOf('local', run), sources: [dev(112)] }], destinations: [dev(71)] }),
    { code: 'ERR_OUT_OF_RANGE', message: /bytes \[8, 72\) of destination tensor #0, past its 71 bytes/ });
  await assert.rejects(copier.copy({ pairs: [{ pair: pairOf('local', run), sources: [dev(112)] }], destinations: [{ kind: 'host', bytes: new Uint8Array(72) }] }),
    { code: 'ERR_UNSUPPORTED', message: /destination tensor #0 is host memory/ });
  await assert.rejects(copier.copy({ pairs: [{ pair: pairOf('nccl', run), sources: [dev(112)] }], destinations: [dev(72)] }),
    { code: 'ERR_UNSUPPORTED', message: /'nccl' pair goes to the NCCL mover/ });
  await assert.rejects(copier.copy({ pairs: [{ pair: pairOf('ipc', [0, 3, 0, 0, 4, 1, 0, 0]), sources: [dev(112)] }], destinations: [dev(72)] }),
    { code: 'ERR_OUT_OF_RANGE', message: /names destination tensor #3, but this side has 1/ });
  // Nothing to copy: resolves without a GPU.
  await copier.copy({ pairs: [], destinations: [] });
  await copier.close();
  await assert.rejects(copier.copy({ pairs: [], destinations: [] }), { code: 'ERR_CLOSED' });
});

test('NCCL mover: refused before anything is queued: a run past an extent, host memory, a non-nccl pair, a peer outside the communicator', async () => {
  let queued = 0;
  const comm = { closed: false, rank: 0, nranks: 2, group: async () => { queued++; } } as unknown as NcclCommunicator;
  const mover = ncclRunMover(device);
  const run = [0, 0, 0, 8, 16, 4, 32, 16];
  const sends = [{ ...pairOf('nccl', run), src: 0, dst: 1 }];
  const recvs = [{ ...pairOf('nccl', run), src: 1, dst: 0 }];
  const id = (r: number): number => r;
  await assert.rejects(mover.move(comm, id, { sends, recvs: [] }, [dev(100)], [], 1 << 20), { code: 'ERR_OUT_OF_RANGE', message: /source tensor #0, past its 100 bytes/ });
  await assert.rejects(mover.move(comm, id, { sends: [], recvs }, [], [dev(71)], 1 << 20), { code: 'ERR_OUT_OF_RANGE', message: /destination tensor #0, past its 71 bytes/ });
  await assert.rejects(mover.move(comm, id, { sends, recvs: [] }, [{ kind: 'host', bytes: new Uint8Array(112) }], [], 1 << 20), { code: 'ERR_UNSUPPORTED', message: /host memory/ });
  await assert.rejects(mover.move(comm, id, { sends: [{ ...sends[0]!, path: 'ipc' }], recvs: [] }, [dev(112)], [], 1 << 20), { code: 'ERR_UNSUPPORTED', message: /goes to the device copier/ });
  await assert.rejects(mover.move(comm, () => 0, { sends, recvs: [] }, [dev(112)], [], 1 << 20), { code: 'ERR_OUT_OF_RANGE', message: /maps to communicator rank 0, not a peer of rank 0 among 2/ });
  await assert.rejects(mover.move(comm, () => 2, { sends, recvs: [] }, [dev(112)], [], 1 << 20), { code: 'ERR_OUT_OF_RANGE' });
  await assert.rejects(mover.move(comm, id, { sends, recvs: [] }, [dev(112)], [], 0), { code: 'ERR_OUT_OF_RANGE', message: /chunk of 0 bytes/ });
  assert.equal(queued, 0, 'no NCCL operation was queued');
  // No pairs: nothing to move, no GPU needed.
  assert.deepEqual(await mover.move(comm, id, { sends: [], recvs: [] }, [], [], 1 << 20), { staging: 0 });
  await mover.close();
  await assert.rejects(mover.move(comm, id, { sends: [], recvs: [] }, [], [], 1 << 20), { code: 'ERR_CLOSED' });
});
