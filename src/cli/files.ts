// File handoff for the two-terminal example: atomic writes and bounded waits.
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { IpcError } from '../errors.js';

/** Writes via a temporary name and a rename, so a reader never sees half a file. */
export function writeFileAtomic(path: string, text: string): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, text, { mode: 0o600 });
  renameSync(tmp, path);
}

/** Resolves with the file's text once it exists; rejects with ERR_TIMEOUT after `timeoutMs`. */
export async function waitForFile(path: string, timeoutMs: number, hint: string): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (existsSync(path)) return readFileSync(path, 'utf8');
    if (Date.now() >= deadline) {
      throw new IpcError('ERR_TIMEOUT', `nothing appeared at ${path} within ${Math.round(timeoutMs / 1000)} s: ${hint}`);
    }
    await sleep(25);
  }
}

export function parseSeconds(value: string | undefined, fallback: number, what: string): number {
  if (value === undefined) return fallback * 1000;
  const s = Number(value);
  if (!Number.isFinite(s) || s <= 0) throw new IpcError('ERR_INVALID_ARG', `${what} must be a positive number of seconds, got '${value}'`);
  return s * 1000;
}

export function parseCount(value: string | undefined, fallback: number, what: string): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n <= 0) throw new IpcError('ERR_INVALID_ARG', `${what} must be a positive integer, got '${value}'`);
  return n;
}

/** A device ordinal from the command line (default 0). */
export function parseOrdinal(value: string | undefined, what: string): number {
  if (value === undefined) return 0;
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n < 0) throw new IpcError('ERR_INVALID_ARG', `${what} must be a device ordinal (0, 1, ...), got '${value}'`);
  return n;
}
