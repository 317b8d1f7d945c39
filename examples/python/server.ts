// A Node server with PyTorch workers. The server spawns N Python workers (spawnPython), streams
// request batches through a work-sharing channel whose slots are GPU memory, and each worker runs a
// small fixed-weight MLP on the slot in place (a torch tensor view, no copy) and writes its answer
// straight into a device slot of a second channel back to the server, which checks every answer
// against a reference it computed once on the CPU.
//
//   requests: device slots, server -> workers (each batch to one worker)
//   answers:  device slots, workers -> server (many producers, one consumer)
//   model:    y = relu(x W1 + b1) W2 + b2, weights from a formula and a seed (worker.py builds them
//             with torch, this file with the same formula in JavaScript)
//
//   node dist/examples/python/server.js [--workers 2] [--requests 256] [--batch 32]
// Without a GPU, or without python3 with torch, it says why and exits 0.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { ChannelHub, spawnPython, pythonPackageDirectory, type DeviceBuffer, type SpawnedChild } from '../../src/index.js';
import { pickDevice, flag } from '../common.js';

const workers = flag('workers', 2);
const requests = flag('requests', 256);
const batch = flag('batch', 32);
const D_IN = 256;
const HIDDEN = 512;
const D_OUT = 64;
const SEED = 0.5;
const INPUT_SETS = 8;  // distinct input batches; request i carries set i % INPUT_SETS
const python = process.env.CUDA_IPC_PYTHON ?? 'python3';
const workerScript = fileURLToPath(new URL('../../../examples/python/worker.py', import.meta.url));

function skip(why: string): never {
  console.log(`example:python: skipped: ${why}`);
  process.exit(0);
}

const device = pickDevice();
if (!device) skip('no CUDA GPU here (the workers run PyTorch on device slots)');
const probe = spawnSync(python, ['-c', 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)'], {
  encoding: 'utf8', env: { ...process.env, PYTHONPATH: pythonPackageDirectory() },
});
if (probe.error) skip(`${python} is not available (${probe.error.message}); set CUDA_IPC_PYTHON`);
if (probe.status === 3) skip(`PyTorch in ${python} sees no CUDA device`);
if (probe.status !== 0) skip(`${python} has no PyTorch: ${(probe.stderr || '').trim().split('\n').pop()}`);

// The model, as worker.py builds it (float32 weights from float64 formulas).
const weight = (rows: number, cols: number, seed: number) => {
  const w = new Float32Array(rows * cols);
  for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) w[i * cols + j] = Math.sin(seed + 0.37 * i + 0.11 * j) / Math.sqrt(rows);
  return w;
};
const biasOf = (n: number, seed: number) => Float32Array.from({ length: n }, (_, j) => Math.cos(seed + 0.23 * j) / 10);
const w1 = weight(D_IN, HIDDEN, SEED), b1 = biasOf(HIDDEN, SEED);
const w2 = weight(HIDDEN, D_OUT, SEED + 1), b2 = biasOf(D_OUT, SEED + 1);

function input(set: number): Float32Array {
  const x = new Float32Array(batch * D_IN);
  for (let r = 0; r < batch; r++) for (let k = 0; k < D_IN; k++) x[r * D_IN + k] = Math.cos(0.013 * (set * batch + r) + 0.07 * k);
  return x;
}

/** The model on the CPU, in float64 over the float32 inputs and weights. */
function reference(x: Float32Array): Float64Array {
  const y = new Float64Array(batch * D_OUT);
  const h = new Float64Array(HIDDEN);
  for (let r = 0; r < batch; r++) {
    for (let j = 0; j < HIDDEN; j++) {
      let s = b1[j]!;
      for (let k = 0; k < D_IN; k++) s += x[r * D_IN + k]! * w1[k * HIDDEN + j]!;
      h[j] = Math.max(0, s);
    }
    for (let j = 0; j < D_OUT; j++) {
      let s = b2[j]!;
      for (let k = 0; k < HIDDEN; k++) s += h[k]! * w2[k * D_OUT + j]!;
      y[r * D_OUT + j] = s;
    }
  }
  return y;
}

const inputs = Array.from({ length: INPUT_SETS }, (_, s) => input(s));
const expected = inputs.map(reference);  // the reference, computed once per input set
console.log(`example:python: ${workers} PyTorch workers, ${requests} requests of ${batch} x ${D_IN} float32 on ${device.name}; ` +
  `MLP ${D_IN} -> ${HIDDEN} -> ${D_OUT}`);

// Both channels live in this process (it creates and watches them), with its own end of each.
const requestHub = ChannelHub.create({
  slots: 2 * workers, slotBytes: batch * D_IN * 4, memory: { device }, consumers: workers, maxPeers: workers + 1,
});
const answerHub = ChannelHub.create({
  slots: 2 * workers, slotBytes: batch * D_OUT * 4, memory: { device }, producers: workers, maxPeers: workers + 1,
});
const requestCh = requestHub.producer();
const answerCh = answerHub.consumer();

const kids: SpawnedChild[] = [];
for (let i = 0; i < workers; i++) {
  const kid = await spawnPython(workerScript, [i, batch, D_IN, HIDDEN, D_OUT, SEED].map(String), { stdio: ['ignore', 'inherit', 'inherit'] });
  await requestHub.attach(kid.link, { role: 'consumer' });
  await answerHub.attach(kid.link, { role: 'producer' });
  kids.push(kid);
}

const t0 = performance.now();
const sentAt = new Float64Array(requests);
const sending = (async () => {
  for (let id = 0; id < requests; id++) {
    const slot = await requestCh.acquire();  // waits (CPU) until the worker that read this slot is done
    (slot.buffer as DeviceBuffer).write(inputs[id % INPUT_SETS]!);
    sentAt[id] = performance.now();
    requestCh.publish(slot, { meta: { id } });
  }
  await requestCh.end();
})();

const latencies: number[] = [];
const perWorker = new Array<number>(workers).fill(0);
const answered = new Set<number>();
let maxError = 0;
let wrong = 0;
const out = new Float32Array(batch * D_OUT);
for await (const msg of answerCh) {
  const { id, worker } = msg.meta as { id: number; worker: number };
  await msg.synchronize();  // the worker's kernels on the slot are done
  (msg.buffer as DeviceBuffer).read(out);
  msg.release();
  latencies.push(performance.now() - sentAt[id]!);
  const want = expected[id % INPUT_SETS]!;
  let err = 0;
  for (let i = 0; i < out.length; i++) err = Math.max(err, Math.abs(out[i]! - want[i]!) / (1 + Math.abs(want[i]!)));
  maxError = Math.max(maxError, err);
  if (!(err < 1e-3) || answered.has(id)) wrong++;
  answered.add(id);
  perWorker[worker] = (perWorker[worker] ?? 0) + 1;
}
await sending;
const seconds = (performance.now() - t0) / 1000;
const served = await Promise.all(kids.map(async (k) => {
  const r = await k.link.receive({ signal: AbortSignal.timeout(60_000) }) as { served: number };
  if (k.child.exitCode === null) await new Promise((resolve) => k.child.once('exit', resolve));
  return r.served;
}));
answerHub.close();
requestHub.close();
latencies.sort((a, b) => a - b);
const median = latencies[Math.floor(latencies.length / 2)] ?? NaN;
console.log(`example:python: ${answered.size} answers in ${seconds.toFixed(2)} s (${Math.round(answered.size / seconds)} batches/s, ` +
  `median request -> answer ${(median * 1000).toFixed(0)} us); per worker: ${perWorker.join(', ')} (they served ${served.join(', ')}); ` +
  `largest relative error ${maxError.toExponential(2)}; ${wrong} wrong`);
if (answered.size !== requests || wrong !== 0 || served.reduce((a, b) => a + b, 0) !== requests) {
  console.log('example:python: FAILED');
  process.exit(1);
}
console.log('example:python: OK');
