// The 1T simulation's layouts (bench/sharded-model.ts: FSDP + expert-parallel trainer, tensor +
// expert-parallel engine, fused qkv and gate_up, a padded vocabulary), scaled down so that every
// byte can be checked: the whole plan applied to materialised tensors, every rank's own plan the
// same pairs, each byte sent once per GPU that needs it, and the bytes per GPU balanced (the
// busiest within 1.1x the mean on both sides). `npm run bench:sharded-plan` runs the full size.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { planBytes, planSharded } from '../../src/tensors/sharded/index.js';
import { dtypeInfo } from '../../src/ipc/dtype.js';
import { modelLayouts, type Cluster, type ModelShape } from '../../bench/sharded-model.js';
import { checkPlan } from './sharded-reference.js';

const model: ModelShape = { layers: 3, experts: 8, hidden: 64, qDim: 64, kvDim: 16, moeInter: 32, sharedInter: 32, denseInter: 96, vocab: 1000 };
const cluster: Cluster = { trainerGpus: 16, trainerEp: 4, inferenceGpus: 8, tp: 4, gpusPerNode: 4 };

test('a small model of the 1T layout: values exact, own plans agree, bytes once, busiest GPU within 1.1x the mean', () => {
  const layouts = modelLayouts(model, cluster);
  const plan = planSharded(layouts);
  assert.deepEqual(checkPlan(layouts, [plan]), []);
  for (const l of layouts) {
    const mine = planSharded(layouts, { rank: l.rank });
    const expected = plan.pairs.filter((p) => p.src === l.rank || p.dst === l.rank);
    assert.deepEqual(mine.pairs.map((p) => [p.src, p.dst, p.path, [...p.runs]]), expected.map((p) => [p.src, p.dst, p.path, [...p.runs]]), `rank ${l.rank}`);
  }
  const { sent, received } = planBytes(plan);
  for (const l of layouts.filter((x) => x.destinations.length > 0)) {
    const declared = l.destinations.reduce((n, d) => n + d.pieces.reduce((m, p) => m + p.length.reduce((a, b) => a * b, dtypeInfo(d.dtype).itemsize), 0), 0);
    assert.equal(received.get(l.rank), declared, `rank ${l.rank} receives exactly what it declared`);
  }
  assert.equal(sent.size, cluster.trainerGpus);
  assert.equal(received.size, cluster.inferenceGpus);
  assert.ok(plan.pairs.every((p) => p.path === 'nccl'), 'trainer and engine on different nodes');
  for (const [side, m] of [['sent', sent], ['received', received]] as const) {
    const xs = [...m.values()];
    const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
    assert.ok(Math.max(...xs) <= 1.1 * mean, `${side}: busiest ${Math.max(...xs)} bytes, mean ${mean}`);
  }
});
