// One rank's planning, in a process of its own (bench/sharded-plan.ts runs one per sampled rank):
// read the group's layout records from FILE (not timed: they came over the links), then, timed,
// what the rank does: decode every record, then plan its own pairs. Prints one JSON line: per phase
// the wall time, the CPU time of the process (every thread: V8's compiler and GC helpers run beside
// the planner's) and of the planner's own thread (/proc/thread-self/stat, in 10 ms ticks: on an
// idle machine, where the helpers run on other cores, what the wall clock would show), the
// fingerprint (part of the plan) also on its own, and a digest of the plan's pairs, which the
// parent compares with the whole plan's pairs for this rank.
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { decodeLayout, layoutFingerprint, planSharded } from '../src/tensors/sharded/index.js';
import { pairsDigest, splitRecords } from './sharded-plan-io.js';

const [file, rankArg] = process.argv.slice(2);
const rank = Number(rankArg);
const records = splitRecords(readFileSync(file!));
const cpu = (): number => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };
/** This thread's user + system time in ms (clock ticks of 10 ms). */
const thread = (): number => {
  const fields = readFileSync('/proc/thread-self/stat', 'latin1').split(')').pop()!.trim().split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10;
};

let c0 = cpu();
let h0 = thread();
let t0 = performance.now();
const layouts = records.map((r) => decodeLayout(r));
const decode = { cpu: cpu() - c0, thread: thread() - h0, wall: performance.now() - t0 };
c0 = cpu();
h0 = thread();
t0 = performance.now();
const plan = planSharded(layouts, { rank });
const own = { cpu: cpu() - c0, thread: thread() - h0, wall: performance.now() - t0 };
c0 = cpu();
layoutFingerprint(layouts);
const fingerprint = { cpu: cpu() - c0 };
const runs = plan.pairs.reduce((k, p) => k + p.runs.length / 8, 0);
console.log(JSON.stringify({ rank, decode, plan: own, fingerprint, pairs: plan.pairs.length, runs, digest: pairsDigest(plan.pairs) }));
