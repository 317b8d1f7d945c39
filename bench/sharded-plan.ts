// `npm run bench:sharded-plan [-- --sample N]`
//
// The sharded-weights planner at scale, on the CPU (issue 37, point 6): the layouts of a
// 1T-parameter MoE model (bench/sharded-model.ts: 61 layers, 384 experts; the trainer on 256 GPUs
// with FSDP + expert parallel, the engine on 128 GPUs with tensor (8, in a node) + expert parallel)
// are encoded as every rank would send them; then, as every rank would, the records are decoded and
// the rank's own part of the plan computed (planSharded(layouts, { rank })), timed (wall and CPU)
// for --sample ranks spread over both sides (default 16). Every rank computes only the pairs it is
// in; the whole plan, which no rank needs, is computed once for the figures: the bytes per GPU,
// min / mean / max, with the busiest GPU against the mean (target: within 1.1x).
import { parseArgs } from 'node:util';
import os from 'node:os';
import { performance } from 'node:perf_hooks';
import { decodeLayout, encodeLayout, planBytes, planSharded, type ShardPlan } from '../src/tensors/sharded/index.js';
import { ONE_T, modelLayouts, parameterCount } from './sharded-model.js';

const { values } = parseArgs({ options: { sample: { type: 'string' } } });
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
// Wall and CPU time (process.cpuUsage) both: on a shared machine the wall clock counts others' work.
const cpu = (): number => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };
let c0 = cpu();
t0 = performance.now();
const decoded = records.map((r) => decodeLayout(r));
const decodeMs = performance.now() - t0;
const decodeCpu = cpu() - c0;
const n = decoded.length;
const sample = Math.min(n, values.sample ? Number(values.sample) : 16);
const ranks = Array.from({ length: sample }, (_, i) => Math.floor(((i + 0.5) * n) / sample));
const timeOf = new Map<number, [number, number]>();
const plans = new Map<number, ShardPlan>();
for (const r of ranks) {
  c0 = cpu();
  const start = performance.now();
  plans.set(r, planSharded(decoded, { rank: r }));
  timeOf.set(r, [performance.now() - start, cpu() - c0]);
}
const stats = (xs: number[], unit = ' ms'): string => {
  const s = [...xs].sort((a, b) => a - b);
  return `min ${s[0]!.toFixed(0)}${unit}, median ${s[Math.floor(s.length / 2)]!.toFixed(0)}${unit}, max ${s[s.length - 1]!.toFixed(0)}${unit}`;
};
console.log(`machine: ${os.cpus().length} CPUs, load average ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}`);
console.log(`per rank: decode all ${n} records: wall ${decodeMs.toFixed(0)} ms, CPU ${decodeCpu.toFixed(0)} ms (every rank does this once); then its own plan:`);
for (const [label, side] of [['trainer (source)', (r: number) => r < cluster.trainerGpus], ['engine (destination)', (r: number) => r >= cluster.trainerGpus]] as const) {
  const mine = ranks.filter(side);
  if (!mine.length) continue;
  console.log(`  ${label} ranks, ${mine.length} timed: wall ${stats(mine.map((r) => timeOf.get(r)![0]))}; CPU ${stats(mine.map((r) => timeOf.get(r)![1]))}`);
}
const worstWall = Math.max(...[...timeOf.values()].map((x) => x[0])) + decodeMs;
const worstCpu = Math.max(...[...timeOf.values()].map((x) => x[1])) + decodeCpu;
console.log(`  slowest rank, decode + own plan: wall ${worstWall.toFixed(0)} ms, CPU ${worstCpu.toFixed(0)} ms (target: under 1000 ms): ${worstCpu < 1000 ? 'MET (CPU)' : 'MISSED'}`);
const runCounts = [...plans.values()].map((p) => p.pairs.reduce((k, x) => k + x.runs.length / 8, 0));
console.log(`  a rank's own plan: runs ${stats(runCounts, '')}; pairs ${stats([...plans.values()].map((p) => p.pairs.length), '')}`);

// The bytes per GPU, from the whole plan (no rank needs it: it is the union of the ranks' own plans,
// checked below for the sampled ranks).
c0 = cpu();
t0 = performance.now();
const whole = planSharded(decoded);
console.log(`whole plan (for the figures): ${whole.pairs.length} pairs, ${whole.pairs.reduce((k, x) => k + x.runs.length / 8, 0)} runs; wall ${(performance.now() - t0).toFixed(0)} ms, CPU ${(cpu() - c0).toFixed(0)} ms`);
for (const [r, mine] of plans) {
  const expected = whole.pairs.filter((p) => p.src === r || p.dst === r);
  const same = expected.length === mine.pairs.length && expected.every((p, i) => {
    const q = mine.pairs[i]!;
    return p.src === q.src && p.dst === q.dst && p.bytes === q.bytes && p.runs.length === q.runs.length && p.runs.every((v, k) => v === q.runs[k]);
  });
  if (!same) throw new Error(`rank ${r}'s own plan differs from the whole plan's pairs for it`);
}
console.log(`  the ${plans.size} sampled ranks' own plans equal the whole plan's pairs for them`);
const { sent, received } = planBytes(whole);
for (const [side, m] of [['sent per trainer GPU', sent], ['received per inference GPU', received]] as const) {
  const xs = [...m.values()];
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
  const max = Math.max(...xs);
  console.log(`bytes ${side}: min ${(Math.min(...xs) / GB).toFixed(2)} GB, mean ${(mean / GB).toFixed(2)} GB, max ${(max / GB).toFixed(2)} GB over ${xs.length} GPUs; busiest / mean ${(max / mean).toFixed(3)} (target <= 1.1): ${max / mean <= 1.1 ? 'MET' : 'MISSED'}`);
}
const total = [...sent.values()].reduce((a, b) => a + b, 0);
const paths = new Map<string, number>();
for (const x of whole.pairs) paths.set(x.path, (paths.get(x.path) ?? 0) + 1);
console.log(`total moved: ${(total / GB).toFixed(0)} GB (each byte once per GPU that needs it); pairs by path: ${[...paths].map(([k, v]) => `${k} ${v}`).join(', ')}`);
