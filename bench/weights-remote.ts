// `npm run bench:weights -- --remote [--tensors 3000] [--gib 8] [--net-tensors 750] [--net-gib 2] [--syncs 5]
//   [--paths nvlink,network] [--broadcast] [--json FILE] [--no-references]`  (also `npm run bench:weights:remote`)
//
// Whole models between machines (issue 26): the weights bench's synthetic bf16 state dict (about 8 GiB in
// about 3,000 tensors) from a PyTorch trainer on GPU 0 to a receiver on GPU 1 over a TCP link, the bytes
// over NCCL (cuda_ipc's nccl-tensor-set), received in place (update_in_place straight into the receiver's
// parameters): the first sync (the NCCL communicator made) and repeated syncs. Beside it, in the same run,
// torch.distributed's NCCL on the same bytes the ways RL stacks write it by hand: one flat send (the
// limit), packed 1 GiB buckets (cat, send, slice-copy), per-tensor send + copy. On both of NCCL's paths:
// its default one (NVLink here) and its network path (P2P and shared memory off, the socket transport over
// loopback: what two machines without InfiniBand get; 2 GiB / 750 tensors by default). With --broadcast
// (four GPUs): the same state dict to three receivers on GPUs 1..3 through one Fanout (one NCCL broadcast).
// Each row against its target: a repeated sync within 1.15x one flat send on both paths; on the NVLink
// path >= 5x faster than per-tensor and >= 1.8x faster than packed; a broadcast to three within 1.3x of the
// time to one. Each sync of ours is split into phases (receive: the trainer's send to the receiver holding
// the message; plan; wait: until the transfer's turn on its communicator; queue: queueing its chunks;
// transfer: until the bytes are in the parameters; ack), so that a miss says which phase holds it.
// Needs two GPUs (four for --broadcast), python3 with PyTorch, and PyTorch's NCCL wheel (every process
// loads it: ranks must run one NCCL version); says why and exits 0 otherwise.
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { probeDriver } from '../src/cuda/driver.js';
import { Device } from '../src/cuda/device.js';
import { spawnPython, pythonPackageDirectory, type Link, type SpawnedChild } from '../src/link/index.js';
import { wheelLibraries } from '../src/nccl/discovery.js';
import { NCCL_LIBRARY_ENV } from '../src/nccl/index.js';
import { printTable, summarize, type Row, type Summary } from './stats.js';
import { NET_ENV } from './nccl-env.js';
import { benchArgs, intOption, positiveOption } from './args.js';

const values = benchArgs('bench:weights:remote', 'usage: npm run bench:weights:remote [-- --tensors 3000] [--gib 8] [--net-tensors 750] [--net-gib 2] [--syncs 5]\n  [--paths nvlink,network] [--broadcast] [--json FILE] [--no-references]', {
  tensors: { type: 'string', default: '3000' },
  gib: { type: 'string', default: '8' },
  'net-tensors': { type: 'string', default: '750' },
  'net-gib': { type: 'string', default: '2' },
  syncs: { type: 'string', default: '5' },
  paths: { type: 'string', default: 'nvlink,network' },
  broadcast: { type: 'boolean', default: false },
  json: { type: 'string' },
  'no-references': { type: 'boolean', default: false },
}, process.argv.slice(2).filter((a) => a !== '--remote'));
const TOOL = 'bench:weights --remote';
const size = {
  tensors: intOption(TOOL, values, 'tensors'), 'net-tensors': intOption(TOOL, values, 'net-tensors'),
  gib: positiveOption(TOOL, values, 'gib'), 'net-gib': positiveOption(TOOL, values, 'net-gib'),
};
const paths = String(values.paths).split(',').filter(Boolean);
if (paths.length === 0 || paths.some((p) => p !== 'nvlink' && p !== 'network')) {
  console.error('bench:weights --remote: --paths is a comma-separated list of nvlink and network');
  process.exit(2);
}
const syncs = intOption(TOOL, values, 'syncs');
const receivers = values.broadcast ? 3 : 1;
const TARGETS = { repeatedVsFlat: 1.15, vsPerTensor: 5, vsPacked: 1.8, broadcastVsOne: 1.3 } as const;
const python = process.env.CUDA_IPC_PYTHON ?? 'python3';
const script = (name: string) => fileURLToPath(new URL(`../../bench/python/${name}`, import.meta.url));
const ms = (us: number[]) => us.map((v) => v / 1000);
const GiB = (b: number) => `${(b / 2 ** 30).toFixed(2)} GiB`;
const token = `bench-${process.pid}-${Math.random().toString(36).slice(2)}-weights-remote`;

function skip(why: string): never {
  console.log(`bench:weights --remote: skipped: ${why}`);
  process.exit(0);
}

const probe = probeDriver();
const gpus = probe.ok ? Device.all().length : 0;
if (!probe.ok || gpus === 0) skip('no CUDA GPU here');
if (gpus < receivers + 1) skip(`needs ${receivers + 1} GPUs (NCCL refuses two ranks on one GPU); this machine shows ${gpus}`);
const torchProbe = spawnSync(python, ['-c', 'import torch, sys; sys.exit(0 if torch.cuda.device_count() >= int(sys.argv[1]) else 3)', String(receivers + 1)], {
  encoding: 'utf8', env: { ...process.env, PYTHONPATH: pythonPackageDirectory() },
});
if (torchProbe.error) skip(`${python} is not available (${torchProbe.error.message}); set CUDA_IPC_PYTHON`);
if (torchProbe.status === 3) skip(`PyTorch in ${python} sees fewer than ${receivers + 1} CUDA devices`);
if (torchProbe.status !== 0) skip(`${python} has no PyTorch: ${(torchProbe.stderr || '').trim().split('\n').pop()}`);
const wheels = await wheelLibraries(python);
if (!wheels.paths.length) skip(`PyTorch's NCCL wheel is not found (${wheels.why})`);
const wheel = wheels.paths[0]!;

console.log(`bench:weights --remote on ${Device.get(0).name} x ${gpus} (CUDA driver ${probe.ok ? probe.version : '?'}), NCCL ${wheel}: ` +
  `${paths.join(' and ')} path(s); ${syncs} repeated syncs per row${values.broadcast ? '; a broadcast to 3 receivers' : ''}`);

async function ask(link: Link, message: unknown, timeoutMs = 600_000): Promise<any> {
  link.send(message);
  const r = await link.receive({ signal: AbortSignal.timeout(timeoutMs) });
  if (r && typeof r === 'object' && 'error' in r) throw new Error(String((r as { error: unknown }).error));
  return r;
}

interface Measured { summary: Summary; phases?: Record<string, number>; note?: string }
interface PathResult { tensors: number; bytes: number; rows: Record<string, Measured | { skipped: string }>; targets: Array<{ what: string; met: boolean }> }

const ROW = {
  flat: 'torch.distributed: one flat send of the same bytes (the limit)',
  packed: 'torch.distributed: packed 1 GiB buckets (cat, send, slice-copy)',
  perTensor: 'torch.distributed: per-tensor send, recv into a new tensor, copy',
  first: 'ours: first sync (NCCL communicator made), in place',
  repeated: 'ours: repeated sync, in place',
  broadcast: 'ours: broadcast to 3 receivers (one Fanout), repeated',
} as const;

function medians(phases: Record<string, number[]>, send: number[]): Record<string, number> {
  const out: Record<string, number> = { 'trainer: send (the record)': summarize(ms(send)).median };
  for (const [k, v] of Object.entries(phases)) out[`receiver: ${k}`] = summarize(ms(v)).median;
  return out;
}

async function ours(path: string, env: NodeJS.ProcessEnv, tensors: number, gib: number, result: PathResult): Promise<void> {
  const spawn = () => spawnPython(script('weights_remote.py'), [], { stdio: ['ignore', 'inherit', 'inherit'], env });
  const trainer: SpawnedChild = await spawn();
  const rx: SpawnedChild[] = [];
  let finished = false;
  try {
    for (let k = 0; k < receivers; k++) rx.push(await spawn());
    const [t, ...r] = await Promise.all([
      ask(trainer.link, { op: 'build', tensors, gib, seed: 1, ordinal: 0 }),
      ...rx.map((c, k) => ask(c.link, { op: 'build', tensors, gib, seed: 2, ordinal: k + 1 })),
    ]);
    if (r.some((x) => x.count !== t.count)) throw new Error('the trainer and the receivers built different state dicts');
    result.tensors = t.count;
    result.bytes = t.bytes;
    const { url } = await ask(trainer.link, { op: 'listen', token, links: receivers });
    for (const c of rx) await ask(c.link, { op: 'connect', url, token });  // one at a time: link k is receiver k
    await ask(trainer.link, { op: 'accepted' });
    const once = async (label: string, n: number, to: number, broadcast: boolean) => {
      const warmup = broadcast ? 1 : 0;  // a Fanout makes its communicator (of 4 ranks) at its first send
      const [run, ...serve] = await Promise.all([
        ask(trainer.link, { op: 'run', syncs: n, warmup, links: to, broadcast }),
        ...rx.slice(0, to).map((c) => ask(c.link, { op: 'serve', syncs: n, warmup })),
      ]);
      result.rows[label] = {
        summary: summarize(ms(run.times)), phases: medians(serve[0].phases, run.send),
        note: `receiver: ${serve[0].method}, ${serve[0].operations} NCCL operation(s) per sync`,
      };
    };
    await once(ROW.first, 1, 1, false);
    await once(ROW.repeated, syncs, 1, false);
    if (values.broadcast) await once(ROW.broadcast, syncs, 3, true);
    const sums = await Promise.all([trainer, ...rx].map((c) => ask(c.link, { op: 'checksum' })));
    const bad = sums.slice(1).findIndex((s) => s.checksum !== sums[0].checksum);
    if (bad >= 0) throw new Error(`${path} path: receiver ${bad + 1}'s parameters differ from the trainer's (checksums ${sums[bad + 1].checksum} and ${sums[0].checksum})`);
    console.log(`${path} path: every receiver ended with the trainer's weights (checksums equal)`);
    await Promise.all([trainer, ...rx].map((c) => ask(c.link, { op: 'free' })));
    finished = true;
  } finally {
    for (const c of [trainer, ...rx]) {
      if (finished) {
        await ask(c.link, { op: 'exit' }).catch(() => {});
        c.link.close();
      } else {
        c.child.kill('SIGKILL');  // one failed while the others may wait on their links: stop them all
        c.link.close();
      }
    }
  }
}

function references(env: NodeJS.ProcessEnv, tensors: number, gib: number, result: PathResult): void {
  const r = spawnSync(python, [script('weights_dist_ref.py'), String(tensors), String(gib), String(syncs), 'flat,packed,per-tensor'], {
    encoding: 'utf8', env, timeout: 900_000, stdio: ['ignore', 'pipe', 'inherit'],
  });
  const labels = { flat: ROW.flat, packed: ROW.packed, 'per-tensor': ROW.perTensor } as const;
  if (r.status !== 0) {
    const why = `failed: ${(r.stdout || String(r.error ?? `exit ${r.status}`)).trim().split('\n').slice(-3).join(' | ')}`;
    for (const label of Object.values(labels)) result.rows[label] = { skipped: why };
    return;
  }
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  for (const [mode, label] of Object.entries(labels)) {
    const m = out[mode];
    result.rows[label] = { summary: summarize(ms(m.times_us)), note: m.checksum_ok ? undefined : 'VALUES DIFFER' };
  }
}

const results: Record<string, PathResult> = {};
for (const path of paths) {
  const net = path === 'network';
  const tensors = size[net ? 'net-tensors' : 'tensors'];
  const gib = size[net ? 'net-gib' : 'gib'];
  const env: NodeJS.ProcessEnv = { ...process.env, NCCL_NVLS_ENABLE: '0', [NCCL_LIBRARY_ENV]: wheel, ...(net ? NET_ENV : {}) };
  const result: PathResult = { tensors, bytes: 0, rows: {}, targets: [] };
  results[path] = result;
  console.log(`\n${path} path: ~${gib} GiB in ~${tensors} tensors${net ? ` (NCCL over sockets: ${Object.entries(NET_ENV).map(([k, v]) => `${k}=${v}`).join(' ')})` : ''}`);
  if (!values['no-references']) references(env, tensors, gib, result);
  await ours(path, env, tensors, gib, result);
  report(path, result);
}

function report(path: string, result: PathResult): void {
  const get = (label: string) => (result.rows[label] && 'summary' in result.rows[label]! ? (result.rows[label] as Measured) : undefined);
  const flat = get(ROW.flat);
  const repeated = get(ROW.repeated);
  const check = (what: string, met: boolean) => {
    result.targets.push({ what, met });
    return `${what}: ${met ? 'MET' : 'MISSED'}`;
  };
  const table: Row[] = [];
  for (const [label, m] of Object.entries(result.rows)) {
    if (!('summary' in m)) {
      table.push({ name: label, unit: 'ms', median: NaN, notes: [`skipped: ${m.skipped}`] });
      continue;
    }
    const notes: string[] = [];
    if (flat && label !== ROW.flat) notes.push(`${(m.summary.median / flat.summary.median).toFixed(2)}x the flat send`);
    if (label === ROW.repeated) {
      if (flat) notes.push(check(`${path}: repeated sync <= ${TARGETS.repeatedVsFlat}x one flat send`, m.summary.median <= TARGETS.repeatedVsFlat * flat.summary.median));
      const perTensor = get(ROW.perTensor);
      const packed = get(ROW.packed);
      if (path === 'nvlink' && perTensor) {
        notes.push(check(`nvlink: ${(perTensor.summary.median / m.summary.median).toFixed(1)}x faster than per-tensor (>= ${TARGETS.vsPerTensor}x)`,
          perTensor.summary.median >= TARGETS.vsPerTensor * m.summary.median));
      }
      if (path === 'nvlink' && packed) {
        notes.push(check(`nvlink: ${(packed.summary.median / m.summary.median).toFixed(1)}x faster than packed (>= ${TARGETS.vsPacked}x)`,
          packed.summary.median >= TARGETS.vsPacked * m.summary.median));
      }
    }
    if (label === ROW.broadcast && repeated) {
      notes.push(check(`${path}: a broadcast to 3 within ${TARGETS.broadcastVsOne}x of one (${(m.summary.median / repeated.summary.median).toFixed(2)}x)`,
        m.summary.median <= TARGETS.broadcastVsOne * repeated.summary.median));
    }
    if (m.note) notes.push(m.note);
    table.push({ name: label, unit: 'ms', median: m.summary.median, p99: m.summary.p99, n: m.summary.n, notes });
  }
  printTable(`Weights sync over a TCP link + NCCL, ${path} path: ${result.tensors} tensors / ${GiB(result.bytes)} bf16, GPU 0 -> GPU 1 (per sync; lower is better)`, table);
  for (const label of [ROW.first, ROW.repeated, ROW.broadcast]) {
    const m = get(label);
    if (m?.phases) console.log(`${label}: where a sync goes (median ms): ${Object.entries(m.phases).map(([k, v]) => `${k} ${v.toFixed(2)}`).join('; ')}`);
  }
  for (const t of result.targets.filter((x) => !x.met)) {
    const m = t.what.includes('broadcast') ? get(ROW.broadcast) : repeated;
    const worst = m?.phases ? Object.entries(m.phases).sort((a, b) => b[1] - a[1])[0] : undefined;
    console.log(`  MISSED ${t.what}${worst ? `; the largest phase: ${worst[0]} (${worst[1].toFixed(2)} ms)` : ''}`);
  }
}

const all = Object.values(results).flatMap((r) => r.targets);
console.log(`\nremote weights targets: ${all.filter((t) => t.met).length} of ${all.length} met`);
if (values.json) {
  writeFileSync(values.json, JSON.stringify({ device: Device.get(0).name, gpus, nccl: wheel, syncs, paths: results, targets: all }, null, 2));
  console.log(`wrote ${values.json}`);
}
process.exit(0);
