// Writes this process's status record (record.ts) when what it shares changes: hooks.ts sets a
// flag and asks for a write; a write happens 20 ms after the first change (so a burst is one
// write) and at most every 250 ms, on an unref'd timer that never keeps the process alive. The
// file is replaced atomically (write a temporary, rename), so a reader never sees half of it, and
// removed when the process exits. A process that dies without exiting (SIGKILL, a crash) leaves
// its record behind: readers see that its pid is gone and remove it (reader.ts).
// What it writes comes from the sources hooks.ts hands it, and the import cache's figures straight
// from the addon: it imports no layer above observe.
import { closeSync, mkdirSync, renameSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { addon } from '../native/addon.js';
import { fdsExhausted, IpcError } from '../errors.js';
import { ensurePrivateDirectory } from '../runtime-directory.js';
import { createFileExclusive, removeIfSame, whyNotReplace, type FileIdentity } from '../safe-files.js';
import type { ChannelStatus, ChannelStatusSource, DeviceMemoryStats, ObservedLink } from './reports.js';
import {
  MAX_LISTED, RECORD_VERSION, defaultStatusDirectory, openFdCount, openStatusDirectory, processStartTime, recordName, removeStaleRecords,
  type LinkRecord, type StatusRecord,
} from './record.js';

/** What the publisher provides once started. */
export interface StatusPublisher {
  /** Something changed: write the record soon (coalesced, rate-limited). */
  schedule(): void;
}

/** What the publisher reads, handed over by hooks.ts. */
export interface StatusSources {
  /** Clears the changed flag and says whether it was set. */
  takeChange(): boolean;
  /** The links alive now and how many leases each received. */
  links(): Iterable<{ link: ObservedLink; received: number }>;
  channels(): ReadonlySet<ChannelStatusSource>;
  deviceMemory(): DeviceMemoryStats;
  /** What a link carried by value (hooks.ts's counters). */
  traffic(link: object): { copiedSent: number; copiedReceived: number; ncclSent: number; ncclReceived: number };
}

const FIRST_DELAY_MS = 20;
const MIN_INTERVAL_MS = 250;
/** While channels are registered, their slot states are sampled this often. */
const CHANNEL_SAMPLE_MS = 500;
const MAX_ARGS = 32;
const MAX_ARG_CHARS = 200;

class Publisher implements StatusPublisher {
  readonly #sources: StatusSources;
  readonly #directory: string;
  readonly #path: string;
  readonly #tmp: string;
  readonly #pid = process.pid;
  readonly #startTime: string;
  readonly #argv = process.argv.slice(0, MAX_ARGS).map((a) => (a.length > MAX_ARG_CHARS ? `${a.slice(0, MAX_ARG_CHARS)}...` : a));
  #timer: NodeJS.Timeout | undefined;
  #sampler: NodeJS.Timeout | undefined;
  #lastWrite = 0;
  #lastBody = '';
  #written = false;
  #stopped = false;
  #removeOnExit = false;
  /** The record file this process last wrote (renamed into place). */
  #file: FileIdentity | undefined;
  #openFds = 0;

  constructor(sources: StatusSources, directory: string, startTime: string) {
    this.#sources = sources;
    this.#directory = directory;
    this.#startTime = startTime;
    this.#path = join(directory, recordName(this.#pid, startTime));
    this.#tmp = `${this.#path}.tmp`;
  }

  schedule(): void {
    if (this.#stopped || this.#timer) return;
    const delay = Math.max(FIRST_DELAY_MS, this.#lastWrite + MIN_INTERVAL_MS - Date.now());
    this.#timer = setTimeout(this.#write, delay).unref();
  }

  readonly #write = (): void => {
    this.#timer = undefined;
    if (this.#stopped) return;
    this.#sources.takeChange();
    let record: StatusRecord;
    try {
      record = this.#record();
    } catch (e) {
      // Status is a view: running out of fds must not take the process down, nor end the records.
      if (fdsExhausted(e)) return this.#retryLater();
      throw e;
    }
    const { updatedAt: _, ...rest } = record;
    const body = JSON.stringify(rest);
    this.#manageSampler();
    // A handshake completes without any other change: look again until the peer is known.
    if (record.links.some((l) => l.state === 'handshaking')) this.schedule();
    if (body === this.#lastBody && this.#written) return;
    const text = JSON.stringify(record) + '\n';
    try {
      this.#writeFile(text);
    } catch (e) {
      if (fdsExhausted(e)) return this.#retryLater();
      if ((e as { code?: string }).code !== 'ENOENT') return this.#stop(e);
      // The folder went away (a temp-directory cleaner): make it again, once. If even the
      // directory above the socket directory is gone, no one can be reading records there.
      try {
        this.prepare();
        this.#writeFile(text);
      } catch (e2) {
        return this.#stop(e2, (e2 as { code?: string }).code === 'ENOENT');
      }
    }
    this.#lastBody = body;
    this.#written = true;
    this.#lastWrite = Date.now();
  };

  /** No fd to spare now (EMFILE/ENFILE): the same record is tried again later, not dropped. */
  #retryLater(): void {
    this.#lastWrite = Date.now();
    this.#written = false;
    this.schedule();
  }

  #writeFile(text: string): void {
    let written: FileIdentity;
    try {
      written = createFileExclusive(this.#tmp, text);
    } catch (e) {
      if ((e as { code?: string }).code !== 'EEXIST') throw e;
      // A temporary of this very process (its pid and start time are in the name, in a private
      // folder) left by a write that failed halfway: removed only if it is this user's file.
      removeIfSame(this.#tmp, undefined);
      written = createFileExclusive(this.#tmp, text);
    }
    // The record's name holds nothing, or the record this process wrote last: nothing else is replaced.
    const why = whyNotReplace(this.#path, this.#file ?? 'never');
    if (why !== undefined) {
      removeIfSame(this.#tmp, written);
      throw new IpcError('ERR_FILE_UNSAFE', `the status record ${this.#path} ${why}; it was left as it is`);
    }
    renameSync(this.#tmp, this.#path);
    this.#file = written;
  }

  /** Creates the folder (and the private socket directory) if needed; throws if unsafe. */
  prepare(): void {
    ensurePrivateDirectory(dirname(this.#directory));
    try {
      mkdirSync(this.#directory, { mode: 0o700 });
    } catch (e) {
      if ((e as { code?: string }).code !== 'EEXIST') throw e;
    }
    // The folder itself must be private too (not a symlink, this user's, mode 0700).
    const dirFd = openStatusDirectory(this.#directory, true);
    try {
      if (!this.#removeOnExit) {
        this.#removeOnExit = true;
        process.on('exit', this.#remove);
        // Records of killed processes wait for a reader; each new publisher sweeps them too, so
        // they never pile up where no one runs `cuda-ipc status`. One readdir, once.
        removeStaleRecords(dirFd);
      }
    } finally {
      closeSync(dirFd);
    }
  }

  #record(): StatusRecord {
    const links: LinkRecord[] = [];
    let leaseCount = 0;
    let leaseBytes = 0;
    let linksNotListed = 0;
    for (const { link, received } of this.#sources.links()) {
      const leased = link.leases;
      leaseCount += leased.count;
      leaseBytes += leased.bytes;
      if (links.length >= MAX_LISTED) {
        linksNotListed++;
        continue;
      }
      let peerPid = 0;
      try {
        peerPid = link.peer.pid;
      } catch {
        // Not known before the handshake (the parent's end of a spawn).
      }
      const entry: LinkRecord = { id: link.id, peerPid, state: link.state, leasedToPeer: leased, receivedFromPeer: received };
      const sq = link.sendQueue;
      if (sq.messages > 0) entry.sendQueue = { messages: sq.messages, bytes: sq.bytes, fds: sq.fds };
      const rq = link.receiveQueue;
      if (rq.messages > 0 || rq.paused) entry.receiveQueue = { messages: rq.messages, bytes: rq.bytes, fds: rq.fds, paused: rq.paused };
      const remote = link.transport === 'tcp' ? link.remote : undefined;
      if (remote) {
        entry.transport = 'tcp';
        entry.remote = { address: remote.address, port: remote.port, family: remote.family, tls: remote.tls };
        entry.traffic = this.#sources.traffic(link);
      }
      links.push(entry);
    }
    const channels: ChannelStatus[] = [];
    let channelsNotListed = 0;
    for (const source of this.#sources.channels()) {
      if (channels.length >= MAX_LISTED) {
        channelsNotListed++;
        continue;
      }
      try {
        channels.push(source.snapshot());
      } catch {
        // A channel closing right now: the next write no longer lists it.
      }
    }
    return {
      version: RECORD_VERSION,
      pid: this.#pid,
      startTime: this.#startTime,
      argv: this.#argv,
      updatedAt: Date.now(),
      device: this.#sources.deviceMemory(),
      leases: { count: leaseCount, bytes: leaseBytes },
      links,
      channels,
      ...(linksNotListed ? { linksNotListed } : {}),
      ...(channelsNotListed ? { channelsNotListed } : {}),
      importCache: addon.legacyCacheStats(),
      openFds: this.#countFds(),
    };
  }

  /** Open fds of this process; when none is left to read /proc/self/fd with, the last count. */
  #countFds(): number {
    try {
      this.#openFds = openFdCount();
    } catch (e) {
      if (!fdsExhausted(e)) throw e;
    }
    return this.#openFds;
  }

  #manageSampler(): void {
    // Slot states and link queues move with every message without a change being noted: while
    // any channel is listed, or a link is backed up, sample them.
    let want = this.#sources.channels().size > 0;
    if (!want) {
      for (const { link } of this.#sources.links()) {
        if (link.sendQueue.messages > 0 || link.receiveQueue.paused) {
          want = true;
          break;
        }
      }
    }
    if (want && !this.#sampler) {
      this.#sampler = setInterval(() => this.schedule(), CHANNEL_SAMPLE_MS).unref();
    } else if (!want && this.#sampler) {
      clearInterval(this.#sampler);
      this.#sampler = undefined;
    }
  }

  #stop(e: unknown, quietly = false): void {
    this.#stopped = true;
    clearInterval(this.#sampler);
    this.#remove();
    if (quietly) return;
    process.emitWarning(
      `cuda-ipc could not write this process's status record in ${this.#directory} (${String((e as Error)?.message ?? e)}); ` +
        '`cuda-ipc status` will not list it. Set CUDA_IPC_STATUS=0 to turn the records off.',
      { code: 'CUDA_IPC_STATUS' },
    );
  }

  /** Removes this process's record (only the file it last wrote there) and a temporary left by a failed write. */
  readonly #remove = (): void => {
    if (this.#file) removeIfSame(this.#path, this.#file);
    removeIfSame(this.#tmp, undefined);
  };
}

/** A publisher that does nothing, for a process that cannot write records (it said why once). */
const inert: StatusPublisher = { schedule() {} };

function warnOff(why: string): StatusPublisher {
  process.emitWarning(`cuda-ipc status records are off for this process: ${why}. Set CUDA_IPC_STATUS=0 to turn them off quietly.`, { code: 'CUDA_IPC_STATUS' });
  return inert;
}

/** Called once, by hooks.ts on the first change. */
export function startPublisher(sources: StatusSources): StatusPublisher {
  const startTime = processStartTime('self');
  if (startTime === undefined) return warnOff('/proc/self/stat is not readable');
  const p = new Publisher(sources, defaultStatusDirectory(), startTime);
  try {
    p.prepare();
  } catch (e) {
    return warnOff(String((e as Error)?.message ?? e));
  }
  return p;
}
