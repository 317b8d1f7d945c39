// `npm run bench:nccl-queue [-- --rounds 5] [--samples 100] [--mib 64] [--no-pin | --cpus A,B] [--json FILE]`: the host time a Python process
// spends queueing NCCL work, idle and with another Python thread busy (bench/python/nccl_queue.py says
// what each row does). A ctypes call that gives the GIL away waits a whole switch interval (5 ms) to get
// it back from a busy thread, so cuda_ipc's Python calls that queue work keep it. Targets: with a busy
// thread, cuda_ipc's broadcast and chunk pipeline within 2x of the same rows idle. References, in the
// same run: the raw NCCL calls keeping the GIL (the floor) and giving it away (how it was).
// Pinned as `npm run bench` pins (bench/placement.ts), on the GPU's NUMA node: the queueing thread on one
// core, the busy thread on the next, NCCL's and every other thread on the rest of the node.
// Needs a GPU, python3 and NCCL (the system's or PyTorch's wheel); says why and exits 0 otherwise.
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { probeDriver } from '../src/cuda/driver.js';
import { Device } from '../src/cuda/device.js';
import { pythonPackageDirectory } from '../src/link/index.js';
import { benchArgs, intOption } from './args.js';
import { benchPinPlan, describePlan } from './placement.js';
import { printTable, spreadOf, spreadText, summarize, verdict, withSpread, type Row, type TargetResult } from './stats.js';

const TOOL = 'bench:nccl-queue';
const values = benchArgs(TOOL, 'usage: npm run bench:nccl-queue [-- --rounds 5] [--samples 100] [--mib 64] [--no-pin | --cpus A,B] [--json FILE]', {
  rounds: { type: 'string', default: '5' },
  samples: { type: 'string', default: '100' },
  'no-pin': { type: 'boolean', default: false },
  cpus: { type: 'string' },
  mib: { type: 'string', default: '64' },
  json: { type: 'string' },
});
const rounds = intOption(TOOL, values, 'rounds');
const samples = intOption(TOOL, values, 'samples');
const mib = intOption(TOOL, values, 'mib');
const BUSY_VS_IDLE = 2;
const python = process.env.CUDA_IPC_PYTHON ?? 'python3';

function skip(why: string): never {
  console.log(`${TOOL}: skipped: ${why}`);
  process.exit(0);
}

const probe = probeDriver();
if (!probe.ok || Device.all().length === 0) skip('no CUDA GPU here');
const device = Device.get(0);
const plan = benchPinPlan(TOOL, values['no-pin'], values.cpus, device.pciBusId);
// The Python process pins its own threads: argument 4, "queueing CPU,busy CPU,the others' CPUs".
const pin = 'skipped' in plan || plan.cores.length < 3 ? undefined : `${plan.cores[0]},${plan.cores[1]},${plan.helperList}`;
console.log(pin && !('skipped' in plan) ? `pinning: ${describePlan(plan)}; the busy thread on CPU ${plan.cores[1]}`
  : `pinning: none (${'skipped' in plan ? plan.skipped : 'fewer than three cores'})`);
const script = fileURLToPath(new URL('../../bench/python/nccl_queue.py', import.meta.url));
const run = spawnSync(python, [script, String(rounds), String(samples), String(mib), ...(pin ? [pin] : [])], {
  encoding: 'utf8', env: { ...process.env, PYTHONPATH: pythonPackageDirectory() }, stdio: ['ignore', 'pipe', 'inherit'], timeout: 600_000,
});
if (run.error) skip(`${python} is not available (${run.error.message}); set CUDA_IPC_PYTHON`);
if (run.status !== 0) {
  console.error(`${TOOL}: ${script} exited with ${run.status ?? run.signal}`);
  process.exit(1);
}
type Samples = number[][];
const out = JSON.parse(run.stdout.trim().split('\n').pop() ?? '{}') as { ops: number; bytes: number; rows: Record<string, { idle: Samples; busy: Samples }> };

const stats = (runs: Samples) => ({ summary: summarize(runs.flat()), spread: spreadOf(runs.map((r) => summarize(r).median)) });
const rows: Row[] = [];
const targets: TargetResult[] = [];
const figures: Record<string, unknown> = {};
for (const [name, m] of Object.entries(out.rows)) {
  const idle = stats(m.idle);
  const busy = stats(m.busy);
  // The target is a ratio: each round's, of samples taken in turns; their spread decides.
  const ratios = spreadOf(m.busy.map((b, i) => summarize(b).median / summarize(m.idle[i]!).median));
  const ratio = summarize(ratios.medians).median;
  const notes = [`busy / idle: ${ratio.toFixed(2)}x (rounds ${ratios.medians.map((v) => v.toFixed(2)).join(' / ')}, ${spreadText(ratios.spread)})`];
  if (name === 'broadcast' || name === 'chunk pipeline') {
    const v = verdict(ratio <= BUSY_VS_IDLE, ratios.spread);
    notes.push(`target <= ${BUSY_VS_IDLE}x: ${v}`);
    targets.push({ row: `${name}, a Python thread busy`, target: `<= ${BUSY_VS_IDLE}x idle`, value: ratio, limit: BUSY_VS_IDLE, spread: ratios.spread, verdict: v });
  }
  rows.push({ name: `${name}, idle`, unit: 'us/op', median: idle.summary.median, p99: idle.summary.p99, n: idle.summary.n, notes: withSpread([], idle.spread) });
  rows.push({ name: `${name}, a Python thread busy`, unit: 'us/op', median: busy.summary.median, p99: busy.summary.p99, n: busy.summary.n, notes: withSpread(notes, busy.spread) });
  figures[name] = { idle: { ...idle.summary, spread: idle.spread.spread }, busy: { ...busy.summary, spread: busy.spread.spread }, ratio, ratioSpread: ratios.spread };
}
const floor = out.rows['raw, GIL kept'];
if (floor) {
  const busyFloor = stats(floor.busy).summary.median;
  for (const r of rows) {
    if (r.name.endsWith('busy') && !r.name.startsWith('raw, GIL kept')) r.notes!.splice(1, 0, `vs raw, GIL kept (busy): ${(r.median / busyFloor).toFixed(2)}x`);
  }
}
printTable(`${TOOL} on ${device.name}: host time per operation queued, ${out.ops} x ${out.bytes >> 20} MiB per sample, ${rounds} rounds of ${samples} samples`, rows);
console.log(`\ntargets: ${targets.map((t) => `${t.row} ${t.verdict}`).join('; ')}`);
if (values.json) writeFileSync(String(values.json), JSON.stringify({ rows: figures, targets }, null, 2));
