// `npm run bench:sharded-plan [-- --sample N] [--full]`
//
// The sharded-weights planner at scale, on the CPU (issue 37, point 6): the layouts of a
// 1T-parameter MoE model (bench/sharded-model.ts: 61 layers, 384 experts; the trainer on 256 GPUs
// with FSDP + expert parallel, the engine on 128 GPUs with tensor (8, in a node) + expert parallel)
// are encoded as every rank would send them; then, as every rank would, the records are decoded and
// the rank's own part of the plan computed (planSharded(layouts, { rank })), timed per rank for
// --sample ranks spread over both sides (default: all 384). Every rank computes only the pairs it is
// in: the whole plan is not needed by anyone (--full times it too). The bytes per GPU come from the
// ranks' own plans (all ranks are planned for them), printed min / mean / max, with the busiest GPU
// against the mean (target: within 1.1x).
import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import { decodeLayout, encodeLayout, planBytes, planSharded, type ShardPlan } from '../src/tensors/sharded/index.js';
import { ONE_T, modelLayouts, parameterCount } from './sharded-model.js';

const { values } = parseArgs({ options: { sample: { type: 'string' }, full: { type: 'boolean', default: false } } });
const { model, cluster } = ONE_T;
const GB = 1e9;

let t0 = performance.now();
const layouts = modelLayouts(model, cluster);
const buildMs = performance.now() - t0;
t0 = performance.now();
const records = layouts.map((l) => encodeLayout(l));
const encodeMs = performance.now() - t0;
const recordBytes = records.reduce((n, r) => n + r.length, 0);
console.log(`model: ${(parameterCount(model) / 1e12).toFixed(3)}T parameters (bf16, ${(parameterCount(model) * 2 / GB).toFixed(0)} GB), ${model.layers} layers, ${model.experts} experts`);
console.log(`ranks: ${cluster.trainerGpus} trainer GPUs (FSDP over all, EP ${cluster.trainerEp} x FSDP ${cluster.trainerGpus / cluster.trainerEp} for experts) -> ${cluster.inferenceGpus} inference GPUs (TP ${cluster.tp} x DP ${cluster.inferenceGpus / cluster.tp}, EP ${cluster.inferenceGpus})`);
console.log(`layouts: built in ${buildMs.toFixed(0)} ms; ${records.length} records, ${(recordBytes / 1e6).toFixed(1)} MB in all (largest ${(Math.max(...records.map((r) => r.length)) / 1e3).toFixed(0)} kB), encoded in ${encodeMs.toFixed(0)} ms`);

// What every rank does with the group's records: decode them all (once), then plan its own pairs.
t0 = performance.now();
const decoded = records.map((r) => decodeLayout(r));
const decodeMs = performance.now() - t0;
const n = decoded.length;
const sample = values.sample ? Number(values.sample) : n;
const ranks = Array.from({ length: Math.min(n, sample) }, (_, i) => Math.floor((i * n) / Math.min(n, sample)));
const timeOf = new Map<number, number>();
const plans = new Map<number, ShardPlan>();
for (const r of ranks) {
  const start = performance.now();
  plans.set(r, planSharded(decoded, { rank: r }));
  timeOf.set(r, performance.now() - start);
}
const stats = (xs: number[]): string => {
  const s = [...xs].sort((a, b) => a - b);
  return `min ${s[0]!.toFixed(0)} ms, median ${s[Math.floor(s.length / 2)]!.toFixed(0)} ms, max ${s[s.length - 1]!.toFixed(0)} ms`;
};
const trainerTimes = ranks.filter((r) => r < cluster.trainerGpus).map((r) => timeOf.get(r)!);
const engineTimes = ranks.filter((r) => r >= cluster.trainerGpus).map((r) => timeOf.get(r)!);
console.log(`per rank: decode all ${n} records ${decodeMs.toFixed(0)} ms (once per rank), then its own plan:`);
if (trainerTimes.length) console.log(`  trainer (source) ranks, ${trainerTimes.length} timed: ${stats(trainerTimes)}`);
if (engineTimes.length) console.log(`  engine (destination) ranks, ${engineTimes.length} timed: ${stats(engineTimes)}`);
const worst = Math.max(...timeOf.values()) + decodeMs;
console.log(`  slowest rank, decode + plan: ${worst.toFixed(0)} ms (target: under 1000 ms) ${worst < 1000 ? 'MET' : 'MISSED'}`);

const runs = [...plans.values()].map((p) => p.pairs.reduce((k, x) => k + x.runs.length / 8, 0));
console.log(`  runs in a rank's own plan: ${stats(runs).replace(/ ms/g, '')}; pairs: ${stats([...plans.values()].map((p) => p.pairs.length)).replace(/ ms/g, '')}`);

if (ranks.length === n) {
  // Each pair appears in its source's and its destination's plan: count it once, from the source's.
  const sent = new Map<number, number>();
  const received = new Map<number, number>();
  for (const [r, p] of plans) {
    const b = planBytes(p);
    if (b.sent.has(r)) sent.set(r, b.sent.get(r)!);
    if (b.received.has(r)) received.set(r, b.received.get(r)!);
  }
  for (const [side, m] of [['sent per trainer GPU', sent], ['received per inference GPU', received]] as const) {
    const xs = [...m.values()];
    const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
    const max = Math.max(...xs);
    console.log(`bytes ${side}: min ${(Math.min(...xs) / GB).toFixed(2)} GB, mean ${(mean / GB).toFixed(2)} GB, max ${(max / GB).toFixed(2)} GB over ${xs.length} GPUs; busiest / mean ${(max / mean).toFixed(3)} (target <= 1.1) ${max / mean <= 1.1 ? 'MET' : 'MISSED'}`);
  }
  const total = [...sent.values()].reduce((a, b) => a + b, 0);
  console.log(`total moved: ${(total / GB).toFixed(0)} GB (each byte once per GPU that needs it)`);
  const paths = new Map<string, number>();
  for (const [r, p] of plans) for (const x of p.pairs) if (x.src === r) paths.set(x.path, (paths.get(x.path) ?? 0) + 1);
  console.log(`pairs by path: ${[...paths].map(([k, v]) => `${k} ${v}`).join(', ')}`);
} else {
  console.log('bytes per GPU: run without --sample (every rank planned) to print them');
}

if (values.full) {
  t0 = performance.now();
  const whole = planSharded(decoded);
  console.log(`the whole plan (no rank needs it): ${whole.pairs.length} pairs, ${whole.pairs.reduce((k, x) => k + x.runs.length / 8, 0)} runs, ${(performance.now() - t0).toFixed(0)} ms`);
}
