// The sharded-weights planner on the CPU: plans for Shard(0), Shard(1), Replicate, uneven splits,
// fused and padded destinations applied to materialised tensors and every destination byte
// compared (sharded-reference.ts); each rank's own plan the same runs as the whole plan; layouts
// that leave a byte uncovered, cover one twice, disagree on a dtype or reach out of bounds refused
// with their code, tensor and range; the layout record's canonical encoding and its refusals.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  LayoutBuilder, LayoutError, decodeLayout, encodeLayout, layoutFingerprint, placementBox, placementPieces, planBytes, planSharded, shardRange,
  tensorParallelParameter, runsOf, SPLIT_MIN_BYTES, type Placement, type RankLayout,
} from '../../src/tensors/sharded/index.js';
import { scenarios } from './sharded-scenarios.js';
import { dtypeInfo } from '../../src/ipc/dtype.js';
import { checkPlan } from './sharded-reference.js';

test('shardRange and placementBox follow DTensor: ceil chunks, the last smaller or empty, nested mesh dimensions', () => {
  assert.deepEqual([0, 1, 2, 3].map((i) => shardRange(10, 4, i)), [[0, 3], [3, 3], [6, 3], [9, 1]]);
  assert.deepEqual([0, 1, 2, 3].map((i) => shardRange(5, 4, i)), [[0, 2], [2, 2], [4, 1], [5, 0]]);
  assert.deepEqual([0, 1, 2, 3].map((i) => shardRange(6, 4, i)), [[0, 2], [2, 2], [4, 2], [6, 0]]);
  // Shard(0) on both mesh dimensions: the second cuts the first's shard (7 -> 4,3 -> 2,2 | 2,1).
  const box = (c: number[]) => placementBox({ shape: [7, 3], mesh: [2, 2], placements: [{ shard: 0 }, { shard: 0 }], coordinate: c });
  assert.deepEqual([[0, 0], [0, 1], [1, 0], [1, 1]].map(box), [
    { start: [0, 0], length: [2, 3] }, { start: [2, 0], length: [2, 3] }, { start: [4, 0], length: [2, 3] }, { start: [6, 0], length: [1, 3] },
  ]);
  assert.deepEqual(placementBox({ shape: [4, 6], mesh: [2, 3], placements: ['replicate', { shard: 1 }], coordinate: [1, 2] }), { start: [0, 4], length: [4, 2] });
  assert.throws(() => placementBox({ shape: [4], mesh: [2], placements: [{ shard: 1 }], coordinate: [0] }), { code: 'ERR_LAYOUT_INVALID' });
});

// torch's definition, on lists of indices: torch.chunk (chunks of ceil(n / k), fewer when they run
// out, filled with empty ones) and _StridedShard._split_tensor (split_factor chunks, each chunked,
// the i-th of each concatenated), applied mesh dimension by mesh dimension to the local indices.
function chunk(xs: number[], k: number): number[][] {
  const size = Math.ceil(xs.length / k);
  const out: number[][] = [];
  for (let i = 0; size > 0 && i < xs.length; i += size) out.push(xs.slice(i, i + size));
  while (out.length < k) out.push([]);
  return out;
}
function splitTensor(xs: number[], k: number, splitFactor?: number): number[][] {
  if (splitFactor === undefined) return chunk(xs, k);
  const second = chunk(xs, splitFactor).map((s) => chunk(s, k));
  return Array.from({ length: k }, (_, i) => second.flatMap((s) => s[i]!));
}
function referenceIndices(shape: number[], mesh: number[], placements: Placement[], coordinate: number[]): number[][] {
  let idx = shape.map((n) => Array.from({ length: n }, (_, i) => i));
  placements.forEach((p, i) => {
    if (p === 'replicate') return;
    idx = idx.map((xs, d) => (d === p.shard ? splitTensor(xs, mesh[i]!, p.splitFactor)[coordinate[i]!]! : xs));
  });
  return idx;
}

test('_StridedShard (FSDP2 over TP): a rank\'s pieces are exactly torch\'s _split_tensor indices, every mesh coordinate, uneven extents', () => {
  const cases: Array<[number[], number[], Placement[]]> = [
    [[8, 8], [2, 2], [{ shard: 0, splitFactor: 2 }, { shard: 0 }]],
    [[10, 6], [2, 3], [{ shard: 0, splitFactor: 2 }, { shard: 0 }]],
    [[10, 6], [2, 3], [{ shard: 0, splitFactor: 3 }, { shard: 0 }]],
    [[7], [2], [{ shard: 0, splitFactor: 2 }]],
    [[5, 11], [3, 2], [{ shard: 1, splitFactor: 2 }, { shard: 1 }]],
    [[9, 5], [2, 2, 2], [{ shard: 0, splitFactor: 2 }, { shard: 1 }, { shard: 0, splitFactor: 3 }]],
    [[13, 4], [2, 2], ['replicate', { shard: 0, splitFactor: 4 }]],
    [[3, 4], [4, 2], [{ shard: 0, splitFactor: 2 }, { shard: 0 }]],
  ];
  let multi = 0;
  for (const [shape, mesh, placements] of cases) {
    const coords: number[][] = [[]];
    for (const m of mesh) coords.splice(0, coords.length, ...coords.flatMap((c) => Array.from({ length: m }, (_, i) => [...c, i])));
    for (const coordinate of coords) {
      const ref = referenceIndices(shape, mesh, placements, coordinate);
      const got = placementPieces({ shape, mesh, placements, coordinate });
      const where = `${JSON.stringify(placements)} on ${JSON.stringify(mesh)} at ${JSON.stringify(coordinate)}`;
      assert.deepEqual(got.shape, ref.map((xs) => xs.length), where);
      // Every local element once, holding the global element the definition puts there.
      const seen = new Set<string>();
      for (const p of got.pieces) {
        const k = p.length.map(() => 0);
        for (;;) {
          const local = k.map((x, d) => p.at[d]! + x);
          assert.deepEqual(local.map((l, d) => ref[d]![l]), k.map((x, d) => p.start[d]! + x), where);
          assert.ok(!seen.has(local.join()), where);
          seen.add(local.join());
          let d = k.length - 1;
          while (d >= 0 && ++k[d]! === p.length[d]!) k[d--] = 0;
          if (d < 0) break;
        }
      }
      assert.equal(seen.size, ref.reduce((n, xs) => n * xs.length, 1), where);
      if (got.pieces.length > 1) multi++;
      else if (got.pieces.length === 1) assert.deepEqual(placementBox({ shape, mesh, placements, coordinate }), { start: got.pieces[0]!.start, length: got.pieces[0]!.length });
    }
  }
  assert.ok(multi >= 4, `some ranks hold several boxes (${multi})`);
  // torch's docstring: [8, 8] on a 2 x 2 mesh, _StridedShard(0, split_factor=2) then Shard(0): ranks hold rows 0-1, 4-5, 2-3, 6-7.
  const rows = [[0, 0], [0, 1], [1, 0], [1, 1]].map((c) => placementBox({ shape: [8, 8], mesh: [2, 2], placements: [{ shard: 0, splitFactor: 2 }, { shard: 0 }], coordinate: c }).start[0]);
  assert.deepEqual(rows, [0, 4, 2, 6]);
  assert.throws(() => placementBox({ shape: [10, 6], mesh: [2, 3], placements: [{ shard: 0, splitFactor: 2 }, { shard: 0 }], coordinate: [0, 1] }), { code: 'ERR_LAYOUT_INVALID', message: /placementPieces/ });
  assert.throws(() => placementPieces({ shape: [4], mesh: [2], placements: [{ shard: 0, splitFactor: 0 }], coordinate: [0] }), { code: 'ERR_LAYOUT_INVALID' });
  // The builder makes such a rank's local tensor of its pieces.
  const l = new LayoutBuilder({ rank: 0, node: 'n', gpu: 0 }).hold('w', { dtype: 'float32', shape: [10, 6], mesh: [2, 3], placements: [{ shard: 0, splitFactor: 2 }, { shard: 0 }], coordinate: [0, 1] }).build();
  assert.deepEqual(l.sources[0]!.shape, [2, 6]);
  assert.deepEqual(l.sources[0]!.pieces.map((p) => [p.start, p.length, p.at]), [[[2, 0], [1, 6], [0, 0]], [[5, 0], [1, 6], [1, 0]]]);
});

test('tensorParallelParameter: fused q/k/v chunks concatenated; a padded vocabulary declares its padding', () => {
  const qkv = tensorParallelParameter({ dtype: 'bfloat16', dim: 0, size: 2, rank: 1, parts: [{ tensor: 'q', shape: [8, 6] }, { tensor: 'k', shape: [4, 6] }, { tensor: 'v', shape: [4, 6] }] });
  assert.deepEqual(qkv.shape, [8, 6]);
  assert.deepEqual(qkv.pieces.map((p) => [p.tensor, p.start, p.length, p.at]), [
    ['q', [4, 0], [4, 6], [0, 0]], ['k', [2, 0], [2, 6], [4, 0]], ['v', [2, 0], [2, 6], [6, 0]],
  ]);
  const vocab = tensorParallelParameter({ dtype: 'bfloat16', dim: 0, size: 2, rank: 1, padMultiple: 64, parts: [{ tensor: 'embed', shape: [100, 6] }] });
  assert.deepEqual(vocab.shape, [64, 6]);
  assert.deepEqual(vocab.pieces.map((p) => [p.start, p.length]), [[[64, 0], [36, 6]]]);
  assert.deepEqual(vocab.padding, [{ start: [36, 0], length: [28, 6] }]);
});

for (const s of scenarios()) {
  test(`plan ${s.name}: every destination byte from its global tensor, once; padding untouched; each rank's own plan agrees`, () => {
    const plan = planSharded(s.layouts);
    assert.ok(plan.pairs.length > 0);
    assert.deepEqual(checkPlan(s.layouts, [plan]), []);
    const own = s.layouts.map((l) => planSharded(s.layouts, { rank: l.rank }));
    assert.deepEqual(checkPlan(s.layouts, own), []);
    // A rank's own plan holds exactly the whole plan's pairs it is in, run for run.
    for (const mine of own) {
      const r = mine.scope as number;
      const expected = plan.pairs.filter((p) => p.src === r || p.dst === r);
      assert.deepEqual(mine.pairs.map((p) => [p.src, p.dst, p.path, p.bytes, [...p.runs]]), expected.map((p) => [p.src, p.dst, p.path, p.bytes, [...p.runs]]), `rank ${r}`);
      assert.equal(mine.fingerprint, plan.fingerprint);
    }
    // The same layouts in another order: the same plan.
    const again = planSharded([...s.layouts].reverse());
    assert.deepEqual(again.pairs.map((p) => [...p.runs]), plan.pairs.map((p) => [...p.runs]));
    // Every byte a destination declared is received once: the plan's bytes are the pieces' bytes.
    const needed = s.layouts.reduce((n, l) => n + l.destinations.reduce((m, d) => m + d.pieces.reduce((k, p) => k + p.length.reduce((a, b) => a * b, dtypeInfo(d.dtype).itemsize), 0), 0), 0);
    assert.equal([...planBytes(plan).received.values()].reduce((a, b) => a + b, 0), needed);
  });
}

test('paths: one rank local, one node CUDA IPC, two nodes NCCL; replicated sources on the destination\'s node are preferred', () => {
  const colocated = scenarios().find((s) => s.name.includes('colocated'))!;
  const plan = planSharded(colocated.layouts);
  assert.ok(plan.pairs.every((p) => p.path === 'ipc'));
  const hsdp = scenarios().find((s) => s.name.startsWith('hsdp'))!;
  const h = planSharded(hsdp.layouts);
  const node = new Map(hsdp.layouts.map((l) => [l.rank, l.node]));
  assert.ok(h.pairs.length > 0 && h.pairs.every((p) => node.get(p.src) === node.get(p.dst) && p.path === 'ipc'), 'node a engines from node a trainers, b from b');
  const fsdp = planSharded(scenarios()[0]!.layouts);
  assert.ok(fsdp.pairs.every((p) => p.path === 'nccl'));
  const self = new LayoutBuilder({ rank: 0, node: 'n', gpu: 0 }).hold('w', { dtype: 'float32', shape: [4] }).need('w2', { dtype: 'float32', shape: [4], tensor: 'w' }).build();
  const p = planSharded([self]);
  assert.deepEqual(p.pairs.map((x) => [x.src, x.dst, x.path, x.bytes]), [[0, 0, 'local', 16]]);
  assert.deepEqual(runsOf(p.pairs[0]!.runs), [{ srcTensor: 0, dstTensor: 0, srcOffset: 0, dstOffset: 0, bytes: 16, count: 1, srcStride: 0, dstStride: 0 }]);
});

test('replicas: a large cell is split over the sources that hold it, bytes balanced; small cells rotate by destination', () => {
  const rows = 2048; const cols = 1024; // 4 MiB of bfloat16: three slabs of at least SPLIT_MIN_BYTES
  assert.ok(rows * cols * 2 >= 3 * SPLIT_MIN_BYTES);
  const layouts: RankLayout[] = [];
  for (let r = 0; r < 3; r++) layouts.push(new LayoutBuilder({ rank: r, node: 'a', gpu: r }).hold('big', { dtype: 'bfloat16', shape: [rows, cols] }).hold('small', { dtype: 'bfloat16', shape: [16] }).build());
  for (let r = 3; r < 9; r++) layouts.push(new LayoutBuilder({ rank: r, node: 'b', gpu: r - 3 }).need('big', { dtype: 'bfloat16', shape: [rows, cols] }).need('small', { dtype: 'bfloat16', shape: [16] }).build());
  const plan = planSharded(layouts);
  assert.deepEqual(checkPlan(layouts, [plan]), []);
  const sent = [...planBytes(plan).sent.values()];
  assert.equal(sent.length, 3);
  assert.ok(Math.max(...sent) - Math.min(...sent) <= 2 * 2 * cols, `sent ${sent}`); // within two rows per destination pair
  // Every destination pulls from all three: 3 slabs of the big tensor.
  for (let d = 3; d < 9; d++) assert.equal(plan.pairs.filter((p) => p.dst === d).length, 3);
});

test('strided sources (a transposed local tensor) and a 3-D expert box: strided runs, values exact', () => {
  const a = new LayoutBuilder({ rank: 0, node: 'n', gpu: 0 })
    .hold('w', { dtype: 'float32', shape: [6, 4], start: [0, 0], length: [6, 2], strides: [4, 24] }) // column-major local
    .hold('x', { dtype: 'float16', shape: [4, 3, 5], start: [0, 0, 0], length: [4, 3, 5] }).build();
  const b = new LayoutBuilder({ rank: 1, node: 'n', gpu: 1 }).hold('w', { dtype: 'float32', shape: [6, 4], start: [0, 2], length: [6, 2] }).build();
  const c = new LayoutBuilder({ rank: 2, node: 'm', gpu: 0 })
    .need('w', { dtype: 'float32', shape: [6, 4], start: [1, 1], length: [4, 3] })
    .needParameter('x13', { dtype: 'float16', shape: [2, 6, 5], pieces: [{ tensor: 'x', shape: [4, 3, 5], start: [1, 0, 0], length: [2, 3, 5], at: [0, 0, 0] }, { tensor: 'x', shape: [4, 3, 5], start: [2, 0, 0], length: [2, 3, 5], at: [0, 3, 0] }] })
    .build();
  const plan = planSharded([a, b, c]);
  assert.deepEqual(checkPlan([a, b, c], [plan]), []);
  const x = runsOf(plan.pairs.find((p) => p.src === 0)!.runs).filter((r) => r.dstTensor === 1);
  assert.deepEqual(x, [
    { srcTensor: 1, dstTensor: 1, srcOffset: 30, dstOffset: 0, bytes: 30, count: 2, srcStride: 30, dstStride: 60 },
    { srcTensor: 1, dstTensor: 1, srcOffset: 60, dstOffset: 30, bytes: 30, count: 2, srcStride: 30, dstStride: 60 },
  ]);
});

function expectLayoutError(fn: () => unknown, code: string, tensor: string, range?: { start: number[]; length: number[] }): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof LayoutError, String(e));
    assert.equal(e.code, code, e.message);
    assert.equal(e.tensor, tensor, e.message);
    if (range) assert.deepEqual(e.range, range, e.message);
    assert.match(e.message, new RegExp(tensor));
    return true;
  });
}

test('refused before anything moves: a byte no source holds, a byte covered twice, dtypes, bounds, global shapes', () => {
  const src = (r: number, start: number, length: number) => new LayoutBuilder({ rank: r, node: 'n', gpu: r }).hold('w', { dtype: 'bfloat16', shape: [10, 4], start: [start, 0], length: [length, 4] }).build();
  const dst = new LayoutBuilder({ rank: 9, node: 'n', gpu: 7 }).need('w', { dtype: 'bfloat16', shape: [10, 4] }).build();
  // Rows 3..5 are held by no one.
  expectLayoutError(() => planSharded([src(0, 0, 3), src(1, 5, 5), dst]), 'ERR_LAYOUT_UNCOVERED', 'w', { start: [3, 0], length: [2, 4] });
  // Each rank's own plan: the destination finds it; a source not involved in the hole does not need to.
  expectLayoutError(() => planSharded([src(0, 0, 3), src(1, 5, 5), dst], { rank: 9 }), 'ERR_LAYOUT_UNCOVERED', 'w');
  // A destination parameter whose pieces overlap (two pieces write rows 2..4 of it).
  const twice = () => new LayoutBuilder({ rank: 9, node: 'n', gpu: 7 }).needParameter('p', { dtype: 'bfloat16', shape: [6, 4], pieces: [
    { tensor: 'w', shape: [10, 4], start: [0, 0], length: [4, 4], at: [0, 0] }, { tensor: 'w', shape: [10, 4], start: [4, 0], length: [4, 4], at: [2, 0] },
  ] }).build();
  expectLayoutError(twice, 'ERR_LAYOUT_OVERLAP', 'p', { start: [2, 0], length: [2, 4] });
  // A destination with a hole neither a piece nor declared padding.
  const hole = () => new LayoutBuilder({ rank: 9, node: 'n', gpu: 7 }).needParameter('p', { dtype: 'bfloat16', shape: [6, 4], pieces: [
    { tensor: 'w', shape: [10, 4], start: [0, 0], length: [4, 4], at: [0, 0] }], padding: [{ start: [5, 0], length: [1, 4] }] }).build();
  expectLayoutError(hole, 'ERR_LAYOUT_UNCOVERED', 'p', { start: [4, 0], length: [1, 4] });
  // Dtypes: a piece whose local tensor has another dtype than the global one, and two ranks disagreeing.
  const f32 = new LayoutBuilder({ rank: 9, node: 'n', gpu: 7 }).need('w', { dtype: 'float32', shape: [10, 4] }).build();
  expectLayoutError(() => planSharded([src(0, 0, 10), f32]), 'ERR_LAYOUT_DTYPE', 'w');
  const wide = new LayoutBuilder({ rank: 9, node: 'n', gpu: 7 }).need('w', { dtype: 'bfloat16', shape: [10, 5] }).build();
  expectLayoutError(() => planSharded([src(0, 0, 10), wide]), 'ERR_LAYOUT_SHAPE', 'w');
  const badLocal = { ...dst, destinations: [{ ...dst.destinations[0]!, dtype: 'float16' as const }] };
  expectLayoutError(() => planSharded([src(0, 0, 10), badLocal]), 'ERR_LAYOUT_DTYPE', 'w');
  // Bounds: a box past the global shape, a piece past its local tensor.
  expectLayoutError(() => new LayoutBuilder({ rank: 0, node: 'n', gpu: 0 }).hold('w', { dtype: 'bfloat16', shape: [10, 4], start: [8, 0], length: [3, 4] }).build(), 'ERR_LAYOUT_BOUNDS', 'w', { start: [8, 0], length: [3, 4] });
  expectLayoutError(() => new LayoutBuilder({ rank: 0, node: 'n', gpu: 0 }).needParameter('p', { dtype: 'bfloat16', shape: [2, 4], pieces: [{ tensor: 'w', shape: [10, 4], start: [0, 0], length: [3, 4] }] }).build(), 'ERR_LAYOUT_BOUNDS', 'p');
  // Two layouts of one rank.
  assert.throws(() => planSharded([src(0, 0, 10), src(0, 0, 10), dst]), { code: 'ERR_LAYOUT_INVALID' });
  // A destination that overlaps with itself through its strides (two elements on one byte).
  const broadcast = { ...dst, destinations: [{ ...dst.destinations[0]!, strides: [0, 2] }] };
  assert.throws(() => planSharded([src(0, 0, 10), broadcast]), { code: 'ERR_LAYOUT_INVALID' });
});

test('layout records: round trip, one encoding, the fingerprint follows the layouts; malformed records refused', () => {
  for (const s of scenarios()) {
    for (const l of s.layouts) {
      const bytes = encodeLayout(l);
      const back = decodeLayout(bytes);
      assert.deepEqual(back, l);
      assert.deepEqual(encodeLayout(back), bytes);
    }
  }
  const [s0] = scenarios();
  const fp = layoutFingerprint(s0!.layouts);
  assert.match(fp, /^[0-9a-f]{64}$/);
  assert.equal(layoutFingerprint([...s0!.layouts].reverse()), fp);
  const changed = s0!.layouts.map((l) => (l.rank === 4 ? { ...l, gpu: 5 } : l));
  assert.notEqual(layoutFingerprint(changed), fp);
  assert.equal(planSharded(s0!.layouts).fingerprint, fp);

  const good = Buffer.from(encodeLayout(s0!.layouts[4]!));
  const refuse = (mutate: (b: Buffer) => Buffer, why: RegExp): void => {
    assert.throws(() => decodeLayout(mutate(Buffer.from(good))), (e: unknown) => e instanceof LayoutError && e.code === 'ERR_LAYOUT_INVALID' && why.test(e.message));
  };
  refuse((b) => { b[0] = 0x58; return b; }, /magic/);
  refuse((b) => { b.writeUInt16LE(2, 4); return b; }, /version 2/);
  refuse((b) => b.subarray(0, b.length - 8), /header says/);
  refuse((b) => { const c = Buffer.concat([b, Buffer.alloc(8)]); c.writeUInt32LE(c.length, 8); return c; }, /follow the last/);
  refuse((b) => { b.writeUInt32LE(0x7fffffff, 20); return b; }, /cannot fit/);
  refuse((b) => { b[32 + 5] = 1; return b; }, /padding after the node id must be zero/); // node 'infer' (5 bytes), padded to 8
  refuse((b) => { b[40 + 4] = 1; return b; }, /reserved bytes must be zero/);
  refuse((b) => { b[40] = 99; return b; }, /dtype code 99/);
  refuse((b) => b.subarray(0, 20), /shorter than/);
});

test('decoded records: the compact check and the object check agree (refusals with their codes; unusual layouts that are valid decode)', () => {
  const src = new LayoutBuilder({ rank: 0, node: 'n', gpu: 0 }).hold('a', { dtype: 'float32', shape: [10, 4], start: [0, 0], length: [5, 4] }).hold('b', { dtype: 'float32', shape: [10, 4], start: [5, 0], length: [5, 4], tensor: 'a' }).build();
  const dst = new LayoutBuilder({ rank: 1, node: 'm', gpu: 0 }).needParameter('w', {
    dtype: 'float32', shape: [10, 4], pieces: [{ tensor: 'a', shape: [10, 4], start: [0, 0], length: [5, 4] }, { tensor: 'a', shape: [10, 4], start: [5, 0], length: [5, 4], at: [5, 0] }],
  }).build();
  const good = Buffer.from(encodeLayout(dst));
  // The second piece's numbers: start (5, 0), length (5, 4), at (5, 0), each a u64.
  const pattern = Buffer.alloc(48);
  [5, 0, 5, 4, 5, 0].forEach((v, i) => pattern.writeUInt32LE(v, 8 * i));
  const at = good.indexOf(pattern);
  assert.ok(at > 0);
  const mutated = (index: number, value: number): Buffer => { const b = Buffer.from(good); b.writeUInt32LE(value, at + 8 * index); return b; };
  const code = (b: Buffer): string => { try { decodeLayout(b); return 'ok'; } catch (e) { return (e as LayoutError).code; } };
  assert.equal(code(good), 'ok');
  assert.equal(code(mutated(4, 4)), 'ERR_LAYOUT_OVERLAP'); // at row 4: overlaps the first piece
  assert.equal(code(mutated(4, 6)), 'ERR_LAYOUT_BOUNDS'); // at row 6: past the local tensor's 10 rows
  assert.equal(code(mutated(2, 4)), 'ERR_LAYOUT_UNCOVERED'); // 4 rows: row 9 neither piece nor padding
  assert.equal(code(mutated(0, 6)), 'ERR_LAYOUT_BOUNDS'); // rows 6..10 of a 10-row tensor
  // Two sources named alike: refused; sources are not required to fill their local tensors.
  const twice = Buffer.from(encodeLayout(src));
  const names = twice.indexOf(Buffer.from('b\0\0\0\0\0\0\0'));
  twice[names] = 0x61; // 'b' -> 'a'
  assert.equal(code(twice), 'ERR_LAYOUT_INVALID');
  // Valid but outside the compact check's fast path: non-ASCII names, strided memory, many pieces.
  const unusual = new LayoutBuilder({ rank: 2, node: 'nœud', gpu: 0 })
    .hold('poids-é', { dtype: 'float32', shape: [4, 3], strides: [4, 16] })
    .needParameter('many', { dtype: 'float32', shape: [12, 1], pieces: Array.from({ length: 12 }, (_, i) => ({ tensor: 'poids-é', shape: [4, 3], start: [i >> 2, i % 3], length: [1, 1], at: [i, 0] })).filter((p) => p.start[0]! < 4) })
    .build();
  const back = decodeLayout(encodeLayout(unusual));
  assert.deepEqual(back, unusual);
  assert.deepEqual(planSharded([back]).pairs.map((p) => p.bytes), planSharded([unusual]).pairs.map((p) => p.bytes));
});
