// The per-process status record: its format, where it lives, and how to tell a live process from
// a dead one. One JSON file per process, `<pid>-<start time>.json`, in the `status` folder of
// this user's private runtime directory (runtime-directory.ts). The start time is the process's
// start in clock ticks since boot (/proc/<pid>/stat, field 22): with it in the name, a record of
// a dead process is never mistaken for one of a new process that got the same pid.
import { lstatSync, readdirSync, readFileSync, unlinkSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { checkPrivateDirectory, defaultSocketDirectory, openPrivateDirectory } from '../runtime-directory.js';
import { inDirectory } from '../safe-files.js';
import type { ImportCacheStats } from '../native/driver-types.js';
import type { ChannelStatus, DeviceMemoryStats } from './reports.js';

export const RECORD_VERSION = 1;
/** Most links, and most channels, one record lists (a process with more says how many it left out). */
export const MAX_LISTED = 1000;
/** Largest record a reader reads: anything bigger was not written by a publisher. */
export const MAX_RECORD_BYTES = 16 * 2 ** 20;

/** One link of a process, as its record lists it. */
export interface LinkRecord {
  /** Link.id (unique in its process). */
  id: number;
  /** The process at the other end; 0 while the handshake runs. */
  peerPid: number;
  state: 'handshaking' | 'open' | 'closed';
  /** Leases this process holds for the peer: what the peer still maps or uses. */
  leasedToPeer: { count: number; bytes: number };
  /** Leases the peer granted this process that are not ended: what this process uses of the peer's. */
  receivedFromPeer: number;
  /** Messages waiting to be sent because the peer is not reading (absent when none). */
  sendQueue?: { messages: number; bytes: number; fds: number };
  /** Messages received and not yet consumed here, and whether reading is paused (absent when none). */
  receiveQueue?: { messages: number; bytes: number; fds: number; paused: boolean };
  /** 'tcp' for a link between machines (absent for a Unix-socket link); its peerPid is 0. */
  transport?: 'tcp';
  /** Where the peer of a TCP link is. */
  remote?: { address: string; port: number; family: string; tls: boolean };
  /**
   * What a TCP link carried by value: host memory copied into and out of its messages, device
   * memory moved over NCCL for it (bytes, since it opened).
   */
  traffic?: { copiedSent: number; copiedReceived: number; ncclSent: number; ncclReceived: number };
}

export interface StatusRecord {
  version: typeof RECORD_VERSION;
  pid: number;
  /** Clock ticks since boot at the process's start (/proc/<pid>/stat field 22), as text. */
  startTime: string;
  argv: string[];
  /** When the record was written (ms since the epoch). */
  updatedAt: number;
  /** Device memory of the process: allocations (and what peers lease of them), imports. */
  device: DeviceMemoryStats;
  /** Leases granted to peers, all links together (device memory, host memory, pools, events). */
  leases: { count: number; bytes: number };
  /** At most MAX_LISTED of each; linksNotListed / channelsNotListed count the rest. */
  links: LinkRecord[];
  channels: ChannelStatus[];
  linksNotListed?: number;
  channelsNotListed?: number;
  importCache: ImportCacheStats;
  /** Open file descriptors when the record was written. */
  openFds: number;
}

/** The folder of the records: `<socket directory>/status`. */
export function defaultStatusDirectory(): string {
  return join(defaultSocketDirectory(), 'status');
}

export const recordName = (pid: number, startTime: string): string => `${pid}-${startTime}.json`;

/** Matches a record's name, and the temporary names a writer renames from. */
export const RECORD_NAME_RE = /^(\d+)-(\d+)\.json(\.tmp)?$/;

/**
 * The start time of process `pid` (field 22 of /proc/<pid>/stat), or undefined when there is no
 * such process. The command name in field 2 may hold spaces and parentheses, so the fields are
 * counted after its closing parenthesis.
 */
export function processStartTime(pid: number | 'self'): string | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'latin1');
  } catch {
    return undefined;
  }
  const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state); field 22 is fields[19]. A zombie has exited: it holds nothing.
  if (fields[0] === 'Z' || fields[0] === 'X') return undefined;
  return fields[19];
}

/** Whether the record (or temporary) file `name` belongs to a process that is gone. */
export function isStale(name: string): { pid: number; stale: boolean; temporary: boolean } | undefined {
  const m = RECORD_NAME_RE.exec(name);
  if (!m) return undefined;
  const pid = Number(m[1]);
  return { pid, stale: processStartTime(pid) !== m[2], temporary: m[3] !== undefined };
}

/**
 * Opens the folder of records `directory` for reading or sweeping, as an fd (the caller closes
 * it): never through a symlink, and only a directory of this user that no one else may enter (for
 * the default folder, its parent too), so that nothing another user planted is read or deleted.
 * Throws ERR_SOCKET_DIR_UNSAFE when it is not; ENOENT when it does not exist.
 */
export function openStatusDirectory(directory: string, isDefault: boolean): number {
  const hint = 'remove it (or the files in it are not to be trusted), or pass another directory';
  if (isDefault) checkPrivateDirectory(dirname(directory), 'the socket directory', hint);
  return openPrivateDirectory(directory, 'the status directory', hint);
}

/** The names in the directory open as `dirFd`. */
export const namesIn = (dirFd: number): string[] => readdirSync(`/proc/self/fd/${dirFd}`);

/**
 * Removes the records (and temporaries) of processes that are gone from the directory open as
 * `dirFd` (openStatusDirectory); returns their pids. Only regular files of this user are removed.
 */
export function removeStaleRecords(dirFd: number, names: readonly string[] = namesIn(dirFd)): number[] {
  const gone: number[] = [];
  const uid = process.getuid?.();
  for (const name of names) {
    const s = isStale(name);
    if (!s?.stale) continue;
    const path = inDirectory(dirFd, name);
    try {
      const st = lstatSync(path);
      if (!st.isFile() || st.uid !== uid) continue;
      if (!s.temporary) gone.push(s.pid);
      unlinkSync(path);
    } catch {
      // Another reader removed it first.
    }
  }
  return gone;
}

/** This process's open fds, less the one the count itself opens; throws what readdir throws (EMFILE). */
export function openFdCount(): number {
  return readdirSync('/proc/self/fd').length - 1;
}
