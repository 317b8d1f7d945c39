// The Python companion's handoff benchmark: a fresh 1 MiB buffer handed from Node to a Python child
// (which views it as a PyTorch tensor without a copy, reads one value and acknowledges), and a fresh
// PyTorch tensor handed from Python to Node (which reads one value and releases it), against
// torch.multiprocessing between two Python processes measured in the same run (target: at least 4x
// faster at the median). Host buffers run everywhere python3 exists; the torch rows where python3
// has torch and a GPU is visible; otherwise the bench says why.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { Device } from '../src/cuda/device.js';
import { DeviceBuffer } from '../src/cuda/buffer.js';
import { HostBuffer } from '../src/host/index.js';
import { spawnPython, pythonPackageDirectory, type Link } from '../src/link/index.js';
import '../src/ipc/pool.js';
import { printTable, RunsByName, spreadText, summarize, verdict, widest, withSpread, type Row, type Spread, type Summary } from './stats.js';

export const TORCH_TARGET_RATIO = 4;
const BYTES = 1 << 20;
const python = process.env.CUDA_IPC_PYTHON ?? 'python3';
const script = (name: string) => fileURLToPath(new URL(`../../bench/python/${name}`, import.meta.url));

export interface PythonLinkResults {
  skipped?: string;
  torchSkipped?: string;
  /** Each row over all its runs (combineRuns: the median of the runs' medians and p99s). */
  rows: Record<string, Summary>;
  /** Each row's runs: their medians and spread. */
  runs: Record<string, Spread>;
  reference?: Summary;
  referenceRuns?: Spread;
  referenceSkipped?: string;
  /** With --python-phases: median microseconds of each phase of a handoff, per row kind. */
  phases?: Record<string, Record<string, number>>;
}

export interface PythonLinkOptions {
  /** Instrumented handoffs per row for the per-phase table (0: none). */
  phases?: number;
  /** Times each row runs (the rows taking turns), and then the reference; default 1. */
  runs?: number;
}

const now = () => process.hrtime.bigint();  // CLOCK_MONOTONIC: the clock of Python's time.monotonic_ns
const us = (a: bigint, b: bigint) => Number(b - a) / 1000;
const median = (v: number[]) => summarize(v).median;

/** Python-side timestamps of one stamped handoff (see bench/python/handoff_cuda_ipc.py). */
type Stamps = bigint[];

// "of which" rows overlap the row above them and are left out of the sum. Where both processes
// share a core, a sendmsg() that wakes the peer also counts the time the peer runs first.
const TO_PYTHON_PHASES = [
  'Node: encode + sendmsg',
  'sendmsg to Python having the message (wake-up, receive, decode)',
  'Python: view (memoryview / torch.as_tensor)',
  'of which mapping the buffer (pool import / handle open: buf.ptr)',
  'Python: read one value',
  'Python: close (unmap, release)',
  "of which dropping torch's tensor (its deleter)",
  'ack: Python send start to Node resuming (encode, sendmsg, wake-up, decode)',
  "of which Python's link.send() (then its RELEASE), until it returns",
] as const;

const FROM_PYTHON_PHASES = [
  'request: Node send to Python having it',
  'Python: allocate the tensor',
  'Python share + send to Node having the buffer (sync, pointer query, handle, encode, sendmsg, wake-up, import)',
  "of which Python's link.send(), until it returns",
  'Node: read one value',
  'Node: close',
] as const;

function printPhases(phases: Record<string, Record<string, number>>): void {
  for (const [names, kinds] of [[TO_PYTHON_PHASES, Object.keys(phases).filter((k) => k !== 'give')], [FROM_PYTHON_PHASES, ['give']]] as const) {
    const present = kinds.filter((k) => phases[k]);
    if (present.length === 0) continue;
    const head = ['phase (median us)', ...present];
    const rows = [...names.map((n) => [n, ...present.map((k) => phases[k]![n]!.toFixed(1))]),
      ['sum of the phase medians (without "of which")', ...present.map((k) => Object.entries(phases[k]!).filter(([n]) => !n.startsWith('of which')).reduce((a, [, b]) => a + b, 0).toFixed(1))]];
    const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
    const line = (c: readonly string[]) => '| ' + c.map((v, i) => (i === 0 ? v.padEnd(widths[i]!) : v.padStart(widths[i]!))).join(' | ') + ' |';
    console.log(`\nWhere a Python-link handoff spends its time (${present.includes('give') ? 'a torch tensor Python -> Node' : 'Node -> Python'}; both processes read CLOCK_MONOTONIC)`);
    console.log(line(head));
    console.log('|' + widths.map((w) => '-'.repeat(w + 2)).join('|') + '|');
    for (const r of rows) console.log(line(r));
  }
}

function probe(code: string): string | undefined {
  const r = spawnSync(python, ['-c', code], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: pythonPackageDirectory() } });
  if (r.error) return `${python} is not available (${r.error.message})`;
  if (r.status !== 0) return (r.stderr || r.stdout).trim().split('\n').pop() ?? `exit ${r.status}`;
  return undefined;
}

async function timed(iterations: number, warmup: number, once: () => Promise<void>): Promise<Summary> {
  for (let i = 0; i < warmup; i++) await once();
  const times = new Float64Array(iterations);
  for (let i = 0; i < iterations; i++) {
    const t0 = process.hrtime.bigint();
    await once();
    times[i] = Number(process.hrtime.bigint() - t0) / 1000;
  }
  return summarize(times);
}

async function expect(link: Link, value: number, what: string): Promise<void> {
  const got = await link.receive({ signal: AbortSignal.timeout(60_000) });
  if (got !== value) throw new Error(`${what}: Python read ${String(got)}, not ${value}`);
}

/** torch.multiprocessing between two Python processes (bench/python/handoff_torch.py). */
function torchReference(iterations: number, warmup: number): { summary?: Summary; skipped?: string } {
  const r = spawnSync(python, [script('handoff_torch.py'), String(iterations), String(warmup)], {
    encoding: 'utf8', env: { ...process.env, PYTHONUNBUFFERED: '1' }, timeout: 600_000,
  });
  if (r.status !== 0) return { skipped: `failed: ${(r.stderr || r.stdout).trim().split('\n').slice(-3).join(' | ')}` };
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { median_us: number; p99_us: number; n: number };
  return { summary: { n: out.n, median: out.median_us, p99: out.p99_us, mean: NaN } };
}

/** Runs the Python-link handoffs; prints their table; returns the figures for --json. */
export async function pythonLinkBenchmarks(iterations: number, warmup: number, device: Device | undefined, options: PythonLinkOptions = {}): Promise<PythonLinkResults> {
  const results: PythonLinkResults = { rows: {}, runs: {} };
  const runs = options.runs ?? 1;
  const noPython = probe('import sys; assert sys.version_info >= (3, 10), "Python " + sys.version.split()[0] + " is older than 3.10"; import cuda_ipc');
  if (noPython) {
    results.skipped = `no usable python3 with cuda_ipc: ${noPython}`;
    console.log(`\npython link handoff: skipped: ${results.skipped}`);
    return results;
  }
  const noTorch = !device ? 'no GPU here' : probe('import torch; assert torch.cuda.is_available(), "torch sees no CUDA device"');
  if (noTorch) results.torchSkipped = noTorch;
  console.log(`\npython link handoff: a fresh 1 MiB buffer between Node and a Python child on a link; ${iterations} timed after ${warmup} warm-up, ` +
    `${runs} run(s) of each row, the rows taking turns, then ${runs} of the reference; figures: the median of the runs' medians (and p99s)` +
    (noTorch ? `; the PyTorch rows are skipped: ${noTorch}` : ''));

  const { child, link } = await spawnPython(script('handoff_cuda_ipc.py'), [], { stdio: ['ignore', 'inherit', 'inherit'] });
  /** Each row's summary per run. */
  const perRun = new RunsByName<{ name: string; summary: Summary }>();
  const add = (name: string, summary: Summary) => perRun.add({ name, summary });
  let pool: import('../src/ipc/pool.js').IpcPool | undefined;
  try {
    let mark = 0;
    const hostToPython = async () => {
      const b = HostBuffer.allocate(BYTES);
      const v = ++mark & 0xffffffff;
      new Uint32Array(b.bytes.buffer, b.bytes.byteOffset, 1)[0] = v;
      link.send({ op: 'host', buffer: b });
      b.close();
      await expect(link, v, 'host buffer');
    };
    let torchRows: (() => Promise<void>) | undefined;
    if (!noTorch && device) {
      const p = (pool = device.createIpcPool());
      // Correctness first (a marked buffer, the value Python read through torch must match); the
      // timed loop then does what torch.multiprocessing's reference does: allocate, hand over, the
      // receiver reads one value and acknowledges.
      const toPython = (make: () => DeviceBuffer, dlpack = false) => async () => {
        const b = make();
        link.send({ op: 'torch', buffer: b, dlpack });
        b.close();
        await link.receive({ signal: AbortSignal.timeout(60_000) });
      };
      for (const [what, make, dlpack] of [['pool', () => p.allocate(BYTES), false], ['pool', () => p.allocate(BYTES), true],
        ['legacy', () => DeviceBuffer.allocate(BYTES, { device }), false]] as const) {
        const b = make();
        b.write(new Float32Array([1234.5]));
        link.send({ op: 'torch', buffer: b, dlpack });
        b.close();
        await expect(link, 1234.5, `${what} buffer viewed by torch${dlpack ? ' through DLPack' : ''}`);
      }
      const read = new Float32Array(1);
      torchRows = async () => {
        add('pool buffer Node -> Python torch.as_tensor view', await timed(iterations, warmup, toPython(() => p.allocate(BYTES))));
        add('pool buffer Node -> Python torch.from_dlpack view', await timed(iterations, warmup, toPython(() => p.allocate(BYTES), true)));
        add('legacy buffer Node -> Python torch.as_tensor view', await timed(Math.min(iterations, 500), Math.min(warmup, 100),
          toPython(() => DeviceBuffer.allocate(BYTES, { device }))));
        add('torch tensor Python -> Node (read one value, release)', await timed(iterations, warmup, async () => {
          link.send({ op: 'give' });
          const t = await link.receive({ signal: AbortSignal.timeout(60_000) }) as DeviceBuffer;
          t.read(read);
          t.close();
        }));
      };
    }
    for (let run = 0; run < runs; run++) {
      add('host buffer Node -> Python (memoryview)', await timed(iterations, warmup, hostToPython));
      await torchRows?.();
    }
    if (options.phases) results.phases = await measurePhases(link, options.phases, device && !noTorch ? device : undefined, pool);
  } finally {
    link.send('end');
    await new Promise((r) => (child.exitCode !== null ? r(null) : child.once('exit', r)));
    link.close();
    pool?.close();
  }
  for (const { m, spread } of perRun.combined()) {
    results.rows[m.name] = m.summary;
    results.runs[m.name] = spread!;
  }
  if (!noTorch) {
    const refs = new RunsByName<{ name: string; summary?: Summary }>();
    for (let run = 0; run < runs && !results.referenceSkipped; run++) {
      const ref = torchReference(iterations, warmup);
      refs.add({ name: 'reference', summary: ref.summary });
      results.referenceSkipped = ref.skipped;
    }
    const ref = refs.combined()[0];
    results.reference = ref?.m.summary;
    results.referenceRuns = ref?.spread;
  }

  const table: Row[] = [];
  const ref = results.reference;
  for (const [name, s] of Object.entries(results.rows)) {
    const notes: string[] = [];
    if (ref && name.includes('torch')) {
      const ratio = ref.median / s.median;
      notes.push(`${ratio.toFixed(1)}x faster than torch.multiprocessing`);
      if (name.startsWith('pool buffer') || name.startsWith('torch tensor')) notes.push(`target >= ${TORCH_TARGET_RATIO}x: ${torchVerdict(results, name)}`);
    }
    table.push({ name, unit: 'us', median: s.median, p99: s.p99, n: s.n, notes: withSpread(notes, results.runs[name]!) });
  }
  if (ref) table.push({ name: 'reference: torch.multiprocessing queue, Python -> Python', unit: 'us', median: ref.median, p99: ref.p99, n: ref.n, notes: withSpread([], results.referenceRuns!) });
  else if (!noTorch) table.push({ name: 'reference: torch.multiprocessing queue', unit: 'us', median: NaN, notes: [`skipped: ${results.referenceSkipped}`] });
  printTable('Python companion handoff round trip (lower is better)', table);
  if (results.phases) printPhases(results.phases);
  return results;
}

/** A torch row's target (>= TORCH_TARGET_RATIO x torch.multiprocessing), decided where both its runs
 * and the reference's agree (spread <= 15%; UNDECIDED otherwise). */
function torchVerdict(r: PythonLinkResults, name: string): string {
  const row = r.rows[name];
  if (!row || !r.reference) return 'not measured';
  const spread = widest(r.runs[name], r.referenceRuns);
  const v = verdict(r.reference.median / row.median >= TORCH_TARGET_RATIO, spread);
  return v === 'UNDECIDED' ? `${v} (${spreadText(spread)})` : v;
}

/** Stamped handoffs of each kind: Node's timestamps here, Python's from the child, lined up. */
async function measurePhases(link: Link, n: number, device: Device | undefined, pool: import('../src/ipc/pool.js').IpcPool | undefined): Promise<Record<string, Record<string, number>>> {
  const out: Record<string, Record<string, number>> = {};
  const fetchStamps = async (): Promise<Stamps[]> => {
    link.send({ op: 'phases' });
    const r = await link.receive({ signal: AbortSignal.timeout(60_000) }) as { stamps: Array<Array<number | bigint>> };
    return r.stamps.map((s) => s.map((v) => BigInt(v)));
  };
  const kinds: Array<[string, string, () => HostBuffer | DeviceBuffer, boolean?]> = [['host', 'host', () => HostBuffer.allocate(BYTES)]];
  if (device && pool) {
    kinds.push(['pool', 'torch', () => pool.allocate(BYTES)], ['pool, from_dlpack', 'torch', () => pool.allocate(BYTES), true],
      ['legacy', 'torch', () => DeviceBuffer.allocate(BYTES, { device })]);
  }
  for (const [kind, op, make, dlpack] of kinds) {
    const node: bigint[][] = [];
    for (let i = 0; i < n; i++) {
      const b = make();
      const t0 = now();
      link.send({ op, buffer: b, stamp: true, dlpack: dlpack === true });
      const t1 = now();
      b.close();
      await link.receive({ signal: AbortSignal.timeout(60_000) });
      node.push([t0, t1, now()]);
    }
    const py = await fetchStamps();
    const cols: number[][] = TO_PYTHON_PHASES.map(() => []);
    py.forEach(([received, viewed, read, closed, ackStart, acked, mapped, dropped], i) => {
      const [t0, t1, t2] = node[i]!;
      // Host buffers: no mapping step and no tensor (0).
      const map = mapped !== undefined ? us(received!, mapped) : 0;
      const drop = dropped !== undefined ? us(read!, dropped) : 0;
      [us(t0!, t1!), us(t1!, received!), us(received!, viewed!), map, us(viewed!, read!), us(read!, closed!), drop, us(ackStart!, t2!), us(ackStart!, acked!)]
        .forEach((v, j) => cols[j]!.push(v));
    });
    out[kind] = Object.fromEntries(TO_PYTHON_PHASES.map((name, j) => [name, median(cols[j]!)]));
  }
  if (device && pool) {
    const read = new Float32Array(1);
    const node: bigint[][] = [];
    for (let i = 0; i < n; i++) {
      const t0 = now();
      link.send({ op: 'give', stamp: true });
      const t = await link.receive({ signal: AbortSignal.timeout(60_000) }) as DeviceBuffer;
      const t1 = now();
      t.read(read);
      const t2 = now();
      t.close();
      node.push([t0, t1, t2, now()]);
    }
    const py = await fetchStamps();
    const cols: number[][] = FROM_PYTHON_PHASES.map(() => []);
    py.forEach(([received, allocated, sent], i) => {
      const [t0, t1, t2, t3] = node[i]!;
      [us(t0!, received!), us(received!, allocated!), us(allocated!, t1!), us(allocated!, sent!), us(t1!, t2!), us(t2!, t3!)]
        .forEach((v, j) => cols[j]!.push(v));
    });
    out.give = Object.fromEntries(FROM_PYTHON_PHASES.map((name, j) => [name, median(cols[j]!)]));
  }
  return out;
}
