// Files in places other users may write to (a shared /tmp, a directory named on the command line):
// nothing here follows a name this process did not create, waits on a FIFO, or reads without a
// bound. What the library and the CLI create, rename or delete goes through these functions; see
// docs/SECURITY.md for the threat model.
import { randomBytes } from 'node:crypto';
import { closeSync, constants, fstatSync, linkSync, lstatSync, openSync, readSync, renameSync, unlinkSync, writeSync, type Stats } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { IpcError } from './errors.js';

const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW, O_NONBLOCK, O_DIRECTORY } = constants;

/** Which file a name stood for when this process made or read it (st_dev, st_ino). */
export interface FileIdentity {
  readonly dev: number;
  readonly ino: number;
}

export const identityOf = (st: Stats): FileIdentity => ({ dev: st.dev, ino: st.ino });
export const sameFile = (a: FileIdentity, b: FileIdentity): boolean => a.dev === b.dev && a.ino === b.ino;

/**
 * The path of `name` inside the directory open as `dirFd`: its lookup goes through the open
 * directory itself (the /proc/self/fd link), never through the directory's name, which another
 * user who can write to the directory above may have swapped for a symlink meanwhile.
 */
export const inDirectory = (dirFd: number, name: string): string => `/proc/self/fd/${dirFd}/${name}`;

function kindOf(st: Stats): string {
  if (st.isSymbolicLink()) return 'a symbolic link';
  if (st.isDirectory()) return 'a directory';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isCharacterDevice() || st.isBlockDevice()) return 'a device';
  if (st.isSocket()) return 'a socket';
  return 'not a regular file';
}

function unsafeFile(path: string, what: string, why: string): IpcError {
  return new IpcError('ERR_FILE_UNSAFE', `${what} ${path} ${why}`);
}

export interface ReadOptions {
  /** Most bytes accepted: a larger file is refused (ERR_FILE_UNSAFE) before anything is read. */
  maxBytes: number;
  /** Follow a symbolic link at the last component (default false: a link is refused). */
  followSymlinks?: boolean;
  /** Names the file in messages, e.g. 'the descriptor'. */
  what: string;
}

/**
 * Opens `path` for reading without blocking (a FIFO opens at once, and is then refused) and
 * checks that it is a regular file of at most options.maxBytes; returns the fd (the caller closes
 * it) and what fstat said. ENOENT and EACCES pass through as Node's errors; anything that is not
 * a regular file, or too large, is ERR_FILE_UNSAFE.
 */
export function openRegularFile(path: string, options: ReadOptions): { fd: number; stats: Stats } {
  let fd: number;
  try {
    fd = openSync(path, O_RDONLY | O_NONBLOCK | (options.followSymlinks ? 0 : O_NOFOLLOW));
  } catch (e) {
    const code = (e as { code?: string }).code;
    if (code === 'ELOOP') throw unsafeFile(path, options.what, 'is a symbolic link; give the file itself');
    if (code === 'EISDIR') throw unsafeFile(path, options.what, 'is a directory');
    if (code === 'ENXIO') throw unsafeFile(path, options.what, 'is a socket or a device without a driver');
    throw e;
  }
  try {
    const stats = fstatSync(fd);
    if (!stats.isFile()) throw unsafeFile(path, options.what, `is ${kindOf(stats)}, not a regular file`);
    if (stats.size > options.maxBytes) throw unsafeFile(path, options.what, `holds ${stats.size} bytes, more than the ${options.maxBytes} it may`);
    return { fd, stats };
  } catch (e) {
    closeSync(fd);
    throw e;
  }
}

/**
 * Reads a whole regular file of at most options.maxBytes (see openRegularFile). A file that grows
 * past the bound while being read is refused too: at most maxBytes + 1 bytes are ever read.
 */
export function readRegularFile(path: string, options: ReadOptions): { bytes: Buffer; identity: FileIdentity; stats: Stats } {
  const { fd, stats } = openRegularFile(path, options);
  try {
    // Sized by fstat, grown if the file grows meanwhile, never past maxBytes + 1.
    let buf = Buffer.allocUnsafe(Math.min(options.maxBytes, stats.size) + 1);
    let n = 0;
    for (;;) {
      if (n === buf.byteLength) {
        if (n > options.maxBytes) throw unsafeFile(path, options.what, `grew past ${options.maxBytes} bytes while it was read`);
        const bigger = Buffer.allocUnsafe(Math.min(options.maxBytes + 1, n * 2));
        buf.copy(bigger, 0, 0, n);
        buf = bigger;
      }
      const got = readSync(fd, buf, n, buf.byteLength - n, null);
      if (got === 0) break;
      n += got;
    }
    return { bytes: buf.subarray(0, n), identity: identityOf(stats), stats };
  } finally {
    closeSync(fd);
  }
}

/** openRegularFile for the promise API: a FileHandle on a regular file (symlinks followed: the caller named the path). */
export async function openRegularFileHandle(path: string, what: string): Promise<FileHandle> {
  let fh: FileHandle;
  try {
    fh = await open(path, O_RDONLY | O_NONBLOCK);
  } catch (e) {
    if ((e as { code?: string }).code === 'EISDIR') throw unsafeFile(path, what, 'is a directory');
    if ((e as { code?: string }).code === 'ENXIO') throw unsafeFile(path, what, 'is a socket or a device without a driver');
    throw e;
  }
  try {
    const stats = await fh.stat();
    if (!stats.isFile()) throw unsafeFile(path, what, `is ${kindOf(stats)}, not a regular file`);
    return fh;
  } catch (e) {
    await fh.close();
    throw e;
  }
}

/** readRegularFile for the promise API, following a symlink (the caller named the path). */
export async function readRegularFileAsync(path: string, maxBytes: number, what: string): Promise<Buffer> {
  const fh = await openRegularFileHandle(path, what);
  try {
    const { size } = await fh.stat();
    if (size > maxBytes) throw unsafeFile(path, what, `holds ${size} bytes, more than the ${maxBytes} it may`);
    const buf = Buffer.allocUnsafe(size + 1);
    let n = 0;
    for (;;) {
      const { bytesRead } = await fh.read(buf, n, buf.byteLength - n, n);
      if (bytesRead === 0) break;
      n += bytesRead;
      if (n === buf.byteLength) throw unsafeFile(path, what, 'grew while it was read');
    }
    return buf.subarray(0, n);
  } finally {
    await fh.close();
  }
}

/**
 * What writeFileAtomic may do with an entry already at `path`:
 * - 'never' (the default): nothing may be there; a name someone else made is never replaced.
 * - 'own-regular-file': a regular file this user owns is replaced (an explicit save, `--force`);
 *   a symlink, a directory, a FIFO, a device, a socket or another user's file never is.
 * - a FileIdentity: only the file this process wrote there before (its own earlier version).
 */
export type ReplacePolicy = 'never' | 'own-regular-file' | FileIdentity;

export interface WriteOptions {
  /** The new file's mode (before the umask); default 0o600. */
  mode?: number;
  /** What may be replaced at `path` (default 'never'). */
  replace?: ReplacePolicy;
  /** Names the file in messages, e.g. 'the descriptor' (default 'the file'). */
  what?: string;
}

/**
 * Why the entry at `path` may not be replaced under `policy`, or undefined when it may (or when
 * nothing is there). Never follows a symlink.
 */
export function whyNotReplace(path: string, policy: ReplacePolicy): string | undefined {
  let st: Stats;
  try {
    st = lstatSync(path);
  } catch (e) {
    if ((e as { code?: string }).code === 'ENOENT') return undefined;
    return `cannot be checked (${(e as Error).message})`;
  }
  const what = st.isFile() ? `a regular file of ${st.size} bytes` : kindOf(st);
  const owner = st.uid === process.getuid?.() ? 'yours' : `owned by uid ${st.uid}`;
  if (typeof policy === 'object') {
    return sameFile(identityOf(st), policy) ? undefined : `now holds ${what} (${owner}) that this process did not write`;
  }
  if (policy === 'own-regular-file' && st.isFile() && st.uid === process.getuid?.()) return undefined;
  if (policy === 'own-regular-file') return `already holds ${what} (${owner}), which is never replaced`;
  return `already holds ${what} (${owner})`;
}

/** Writes every chunk to `fd`. */
function writeAll(fd: number, chunks: readonly Uint8Array[]): void {
  for (const c of chunks) {
    let done = 0;
    while (done < c.byteLength) done += writeSync(fd, c, done, c.byteLength - done);
  }
}

/**
 * Creates `path` as a new file (O_CREAT | O_EXCL | O_NOFOLLOW: nothing there is opened, a symlink
 * included), writes `data` into it and returns its identity, for removeIfSame(). EEXIST passes
 * through; a file made but not fully written is removed.
 */
export function createFileExclusive(path: string, data: string | Uint8Array | readonly Uint8Array[], mode = 0o600): FileIdentity {
  const chunks = typeof data === 'string' ? [Buffer.from(data)] : data instanceof Uint8Array ? [data] : data;
  const fd = openSync(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode);
  let identity: FileIdentity | undefined;
  try {
    identity = identityOf(fstatSync(fd));
    writeAll(fd, chunks);
  } catch (e) {
    closeSync(fd);
    removeIfSame(path, identity);
    throw e;
  }
  closeSync(fd);
  return identity;
}

/**
 * Writes `data` to `path` atomically, never over what options.replace does not allow (by default
 * nothing may be at `path`): into a new file of a random name in the same directory (created with
 * O_EXCL | O_NOFOLLOW, so a name planted there is never opened), then published at `path`: by a
 * hard link when nothing may be replaced (link() fails on any existing entry, atomically), else by
 * rename over the checked entry (rename replaces a name, never follows it). A reader never sees
 * half a file. Returns the identity of the file now at `path`, for removeIfSame(); the temporary
 * is removed whatever happens.
 * @throws IpcError ERR_FILE_UNSAFE when something is at `path` that may not be replaced (the
 * message says what is there); the system error for a directory it cannot write.
 */
export function writeFileAtomic(path: string, data: string | Uint8Array | readonly Uint8Array[], options: WriteOptions = {}): FileIdentity {
  const policy = options.replace ?? 'never';
  const what = options.what ?? 'the file';
  const refuse = (why: string) =>
    new IpcError('ERR_FILE_UNSAFE', `${what} ${path} ${why}; it was left as it is: remove it or write elsewhere`);
  const before = whyNotReplace(path, policy);
  if (before !== undefined) throw refuse(before);
  const dir = dirname(path);
  let tmp = '';
  let identity: FileIdentity | undefined;
  for (let attempt = 0; identity === undefined; attempt++) {
    tmp = join(dir, `.${basename(path)}.${randomBytes(6).toString('hex')}.tmp`);
    try {
      identity = createFileExclusive(tmp, data, options.mode ?? 0o600);
    } catch (e) {
      if ((e as { code?: string }).code !== 'EEXIST' || attempt >= 8) throw e;
    }
  }
  try {
    if (!publishNew(tmp, path)) {
      // Something is there: replaced only if the policy allows what it is now.
      const why = whyNotReplace(path, policy);
      if (why !== undefined || policy === 'never') throw refuse(why ?? 'already exists');
      renameSync(tmp, path);
    }
  } finally {
    removeIfSame(tmp, identity);
  }
  return identity;
}

/**
 * Gives the file `tmp` the name `path` if nothing has it: true when it did, false when `path`
 * exists. link() is atomic; on a filesystem without hard links, rename after a check (a name
 * made in between is replaced: only someone who may write the directory can do that).
 */
function publishNew(tmp: string, path: string): boolean {
  try {
    linkSync(tmp, path);
    return true;
  } catch (e) {
    const code = (e as { code?: string }).code;
    if (code === 'EEXIST') return false;
    if (code !== 'EPERM' && code !== 'ENOTSUP' && code !== 'EOPNOTSUPP' && code !== 'EMLINK') throw e;
  }
  try {
    lstatSync(path);
    return false;
  } catch (e) {
    if ((e as { code?: string }).code !== 'ENOENT') throw e;
  }
  renameSync(tmp, path);
  return true;
}

/**
 * Removes `path` if it is still the file `identity` names (what this process created there), and
 * nothing else: a name another user replaced meanwhile stays. `undefined`: remove only a regular
 * file this user owns (a temporary of ours whose identity was never taken). Between the check and
 * the unlink only someone who may rename entries of the directory could swap the name, and
 * unlink removes a name, never what a symlink points to. Returns whether it removed it.
 */
export function removeIfSame(path: string, identity: FileIdentity | undefined): boolean {
  let st: Stats;
  try {
    st = lstatSync(path);
  } catch {
    return false;
  }
  const ours = identity ? sameFile(identityOf(st), identity) : st.isFile() && st.uid === process.getuid?.();
  if (!ours) return false;
  try {
    unlinkSync(path);
    return true;
  } catch {
    return false;
  }
}

/** Whose the entry at `path` is, for messages: 'uid N's socket', without following it. */
export function describeEntry(path: string): string | undefined {
  try {
    const st = lstatSync(path);
    const what = st.isSocket() ? 'socket' : st.isSymbolicLink() ? 'symbolic link' : st.isDirectory() ? 'directory' : st.isFile() ? 'file' : 'special file';
    return `a ${what} of uid ${st.uid}`;
  } catch {
    return undefined;
  }
}

/**
 * Opens the directory `path` as an fd (O_DIRECTORY, and O_NOFOLLOW unless `followSymlinks`) and
 * returns it with what fstat says; the caller closes it.
 */
export function openDirectory(path: string, followSymlinks: boolean): { fd: number; stats: Stats } {
  const fd = openSync(path, O_RDONLY | O_DIRECTORY | (followSymlinks ? 0 : O_NOFOLLOW));
  try {
    return { fd, stats: fstatSync(fd) };
  } catch (e) {
    closeSync(fd);
    throw e;
  }
}
