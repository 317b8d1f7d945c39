// Weights loaded once, served by N Python workers, updated in place by a trainer.
//
//   1. writes a small safetensors checkpoint (an MLP: y = relu(x W1 + b1) W2 + b2, weights from a
//      formula), and loads it ONCE into one allocation (loadSafetensors: an IPC pool on a GPU);
//   2. spawns N Python workers and sends each the loaded map: they get torch tensors over the same
//      memory, no copy, and answer requests with them (the server checks every answer against the
//      model computed here on the CPU);
//   3. a trainer process (Python) makes new weights (the same formula with another seed, standing in
//      for a training step) and sends them as a tensor set (share_tensors); the server copies them
//      into the loaded memory in place (updateInPlace: one copy kernel launch on a GPU);
//   4. the workers' next answers use the new weights, with nothing re-sent to them.
//
//   node dist/examples/weights/main.js [--workers 2] [--requests 8] [--host]
// Without a GPU (or with --host) it runs the same flow on host shared memory with pure-Python
// workers; without python3 it says so and exits 0.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  spawnPython, pythonPackageDirectory, loadSafetensors, updateInPlace, writeSafetensors,
  type DeviceArray, type HostArray, type Link, type SpawnedChild, type TensorMap,
} from '../../src/index.js';
import { flag, pickDevice } from '../common.js';

const workers = flag('workers', 2);
const requests = flag('requests', 8);
const D_IN = 32;
const HIDDEN = 64;
const D_OUT = 8;
const BATCH = 4;
const python = process.env.CUDA_IPC_PYTHON ?? 'python3';
const here = (name: string) => fileURLToPath(new URL(`../../../examples/weights/${name}`, import.meta.url));

function skip(why: string): never {
  console.log(`example:weights: skipped: ${why}`);
  process.exit(0);
}

const device = pickDevice();
const probe = (code: string) => spawnSync(python, ['-c', code], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: pythonPackageDirectory() } });
const base = probe('import cuda_ipc');
if (base.error) skip(`${python} is not available (${base.error.message}); set CUDA_IPC_PYTHON`);
if (base.status !== 0) skip(`${python} cannot import cuda_ipc: ${(base.stderr || '').trim().split('\n').pop()}`);
let memory: 'device' | 'host' = device ? 'device' : 'host';
if (memory === 'device') {
  const t = probe('import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)');
  if (t.status !== 0) {
    console.log(`example:weights: ${t.status === 3 ? 'PyTorch sees no CUDA device' : `${python} has no PyTorch`}; running on host shared memory with pure-Python workers instead`);
    memory = 'host';
  }
}
if (memory === 'host' && !device && !process.argv.includes('--host')) console.log('example:weights: no CUDA GPU here; running on host shared memory with pure-Python workers');

// The model, from a formula (the workers only see what crosses; the trainer computes its own).
const weight = (rows: number, cols: number, seed: number) =>
  Float32Array.from({ length: rows * cols }, (_, k) => Math.sin(seed + 0.37 * Math.floor(k / cols) + 0.11 * (k % cols)) / Math.sqrt(rows));
const bias = (n: number, seed: number) => Float32Array.from({ length: n }, (_, j) => Math.cos(seed + 0.23 * j) / 10);
const model = (seed: number) => ({ w1: weight(D_IN, HIDDEN, seed), b1: bias(HIDDEN, seed), w2: weight(HIDDEN, D_OUT, seed + 1), b2: bias(D_OUT, seed + 1) });

function reference(m: ReturnType<typeof model>, x: Float32Array): Float64Array {
  const y = new Float64Array(BATCH * D_OUT);
  const h = new Float64Array(HIDDEN);
  for (let r = 0; r < BATCH; r++) {
    for (let j = 0; j < HIDDEN; j++) {
      let s = m.b1[j]!;
      for (let k = 0; k < D_IN; k++) s += x[r * D_IN + k]! * m.w1[k * HIDDEN + j]!;
      h[j] = Math.max(0, s);
    }
    for (let j = 0; j < D_OUT; j++) {
      let s = m.b2[j]!;
      for (let k = 0; k < HIDDEN; k++) s += h[k]! * m.w2[k * D_OUT + j]!;
      y[r * D_OUT + j] = s;
    }
  }
  return y;
}

const input = (i: number) => Float32Array.from({ length: BATCH * D_IN }, (_, k) => Math.cos(0.013 * i + 0.07 * k));

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  return link.receive({ signal: AbortSignal.timeout(60_000) });
}

/** Every worker answers `requests` batches; each answer is checked against `m`. */
async function serve(pool: SpawnedChild[], m: ReturnType<typeof model>, what: string): Promise<void> {
  let worst = 0;
  for (let i = 0; i < requests; i++) {
    const w = pool[i % pool.length]!;
    const x = input(i);
    const { y } = (await ask(w.link, { op: 'infer', x })) as { y: Float32Array };
    const want = reference(m, x);
    for (let k = 0; k < want.length; k++) worst = Math.max(worst, Math.abs(y[k]! - want[k]!));
  }
  if (!(worst < 1e-3)) throw new Error(`${what}: an answer differs from the model by ${worst}`);
  console.log(`  ${requests} requests over ${pool.length} workers answered with ${what} (largest difference from the CPU reference ${worst.toExponential(1)})`);
}

const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-example-weights-'));
const pool: SpawnedChild[] = [];
let trainer: SpawnedChild | undefined;
try {
  const first = model(0.5);
  const path = join(dir, 'mlp.safetensors');
  writeSafetensors(path, [
    ['w1', { dtype: 'float32', shape: [D_IN, HIDDEN], data: first.w1 }], ['b1', { dtype: 'float32', shape: [HIDDEN], data: first.b1 }],
    ['w2', { dtype: 'float32', shape: [HIDDEN, D_OUT], data: first.w2 }], ['b2', { dtype: 'float32', shape: [D_OUT], data: first.b2 }],
  ], { model: 'mlp', version: '1' });
  const weights = memory === 'device'
    ? await loadSafetensors(path, { device })
    : await loadSafetensors(path, { memory: 'host' });
  console.log(`loaded ${path} once: ${weights.size} tensors, ${weights.byteLength} bytes in one ${memory === 'device' ? 'IPC-pool allocation on ' + device!.name : 'host shared-memory buffer'} (metadata ${JSON.stringify(weights.metadata)})`);

  for (let i = 0; i < workers; i++) pool.push(await spawnPython(here('worker.py'), [memory]));
  for (const w of pool) {
    const r = await ask(w.link, { op: 'load', weights });
    console.log(`  worker pid ${w.child.pid} mapped them: ${r.tensors} tensors as ${r.kind}, no copy`);
  }
  await serve(pool, first, 'the loaded weights');

  // A trainer sends new weights; the server copies them into the memory the workers map.
  trainer = await spawnPython(here('trainer.py'), [memory]);
  const { weights: fresh } = (await ask(trainer.link, { op: 'train', seed: 2.5, d_in: D_IN, hidden: HIDDEN, d_out: D_OUT })) as { weights: TensorMap };
  const r = await updateInPlace(weights as TensorMap<DeviceArray | HostArray>, fresh);
  fresh.close();
  console.log(`trainer pid ${trainer.child.pid} sent new weights: ${r.copied} tensors, ${r.bytes} bytes copied in place (${r.method}, ${r.operations} GPU operation(s)); nothing re-sent to the workers`);
  await serve(pool, model(2.5), 'the trainer\'s weights');
  weights.close();
  console.log('example:weights: ok');
} finally {
  for (const w of pool) await w.link.end();
  if (trainer) await trainer.link.end();
  rmSync(dir, { recursive: true, force: true });
}
