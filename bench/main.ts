// `npm run bench [-- --iterations N] [--json FILE] [--breakdown] [--python-phases] [--no-python] [--no-python-link] [--no-c] [--no-handoff] [--no-channels] [--no-peer]
//   [--runs N] [--warmup-runs N] [--only REGEX] [--no-pin | --cpus A,B]`:
// the project's benchmarks as a table (median, p99, comparison with the references measured in the
// same run: C, PyTorch, CuPy), optionally a per-phase breakdown of one handoff, optionally JSON.
// Every row runs --runs times (default 3, rows taking turns; channel rows after --warmup-runs dropped
// rounds, default 1) and prints the spread of its runs; a target on a row whose runs spread over 15%
// (or on a reference whose runs do) is UNDECIDED instead of MET / MISSED; --only runs the channel rows whose names match (e.g. --only 'one way, 4 KiB slots, adaptive \(host|Python'
// --no-handoff --no-python-link --no-peer for the Python rows and the Node row they compare with).
// The processes are pinned to CPUs of the GPU's NUMA node (node 0 without a GPU; --no-pin: not;
// --cpus A,B: the bench's main thread on A, a row's child on B, e.g. a pair probed as the nearest).
import { writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { probeDriver } from '../src/cuda/driver.js';
import { Device } from '../src/cuda/device.js';
import { ALT_RINGS, handoffBenchmarks, HANDOFF_BYTES, type HandoffKind, type HandoffResult } from './handoff.js';
import { printBreakdown, PHASES, type Breakdown } from './breakdown.js';
import { buildCReference, runCReference, type CBuild, type CMode, type CReference } from './c-reference.js';
import { pythonHandoffRefs, type PythonRef } from './python-refs.js';
import { printTable, RunsByName, spreadOf, spreadText, verdict, widest, withSpread, type Row, type Spread, type TargetResult, type Verdict } from './stats.js';
import { channelBenchmarks, TARGETS as CHANNEL_TARGETS, type ChannelResults } from './channel.js';
import { printChannelTables } from './channel-tables.js';
import { peerBenchmarks, printPeer, type PeerResults } from './peer.js';
import { pythonLinkBenchmarks, TORCH_TARGET_RATIO, type PythonLinkResults } from './python-link.js';
import { benchPinPlan, describePlan, pinProcess } from './placement.js';
import { benchArgs, intOption } from './args.js';

const USAGE = `usage: npm run bench [-- --iterations N] [--warmup N] [--json FILE] [--breakdown] [--python-phases] [--no-python] [--no-python-link] [--no-c]
  [--no-handoff] [--no-channels] [--no-peer] [--runs N] [--warmup-runs N] [--only REGEX] [--no-pin | --cpus A,B]
(README.md, "Benchmarks", says what each part measures)`;
const values = benchArgs('bench', USAGE, {
  iterations: { type: 'string', default: '2000' },
  warmup: { type: 'string', default: '300' },
  json: { type: 'string' },
  breakdown: { type: 'boolean', default: false },
  'no-python': { type: 'boolean', default: false },
  'no-c': { type: 'boolean', default: false },
  'no-handoff': { type: 'boolean', default: false },
  'no-channels': { type: 'boolean', default: false },
  'no-peer': { type: 'boolean', default: false },
  'no-python-link': { type: 'boolean', default: false },
  'python-phases': { type: 'boolean', default: false },
  runs: { type: 'string', default: '3' },
  'warmup-runs': { type: 'string', default: '1' },
  only: { type: 'string' },
  'no-pin': { type: 'boolean', default: false },
  cpus: { type: 'string' },
});
const iterations = intOption('bench', values, 'iterations');
const warmup = intOption('bench', values, 'warmup', 0);
const runs = intOption('bench', values, 'runs');
const warmupRuns = intOption('bench', values, 'warmup-runs', 0);
let only: RegExp | undefined;
try {
  only = values.only === undefined ? undefined : new RegExp(values.only);
} catch (e) {
  console.error(`bench: --only: ${(e as Error).message}`);
  process.exit(2);
}

/** Handoff targets (issues 10 and 19), each against a figure measured in the same run. */
const HANDOFF_TARGETS = {
  /** pool median at most this many times the C pool flow (issue 19) */
  poolVsC: 1.3,
  /** legacy median at most this many times the C legacy flow (issue 10) */
  legacyVsC: 1.5,
  /** pool median at least this many times faster than PyTorch / CuPy */
  vsTorch: 8,
  vsCupy: 4,
  /** host-buffer median at most this many times the link floor */
  hostVsFloor: 2,
  /** link floor at most this many times the C 1-byte socket round trip (issue 19) */
  floorVsC: 1.3,
  /** Python: pool buffer Node -> torch view at least this many times faster than torch.multiprocessing */
  pythonVsTorchMp: TORCH_TARGET_RATIO,
  /** p99 at most this many times the median: pool, legacy and host rows (issue 10) */
  p99VsMedian: 3,
} as const;

const probe = probeDriver();
const gpu = probe.ok && Device.all().length > 0;
const device = gpu ? Device.get(0) : undefined;
console.log(`cuda-ipc benchmarks on ${hostname()}: ${device ? `${device.name} (CUDA driver ${probe.ok ? probe.version : '?'})` : 'no GPU (host buffers only)'}; Node ${process.version}`);

// Every thread of this process (and so its children) on CPUs of one NUMA node; the channel rows
// pin further (placement.ts).
const plan = benchPinPlan('bench', values['no-pin'], values.cpus, device?.pciBusId);
const pin = 'skipped' in plan ? undefined : plan;
if (pin && !pinProcess(process.pid, pin.cpuList)) console.log(`pinning: taskset failed; not pinned`);
console.log(pin ? `pinning: every process on CPUs ${pin.cpuList}; channel rows: ${describePlan(pin)}`
  : `pinning: none (${'skipped' in plan ? plan.skipped : ''})`);

let handoff: HandoffResult[] = [];
let cBuild: CBuild | undefined;
const cRefs = new Map<CMode, CReference>();
let pyRefs: PythonRef[] = [];
/** Each target with its verdict: MET or MISSED where the runs of every row it compares agree
 * (spread <= 15%), else UNDECIDED (stats.ts verdict). */
const targets: Array<{ row: string; target: string; value: number; limit: number; spread: number; verdict: Verdict }> = [];
const check = (row: string, target: string, value: number, limit: number, atMost: boolean, ...spreads: Array<Spread | undefined>): string => {
  const spread = widest(...spreads);
  const v = verdict(atMost ? value <= limit : value >= limit, spread);
  targets.push({ row, target, value, limit, spread, verdict: v });
  return `${target}: ${v}${v === 'UNDECIDED' ? ` (${spreadText(spread)})` : ''}`;
};
/** The runs of the handoff rows, the C references and the Python references (medians and spread). */
const ours = new RunsByName<HandoffResult>();
const cRuns = new RunsByName<CReference>();
const pyRuns = new RunsByName<PythonRef>();

if (!values['no-handoff']) {
  const breakdownRuns = values.breakdown ? Math.min(iterations, 1000) : 0;
  console.log(`handoff: a fresh 1 MiB buffer to a child that reads one value and acknowledges; ${iterations} timed after ${warmup} warm-up; ` +
    `${runs} run(s) of each row and reference, the rows taking turns; figures: the median of the runs' medians (and p99s)` +
    (breakdownRuns ? `, then ${breakdownRuns} instrumented for the breakdown` : ''));
  // Each round runs every row and reference once; the figures combine the rounds (combineRuns).
  if (!values['no-c']) cBuild = buildCReference(gpu);
  for (let run = 0; run < runs; run++) {
    if (runs > 1) process.stderr.write(`  handoff rows: run ${run + 1} of ${runs}\n`);
    // The breakdown (instrumented handoffs) in the last round only: the last run's result is kept.
    for (const r of await handoffBenchmarks({ iterations, warmup, gpu, breakdown: run === runs - 1 ? breakdownRuns : 0 })) ours.add(r);
    if (cBuild) {
      for (const m of (gpu ? ['pool', 'legacy', 'host', 'socket'] : ['host', 'socket']) as CMode[]) cRuns.add(runCReference(cBuild, m, iterations, warmup, HANDOFF_BYTES));
    }
    if (gpu && !values['no-python']) for (const r of pythonHandoffRefs(iterations, warmup)) pyRuns.add(r);
  }
  handoff = ours.combined().map(({ m }) => m);
  for (const { m } of cRuns.combined()) cRefs.set(m.mode, m);
  pyRefs = pyRuns.combined().map(({ m }) => m);

  const byKind = new Map(handoff.map((r) => [r.kind, r]));
  const cFor: Record<HandoffKind, CMode> = { pool: 'pool', 'pool-fresh': 'pool', legacy: 'legacy', host: 'host', floor: 'socket', 'host-alt': 'host', 'floor-alt': 'socket' };
  const torchRef = pyRefs.find((r) => r.name.startsWith('PyTorch'));
  const cupyRef = pyRefs.find((r) => r.name.startsWith('CuPy'));
  const torch = torchRef?.summary;
  const cupy = cupyRef?.summary;
  const rows: Row[] = [];
  for (const r of handoff) {
    const s = r.summary;
    const mine = ours.spread(r.name);
    const notes: string[] = [];
    const cRef = cRefs.get(cFor[r.kind]);
    const c = cRef?.summary;
    const cRunsOf = cRef && cRuns.spread(cRef.name);
    if (c) notes.push(`${(s.median / c.median).toFixed(2)}x C`);
    if (r.kind === 'pool' || r.kind === 'legacy') {
      const limit = r.kind === 'pool' ? HANDOFF_TARGETS.poolVsC : HANDOFF_TARGETS.legacyVsC;
      if (c) notes.push(check(r.name, `<= ${limit}x C`, s.median / c.median, limit, true, mine, cRunsOf));
      else notes.push(`<= ${limit}x C: no C reference`);
    }
    if (r.kind === 'floor') {
      if (c) notes.push(check(r.name, `<= ${HANDOFF_TARGETS.floorVsC}x C`, s.median / c.median, HANDOFF_TARGETS.floorVsC, true, mine, cRunsOf));
      else notes.push(`<= ${HANDOFF_TARGETS.floorVsC}x C: no C reference`);
    }
    // The default path against the other one (frame rings on or off), same run, same flow.
    const alt = r.kind === 'floor' || r.kind === 'host' ? byKind.get(`${r.kind}-alt`)?.summary : undefined;
    if (alt) notes.push(`${(s.median / alt.median).toFixed(2)}x ${ALT_RINGS ? 'with frame rings' : 'over the socket alone'}`);
    if (r.kind === 'pool') {
      if (torch) notes.push(check(r.name, `${(torch.median / s.median).toFixed(1)}x faster than PyTorch (>= ${HANDOFF_TARGETS.vsTorch}x)`, torch.median / s.median, HANDOFF_TARGETS.vsTorch, false, mine, pyRuns.spread(torchRef!.name)));
      if (cupy) notes.push(check(r.name, `${(cupy.median / s.median).toFixed(1)}x faster than CuPy (>= ${HANDOFF_TARGETS.vsCupy}x)`, cupy.median / s.median, HANDOFF_TARGETS.vsCupy, false, mine, pyRuns.spread(cupyRef!.name)));
    }
    if (r.kind === 'host') {
      const floor = byKind.get('floor');
      if (floor) notes.push(check(r.name, `${(s.median / floor.summary.median).toFixed(2)}x the link floor (<= ${HANDOFF_TARGETS.hostVsFloor}x)`, s.median / floor.summary.median, HANDOFF_TARGETS.hostVsFloor, true, mine, ours.spread(floor.name)));
    }
    if (r.kind === 'pool' || r.kind === 'legacy' || r.kind === 'host') {
      // Decided by how much the runs' own ratios differ.
      const tails = ours.runs(r.name).map((x) => x.p99 / x.median);
      notes.push(check(r.name, `p99 ${(s.p99 / s.median).toFixed(1)}x median (<= ${HANDOFF_TARGETS.p99VsMedian}x)`, s.p99 / s.median, HANDOFF_TARGETS.p99VsMedian, true, spreadOf(tails)));
    }
    rows.push({ name: r.name, unit: 'us', median: s.median, p99: s.p99, n: s.n, notes: mine ? withSpread(notes, mine) : notes });
  }
  for (const c of cRefs.values()) {
    rows.push(c.summary
      ? { name: `reference: ${c.name}`, unit: 'us', median: c.summary.median, p99: c.summary.p99, n: c.summary.n, notes: withSpread([], cRuns.spread(c.name)!) }
      : { name: `reference: ${c.name}`, unit: 'us', median: NaN, notes: [`skipped: ${c.skipped}`] });
  }
  for (const r of pyRefs) {
    rows.push(r.summary
      ? { name: `reference: ${r.name}`, unit: 'us', median: r.summary.median, p99: r.summary.p99, n: r.summary.n, notes: withSpread([], pyRuns.spread(r.name)!) }
      : { name: `reference: ${r.name}`, unit: 'us', median: NaN, notes: [`skipped: ${r.skipped}`] });
  }
  if (values['no-c']) console.log('C reference: not run (--no-c)');
  else if (cBuild?.why) console.log(`C reference: ${cBuild.why}`);
  printTable('Handoff round trip (lower is better; "x C" = median over the C reference of the same flow, same run)', rows);

  if (values.breakdown) {
    printBreakdown('Where one handoff spends its time (median us per phase; sender = this process, receiver = the child)',
      new Map(handoff.map((r) => [r.kind, r.breakdown!])), new Map(handoff.map((r) => [r.kind, r.summary.median])));
  }
}

function largestPhases(b: Breakdown, tail: boolean): string {
  return PHASES.filter((p) => !('beside' in p) && b.phases[p.key])
    .map((p) => ({ what: p.what, us: tail ? b.phases[p.key]!.p99 : b.phases[p.key]!.median }))
    .sort((x, y) => y.us - x.us)
    .slice(0, 4)
    .map((p) => `${p.what} ${p.us.toFixed(1)} us`)
    .join(', ');
}

// The Python companion (its own table; python3 with torch where there is a GPU).
const pythonLink: PythonLinkResults | undefined = values['no-python'] || values['no-python-link'] ? undefined : await pythonLinkBenchmarks(iterations, warmup, device,
  { phases: values['python-phases'] ? Math.min(iterations, 1000) : 0, runs });
const TORCH_ROW = 'pool buffer Node -> Python torch.as_tensor view';
const torchRow = pythonLink?.rows[TORCH_ROW];
if (torchRow && pythonLink?.reference) {
  const ratio = pythonLink.reference.median / torchRow.median;
  check('Python: pool buffer Node -> torch view', `${ratio.toFixed(1)}x faster than torch.multiprocessing (>= ${HANDOFF_TARGETS.pythonVsTorchMp}x)`, ratio, HANDOFF_TARGETS.pythonVsTorchMp, false,
    pythonLink.runs[TORCH_ROW], pythonLink.referenceRuns);
} else if (gpu && pythonLink) {
  console.log(`Python target (>= ${HANDOFF_TARGETS.pythonVsTorchMp}x torch.multiprocessing): not measured (${pythonLink.torchSkipped ?? pythonLink.referenceSkipped ?? pythonLink.skipped ?? 'no torch row'})`);
}

// Every handoff target of the run, met or missed, with the phases that hold a missed one.
if (targets.length) {
  const count = (v: Verdict) => targets.filter((t) => t.verdict === v).length;
  console.log(`\nhandoff targets: ${count('MET')} met, ${count('MISSED')} missed, ${count('UNDECIDED')} undecided (runs spread over 15%) of ${targets.length}`);
  const byName = new Map(handoff.map((r) => [r.name, r]));
  for (const t of targets) {
    const b = byName.get(t.row)?.breakdown;
    const tail = t.target.startsWith('p99');
    const why = t.verdict === 'MET' || !byName.has(t.row) ? '' : b ? `; ${tail ? 'phases with the largest p99' : 'largest phases (median)'}: ${largestPhases(b, tail)}` : ' (run with --breakdown to see which phase holds it)';
    const v = t.verdict === 'UNDECIDED' ? `UNDECIDED (${spreadText(t.spread)})` : t.verdict;
    console.log(`  ${v.padEnd(9)} ${t.row}: ${t.target}${why}`);
  }
}

// Channels: after the handoff table.
let channels: ChannelResults | undefined;
let channelTargets: TargetResult[] = [];
if (!values['no-channels']) {
  // The main thread on a core of its own while the channel rows run, the other threads off the
  // pinned cores (their children pin themselves).
  if (pin && !pinProcess(process.pid, pin.helperList, pin.cores[0])) console.log('pinning: taskset failed for the channel rows');
  channels = await channelBenchmarks(iterations, warmup, device, { python: !values['no-python'], only, runs, warmupRuns, pin });
  if (pin) pinProcess(process.pid, pin.cpuList);
  channelTargets = printChannelTables(channels, iterations, warmup, device);
}

// Peer access across GPUs: prints why it is skipped where there are not two.
let peer: PeerResults | undefined;
if (!values['no-peer']) {
  peer = await peerBenchmarks({ python: !values['no-python'] });
  printPeer(peer);
}

if (values.json) {
  writeFileSync(values.json, JSON.stringify({
    host: hostname(), node: process.version, device: device?.toJSON() ?? null, iterations, warmup,
    handoff: Object.fromEntries(handoff.map((r) => [r.name, r.summary])),
    handoffBreakdown: values.breakdown ? Object.fromEntries(handoff.map((r) => [r.name, r.breakdown])) : null,
    handoffTargets: { limits: HANDOFF_TARGETS, results: targets },
    handoffRuns: Object.fromEntries([...ours.spreads(), ...cRuns.spreads('reference: '), ...pyRuns.spreads('reference: ')]),
    references: pyRefs,
    cReference: cBuild ? { build: cBuild, results: [...cRefs.values()] } : null,
    pythonLink: pythonLink ?? null,
    channels: channels ? { targets: CHANNEL_TARGETS, ...channels, verdicts: channelTargets } : null,
    peer: peer ?? null,
  }, null, 2) + '\n');
  console.log(`\nwrote ${values.json}`);
}

// A measurement that was abandoned (timed out) may leave its child behind: do not wait for it.
process.exit(process.exitCode ?? 0);
