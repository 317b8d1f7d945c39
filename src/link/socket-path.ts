// Where listen()/connect() put their sockets: `<dir>/<name>.sock`, by default in a private 0700
// directory of this user: `${XDG_RUNTIME_DIR or the temp dir}/cuda-ipc-<uid>`.
import { lstatSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { IpcError } from '../errors.js';

const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/;
/** sockaddr_un.sun_path holds 108 bytes including the terminating NUL. */
const MAX_PATH_BYTES = 107;

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

/** Validates `name` and returns the socket's path. */
export function socketPath(name: string, directory?: string): string {
  if (typeof name !== 'string' || !NAME_RE.test(name) || name.includes('..')) {
    throw new IpcError(
      'ERR_INVALID_ARG',
      `link name ${JSON.stringify(name)} is not valid: use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit (no slashes)`,
    );
  }
  const path = join(directory ?? defaultSocketDirectory(), `${name}.sock`);
  if (Buffer.byteLength(path) > MAX_PATH_BYTES) {
    throw new IpcError('ERR_INVALID_ARG', `the socket path ${path} is longer than ${MAX_PATH_BYTES} bytes, the limit of a Unix socket address; use a shorter name or directory`);
  }
  return path;
}
