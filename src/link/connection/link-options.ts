// The bounds a link puts on what one peer can make it hold, given to spawn(), connect(), listen()
// and parentLink(), checked once when the link is made.
import { constants as bufferConstants } from 'node:buffer';
import { readFileSync } from 'node:fs';
import { checkObject, invalidArgType, optionalInteger, outOfRange, received } from '../../arg-errors.js';

/** Bounds of one link (options of spawn(), connect(), listen() and parentLink()): what one peer can make this process hold. */
export interface LinkOptions {
  /**
   * The largest message, in payload bytes, this link sends or accepts: at most `inbox.bytes`, and
   * by default equal to it (256 MiB), so that one message can never hold more than the inbox may
   * (a larger value is a RangeError: raise inbox.bytes with it). Messages larger than a frame
   * (128 KiB) travel in a sealed memfd (inline on TCP). A send over it throws
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
   * the kernel and the peer's send() returns false. Nothing is refused or dropped. Received bytes
   * also count against the process's bound across all links (setMaxReceivedBytes(), 1 GiB).
   */
  inbox?: { messages?: number; bytes?: number; fds?: number };
  /**
   * IPC memory pools the peer may make this process import over the link (default 64); each
   * holds an fd and driver state for the link's life. A message naming one more fails alone with
   * ERR_LIMIT_REACHED (limit 'importedPools').
   */
  importedPools?: number;
  /**
   * Device memory on a tls:// link (TCP links only; default false). It moves over NCCL, beside the
   * link's socket: NCCL does not encrypt, so its bytes cross NCCL's network (sockets, InfiniBand,
   * RoCE) in clear, outside TLS. Without this option sending device memory on a tls:// link throws
   * ERR_NCCL_UNENCRYPTED, and receiving it fails that message with ERR_NCCL_UNENCRYPTED (the
   * sender is told, NCCL_ABORT). Set it where the network NCCL uses is trusted; tcp:// links,
   * which encrypt nothing, are not affected.
   */
  allowNcclInClear?: boolean;
}

/** The keys of LinkOptions, for the option checks of spawn(), connect(), listen() and parentLink(). */
export const LINK_OPTION_KEYS: Readonly<Record<keyof LinkOptions, true>> = {
  maxMessageBytes: true, sendQueue: true, leases: true, inbox: true, importedPools: true, allowNcclInClear: true,
};

/** LinkOptions with every default filled in. */
export interface LinkLimits {
  readonly maxMessageBytes: number;
  readonly sendQueue: { readonly messages: number; readonly bytes: number; readonly fds: number };
  readonly leases: { readonly count: number; readonly bytes: number; readonly fds: number };
  readonly inbox: { readonly messages: number; readonly bytes: number; readonly fds: number };
  readonly importedPools: number;
  readonly allowNcclInClear: boolean;
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

/** Default inbox bound in bytes, and so the default maxMessageBytes: 256 MiB. */
export const DEFAULT_INBOX_BYTES = 256 * 2 ** 20;

export const DEFAULT_LINK_LIMITS: LinkLimits = {
  maxMessageBytes: DEFAULT_INBOX_BYTES,
  sendQueue: { messages: 4096, bytes: 64 * 2 ** 20, fds: 1024 },
  leases: { count: 16384, bytes: Number.MAX_SAFE_INTEGER, fds: defaultLeaseFds() },
  inbox: { messages: 1024, bytes: DEFAULT_INBOX_BYTES, fds: 1024 },
  importedPools: 64,
  allowNcclInClear: false,
};

/** Checks `options` (TypeError / RangeError with Node's codes) and fills in the defaults. */
export function linkLimits(options: LinkOptions | undefined, what: string): LinkLimits {
  const o = checkObject<LinkOptions>(options, what);
  if (!o) return DEFAULT_LINK_LIMITS;
  const d = DEFAULT_LINK_LIMITS;
  const q = checkObject<NonNullable<LinkOptions['sendQueue']>>(o.sendQueue, `${what}.sendQueue`) ?? {};
  const l = checkObject<NonNullable<LinkOptions['leases']>>(o.leases, `${what}.leases`) ?? {};
  const i = checkObject<NonNullable<LinkOptions['inbox']>>(o.inbox, `${what}.inbox`) ?? {};
  const inboxBytes = optionalInteger(i.bytes, `${what}.inbox.bytes`, d.inbox.bytes, 1);
  // At most what one Buffer can hold (a received large message is read into one), and at most the
  // inbox: one message must not hold more than the whole backlog of the link may.
  const maxMessageBytes = optionalInteger(o.maxMessageBytes, `${what}.maxMessageBytes`, Math.min(inboxBytes, bufferConstants.MAX_LENGTH), 1, bufferConstants.MAX_LENGTH);
  if (maxMessageBytes > inboxBytes) {
    throw outOfRange(`${what}.maxMessageBytes (${maxMessageBytes}) is larger than ${what}.inbox.bytes (${inboxBytes}): one received message may not hold more ` +
      `than the inbox bound; raise inbox.bytes with it (both bound what a peer makes this process hold)`);
  }
  if (o.allowNcclInClear !== undefined && typeof o.allowNcclInClear !== 'boolean') {
    throw invalidArgType(`The "${what}.allowNcclInClear" property must be of type boolean. ${received(o.allowNcclInClear)}`);
  }
  return {
    allowNcclInClear: o.allowNcclInClear ?? false,
    importedPools: optionalInteger(o.importedPools, `${what}.importedPools`, d.importedPools, 0),
    inbox: {
      messages: optionalInteger(i.messages, `${what}.inbox.messages`, d.inbox.messages, 1),
      bytes: inboxBytes,
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
    maxMessageBytes,
  };
}
