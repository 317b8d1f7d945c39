// File handoff for the two-terminal example: atomic writes and bounded waits.
import { readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { IpcError } from '../errors.js';
import { UsageError } from './args.js';
import { invalidArgValue } from '../arg-errors.js';

/** Writes via a temporary name and a rename, so a reader never sees half a file. */
export function writeFileAtomic(path: string, text: string): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, text, { mode: 0o600 });
  renameSync(tmp, path);
}

/**
 * Checks, before anything is allocated or waited for, that `path` can be a file: not a
 * directory, and (for a file this command writes) in a directory that exists.
 */
export function checkFileArgument(path: string, what: string, example: string, options: { writes: boolean }): void {
  let st;
  try {
    st = statSync(path);
  } catch {
    st = undefined;
  }
  if (st?.isDirectory()) throw new UsageError(`${what} ${path} is a directory; give a file in it, e.g. ${example}`);
  if (options.writes) {
    const dir = dirname(path);
    let d;
    try {
      d = statSync(dir);
    } catch {
      d = undefined;
    }
    if (!d?.isDirectory()) throw new UsageError(`${what} ${path}: the directory ${dir} does not exist; create it or write elsewhere`);
  }
}

/** Resolves with the file's text once it exists; rejects with ERR_TIMEOUT after `timeoutMs`. */
export async function waitForFile(path: string, timeoutMs: number, hint: string): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return readFileSync(path, 'utf8');
    } catch (e) {
      const code = (e as { code?: string }).code;
      if (code === 'EISDIR') throw invalidArgValue(`${path} is a directory, not the descriptor file; ${hint}`);
      if (code === 'EACCES') throw invalidArgValue(`${path} exists but this user may not read it (permission denied); check its owner and mode`);
      if (code !== 'ENOENT') throw invalidArgValue(`cannot read ${path}: ${(e as Error).message}`);
    }
    if (Date.now() >= deadline) {
      throw new IpcError('ERR_TIMEOUT', `nothing appeared at ${path} within ${timeoutMs / 1000} s: ${hint}`);
    }
    await sleep(25);
  }
}
