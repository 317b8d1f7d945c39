// Reads every status record of this user (record.ts) into one snapshot for `cuda-ipc status` and
// `top`. Reading only reads: the publishers are never signalled or waited on. Records of
// processes that are gone (killed, crashed: they could not remove their own) are recognised by
// their pid and start time, and removed.
import { closeSync, readdirSync } from 'node:fs';
import type { ImportCacheStats } from '../native/driver-types.js';
import { inDirectory, readRegularFile } from '../safe-files.js';
import type { ChannelStatus, DeviceMemoryStats } from './reports.js';
import { checkRecord } from './record-check.js';
import {
  MAX_RECORD_BYTES, RECORD_NAME_RE, RECORD_VERSION, defaultStatusDirectory, isStale, namesIn, openStatusDirectory, removeStaleRecords,
  type LinkRecord, type StatusRecord,
} from './record.js';

/** What one process holds of another's, or lends to it. */
export interface PeerShare {
  pid: number;
  /** Leases (values sent and not yet released). */
  count: number;
  /** Bytes they keep alive; null when the other process publishes no record to tell. */
  bytes: number | null;
}

/**
 * One process in a status snapshot: what it allocated, leases, holds from others, its links and
 * channels.
 */
export interface ProcessStatus {
  pid: number;
  /** The command line, as the process started (argv, shortened). */
  argv: string[];
  /** When its record was last written (ISO 8601), and how long ago in ms. */
  updatedAt: string;
  ageMs: number;
  /** Its device memory: allocations, what peers lease of them, imports. */
  device: DeviceMemoryStats;
  /** Leases it granted, all peers together. */
  leases: { count: number; bytes: number };
  /** What each peer still holds of this process's memory (device and host), by peer pid. */
  leasedTo: PeerShare[];
  /** What this process holds of each peer's memory, by peer pid. */
  importedFrom: PeerShare[];
  /** Its links, each with what waits to be sent and to be consumed when a side is behind. */
  links: LinkRecord[];
  channels: ChannelStatus[];
  /** Links and channels beyond the most a record lists (MAX_LISTED), when there were more. */
  linksNotListed?: number;
  channelsNotListed?: number;
  importCache: ImportCacheStats;
  /** Open file descriptors: counted now in /proc where readable, else as recorded. */
  openFds: number;
}

/** Every process of this user that uses cuda-ipc (collectStatus(), `cuda-ipc status --json`). */
export interface StatusSnapshot {
  version: typeof RECORD_VERSION;
  takenAt: string;
  /** The folder the records were read from. */
  directory: string;
  processes: ProcessStatus[];
  /** Pids whose records were left by processes that are gone (removed unless told not to). */
  stale: number[];
  /** Records that could not be used, and why. */
  unreadable: Array<{ file: string; reason: string }>;
}

/** Options of collectStatus(). */
export interface CollectOptions {
  /**
   * Where the records are; default: the `status` folder of this user's socket directory. Either
   * must be a directory of this user that no one else may enter (ERR_SOCKET_DIR_UNSAFE if not).
   */
  directory?: string;
  /** Remove records of processes that are gone (default true). */
  removeStale?: boolean;
}

function countFds(pid: number): number | undefined {
  try {
    return readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    return undefined;
  }
}

/** Reads the records in `directory`; see CollectOptions. */
export function collectStatus(options: CollectOptions = {}): StatusSnapshot {
  const directory = options.directory ?? defaultStatusDirectory();
  const removeStale = options.removeStale ?? true;
  const now = Date.now();
  const snapshot: StatusSnapshot = { version: RECORD_VERSION, takenAt: new Date(now).toISOString(), directory, processes: [], stale: [], unreadable: [] };
  let dirFd: number;
  try {
    dirFd = openStatusDirectory(directory, options.directory === undefined);
  } catch (e) {
    if ((e as { code?: string }).code === 'ENOENT') return snapshot; // nothing ever published here
    throw e;
  }
  const records: StatusRecord[] = [];
  try {
    const names = namesIn(dirFd).sort();
    if (removeStale) snapshot.stale = removeStaleRecords(dirFd, names);
    for (const name of names) {
      const s = isStale(name);
      if (!s) continue;
      if (s.stale) {
        if (!removeStale && !s.temporary) snapshot.stale.push(s.pid);
        continue;
      }
      if (s.temporary) continue; // a live writer's temporary file
      const record = readRecord(dirFd, name, s.pid, snapshot.unreadable);
      if (record) records.push(record);
    }
  } finally {
    closeSync(dirFd);
  }
  const byPid = new Map(records.map((r) => [r.pid, r]));
  for (const r of records) {
    snapshot.processes.push({
      pid: r.pid,
      argv: r.argv,
      updatedAt: new Date(r.updatedAt).toISOString(),
      ageMs: Math.max(0, now - r.updatedAt),
      device: r.device,
      leases: r.leases,
      leasedTo: leasedTo(r),
      importedFrom: importedFrom(r, byPid),
      links: r.links,
      channels: r.channels,
      ...(r.linksNotListed ? { linksNotListed: r.linksNotListed } : {}),
      ...(r.channelsNotListed ? { channelsNotListed: r.channelsNotListed } : {}),
      importCache: r.importCache,
      openFds: countFds(r.pid) ?? r.openFds,
    });
  }
  snapshot.processes.sort((a, b) => a.pid - b.pid);
  return snapshot;
}

/**
 * The record `name` of the directory open as `dirFd`, checked; undefined (and the reason in
 * `unreadable`) when it is not a regular file of this user (a symlink, a FIFO, a device are not
 * opened, or opened without blocking and refused), is larger than a record, or does not parse.
 */
function readRecord(dirFd: number, name: string, pid: number, unreadable: StatusSnapshot['unreadable']): StatusRecord | undefined {
  let text: string;
  try {
    const { bytes, stats } = readRegularFile(inDirectory(dirFd, name), { maxBytes: MAX_RECORD_BYTES, what: 'the status record' });
    if (stats.uid !== process.getuid?.()) {
      unreadable.push({ file: name, reason: `it belongs to uid ${stats.uid}, not to this user` });
      return undefined;
    }
    text = bytes.toString('utf8');
  } catch (e) {
    if ((e as { code?: string }).code === 'ENOENT') return undefined; // the process exited just now
    // The message names the /proc/self/fd path: say what it was instead.
    const reason = (e as { code?: string }).code === 'ERR_FILE_UNSAFE'
      ? String((e as Error).message).replace(/^the status record \S+ /, '')
      : `cannot be read (${(e as { code?: string }).code ?? String(e)})`;
    unreadable.push({ file: name, reason });
    return undefined;
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    unreadable.push({ file: name, reason: 'not JSON' });
    return undefined;
  }
  const record = checkRecord(parsed, pid, RECORD_NAME_RE.exec(name)![2]!);
  if (typeof record === 'string') {
    unreadable.push({ file: name, reason: record });
    return undefined;
  }
  return record;
}

/** Sums `f` over the links of `r` by peer pid (links whose peer is not known yet are left out). */
function byPeer(r: StatusRecord, f: (l: LinkRecord) => { count: number; bytes: number }): Map<number, { count: number; bytes: number }> {
  const out = new Map<number, { count: number; bytes: number }>();
  for (const l of r.links) {
    if (l.peerPid === 0) continue;
    const v = f(l);
    const sum = out.get(l.peerPid) ?? { count: 0, bytes: 0 };
    sum.count += v.count;
    sum.bytes += v.bytes;
    out.set(l.peerPid, sum);
  }
  return out;
}

function leasedTo(r: StatusRecord): PeerShare[] {
  const out: PeerShare[] = [];
  for (const [pid, v] of byPeer(r, (l) => l.leasedToPeer)) if (v.count > 0) out.push({ pid, ...v });
  return out.sort((a, b) => a.pid - b.pid);
}

/**
 * What `r` holds of each peer: the count from its own links (leases received and not ended); the
 * bytes from the peer's record (what the peer leases to `r`), since only the lender knows sizes.
 */
function importedFrom(r: StatusRecord, byPid: ReadonlyMap<number, StatusRecord>): PeerShare[] {
  const out: PeerShare[] = [];
  for (const [pid, v] of byPeer(r, (l) => ({ count: l.receivedFromPeer, bytes: 0 }))) {
    if (v.count === 0) continue;
    const lender = byPid.get(pid);
    const lent = lender ? byPeer(lender, (l) => l.leasedToPeer).get(r.pid) : undefined;
    out.push({ pid, count: v.count, bytes: lender ? (lent?.bytes ?? 0) : null });
  }
  return out.sort((a, b) => a.pid - b.pid);
}
