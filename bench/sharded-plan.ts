// `npm run bench:sharded-plan [-- --sample N]`
//
// The sharded-weights planner at scale, on the CPU (issue 37, point 6): the layouts of a
// 1T-parameter MoE model (bench/sharded-model.ts: 61 layers, 384 experts; the trainer on 256 GPUs
// with FSDP + expert parallel, the engine on 128 GPUs with tensor (8, in a node) + expert parallel)
// are encoded as every rank would send them; then, as every rank would, a process of its own per
// sampled rank (--sample, default 8, spread over both sides; bench/sharded-plan-rank.ts) decodes
// every record and computes the rank's own part of the plan (planSharded(layouts, { rank })),
// timed per phase (a fresh process, so the JIT's warm-up is counted as a rank pays it): the CPU
// time of the planner's thread, of the whole process (V8's compiler and GC threads run beside it),
// and the wall clock. The whole plan, which no rank needs, is computed here once for the figures
// (the bytes per GPU, min / mean / max, the busiest GPU against the mean: target within 1.1x) and
// to check each sampled rank's plan: its pairs must be exactly the whole plan's pairs for that rank.
import os from 'node:os';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import { decodeLayout, encodeLayout, planBytes, planSharded } from '../src/tensors/sharded/index.js';
import { ONE_T, modelLayouts, parameterCount } from './sharded-model.js';
import { pairsDigest } from './sharded-plan-io.js';
import { benchArgs } from './args.js';

const values = benchArgs('bench:sharded-plan', 'usage: npm run bench:sharded-plan [-- --sample N]', { sample: { type: 'string' } });
const { model, cluster } = ONE_T;
const GB = 1e9;

let start = performance.now();
const layouts = modelLayouts(model, cluster);
const buildMs = performance.now() - start;
start = performance.now();
const records = layouts.map((l) => encodeLayout(l));
const encodeMs = performance.now() - start;
const recordBytes = records.reduce((n, r) => n + r.length, 0);
console.log(`model: ${(parameterCount(model) / 1e12).toFixed(3)}T parameters (bf16, ${(parameterCount(model) * 2 / GB).toFixed(0)} GB), ${model.layers} layers, ${model.experts} experts`);
console.log(`ranks: ${cluster.trainerGpus} trainer GPUs (FSDP over all, EP ${cluster.trainerEp} x FSDP ${cluster.trainerGpus / cluster.trainerEp} for experts) -> ${cluster.inferenceGpus} inference GPUs (TP ${cluster.tp} x DP ${cluster.inferenceGpus / cluster.tp}, EP ${cluster.inferenceGpus})`);
console.log(`layouts: built in ${buildMs.toFixed(0)} ms; ${records.length} records, ${(recordBytes / 1e6).toFixed(1)} MB in all (largest ${(Math.max(...records.map((r) => r.length)) / 1e3).toFixed(0)} kB), encoded in ${encodeMs.toFixed(0)} ms`);

// What every rank does with the group's records, each sampled rank in a process of its own.
const cpu = (): number => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };
const n = records.length;
const sample = Math.min(n, values.sample ? Number(values.sample) : 8);
const ranks = Array.from({ length: sample }, (_, i) => Math.floor(((i + 0.5) * n) / sample));
const dir = mkdtempSync(join(os.tmpdir(), 'sharded-plan-'));
interface Phase { cpu: number; thread: number; wall: number }
interface RankRun { rank: number; decode: Phase; plan: Phase; fingerprint: { cpu: number }; pairs: number; runs: number; digest: string }
const runsOf = new Map<number, RankRun>();
try {
  const file = join(dir, 'records');
  writeFileSync(file, Buffer.concat(records.map((r) => Buffer.from(r.buffer, r.byteOffset, r.byteLength))), { mode: 0o600 });
  const child = fileURLToPath(new URL('./sharded-plan-rank.js', import.meta.url));
  for (const r of ranks) {
    const out = execFileSync(process.execPath, [child, file, String(r)], { encoding: 'utf8', maxBuffer: 1 << 20 });
    runsOf.set(r, JSON.parse(out.trim().split('\n').pop()!) as RankRun);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
const stats = (xs: number[], unit = ' ms'): string => {
  const s = [...xs].sort((a, b) => a - b);
  return `min ${s[0]!.toFixed(0)}${unit}, median ${s[Math.floor(s.length / 2)]!.toFixed(0)}${unit}, max ${s[s.length - 1]!.toFixed(0)}${unit}`;
};
const phase = (xs: Phase[]): string => `planner's thread ${stats(xs.map((x) => x.thread))}; process, all threads ${stats(xs.map((x) => x.cpu))}; wall ${stats(xs.map((x) => x.wall))}`;
const sum = (a: Phase, b: Phase): Phase => ({ cpu: a.cpu + b.cpu, thread: a.thread + b.thread, wall: a.wall + b.wall });
console.log(`machine: ${os.cpus().length} CPUs, load average ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}`);
console.log(`per rank, each in a fresh process: CPU time of the planner's thread (10 ms ticks; on an idle machine, its wall time), of the whole process (V8's compiler and GC threads too), and the wall clock (which counts others' work here):`);
for (const [label, side] of [['trainer (source)', (r: number) => r < cluster.trainerGpus], ['engine (destination)', (r: number) => r >= cluster.trainerGpus]] as const) {
  const mine = ranks.filter(side).map((r) => runsOf.get(r)!);
  if (!mine.length) continue;
  console.log(`  ${label} ranks, ${mine.length} timed:`);
  console.log(`    decode all ${n} records: ${phase(mine.map((x) => x.decode))}`);
  console.log(`    own plan: ${phase(mine.map((x) => x.plan))} (of which the layouts' fingerprint, SHA-256 of ${(recordBytes / 1e6).toFixed(0)} MB: ${stats(mine.map((x) => x.fingerprint.cpu))})`);
  console.log(`    decode + own plan: ${phase(mine.map((x) => sum(x.decode, x.plan)))}`);
}
const all = [...runsOf.values()].map((x) => sum(x.decode, x.plan));
const worst = (k: keyof Phase): number => Math.max(...all.map((x) => x[k]));
console.log(`  slowest rank, decode + own plan: planner's thread ${worst('thread').toFixed(0)} ms, process ${worst('cpu').toFixed(0)} ms, wall ${worst('wall').toFixed(0)} ms (target: under 1000 ms): ${worst('thread') < 1000 ? 'MET (planner\'s thread)' : 'MISSED (planner\'s thread)'}${worst('cpu') < 1000 ? ', MET (process)' : ', MISSED (process, all threads)'}`);
console.log(`  a rank's own plan: runs ${stats([...runsOf.values()].map((x) => x.runs), '')}; pairs ${stats([...runsOf.values()].map((x) => x.pairs), '')}`);

// The bytes per GPU, from the whole plan (no rank needs it: it is the union of the ranks' own plans,
// checked below for the sampled ranks).
let c0 = cpu();
let t0 = performance.now();
const decoded = records.map((r) => decodeLayout(r));
const whole = planSharded(decoded);
console.log(`whole plan (for the figures and the check): ${whole.pairs.length} pairs, ${whole.pairs.reduce((k, x) => k + x.runs.length / 8, 0)} runs; wall ${(performance.now() - t0).toFixed(0)} ms, CPU ${(cpu() - c0).toFixed(0)} ms`);
for (const [r, mine] of runsOf) {
  const expected = whole.pairs.filter((p) => p.src === r || p.dst === r);
  if (pairsDigest(expected) !== mine.digest || expected.length !== mine.pairs) throw new Error(`rank ${r}'s own plan differs from the whole plan's pairs for it`);
}
console.log(`  the ${runsOf.size} sampled ranks' own plans equal the whole plan's pairs for them (SHA-256 of every pair's runs)`);
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
