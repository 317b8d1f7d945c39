// The bounds a link puts on what one peer can make it hold, given to spawn(), connect(), listen()
// and parentLink(), checked once when the link is made.
import { constants as bufferConstants } from 'node:buffer';
import { readFileSync } from 'node:fs';
import { checkObject, optionalInteger } from '../../arg-errors.js';
import { DEFAULT_MAX_MESSAGE_BYTES } from '../transport/large-message.js';

/** Bounds of one link (options of spawn(), connect(), listen() and parentLink()): what one peer can make this process hold. */
export interface LinkOptions {
  /**
   * The largest message, in payload bytes, this link sends or accepts (default 1 GiB). Messages
   * larger than a frame (128 KiB) travel in a sealed memfd. A send over it throws
   * ERR_MESSAGE_TOO_LARGE; a peer that sends more gets the link closed (ERR_MESSAGE_TOO_LARGE).
   */
  maxMessageBytes?: number;
  /**
   * Bounds of the queue of messages waiting for room in the socket while the peer is not reading
   * (default 4096 messages, 64 MiB, 1024 fds). send() returns false once a message had to wait
   * (resume on 'drain'); a message that would pass a bound throws ERR_SEND_QUEUE_FULL, naming
   * it. A message always fits an empty queue, whatever its size.
   */
  sendQueue?: { messages?: number; bytes?: number; fds?: number };
  /**
   * Bounds of what the peer may hold of this link's sends at once: leases (received values it
   * has not released), the bytes they keep alive here and the fds they keep open here (a host
   * buffer's memfd stays open until the peer releases it, even once closed here). Defaults: 16384
   * leases, no byte bound, half this process's fd limit (`ulimit -n`, at least 16). send() returns
   * false while the peer holds half of any (so a sender of fresh buffers is told to wait at a
   * quarter of its fd limit, before it runs out); a message that would pass one throws
   * ERR_LIMIT_REACHED.
   */
  leases?: { count?: number; bytes?: number; fds?: number };
  /**
   * Bounds of the messages received and not yet consumed (receive(), 'message'), counted in
   * messages, bytes and the fds their values hold (default 1024 messages, 256 MiB, 1024 fds).
   * At a bound the link stops reading its socket until consumers catch up: the backlog waits in
   * the kernel and the peer's send() returns false. Nothing is refused or dropped.
   */
  inbox?: { messages?: number; bytes?: number; fds?: number };
  /**
   * IPC memory pools the peer may make this process import over the link (default 64); each
   * holds an fd and driver state for the link's life. A message naming one more fails alone with
   * ERR_LIMIT_REACHED (limit 'importedPools').
   */
  importedPools?: number;
}

/** The keys of LinkOptions, for the option checks of spawn(), connect(), listen() and parentLink(). */
export const LINK_OPTION_KEYS: Readonly<Record<keyof LinkOptions, true>> = {
  maxMessageBytes: true, sendQueue: true, leases: true, inbox: true, importedPools: true,
};

/** LinkOptions with every default filled in. */
export interface LinkLimits {
  readonly maxMessageBytes: number;
  readonly sendQueue: { readonly messages: number; readonly bytes: number; readonly fds: number };
  readonly leases: { readonly count: number; readonly bytes: number; readonly fds: number };
  readonly inbox: { readonly messages: number; readonly bytes: number; readonly fds: number };
  readonly importedPools: number;
}

/**
 * This process's soft limit on open files (`ulimit -n`) from /proc/self/limits; undefined where
 * it cannot be read or is unlimited.
 */
function openFileLimit(): number | undefined {
  try {
    const line = /^Max open files\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'latin1'));
    return line ? Number(line[1]) : undefined;
  } catch {
    return undefined;
  }
}

/** leases.fds by default: half the fd limit, so that send() says to wait at a quarter of it, long before EMFILE. */
function defaultLeaseFds(): number {
  const limit = openFileLimit();
  return limit === undefined ? Number.MAX_SAFE_INTEGER : Math.max(16, Math.floor(limit / 2));
}

export const DEFAULT_LINK_LIMITS: LinkLimits = {
  maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
  sendQueue: { messages: 4096, bytes: 64 * 2 ** 20, fds: 1024 },
  leases: { count: 16384, bytes: Number.MAX_SAFE_INTEGER, fds: defaultLeaseFds() },
  inbox: { messages: 1024, bytes: 256 * 2 ** 20, fds: 1024 },
  importedPools: 64,
};

/** Checks `options` (TypeError / RangeError with Node's codes) and fills in the defaults. */
export function linkLimits(options: LinkOptions | undefined, what: string): LinkLimits {
  const o = checkObject<LinkOptions>(options, what);
  if (!o) return DEFAULT_LINK_LIMITS;
  const d = DEFAULT_LINK_LIMITS;
  const q = checkObject<NonNullable<LinkOptions['sendQueue']>>(o.sendQueue, `${what}.sendQueue`) ?? {};
  const l = checkObject<NonNullable<LinkOptions['leases']>>(o.leases, `${what}.leases`) ?? {};
  const i = checkObject<NonNullable<LinkOptions['inbox']>>(o.inbox, `${what}.inbox`) ?? {};
  return {
    importedPools: optionalInteger(o.importedPools, `${what}.importedPools`, d.importedPools, 0),
    inbox: {
      messages: optionalInteger(i.messages, `${what}.inbox.messages`, d.inbox.messages, 1),
      bytes: optionalInteger(i.bytes, `${what}.inbox.bytes`, d.inbox.bytes, 1),
      fds: optionalInteger(i.fds, `${what}.inbox.fds`, d.inbox.fds, 1),
    },
    leases: {
      count: optionalInteger(l.count, `${what}.leases.count`, d.leases.count, 1),
      bytes: optionalInteger(l.bytes, `${what}.leases.bytes`, d.leases.bytes, 1),
      fds: optionalInteger(l.fds, `${what}.leases.fds`, d.leases.fds, 1),
    },
    sendQueue: {
      messages: optionalInteger(q.messages, `${what}.sendQueue.messages`, d.sendQueue.messages, 1),
      bytes: optionalInteger(q.bytes, `${what}.sendQueue.bytes`, d.sendQueue.bytes, 1),
      fds: optionalInteger(q.fds, `${what}.sendQueue.fds`, d.sendQueue.fds, 0),
    },
    // At most what one Buffer can hold: a received large message is read into one.
    maxMessageBytes: optionalInteger(o.maxMessageBytes, `${what}.maxMessageBytes`, DEFAULT_MAX_MESSAGE_BYTES, 1, bufferConstants.MAX_LENGTH),
  };
}
