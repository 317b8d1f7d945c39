// The fake libnccl (test/fixtures/fake-nccl.c) compiled for a test file: a good copy, copies at
// other paths (each a library of its own to the loader), and broken variants. Tests skip, with
// the reason, where there is no C compiler.
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const FAKE_NCCL_SOURCE = fileURLToPath(new URL('../../../test/fixtures/fake-nccl.c', import.meta.url));
const CC = process.env.CC ?? 'cc';

export interface FakeNccl {
  dir: string;
  /** The good fake. */
  lib: string;
  /** Aborts the process that loads it (its constructor calls abort()). */
  crash: string;
  /** Lacks ncclCommInitRankConfig and ncclCommFinalize (NCCL older than 2.14). */
  old: string;
  /** A text file with a .so name. */
  notElf: string;
  /** The log the fake appends a line to per call (FAKE_NCCL_LOG). */
  log: string;
  /** Copies the good fake to `relative` under dir (a library of its own to the loader); returns its path. */
  copy(relative: string): string;
  /** The log's lines so far. */
  lines(): string[];
  cleanup(): void;
}

function compile(out: string, ...flags: string[]): string | undefined {
  const r = spawnSync(CC, ['-shared', '-fPIC', '-O1', ...flags, '-o', out, FAKE_NCCL_SOURCE], { encoding: 'utf8' });
  if (r.error) return `no C compiler (${CC}: ${r.error.message}); set CC or install one (apt install gcc)`;
  if (r.status !== 0) return `${CC} could not build test/fixtures/fake-nccl.c: ${r.stderr.trim().split('\n').slice(-3).join(' | ')}`;
  return undefined;
}

function build(): FakeNccl | string {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-fake-nccl-'));
  const lib = join(dir, 'good', 'libnccl.so.2');
  mkdirSync(dirname(lib));
  const why = compile(lib) ?? compile(join(dir, 'crash.so'), '-DFAKE_NCCL_CRASH') ?? compile(join(dir, 'old.so'), '-DFAKE_NCCL_OLD');
  if (why) {
    rmSync(dir, { recursive: true, force: true });
    return why;
  }
  const notElf = join(dir, 'not-elf.so');
  writeFileSync(notElf, 'this is not a shared library\n'.repeat(200));
  const log = join(dir, 'calls.log');
  return {
    dir, lib, crash: join(dir, 'crash.so'), old: join(dir, 'old.so'), notElf, log,
    copy(relative) {
      const p = join(dir, relative);
      mkdirSync(dirname(p), { recursive: true });
      copyFileSync(lib, p);
      return p;
    },
    lines() {
      return existsSync(log) ? readFileSync(log, 'utf8').split('\n').filter(Boolean) : [];
    },
    cleanup() {
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const built = build();
/** The compiled fake, or undefined where it could not be built (see noFakeNccl). */
export const fakeNccl: FakeNccl | undefined = typeof built === 'string' ? undefined : built;
/** undefined where the fake was built; otherwise the reason to skip. */
export const noFakeNccl: string | undefined = typeof built === 'string' ? built : undefined;

/** Every FAKE_NCCL_* variable, cleared (between tests). */
export function resetFakeEnv(): void {
  for (const k of Object.keys(process.env)) if (k.startsWith('FAKE_NCCL_')) delete process.env[k];
  if (fakeNccl) {
    rmSync(fakeNccl.log, { force: true });
    process.env.FAKE_NCCL_LOG = fakeNccl.log;
  }
}

/** Sets FAKE_NCCL_<name> for the calls that follow. */
export function fake(settings: Record<string, string | number>): void {
  for (const [k, v] of Object.entries(settings)) process.env[`FAKE_NCCL_${k}`] = String(v);
}
