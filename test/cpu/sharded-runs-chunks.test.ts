// The pure half of the sharded sync's device paths (src/tensors/sharded/pair-stream.ts) against a
// byte-by-byte reference: a pair's packed stream cut into chunks maps every stream byte to the
// local byte the reference says, once; a chunk is direct exactly when the reference's bytes of it
// are one range of one tensor; strided runs cut across chunk boundaries; the copy rows of runs and
// of staged pieces; runs past a memory's extent refused with the tensor and the range.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { planSharded, RUN_FIELDS, type PlanPair } from '../../src/tensors/sharded/index.js';
import { checkRunBounds, copyRunsTable, ncclChunkBytes, CopyRunsTableBuilder, pairChunks, pieceRows, planRounds, runRows, streamBytes, toAddress, SLOT_ALIGN, type PairChunk, type RunSide } from '../../src/tensors/sharded/pair-stream.js';
import { CHUNK_BYTES, planRuns } from '../../src/tensors/kernels.js';
import { scenarios } from './sharded-scenarios.js';

/** The reference: stream byte i is byte [tensor, offset] of this side. */
function streamMap(runs: Float64Array, side: RunSide): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (let i = 0; i < runs.length; i += RUN_FIELDS) {
    const [st, dt, so, doff, bytes, count, ss, ds] = Array.from(runs.subarray(i, i + RUN_FIELDS)) as number[];
    const [t, o, s] = side === 'src' ? [st!, so!, ss!] : [dt!, doff!, ds!];
    for (let c = 0; c < count!; c++) for (let b = 0; b < bytes!; b++) out.push([t, o + c * s + b]);
  }
  return out;
}

/** What the chunks say stream byte i is. */
function chunkMap(chunks: readonly PairChunk[]): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (const chunk of chunks) {
    const here: Array<[number, number] | undefined> = new Array(chunk.bytes).fill(undefined);
    if (chunk.direct) {
      for (let b = 0; b < chunk.bytes; b++) here[b] = [chunk.tensor, chunk.offset + b];
    } else {
      for (const p of chunk.pieces) {
        assert.ok(p.count >= 1 && p.bytes > 0, 'no empty piece');
        for (let c = 0; c < p.count; c++) {
          for (let b = 0; b < p.bytes; b++) {
            const at = p.at + c * p.bytes + b;
            assert.equal(here[at], undefined, `chunk byte ${at} filled twice`);
            here[at] = [p.tensor, p.offset + c * p.stride + b];
          }
        }
      }
    }
    here.forEach((x, b) => assert.ok(x, `chunk byte ${b} filled by no piece`));
    out.push(...(here as Array<[number, number]>));
  }
  return out;
}

function contiguous(bytes: ReadonlyArray<[number, number]>): boolean {
  return bytes.every(([t, o], i) => i === 0 || (t === bytes[0]![0] && o === bytes[0]![1] + i));
}

function checkChunks(runs: Float64Array, side: RunSide, chunkBytes: number, label: string): PairChunk[] {
  const chunks = pairChunks(runs, side, chunkBytes);
  const ref = streamMap(runs, side);
  assert.equal(streamBytes(runs), ref.length);
  assert.equal(chunks.length, Math.ceil(ref.length / chunkBytes), `${label}: chunk count`);
  chunks.forEach((c, k) => assert.equal(c.bytes, Math.min(chunkBytes, ref.length - k * chunkBytes), `${label}: chunk ${k} size`));
  assert.deepEqual(chunkMap(chunks), ref, `${label}: every stream byte where the reference puts it`);
  chunks.forEach((c, k) => {
    const lo = k * chunkBytes;
    assert.equal(c.direct, contiguous(ref.slice(lo, lo + c.bytes)), `${label}: chunk ${k} direct exactly when it is one range`);
  });
  return chunks;
}

const table = (...runs: number[][]): Float64Array => Float64Array.from(runs.flat());

test('a strided run cut across chunk boundaries: a partial block, whole blocks, a partial block; both sides', () => {
  // 5 blocks of 10 bytes, source contiguous (stride 10), destination every 32 bytes.
  const runs = table([0, 1, 100, 4, 10, 5, 10, 32]);
  const dst = checkChunks(runs, 'dst', 23, 'dst');
  assert.deepEqual(dst[0], { direct: false, bytes: 23, pieces: [
    { at: 0, tensor: 1, offset: 4, bytes: 10, count: 2, stride: 32 },
    { at: 20, tensor: 1, offset: 68, bytes: 3, count: 1, stride: 0 },
  ] });
  assert.deepEqual(dst[1], { direct: false, bytes: 23, pieces: [
    { at: 0, tensor: 1, offset: 71, bytes: 7, count: 1, stride: 0 },
    { at: 7, tensor: 1, offset: 100, bytes: 10, count: 1, stride: 0 },
    { at: 17, tensor: 1, offset: 132, bytes: 6, count: 1, stride: 0 },
  ] });
  assert.deepEqual(dst[2], { direct: true, bytes: 4, tensor: 1, offset: 138 });
  // The source side of the same stream is one range: every chunk direct.
  const src = checkChunks(runs, 'src', 23, 'src');
  assert.deepEqual(src.map((c) => c.direct && [c.tensor, c.offset, c.bytes]), [[0, 100, 23], [0, 123, 23], [0, 146, 4]]);
  // A chunk inside one block is direct.
  assert.ok(checkChunks(runs, 'dst', 5, 'dst 5').every((c) => c.direct));
});

test('runs that continue each other in memory join; runs of another tensor or with a gap do not', () => {
  const runs = table([0, 0, 0, 0, 8, 1, 0, 0], [0, 0, 8, 16, 8, 1, 0, 0], [1, 0, 0, 24, 8, 1, 0, 0], [1, 1, 16, 0, 8, 1, 0, 0]);
  const src = checkChunks(runs, 'src', 16, 'src');
  assert.deepEqual(src.map((c) => c.direct), [true, false]);
  const dst = checkChunks(runs, 'dst', 16, 'dst');
  assert.deepEqual(dst.map((c) => c.direct), [false, false]);
  assert.deepEqual(checkChunks(runs, 'dst', 8, 'dst 8').map((c) => c.direct), [true, true, true, true]);
  // Zero-byte runs are skipped; an empty stream has no chunk.
  assert.deepEqual(pairChunks(table([0, 0, 0, 0, 0, 1, 0, 0]), 'src', 8), []);
});

test('random runs, both sides, many chunk sizes: every byte where the reference puts it', () => {
  let seed = 12345;
  const rand = (n: number): number => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return seed % n;
  };
  for (let trial = 0; trial < 60; trial++) {
    const runs: number[][] = [];
    const n = 1 + rand(6);
    for (let i = 0; i < n; i++) {
      const bytes = 1 + rand(12);
      const count = 1 + rand(4);
      const kind = rand(3); // 0: contiguous, 1: strided with gaps, 2: stride == bytes
      const stride = (side: number): number => (count === 1 ? 0 : kind === 1 ? bytes + side : bytes);
      runs.push([rand(2), rand(2), rand(4) * 8, rand(4) * 8, bytes, count, stride(1 + rand(5)), stride(1 + rand(5))]);
    }
    const t = table(...runs);
    for (const chunk of [1, 3, 7, 16, 64, 1000]) for (const side of ['src', 'dst'] as const) checkChunks(t, side, chunk, `trial ${trial} ${side} chunk ${chunk}`);
  }
});

test('the scenarios\' plans, every pair, both sides: every byte where the reference puts it', () => {
  let pairs = 0;
  for (const s of scenarios()) {
    for (const pair of planSharded(s.layouts).pairs) {
      pairs++;
      for (const chunk of [7, 64, 96, 1 << 20]) {
        for (const side of ['src', 'dst'] as const) checkChunks(pair.runs, side, chunk, `${s.name} ${pair.src}->${pair.dst} ${side} chunk ${chunk}`);
      }
    }
  }
  assert.ok(pairs > 20);
});

test('copy rows: each block of a strided run a row; staged pieces gathered into or scattered from their slot offsets', () => {
  const runs = table([0, 1, 100, 4, 10, 3, 10, 32], [1, 0, 0, 0, 0, 4, 0, 0], [1, 0, 8, 40, 6, 1, 0, 0]);
  const rows = runRows(runs, (t) => (t === 0 ? 0x1000 : 0x2000), (t) => (t === 0 ? 0x5000 : 0x6000));
  assert.deepEqual(rows, {
    srcs: [0x1064, 0x106e, 0x1078, 0x2008],
    dsts: [0x6004, 0x6024, 0x6044, 0x5028],
    sizes: [10, 10, 10, 6],
  });
  const chunk = pairChunks(runs, 'dst', 23)[0]!;
  assert.equal(chunk.direct, false);
  const pieces = chunk.direct ? [] : chunk.pieces;
  const gather = pieceRows(pieces, (t) => 0x6000 + t, 0x9000, true);
  assert.deepEqual(gather, { srcs: [0x6005, 0x6025, 0x6045], dsts: [0x9000, 0x900a, 0x9014], sizes: [10, 10, 3] });
  const scatter = pieceRows(pieces, (t) => 0x6000 + t, 0x9000, false);
  assert.deepEqual(scatter, { dsts: gather.srcs, srcs: gather.dsts, sizes: gather.sizes });
});

test('copyRunsTable: byte for byte what planRuns makes of the same rows (misaligned heads split, empty rows left out, addresses past 2^32)', () => {
  let seed = 99;
  const rand = (n: number): number => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return seed % n;
  };
  for (let trial = 0; trial < 50; trial++) {
    const rows = { dsts: [] as number[], srcs: [] as number[], sizes: [] as number[] };
    const n = rand(40);
    for (let i = 0; i < n; i++) {
      const base = 0x7f12_3456_0000 + rand(1 << 20) * 4096;
      const mis = rand(4) === 0 ? rand(16) : 0;
      rows.dsts.push(base + rand(64) * 16 + mis);
      rows.srcs.push(base + 0x1_0000_0000 + rand(64) * 16 + (rand(2) ? mis : rand(16)));
      rows.sizes.push([0, 1, 7, 15, 16, 1000, CHUNK_BYTES, CHUNK_BYTES + 3, 5 * CHUNK_BYTES - 1][rand(9)]!);
    }
    const mine = copyRunsTable(rows, CHUNK_BYTES);
    const big = (xs: number[]): BigUint64Array => BigUint64Array.from(xs.map((x) => BigInt(x)));
    const ref = planRuns(big(rows.dsts), big(rows.srcs), big(rows.sizes));
    assert.equal(mine.runs, ref.runs);
    assert.equal(mine.chunks, ref.chunks);
    assert.deepEqual(Buffer.from(mine.data), Buffer.from(ref.data), `trial ${trial}`);
  }
  assert.equal(toAddress(0x7f12_3456_0000n), 0x7f12_3456_0000);
  assert.throws(() => toAddress(1n << 60n), { code: 'ERR_UNSUPPORTED' });
});

test('CopyRunsTableBuilder: from plan runs, byte for byte what planRuns makes of their blocks as rows (strided runs, misaligned heads, rows over a chunk, addresses past 2^32, many pairs growing the buffer)', () => {
  let seed = 7;
  const rand = (n: number): number => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return seed % n;
  };
  for (let trial = 0; trial < 30; trial++) {
    const builder = new CopyRunsTableBuilder(CHUNK_BYTES);
    const rows = { dsts: [] as number[], srcs: [] as number[], sizes: [] as number[] };
    for (let pair = 0, pairs = 1 + rand(4); pair < pairs; pair++) {
      const src = [0x7f12_3456_0000 + rand(1 << 20) * 4096 + rand(2) * rand(16), 0x1_2345_0000 + rand(16)];
      const dst = [0x7f00_0000_0000 + rand(1 << 20) * 4096 + rand(16)];
      const values: number[] = [];
      for (let i = 0, n = rand(30); i < n; i++) {
        const bytes = [0, 1, 7, 16, 1000, 4096, CHUNK_BYTES, CHUNK_BYTES + 3, 3 * CHUNK_BYTES - 1][rand(9)]!;
        const count = rand(3) === 0 ? 1 + rand(3000) : 1;
        values.push(rand(2), 0, rand(1 << 16), rand(1 << 16), bytes, count, count > 1 ? bytes + rand(64) : 0, count > 1 ? bytes + rand(64) : 0);
      }
      const runs = Float64Array.from(values);
      builder.addRuns(runs, src, dst);
      runRows(runs, (t) => src[t]!, (t) => dst[t]!, rows);
    }
    const mine = builder.finish();
    const big = (xs: number[]): BigUint64Array => BigUint64Array.from(xs.map((x) => BigInt(x)));
    const ref = planRuns(big(rows.dsts), big(rows.srcs), big(rows.sizes));
    assert.equal(mine.runs, ref.runs, `trial ${trial}: rows`);
    assert.equal(mine.chunks, ref.chunks, `trial ${trial}: chunks`);
    assert.ok(Buffer.from(mine.data).equals(Buffer.from(ref.data)), `trial ${trial}: the table's bytes`);
  }
});

test('bounds: a run past a memory\'s extent, a tensor index the side lacks, a corrupt number: ERR_OUT_OF_RANGE naming tensor and range', () => {
  const runs = table([0, 1, 100, 4, 10, 5, 10, 32]);
  checkRunBounds(runs, 'src', [150], 'pair 0 -> 1');
  checkRunBounds(runs, 'dst', [0, 4 + 4 * 32 + 10], 'pair 0 -> 1');
  assert.throws(() => checkRunBounds(runs, 'src', [149], 'pair 0 -> 1'), (e: any) => {
    assert.equal(e.code, 'ERR_OUT_OF_RANGE');
    assert.equal(e.name, 'IpcError');
    assert.match(e.message, /pair 0 -> 1: run #0 reaches bytes \[100, 150\) of source tensor #0, past its 149 bytes/);
    return true;
  });
  assert.throws(() => checkRunBounds(runs, 'dst', [0, 141], 'p'), /bytes \[4, 142\) of destination tensor #1, past its 141 bytes/);
  assert.throws(() => checkRunBounds(runs, 'dst', [1000], 'p'), /names destination tensor #1, but this side has 1 destination tensors/);
  assert.throws(() => checkRunBounds(table([0, 0, -1, 0, 4, 1, 0, 0]), 'src', [10], 'p'), { code: 'ERR_OUT_OF_RANGE', message: /run #0 has -1/ });
  assert.throws(() => checkRunBounds(table([0, 0, 0.5, 0, 4, 1, 0, 0]), 'src', [10], 'p'), { code: 'ERR_OUT_OF_RANGE' });
  assert.throws(() => checkRunBounds(Float64Array.of(1, 2, 3), 'src', [10], 'p'), { code: 'ERR_OUT_OF_RANGE', message: /not a multiple of 8/ });
  // An empty run touches nothing, wherever it points.
  checkRunBounds(table([0, 0, 1e6, 0, 0, 1, 0, 0]), 'src', [10], 'p');
  assert.throws(() => pairChunks(runs, 'src', 0), { code: 'ERR_OUT_OF_RANGE' });
});

test('rounds: round k holds chunk k of every stream that has one; staged chunks laid out in one slot, aligned, not overlapping', () => {
  const strided = table([0, 0, 0, 0, 10, 30, 10, 32]); // 300 bytes; the destination side is strided
  const flat = table([0, 0, 0, 0, 700, 1, 0, 0]);
  const streams = [pairChunks(strided, 'dst', 256), pairChunks(flat, 'dst', 256), pairChunks(strided, 'src', 256), pairChunks(strided, 'dst', 100)];
  const { rounds, slotBytes } = planRounds(streams);
  assert.equal(rounds.length, 3);
  assert.deepEqual(rounds.map((r) => r.map((e) => [e.stream, e.slotOffset])), [
    [[0, 0], [1, -1], [2, -1], [3, 256]],
    [[0, 0], [1, -1], [2, -1], [3, 256]],
    [[1, -1], [3, 0]],
  ]);
  rounds.forEach((r, k) => r.forEach((e) => assert.equal(e.chunk, streams[e.stream]![k])));
  assert.equal(slotBytes, 356, 'the largest round: 256 bytes, then 100 at the next 256-byte boundary');
  for (const r of rounds) {
    const staged = r.filter((e) => e.slotOffset >= 0).sort((a, b) => a.slotOffset - b.slotOffset);
    staged.forEach((e, i) => {
      assert.equal(e.slotOffset % SLOT_ALIGN, 0);
      if (i > 0) assert.ok(e.slotOffset >= staged[i - 1]!.slotOffset + staged[i - 1]!.chunk.bytes);
      assert.ok(e.slotOffset + e.chunk.bytes <= slotBytes);
    });
  }
  assert.deepEqual(planRounds([pairChunks(flat, 'src', 256)]).slotBytes, 0, 'direct chunks need no staging');
  assert.deepEqual(planRounds([]), { rounds: [], slotBytes: 0 });
});

// The chunk rule both languages follow (PROTOCOL.md 9.3; python/tests/test_sharded_nccl_chunks twin, same figures).
test('ncclChunkBytes: the plan\'s chunk over the busier rank\'s NCCL streams, down to 256 where 512 or more remain; both ends alike; a round of a rank within the chunk', () => {
  const pair = (src: number, dst: number, path: 'nccl' | 'ipc' | 'local' = 'nccl') => ({ src, dst, path, bytes: 1, runs: new Float64Array(0) }) as unknown as PlanPair;
  // Sources 0, 1; destinations 2..5 (two replicas of TP2): sources have 4 streams, destinations 2.
  const pairs = [0, 1].flatMap((s) => [2, 3, 4, 5].map((d) => pair(s, d)));
  const chunkOf = ncclChunkBytes([...pairs, pair(2, 2, 'local'), pair(0, 1, 'ipc')], 64 << 20);
  assert.deepEqual(pairs.map(chunkOf), Array(8).fill(16 << 20), 'every pair touches a source with 4 streams');
  for (const r of [0, 1, 2, 3, 4, 5]) {
    const round = pairs.filter((p) => p.src === r || p.dst === r).reduce((n, p) => n + chunkOf(p), 0);
    assert.ok(round <= 64 << 20, `rank ${r}'s round holds ${round} bytes`);
  }
  // Two colocated ranks: each sends one and receives one stream.
  const two = [pair(0, 1), pair(1, 0)];
  assert.deepEqual(two.map(ncclChunkBytes(two, 64 << 20)), [32 << 20, 32 << 20]);
  assert.deepEqual(two.map(ncclChunkBytes(two, 10_000)), [4864, 4864], '5000 down to a multiple of 256');
  assert.deepEqual(two.map(ncclChunkBytes(two, 1000)), [500, 500], 'under 512: as divided');
  assert.deepEqual([pair(0, 1)].map(ncclChunkBytes([pair(0, 1)], 3)), [3], 'one stream each: the chunk itself');
  const three = [pair(0, 1), pair(0, 2), pair(0, 3)];
  assert.deepEqual(three.map(ncclChunkBytes(three, 2)), [1, 1, 1], 'never under one byte');
});
