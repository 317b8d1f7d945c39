// The Python reference implementations, run in the same session as ours where python3 has them.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { Summary } from './stats.js';

const script = (name: string) => fileURLToPath(new URL(`../../bench/python/${name}`, import.meta.url));

export interface PythonRef { name: string; summary?: Summary; skipped?: string }

function runRef(name: string, file: string, modules: string, iterations: number, warmup: number): PythonRef {
  const probe = spawnSync('python3', ['-c', `import ${modules}`], { encoding: 'utf8' });
  if (probe.error || probe.status !== 0) return { name, skipped: `python3 with ${modules} is not available` };
  const r = spawnSync('python3', [script(file), String(iterations), String(warmup)], {
    encoding: 'utf8', env: { ...process.env, PYTHONUNBUFFERED: '1' }, timeout: 600_000,
  });
  if (r.status !== 0) return { name, skipped: `failed: ${(r.stderr || r.stdout).trim().split('\n').slice(-3).join(' | ')}` };
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { median_us: number; p99_us: number; n: number };
  return { name, summary: { n: out.n, median: out.median_us, p99: out.p99_us, mean: NaN } };
}

export function pythonHandoffRefs(iterations: number, warmup: number): PythonRef[] {
  return [
    runRef('PyTorch torch.multiprocessing queue', 'handoff_torch.py', 'torch', iterations, warmup),
    runRef('CuPy raw legacy handle via multiprocessing queue', 'handoff_cupy.py', 'cupy', iterations, warmup),
  ];
}
