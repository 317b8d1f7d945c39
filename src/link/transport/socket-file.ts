// The file of a listening socket, made without following anything another user planted.
//
// bind() creates the file with the mode the umask leaves, so the mode other uids need (0666) takes
// a chmod after it, and a chmod by name can be sent elsewhere: someone who can write to the
// directory swaps the new name for a symlink between the two calls, and chmod follows it (issue
// 29: a root-only file became 0666). fchmod() on the socket before bind() sets the mode in one
// step on Linux, but the umask still applies (022 takes away the write bit connect() needs) and
// changing the umask is process-wide (other threads create files meanwhile). So the socket is
// bound inside a new private directory (mkdtemp: 0700 and ours, nobody else can reach into it),
// given its mode there, and only then published under its name with link(): link() creates the
// name in one step, never follows or replaces what is already there (EEXIST), and the file
// appears with its final mode. Every lookup goes through directory fds (/proc/self/fd/N), never
// through a name that could be swapped meanwhile.
import { closeSync, chmodSync, fstatSync, linkSync, lstatSync, mkdtempSync, rmdirSync, unlinkSync } from 'node:fs';
import { basename, dirname } from 'node:path';
import { IpcError } from '../../errors.js';
import { addon } from '../../native/addon.js';
import { describeEntry, identityOf, inDirectory, openDirectory, sameFile, type FileIdentity } from '../../safe-files.js';

function codeOf(e: unknown): string | undefined {
  return (e as { code?: string })?.code;
}

/** True when something accepts connections at `path` (a live listener, not a stale file). */
function someoneListens(path: string): boolean {
  const fd = addon.socket();
  try {
    addon.connect(fd, path);
    return true;
  } catch (e) {
    return codeOf(e) === 'EAGAIN';  // backlog full: alive
  } finally {
    addon.close(fd);
  }
}

/**
 * Binds the unbound socket `fd` and publishes it at `path` with `mode` (see the file's notes);
 * returns the identity of the socket file, for the listener's close() to remove only its own.
 * A live listener at `path` is ERR_ADDRESS_IN_USE; a stale socket of this user is replaced; a name
 * held by anything else (another user's file, a symlink) is ERR_ADDRESS_IN_USE naming its owner.
 */
export function bindSocketFile(fd: number, path: string, name: string, mode: number): FileIdentity {
  const target = openDirectory(dirname(path), true).fd;
  const base = basename(path);
  let privateFd = -1;
  let privateName = '';
  let verified = false;
  try {
    privateName = basename(mkdtempSync(inDirectory(target, `.${base}.`)));
    let st;
    try {
      ({ fd: privateFd, stats: st } = openDirectory(inDirectory(target, privateName), false));
    } catch (e) {
      // Renamed away (ENOENT) or swapped for a symlink (ELOOP) or a file (ENOTDIR) meanwhile.
      if (codeOf(e) !== 'ELOOP' && codeOf(e) !== 'ENOTDIR' && codeOf(e) !== 'ENOENT') throw e;
    }
    if (!st || st.uid !== process.getuid?.() || (st.mode & 0o077) !== 0) {
      throw new IpcError('ERR_SOCKET_DIR_UNSAFE', `the directory ${dirname(path)} changed under listen('${name}'): its new private folder ${privateName} was replaced; do not listen in a directory where others may rename entries`);
    }
    verified = true;
    const inside = inDirectory(privateFd, 's');
    addon.bind(fd, inside);
    chmodSync(inside, mode);
    const identity = identityOf(lstatSync(inside));
    publish(inside, target, base, path, name);
    return identity;
  } finally {
    if (verified) {
      try {
        unlinkSync(inDirectory(privateFd, 's'));
      } catch {
        // Never bound.
      }
      try {
        // Only our own folder: compare with the one held open before removing the name.
        if (sameFile(identityOf(lstatSync(inDirectory(target, privateName))), identityOf(fstatSync(privateFd)))) {
          rmdirSync(inDirectory(target, privateName));
        }
      } catch {
        // Renamed away by someone else: it is empty, and theirs to remove.
      }
    }
    if (privateFd >= 0) closeSync(privateFd);
    closeSync(target);
  }
}

/** link() `inside` to `base` in the directory `target`; replaces only a stale socket of this user. */
function publish(inside: string, target: number, base: string, path: string, name: string): void {
  const at = inDirectory(target, base);
  for (let attempt = 0; ; attempt++) {
    try {
      linkSync(inside, at);
      return;
    } catch (e) {
      if (codeOf(e) !== 'EEXIST') throw e;
    }
    if (attempt > 0) throw new IpcError('ERR_ADDRESS_IN_USE', `another process took '${name}' (${path}) at the same time`);
    if (someoneListens(path)) {
      throw new IpcError('ERR_ADDRESS_IN_USE', `another process is already listening on '${name}' (${path}); pick another name or close that listener`);
    }
    let st;
    try {
      st = lstatSync(at);
    } catch {
      continue; // gone meanwhile: try again
    }
    if (!st.isSocket() || st.uid !== process.getuid?.()) {
      throw new IpcError(
        'ERR_ADDRESS_IN_USE',
        `the name '${name}' is taken: ${path} is ${describeEntry(at) ?? 'there'}, not a socket this user left; remove it or pick another name ` +
          '(in a directory other users may write to, any of them can take a name first)',
      );
    }
    // A socket of this user that nobody listens on: left by a listener that died. In a directory
    // others may only add to (sticky, or private) nobody else can swap this entry before unlink.
    try {
      unlinkSync(at);
    } catch {
      // Gone already, or swapped for something unlink cannot remove: the next link() says.
    }
  }
}
