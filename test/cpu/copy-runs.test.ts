// The copy_runs kernel's table (src/tensors/kernels.ts planRuns, python/cuda_ipc/tensors/kernels.py
// plan_runs), built on the host: rows, chunks, the split of a shared misalignment, the same bytes
// from both languages; and the shipped PTX: its entry points match TENSOR_KERNELS, and the Python
// package carries the same file.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { CHUNK_BYTES, TENSOR_KERNELS, TENSORS_PTX_FILE, planRuns, runGrid, RUN_BLOCKS_PER_SM } from '../../src/tensors/kernels.js';
import { pythonPackageDirectory } from '../../src/link/index.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const u64 = (xs: Array<number | bigint>) => BigUint64Array.from(xs.map(BigInt));

function rows(t: { data: Uint8Array; runs: number }): bigint[][] {
  const v = new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  return Array.from({ length: t.runs }, (_, i) => [0, 8, 16, 24].map((o) => v.getBigUint64(32 * i + o, true)));
}

test('each run is a row naming its first chunk; the chunks add up', () => {
  const t = planRuns(u64([0x1000, 0x20000, 0x90000]), u64([0x5000, 0x60000, 0xa0000]), u64([100, 3 * 4096 + 1, 4096]), 4096);
  assert.deepEqual(rows(t), [[0x1000n, 0x5000n, 100n, 0n], [0x20000n, 0x60000n, 12289n, 1n], [0x90000n, 0xa0000n, 4096n, 5n]]);
  assert.equal(t.runs, 3);
  assert.equal(t.chunks, 6);
  assert.equal(t.data.byteLength, 96);
});

test('a misalignment both addresses share is split off, so the rest copies with 16-byte loads', () => {
  assert.deepEqual(rows(planRuns(u64([0x1003]), u64([0x7013]), u64([100]), 64)), [[0x1003n, 0x7013n, 13n, 0n], [0x1010n, 0x7020n, 87n, 1n]]);
  assert.deepEqual(rows(planRuns(u64([0x1003]), u64([0x7001]), u64([100]))), [[0x1003n, 0x7001n, 100n, 0n]], 'different misalignments: one row');
  assert.deepEqual(rows(planRuns(u64([0x1003]), u64([0x2003]), u64([5]))), [[0x1003n, 0x2003n, 5n, 0n]], 'shorter than its head: one row');
});

test('empty runs are left out; chunk bytes must be a positive multiple of 16; the grid fills the SMs', () => {
  assert.deepEqual(rows(planRuns(u64([1, 0x2000]), u64([2, 0x4000]), u64([0, 16]))), [[0x2000n, 0x4000n, 16n, 0n]]);
  assert.deepEqual({ ...planRuns(u64([]), u64([]), u64([])), data: undefined }, { data: undefined, runs: 0, chunks: 0 });
  for (const bad of [0, 24, -16, 1.5]) assert.throws(() => planRuns(u64([0]), u64([0]), u64([1]), bad), { code: 'ERR_INVALID_ARG_VALUE' });
  assert.equal(runGrid(3, 132), 3);
  assert.equal(runGrid(1e6, 132), 132 * RUN_BLOCKS_PER_SM);
  assert.equal(runGrid(0, 132), 1);
});

test('Node and Python build the same table from the same runs', (t) => {
  const n = 500;
  const dsts = Array.from({ length: n }, (_, i) => (i << 20) + (i % 16));
  const srcs = Array.from({ length: n }, (_, i) => 0x8000_0000 + (i << 20) + (i % 3 === 0 ? i % 16 : (i * 7) % 16));
  const sizes = Array.from({ length: n }, (_, i) => (i * 7919) % 300_000);
  const ours = planRuns(u64(dsts), u64(srcs), u64(sizes));
  const py = spawnSync('python3', ['-c',
    'import json, sys; from cuda_ipc.tensors.kernels import plan_runs; a = json.load(sys.stdin); t = plan_runs(*a); print(json.dumps([t.data.hex(), t.runs, t.chunks]))'],
  { input: JSON.stringify([dsts, srcs, sizes]), encoding: 'utf8', env: { ...process.env, PYTHONPATH: pythonPackageDirectory() } });
  if (py.error) {
    t.skip(`python3 is not available: ${py.error.message}`);
    return;
  }
  assert.equal(py.status, 0, py.stderr);
  const [hex, runs, chunks] = JSON.parse(py.stdout) as [string, number, number];
  assert.equal(runs, ours.runs);
  assert.equal(chunks, ours.chunks);
  assert.equal(hex, Buffer.from(ours.data).toString('hex'));
  assert.ok(ours.runs > n - 10, 'most runs kept, some split');
  assert.equal(ours.chunks, rows(ours).reduce((s, r) => s + Math.ceil(Number(r[2]) / CHUNK_BYTES), 0));
});

test('the tensors PTX (the Python package\'s copy, which both languages load) declares TENSOR_KERNELS and is kernels/tensors.ptx', () => {
  const ptx = readFileSync(`${root}${TENSORS_PTX_FILE}`, 'utf8');
  const declared = new Map([...ptx.matchAll(/\.entry\s+(\w+)\s*\(([^)]*)\)/g)].map((m) => [m[1]!, (m[2]!.match(/\.param\s+\.\w+/g) ?? []).map((p) => p.split(/\s+/)[1])]));
  const ptxType = { ptr: '.u64', u64: '.u64', u32: '.u32' } as Record<string, string>;
  assert.deepEqual([...declared.keys()].sort(), TENSOR_KERNELS.map((k) => k.name).sort());
  for (const k of TENSOR_KERNELS) assert.deepEqual(declared.get(k.name), k.params.map((p) => ptxType[p.type]), k.name);
  assert.equal(readFileSync(`${root}kernels/tensors.ptx`, 'utf8'), ptx,
    `${TENSORS_PTX_FILE} differs from kernels/tensors.ptx: run scripts/gen-ptx.sh (it writes both)`);
});
