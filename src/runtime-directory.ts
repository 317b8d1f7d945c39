// This user's private runtime directory, `${XDG_RUNTIME_DIR or the temp dir}/cuda-ipc-<uid>`
// (mode 0700): listen()/connect() put their sockets there (link/socket-path.ts) and each process
// its status record, in its `status` folder (observe/record.ts).
import { lstatSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { IpcError } from './errors.js';

export function defaultSocketDirectory(): string {
  const base = process.env.XDG_RUNTIME_DIR || tmpdir();
  return join(base, `cuda-ipc-${process.getuid?.() ?? 'user'}`);
}

/** Creates the default directory if needed and checks that only this user can reach it. */
export function ensurePrivateDirectory(dir: string): void {
  try {
    mkdirSync(dir, { mode: 0o700 });
  } catch (e) {
    if ((e as { code?: string }).code !== 'EEXIST') throw e;
  }
  const st = lstatSync(dir);
  const uid = process.getuid?.();
  if (!st.isDirectory() || (uid !== undefined && st.uid !== uid) || (st.mode & 0o077) !== 0) {
    throw new IpcError(
      'ERR_SOCKET_DIR_UNSAFE',
      `the socket directory ${dir} is not a private directory of this user (it must be a real directory, owned by uid ${uid}, ` +
        `mode 0700; it has mode 0${(st.mode & 0o777).toString(8)} and owner ${st.uid}); remove it, or pass { directory } to use another`,
    );
  }
}
