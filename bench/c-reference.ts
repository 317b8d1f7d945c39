// The C reference (bench/reference/handoff_ref.c): built here at run time where a C compiler
// exists (with cuda.h for the pool and legacy modes), run in the same session as the Node
// benchmark, so that every handoff row has its ratio to raw C from the same machine and run.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Summary } from './stats.js';

export type CMode = 'socket' | 'host' | 'pool' | 'legacy';
export const C_NAMES: Record<CMode, string> = {
  socket: 'C: 1-byte socket round trip',
  host: 'C: memfd + SCM_RIGHTS, mmap, read, munmap',
  pool: 'C: pool pointer over a socket (driver API)',
  legacy: 'C: legacy handle over a socket (driver API)',
};

export interface CReference {
  mode: CMode;
  name: string;
  summary?: Summary;
  /** Why there is no summary. */
  skipped?: string;
}

export interface CBuild {
  /** The binary, or undefined with `why`. */
  binary?: string;
  /** Built with cuda.h: the pool and legacy modes exist. */
  cuda: boolean;
  /** Why it was not built, or built without the CUDA modes. */
  why?: string;
  command?: string;
}

const source = fileURLToPath(new URL('../../bench/reference/handoff_ref.c', import.meta.url));

/** A C compiler that answers --version: $CC, cc, gcc or clang; undefined where none does. */
export function findCompiler(): string | undefined {
  for (const cc of [process.env.CC, 'cc', 'gcc', '/usr/bin/gcc', 'clang'].filter((c): c is string => !!c)) {
    const r = spawnSync(cc, ['--version'], { encoding: 'utf8' });
    if (!r.error && r.status === 0) return cc;
  }
  return undefined;
}

function findCudaInclude(): string | undefined {
  const dirs = [process.env.CUDA_HOME, process.env.CUDA_PATH].filter((d): d is string => !!d).map((d) => join(d, 'include'));
  dirs.push('/usr/local/cuda/include', '/usr/include');
  return dirs.find((d) => existsSync(join(d, 'cuda.h')));
}

/** Compiles the reference into a folder under the temp dir (cached by source and flags). */
export function buildCReference(wantCuda: boolean): CBuild {
  if (!existsSync(source)) return { cuda: false, why: `the reference source ${source} is missing` };
  const cc = findCompiler();
  if (!cc) return { cuda: false, why: 'no C compiler (cc, gcc or clang; or set CC) on this machine' };
  const include = wantCuda ? findCudaInclude() : undefined;
  const attempts: Array<{ cuda: boolean; args: string[] }> = [];
  if (include) attempts.push({ cuda: true, args: ['-O2', '-DHANDOFF_REF_CUDA', `-I${include}`, '-o', '', source, '-ldl', '-lm'] });
  attempts.push({ cuda: false, args: ['-O2', '-o', '', source, '-lm'] });
  let why = !wantCuda ? undefined : include ? undefined : 'no cuda.h (looked in $CUDA_HOME/include, $CUDA_PATH/include, /usr/local/cuda/include, /usr/include): only the socket and host modes were built';
  const text = readFileSync(source);
  const dir = join(tmpdir(), `cuda-ipc-bench-${process.getuid?.() ?? 0}`);
  mkdirSync(dir, { recursive: true });
  for (const a of attempts) {
    const hash = createHash('sha256').update(text).update(cc).update(a.args.join(' ')).digest('hex').slice(0, 16);
    const out = join(dir, `handoff_ref-${hash}`);
    const args = a.args.map((x) => (x === '' ? `${out}.tmp` : x));
    const command = `${cc} ${args.join(' ')}`;
    if (existsSync(out)) return { binary: out, cuda: a.cuda, why, command };
    const r = spawnSync(cc, args, { encoding: 'utf8' });
    if (r.status === 0) {
      renameSync(`${out}.tmp`, out);
      return { binary: out, cuda: a.cuda, why, command };
    }
    const err = (r.stderr || r.stdout || String(r.error)).trim().split('\n').slice(-4).join(' | ');
    why = `${a.cuda ? 'the CUDA build' : 'the build'} failed (${command}): ${err}`;
  }
  return { cuda: false, why };
}

/** Runs one mode of a built reference. */
export function runCReference(build: CBuild, mode: CMode, iterations: number, warmup: number, bytes: number): CReference {
  const name = C_NAMES[mode];
  if (!build.binary) return { mode, name, skipped: build.why ?? 'not built' };
  if ((mode === 'pool' || mode === 'legacy') && !build.cuda) return { mode, name, skipped: build.why ?? 'built without cuda.h' };
  const r = spawnSync(build.binary, [mode, String(iterations), String(warmup), String(bytes)], { encoding: 'utf8', timeout: 300_000 });
  if (r.status !== 0) {
    const err = (r.stderr || r.stdout || String(r.error)).trim().split('\n').slice(-3).join(' | ');
    return { mode, name, skipped: `failed (status ${r.status ?? r.signal}): ${err}` };
  }
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { median_us: number; p99_us: number; mean_us: number; n: number };
  return { mode, name, summary: { n: out.n, median: out.median_us, p99: out.p99_us, mean: out.mean_us } };
}
