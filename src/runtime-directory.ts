// This user's private runtime directory, `${XDG_RUNTIME_DIR or the temp dir}/cuda-ipc-<uid>`
// (mode 0700): listen()/connect() put their sockets there (link/transport/socket-path.ts) and each process
// its status record, in its `status` folder (observe/record.ts).
import { closeSync, lstatSync, mkdirSync, type Stats } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { IpcError } from './errors.js';
import { openDirectory } from './safe-files.js';

export function defaultSocketDirectory(): string {
  const base = process.env.XDG_RUNTIME_DIR || tmpdir();
  return join(base, `cuda-ipc-${process.getuid?.() ?? 'user'}`);
}

/** Why `st` (of `dir`, not followed) is not a private directory of this user, or undefined when it is. */
function notPrivate(dir: string, st: Stats, what: string, hint: string): IpcError | undefined {
  const uid = process.getuid?.();
  if (st.isDirectory() && (uid === undefined || st.uid === uid) && (st.mode & 0o077) === 0) return undefined;
  const kind = st.isSymbolicLink() ? 'a symbolic link' : st.isDirectory() ? 'a directory' : 'not a directory';
  return new IpcError(
    'ERR_SOCKET_DIR_UNSAFE',
    `${what} ${dir} is not a private directory of this user (it must be a real directory, owned by uid ${uid}, ` +
      `mode 0700; it is ${kind} with mode 0${(st.mode & 0o777).toString(8)} and owner ${st.uid}); ${hint}`,
  );
}

/** Creates the default directory if needed and checks that only this user can reach it. */
export function ensurePrivateDirectory(dir: string): void {
  try {
    mkdirSync(dir, { mode: 0o700 });
  } catch (e) {
    if ((e as { code?: string }).code !== 'EEXIST') throw e;
  }
  checkPrivateDirectory(dir, 'the socket directory', 'remove it, or pass { directory } to use another');
}

/** Throws ERR_SOCKET_DIR_UNSAFE unless `dir` (not followed) is a directory of this user with no group or other permissions. */
export function checkPrivateDirectory(dir: string, what: string, hint: string): void {
  const err = notPrivate(dir, lstatSync(dir), what, hint);
  if (err) throw err;
}

/**
 * Opens `dir` (never through a symlink) and checks, on the open directory itself, that it is
 * private to this user; returns the fd (the caller closes it). What is then looked up through
 * the fd (safe-files.ts inDirectory) cannot be redirected by renaming the directory.
 */
export function openPrivateDirectory(dir: string, what: string, hint: string): number {
  let opened: { fd: number; stats: Stats };
  try {
    opened = openDirectory(dir, false);
  } catch (e) {
    const code = (e as { code?: string }).code;
    if (code !== 'ELOOP' && code !== 'ENOTDIR') throw e;
    const err = notPrivate(dir, lstatSync(dir), what, hint);
    throw err ?? e;
  }
  const err = notPrivate(dir, opened.stats, what, hint);
  if (err) {
    closeSync(opened.fd);
    throw err;
  }
  return opened.fd;
}
