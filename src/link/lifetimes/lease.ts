// Leases: everything sent over a link that keeps a resource alive on the sending side (a host
// buffer's mapping, device memory, a pool, an event) is leased to the peer until the peer says it
// is done with it (a RELEASE frame) or the link closes for any reason, the peer's death included.
//
// Sending side (OutgoingLeases, one per link): a transfer handler's encode() may return a `hold`;
// once the message is committed the link records it under a fresh lease id, and runs
// hold.release() when the peer releases that id or the link closes. The id travels in the
// value's transfer record (message-format.ts).
// Receiving side (IncomingLeases, one per link): each record with a lease id gives its handler a
// ReceivedLease; the decoded value calls end() once it is finally released, and the ids ended
// in one tick go back to the sender batched in RELEASE frames.
import { MAX_RELEASE_IDS } from '../transport/frame.js';
import { noteChange } from '../../observe/hooks.js';

/** The sender-side resource a lease keeps alive (TransferEncoding.hold). */
export interface LeaseHold {
  /** Runs once: when the peer released the value, the link closed, or the send failed. */
  release(): void;
  /** Bytes the lease keeps alive, for accounting (link.leases, leaseStats()); default 0. */
  readonly bytes?: number;
  /**
   * Names the file descriptor the lease keeps open in this process (LinkOptions.leases.fds counts
   * them): any object standing for it; leases naming the same object count it once. Default none.
   */
  readonly fd?: object;
}

/** The receiving side of one lease, given to TransferHandler.decode(). */
export interface ReceivedLease {
  /** The id the sender gave this lease (unique on its link). */
  readonly id: number;
  /** True once end() ran, or once the link closed (the sender has then ended the lease itself). */
  readonly ended: boolean;
  /**
   * Tells the sender that this process is done with the value: call it once the decoded value is
   * finally released (e.g. a HostBuffer when its last view closes). Idempotent; does nothing once
   * the link is closed.
   */
  end(): void;
}

/** Lease totals, for one link or for the whole process. */
export interface LeaseCounts {
  /** Leases outstanding. */
  count: number;
  /** Bytes they keep alive (as the transfer handlers reported them). */
  bytes: number;
}

export interface LinkLeaseStats extends LeaseCounts {
  /** Link.id of the link the leases were granted on. */
  linkId: number;
  /** The peer holding them (0 while the link's handshake is still running). */
  peerPid: number;
}

export interface LeaseStats extends LeaseCounts {
  /** One entry per link with outstanding leases. */
  links: LinkLeaseStats[];
}

/** Lease ids are unique in the process (so also per link); they fit u64 and stay below 2^53. */
let lastLeaseId = 0;
export function nextLeaseId(): number {
  return ++lastLeaseId;
}

/** Runs `hold.release()`, reporting (never throwing) a failure: the other holds must still run. */
export function releaseHold(hold: LeaseHold): void {
  try {
    hold.release();
  } catch (e) {
    process.emitWarning(`a lease's release() threw: ${String((e as Error)?.message ?? e)}`, { code: 'CUDA_IPC_LEASE_RELEASE' });
  }
}

/** The tables that hold at least one lease, for leaseStats(). */
const withLeases = new Set<OutgoingLeases>();

/** The link a table of leases belongs to, as leaseStats() names it (link.ts's Link). */
export interface LeasingLink {
  readonly id: number;
  /** Throws while the peer is not known yet. */
  readonly peer: { readonly pid: number };
}

/** Leases this process granted to the peer of one link. */
export class OutgoingLeases {
  readonly #holds = new Map<number, LeaseHold>();
  #bytes = 0;
  /** Outstanding leases per fd they keep open (LeaseHold.fd). */
  readonly #fdUsers = new Map<object, number>();
  #closed = false;

  constructor(readonly link: LeasingLink) {}

  get count(): number {
    return this.#holds.size;
  }
  get bytes(): number {
    return this.#bytes;
  }
  /** Fds the outstanding leases keep open here. */
  get fds(): number {
    return this.#fdUsers.size;
  }

  /** Whether a lease on `fd` would add an fd to what the leases keep open. */
  addsFd(fd: object | undefined): boolean {
    return fd !== undefined && !this.#fdUsers.has(fd);
  }

  /** Records a committed lease. On a closed link the hold is released at once (no one has it). */
  add(id: number, hold: LeaseHold): void {
    if (this.#closed) {
      releaseHold(hold);
      return;
    }
    if (this.#holds.size === 0) withLeases.add(this);
    this.#holds.set(id, hold);
    this.#bytes += hold.bytes ?? 0;
    if (hold.fd) this.#fdUsers.set(hold.fd, (this.#fdUsers.get(hold.fd) ?? 0) + 1);
    noteChange(); // for `cuda-ipc status`: a flag test
  }

  /**
   * The peer released `ids`. Returns the first id that is not outstanding (never granted on this
   * link, or released already), having released the ids before it; undefined when all were known.
   */
  release(ids: readonly number[]): number | undefined {
    for (const id of ids) {
      const hold = this.#holds.get(id);
      if (!hold) return id;
      this.#holds.delete(id);
      this.#bytes -= hold.bytes ?? 0;
      if (hold.fd) {
        const users = this.#fdUsers.get(hold.fd)! - 1;
        if (users > 0) this.#fdUsers.set(hold.fd, users);
        else this.#fdUsers.delete(hold.fd);
      }
      if (this.#holds.size === 0) {
        this.#bytes = 0;
        this.#fdUsers.clear();
        withLeases.delete(this);
      }
      releaseHold(hold);
    }
    noteChange();
    return undefined;
  }

  /** The link closed: every lease ends, and later add() calls release at once. */
  close(): void {
    this.#closed = true;
    const holds = [...this.#holds.values()];
    this.#holds.clear();
    this.#bytes = 0;
    this.#fdUsers.clear();
    withLeases.delete(this);
    for (const hold of holds) releaseHold(hold);
  }

  stats(): LinkLeaseStats {
    let peerPid = 0;
    try {
      peerPid = this.link.peer.pid;
    } catch {
      // A child's parentLink() can send before its handshake completed: the pid is not known yet.
    }
    return { linkId: this.link.id, peerPid, count: this.#holds.size, bytes: this.#bytes };
  }
}

/**
 * Leases this process holds for its peers, per link and in total: what its links keep alive on
 * the peers' behalf (memory a peer still maps, ...). Links without leases are not listed.
 */
export function leaseStats(): LeaseStats {
  const links: LinkLeaseStats[] = [];
  let count = 0;
  let bytes = 0;
  for (const t of withLeases) {
    const s = t.stats();
    links.push(s);
    count += s.count;
    bytes += s.bytes;
  }
  return { count, bytes, links };
}

class LeaseFromPeer implements ReceivedLease {
  #ended = false;
  constructor(
    readonly table: IncomingLeases,
    readonly id: number,
  ) {}
  get ended(): boolean {
    return this.#ended || this.table.closed;
  }
  end(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.table.end(this.id);
  }
}

/**
 * Leases the peer of one link granted to this process. `send` puts one RELEASE frame on the link;
 * ids ended during one tick of the event loop are sent together, on a microtask.
 */
export class IncomingLeases {
  readonly #live = new Set<number>();
  #pending: number[] = [];
  #scheduled = false;
  #closed = false;

  constructor(readonly send: (ids: readonly number[]) => void) {}

  get closed(): boolean {
    return this.#closed;
  }
  /** Leases received and not yet ended. */
  get count(): number {
    return this.#live.size;
  }
  /** True while `id` was received and not ended: the peer must not grant it again. */
  isLive(id: number): boolean {
    return this.#live.has(id);
  }

  /** The receiving side of lease `id`, which the codec has checked is not live already. */
  open(id: number): ReceivedLease {
    this.#live.add(id);
    noteChange();
    return new LeaseFromPeer(this, id);
  }

  /** @internal Called by ReceivedLease.end(). */
  end(id: number): void {
    if (!this.#live.delete(id) || this.#closed) return;
    noteChange();
    this.#pending.push(id);
    if (!this.#scheduled) {
      this.#scheduled = true;
      queueMicrotask(this.#flush);
    }
  }

  /** Ids ended and not sent yet: the outbox may send their RELEASE behind the frame it sends now (sent()). */
  get waiting(): readonly number[] {
    return this.#pending;
  }

  /** The outbox sent a RELEASE of `waiting`: the flush already scheduled finds nothing to send. */
  sent(): void {
    this.#pending = [];
  }

  readonly #flush = (): void => {
    this.#scheduled = false;
    const ids = this.#pending;
    this.#pending = [];
    if (this.#closed) return;
    for (let i = 0; i < ids.length; i += MAX_RELEASE_IDS) {
      try {
        this.send(ids.length <= MAX_RELEASE_IDS ? ids : ids.slice(i, i + MAX_RELEASE_IDS));
      } catch {
        // The link is going away: its close ends every lease on the sender's side anyway.
        return;
      }
    }
  };

  /** The link closed: the sender has ended every lease itself; nothing more is sent. */
  close(): void {
    this.#closed = true;
    this.#live.clear();
    this.#pending = [];
  }
}
