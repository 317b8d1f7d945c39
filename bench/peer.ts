// Peer benchmarks (two GPUs): a process working on GPU 1 uses a pool buffer that another process
// allocated on GPU 0. Measured in the child, on GPU 1: a reading kernel on the shared buffer
// against the same kernel on GPU 1's own memory, and a copy of the shared buffer into GPU 1's
// memory; in the same run, PyTorch's peer copy of the same size (python3 with torch). Printed in
// GB/s with ratios. Skipped, with the reason, without two GPUs that reach each other.
//
//   node dist/bench/peer.js [--mib 256] [--reps 10] [--batch 5] [--no-python] [--same-gpu] [--json FILE]
// --same-gpu runs the same path with both processes on GPU 0: a check of the machinery on a
// one-GPU machine, not a peer figure.
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { probeDriver } from '../src/cuda/driver.js';
import { Device } from '../src/cuda/device.js';
import { Stream } from '../src/cuda/stream.js';
import { spawn } from '../src/link/index.js';
import { printTable, summarize, type Row, type Summary } from './stats.js';
import { benchArgs, intOption } from './args.js';

const CHILD = new URL('./peer-child.js', import.meta.url);
const TORCH_SCRIPT = fileURLToPath(new URL('../../bench/python/peer_copy_torch.py', import.meta.url));

export interface PeerOptions {
  bytes?: number;
  /** Samples per round (3 rounds); each sample is the mean of `batch` operations. */
  reps?: number;
  batch?: number;
  python?: boolean;
  /** Both ends on GPU 0: checks the machinery where there is one GPU (not a peer figure). */
  sameGpu?: boolean;
}

export interface PeerResults {
  skipped?: string;
  bytes: number;
  from?: string;
  to?: string;
  sameGpu?: boolean;
  /** Microseconds per operation. */
  kernelPeerUs?: Summary;
  kernelLocalUs?: Summary;
  copyUs?: Summary;
  torch?: { summary?: Summary; skipped?: string };
}

/** Why the peer benchmark cannot run here, or undefined. */
function whyNot(sameGpu: boolean): string | undefined {
  const probe = probeDriver();
  if (!probe.ok) return `no CUDA driver: ${probe.error.message}`;
  const all = Device.all();
  if (sameGpu) return all.length > 0 ? undefined : 'no CUDA device';
  if (all.length < 2) return `needs two GPUs with peer access; ${all.length} visible (run with --same-gpu to check the machinery on one)`;
  if (!all[1]!.canAccessPeer(all[0]!)) return 'GPU 1 cannot access GPU 0\'s memory (cuDeviceCanAccessPeer)';
  return undefined;
}

function torchPeerCopy(bytes: number, reps: number, batch: number, from: Device, to: Device): { summary?: Summary; skipped?: string } {
  const probe = spawnSync('python3', ['-c', 'import torch; assert torch.cuda.is_available()'], { encoding: 'utf8' });
  if (probe.error || probe.status !== 0) return { skipped: 'python3 with a CUDA-enabled torch is not available' };
  const r = spawnSync('python3', [TORCH_SCRIPT, String(bytes), String(reps), String(batch), from.uuid, to.uuid], {
    encoding: 'utf8', env: { ...process.env, PYTHONUNBUFFERED: '1' }, timeout: 300_000,
  });
  if (r.status !== 0) return { skipped: `failed: ${(r.stderr || r.stdout || String(r.error)).trim().split('\n').slice(-3).join(' | ')}` };
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { median_us: number; p99_us: number; n: number };
  return { summary: { n: out.n, median: out.median_us, p99: out.p99_us, mean: NaN } };
}

export async function peerBenchmarks(options: PeerOptions = {}): Promise<PeerResults> {
  const bytes = options.bytes ?? 256 << 20;
  const sameGpu = options.sameGpu ?? false;
  const skipped = whyNot(sameGpu);
  if (skipped) return { skipped, bytes };
  const from = Device.get(0);
  const to = sameGpu ? from : Device.get(1);
  const reps = options.reps ?? 10;
  const batch = options.batch ?? 5;
  process.stderr.write(`  measuring peer: ${bytes} bytes on ${from.name} (${from.uuid}) used from ${to.name} (${to.uuid})\n`);
  using pool = from.createIpcPool();
  using buffer = pool.allocate(bytes);
  {
    using stream = Stream.create(from);
    buffer.fill(7, { stream });
    await stream.synchronize();
  }
  const { child, link } = await spawn(CHILD, [], { device: to, stdio: 'inherit' });
  let r: { kernelPeerUs: number[]; kernelLocalUs: number[]; copyUs: number[] };
  try {
    link.send({ buffer, reps, batch });
    r = (await link.receive({ signal: AbortSignal.timeout(300_000) })) as typeof r;
  } finally {
    if (child.exitCode === null && child.signalCode === null) await new Promise((resolve) => child.once('exit', resolve));
  }
  const torch = options.python === false ? { skipped: 'not run (--no-python)' } : torchPeerCopy(bytes, reps, batch, from, to);
  return {
    bytes, from: from.uuid, to: to.uuid, sameGpu,
    kernelPeerUs: summarize(r.kernelPeerUs), kernelLocalUs: summarize(r.kernelLocalUs), copyUs: summarize(r.copyUs), torch,
  };
}

/** GB/s at the median time, and at the p99 time (the slowest 1% of samples). */
function rate(bytes: number, s: Summary): { median: number; p99: number } {
  return { median: bytes / s.median / 1e3, p99: bytes / s.p99 / 1e3 };
}

export function peerRows(r: PeerResults): Row[] {
  if (r.skipped || !r.kernelPeerUs || !r.kernelLocalUs || !r.copyUs) return [{ name: 'peer benchmarks', unit: '', median: NaN, notes: [`skipped: ${r.skipped}`] }];
  const mib = `${r.bytes / 1048576} MiB`;
  const [src, dst] = r.sameGpu ? ['GPU 0', 'GPU 0 (same GPU: not a peer figure)'] : ['GPU 0', 'GPU 1'];
  const peer = rate(r.bytes, r.kernelPeerUs);
  const local = rate(r.bytes, r.kernelLocalUs);
  const copy = rate(r.bytes, r.copyUs);
  const torch = r.torch?.summary ? rate(r.bytes, r.torch.summary) : undefined;
  const rows: Row[] = [
    { name: `checksum kernel on ${dst} reading a ${mib} pool buffer of ${src} (another process's)`, unit: 'GB/s', ...peer, n: r.kernelPeerUs.n,
      notes: [`${((peer.median / local.median) * 100).toFixed(1)}% of the same kernel on its own memory`] },
    { name: `same kernel on ${dst} reading its own memory`, unit: 'GB/s', ...local, n: r.kernelLocalUs.n },
    { name: `copy of the shared ${mib} buffer ${src} -> ${dst} in the importing process (cuMemcpyDtoDAsync)`, unit: 'GB/s', ...copy, n: r.copyUs.n,
      notes: torch ? [`${(copy.median / torch.median).toFixed(2)}x PyTorch's peer copy`] : [] },
  ];
  if (torch) rows.push({ name: `reference: PyTorch peer copy ${src} -> ${dst} (dst.copy_(src), one process, same size)`, unit: 'GB/s', ...torch, n: r.torch!.summary!.n });
  else rows.push({ name: 'reference: PyTorch peer copy', unit: 'GB/s', median: NaN, notes: [`skipped: ${r.torch?.skipped}`] });
  return rows;
}

export function printPeer(r: PeerResults): void {
  printTable('Peer access across GPUs (higher is better; "p99" column = GB/s of the slowest 1% of samples)', peerRows(r));
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const values = benchArgs('bench/peer', 'usage: node dist/bench/peer.js [--mib 256] [--reps 10] [--batch 5] [--json FILE] [--no-python] [--same-gpu]', {
    mib: { type: 'string', default: '256' },
    reps: { type: 'string', default: '10' },
    batch: { type: 'string', default: '5' },
    json: { type: 'string' },
    'no-python': { type: 'boolean', default: false },
    'same-gpu': { type: 'boolean', default: false },
  });
  const [mib, reps, batch] = (['mib', 'reps', 'batch'] as const).map((k) => intOption('bench/peer', values, k));
  const r = await peerBenchmarks({ bytes: mib * 1048576, reps, batch, python: !values['no-python'], sameGpu: values['same-gpu'] });
  printPeer(r);
  if (values.json) writeFileSync(values.json, JSON.stringify(r, null, 2) + '\n');
  process.exit(0);
}
