// `node dist/bench/python-ratios.js [--runs N] [--warmup-runs N] [--no-pin | --cpus A,B]`: the Python channel rows
// of `npm run bench` (issue 38: a Python end at half of Node's pace) and the Node -> Node row they
// compare with, alone, and each run's ratio. The rows take turns as in the whole bench (one round
// runs each row once), so a run's ratio compares rows measured seconds apart: on a loaded machine
// the runs' rates move together more than the rows' do, and the ratios of one round are the figure
// to read, not the medians over every round.
import { benchArgs, intOption } from './args.js';
import { channelBenchmarks, PYTHON_SLOT_BYTES, ROW } from './channel.js';
import { benchPinPlan, describePlan, pinProcess } from './placement.js';

const USAGE = 'usage: node dist/bench/python-ratios.js [--runs N] [--warmup-runs N] [--no-pin | --cpus A,B]';
const values = benchArgs('python-ratios', USAGE, {
  runs: { type: 'string', default: '5' },
  'warmup-runs': { type: 'string', default: '1' },
  'no-pin': { type: 'boolean', default: false },
  cpus: { type: 'string' },
});
const runs = intOption('python-ratios', values, 'runs');
const warmupRuns = intOption('python-ratios', values, 'warmup-runs', 0);
const plan = benchPinPlan('python-ratios', values['no-pin'], values.cpus);
const pin = 'skipped' in plan ? undefined : plan;
if (pin && !pinProcess(process.pid, pin.cpuList)) console.log('pinning: taskset failed; not pinned');
console.log(pin ? `pinning: ${describePlan(pin)}` : `pinning: none (${'skipped' in plan ? plan.skipped : ''})`);
if (pin && !pinProcess(process.pid, pin.helperList, pin.cores[0])) console.log('pinning: taskset failed for the rows');

const nodeRow = ROW.oneWay(PYTHON_SLOT_BYTES, 'adaptive', 'host');
const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
// Node -> Node's row and every row with a Python end (no other row's name says Python).
const res = await channelBenchmarks(0, 0, undefined, { only: new RegExp(`^${escape(nodeRow)}$|Python`), runs, warmupRuns, pin });
const node = res.oneWay[nodeRow];
if (!node) throw new Error(`python-ratios: the row "${nodeRow}" did not run`);
if (!res.python || 'skipped' in res.python) {
  console.log(`Python rows: ${res.python && 'skipped' in res.python ? res.python.skipped : 'did not run'}`);
  process.exit(1);
}
const k = (v: number) => `${(v / 1000).toFixed(0)}k`;
const pct = (v: number) => `${(v * 100).toFixed(0)}%`;
console.log(`\n${runs} run(s) after ${warmupRuns} dropped; msg/s, median of 2000-message batches; Python hot path: ${res.python.rows[0]?.hotPath}`);
console.log(`| row | ${Array.from({ length: runs }, (_, i) => `run ${i + 1}`).join(' | ')} | median of the ratios | Python CPU us/msg (last run) |`);
console.log(`| --- |${' --- |'.repeat(runs + 2)}`);
console.log(`| Node -> Node | ${node.runs.medians.map(k).join(' | ')} | | |`);
for (const p of res.python.rows) {
  const ratios = p.runs.medians.map((m, i) => m / node.runs.medians[i]!);
  const sorted = ratios.slice().sort((a, b) => a - b);
  console.log(`| ${p.direction} | ${p.runs.medians.map((m, i) => `${k(m)} = ${pct(ratios[i]!)}`).join(' | ')} | ${pct(sorted[Math.floor(sorted.length / 2)]!)} | ${p.pythonCpuUsPerMsg.toFixed(2)} |`);
}
// Why a run's rate differs from another's: the core-to-core round trip probed before it, each
// end's waits (spin hits: which end waited for the other; sleeps cost the peer a doorbell ring and
// the sleeper a wake-up), Python's CPU per message, and where the processes ran.
const runLine = (i: number, median: number, floorUs: number | undefined, detail?: string) => console.log(`    ${[`run ${i + 1}: ${k(median)} msg/s`,
  ...(floorUs === undefined ? [] : [`core-to-core round trip before it ${floorUs.toFixed(2)} us`]), ...(detail ? [detail] : [])].join('; ')}`);
console.log(`\nper run${node.placement ? ` (Node -> Node ran on ${node.placement})` : ''}:`);
console.log('  Node -> Node:');
node.runs.medians.forEach((m, i) => runLine(i, m, node.floorsUs?.[i]));
for (const p of res.python.rows) {
  console.log(`  ${p.direction} (${p.placement}):`);
  p.details.forEach((d, i) => runLine(i, p.runs.medians[i]!, p.floorsUs[i], d));
}
if (res.leftovers.length) console.log(`leftovers: ${res.leftovers.join('; ')}`);
