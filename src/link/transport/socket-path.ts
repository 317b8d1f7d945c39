// Where listen()/connect() put their sockets: `<dir>/<name>.sock`, by default in this user's
// private runtime directory (runtime-directory.ts).
import { join } from 'node:path';
import { IpcError } from '../../errors.js';
import { defaultSocketDirectory } from '../../runtime-directory.js';
import { invalidArgValue } from '../../arg-errors.js';

const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/;
/** sockaddr_un.sun_path holds 108 bytes including the terminating NUL. */
const MAX_PATH_BYTES = 107;

/** Validates `name` and returns the socket's path. */
export function socketPath(name: string, directory?: string): string {
  if (typeof name !== 'string' || !NAME_RE.test(name) || name.includes('..')) {
    throw invalidArgValue(`link name ${JSON.stringify(name)} is not valid: use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit (no slashes)`,
    );
  }
  const path = join(directory ?? defaultSocketDirectory(), `${name}.sock`);
  if (Buffer.byteLength(path) > MAX_PATH_BYTES) {
    throw invalidArgValue(`the socket path ${path} is longer than ${MAX_PATH_BYTES} bytes, the limit of a Unix socket address; use a shorter name or directory`);
  }
  return path;
}
