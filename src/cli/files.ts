// File handoff for the two-terminal example: atomic writes, bounded reads, and waits that end at
// the command's --timeout. The files may sit in a shared directory: a temporary is a new file of a
// random name (O_EXCL), what is read must be a regular file of a descriptor's size (a FIFO, a
// device or /dev/zero is refused at once), and only what this process wrote is removed.
import { lstatSync, statSync } from 'node:fs';
import { dirname } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { IpcError } from '../errors.js';
import { UsageError } from './args.js';
import { invalidArgValue } from '../arg-errors.js';
import { identityOf, readRegularFile, removeIfSame, sameFile, whyNotReplace, type FileIdentity } from '../safe-files.js';

export { removeIfSame, writeFileAtomic, type FileIdentity } from '../safe-files.js';

/** Descriptors and reports are a few hundred bytes: anything this large was not written by cuda-ipc. */
export const MAX_HANDOFF_BYTES = 1 << 20;

/** The end of a command's waits, all of them together: its --timeout counted from the start. */
export class Deadline {
  readonly #end: number;
  readonly ms: number;
  constructor(ms: number) {
    this.ms = ms;
    this.#end = Date.now() + ms;
  }
  /** Milliseconds left, at least 1 while any is left, 0 once it passed. */
  left(): number {
    const left = this.#end - Date.now();
    return left > 0 ? Math.max(1, left) : 0;
  }
  /** How the bound reads in messages: '2 s (--timeout)'. */
  toString(): string {
    return `${this.ms / 1000} s (--timeout)`;
  }
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

/**
 * --out FILE and the consumer's report name FILE.done must hold nothing: produce never writes
 * over, nor later deletes, a file it did not make. With --force, a regular file of this user
 * there is replaced (FILE) or removed before the wait (a report left by an earlier run at
 * FILE.done); a symlink, a FIFO, a device, a directory or another user's file never is.
 * Throws a UsageError (exit 2) that says what is there and what to do.
 */
export function checkNothingThere(out: string, doneFile: string, force: boolean): void {
  const policy = force ? 'own-regular-file' : 'never';
  for (const [path, what] of [[out, '--out'], [doneFile, `the consumer's report name ${doneFile}`]] as const) {
    const why = whyNotReplace(path, policy);
    if (why === undefined) continue;
    const named = path === out ? `${what} ${path}` : what;
    throw new UsageError(
      force
        ? `${named} ${why}: --force replaces only a regular file of your own; remove it yourself or give another --out`
        : `${named} ${why}; cuda-ipc writes only new files and never replaces one it did not make: give another --out, remove it first, or add --force to replace a regular file of your own`,
    );
  }
  // --force: a report left by an earlier run (a regular file of this user, checked above) goes now.
  const left = force ? leftover(doneFile) : undefined;
  if (left) removeIfSame(doneFile, left);
}

/**
 * On Ctrl-C, SIGTERM or SIGHUP: `cleanup` (removing this process's own files), then exit with
 * 128 + the signal's number, as the shell reports a process killed by it.
 */
export function onSignalsRemove(cleanup: () => void): void {
  for (const [signal, n] of [['SIGINT', 2], ['SIGTERM', 15], ['SIGHUP', 1]] as const) {
    process.once(signal, () => { cleanup(); process.exit(128 + n); });
  }
}

export interface WaitForFileOptions {
  /** A file already there that does not count (a report left by an earlier run). */
  ignore?: FileIdentity;
  /** Follow a symlink at `path` (a name the user gave); default false (a name this command made up). */
  followSymlinks?: boolean;
  /** Names the file in messages. */
  what: string;
}

/**
 * Resolves with the file's text once it exists (a regular file of at most MAX_HANDOFF_BYTES);
 * rejects with ERR_TIMEOUT when `deadline` passes, ERR_FILE_UNSAFE at once for anything else at
 * `path` (a FIFO, a device, a directory, a symlink where none is followed, a large file).
 */
export async function waitForFile(path: string, deadline: Deadline, hint: string, options: WaitForFileOptions): Promise<{ text: string; identity: FileIdentity }> {
  for (;;) {
    try {
      const { bytes, identity } = readRegularFile(path, { maxBytes: MAX_HANDOFF_BYTES, followSymlinks: options.followSymlinks ?? false, what: options.what });
      if (!options.ignore || !sameFile(identity, options.ignore)) return { text: bytes.toString('utf8'), identity };
    } catch (e) {
      const code = (e as { code?: string }).code;
      if (code === 'ERR_FILE_UNSAFE') throw e;
      if (code === 'EACCES') throw invalidArgValue(`${path} exists but this user may not read it (permission denied); check its owner and mode`);
      if (code !== 'ENOENT') throw invalidArgValue(`cannot read ${path}: ${(e as Error).message}`);
    }
    const left = deadline.left();
    if (left === 0) throw new IpcError('ERR_TIMEOUT', `nothing appeared at ${path} within ${deadline}: ${hint}`);
    await sleep(Math.min(25, left));
  }
}

/** The identity of the regular file at `path` now (not followed), if there is one: a leftover to ignore. */
export function leftover(path: string): FileIdentity | undefined {
  try {
    const st = lstatSync(path);
    return st.isFile() ? identityOf(st) : undefined;
  } catch {
    return undefined;
  }
}
