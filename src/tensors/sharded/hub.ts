// The hub of a sharded sync group (docs/PROTOCOL.md 9.3): it takes joins (each rank's layout and
// serve name), plans the whole group once it is complete (refusing the joiner whose layout breaks
// the plan), sends the plan with a new epoch, waits until every rank said 'planned' with the same
// fingerprint, makes the NCCL unique id when some rank has NCCL pairs, and tells every rank
// 'ready'. A rank whose link drops is announced 'lost' to the others; a replacement (the same rank
// joining again) or a new layout re-plans (epoch + 1). The hub's own rank is a member without a link.
import { IpcError } from '../../errors.js';
import type { Link } from '../../link/connection/link.js';
import { LayoutError } from './errors.js';
import { decodeLayout, layoutFingerprint } from './layout-wire.js';
import { validateLayout, type RankLayout } from './layout.js';
import { planSharded } from './plan.js';
import { parseShardMessage, trySend, type FromHub, type JoinMessage, type PlannedMessage, type ToHub } from './group-wire.js';

/** Groups larger than this are not planned whole by the hub; each record is only validated. */
export const HUB_PLAN_MAX_RANKS = 64;

interface Member {
  readonly rank: number;
  /** null: the hub's own rank. */
  readonly link: Link | null;
  layout: Uint8Array;
  decoded: RankLayout;
  serve: string | null;
}

/** What the hub needs from its process. */
export interface HubOptions {
  /** Ranks in the group (the hub's own included). */
  readonly size: number;
  /** The hub's own rank. */
  readonly rank: number;
  readonly chunkBytes: number;
  /** Delivers a message to the hub's own rank. */
  readonly deliver: (message: FromHub) => void;
  /** A fresh 128-byte NCCL unique id from the loaded library (called only when some rank has NCCL pairs). */
  readonly ncclId: () => Promise<Uint8Array>;
}

export class ShardHub {
  readonly #o: HubOptions;
  readonly #members = new Map<number, Member>();
  /** Links that joined no rank yet (or were refused), watched for their close. */
  readonly #links = new Set<Link>();
  readonly #planned = new Map<number, PlannedMessage>();
  #epoch = 0;
  #fingerprint: string | undefined;
  #closed = false;

  constructor(options: HubOptions) {
    this.#o = options;
  }

  get epoch(): number { return this.#epoch; }

  /** Ranks joined now, sorted. */
  get ranks(): number[] { return [...this.#members.keys()].sort((a, b) => a - b); }

  /** Takes an accepted link: its messages are joins and 'planned's. */
  add(link: Link): void {
    if (this.#closed) { link.close(); return; }
    this.#links.add(link);
    link.on('message', (value: unknown) => {
      let msg: ToHub;
      try {
        const parsed = parseShardMessage(value);
        if (parsed.shard !== 'join' && parsed.shard !== 'planned') throw new IpcError('ERR_SHARD_PROTOCOL', `a member sent the hub a '${parsed.shard}', which only the hub or a serve link sends`);
        msg = parsed;
      } catch (e) {
        this.#protocolError(link, e as IpcError);
        return;
      }
      const member = this.#memberOf(link);
      if (msg.shard === 'join') this.#join(link, msg);
      else if (!member) this.#protocolError(link, new IpcError('ERR_SHARD_PROTOCOL', "a link sent 'planned' before it joined"));
      else this.#onPlanned(member.rank, msg);
    });
    link.on('messageerror', (e: IpcError) => this.#protocolError(link, new IpcError('ERR_SHARD_PROTOCOL', `a member's message could not be decoded: ${e.message}`, { cause: e })));
    link.on('close', (reason: IpcError | undefined) => this.#dropped(link, reason));
  }

  /** The hub's own rank joins (or changes its layout). Throws LayoutError / IpcError where a member would be refused. */
  joinSelf(msg: JoinMessage): void {
    const refusal = this.#join(null, msg);
    if (refusal) throw refusal;
  }

  /** The hub's own rank planned. */
  plannedSelf(msg: PlannedMessage, rank: number): void {
    this.#onPlanned(rank, msg);
  }

  /** Ends the group: every member's link closes (they see the hub lost). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const l of this.#links) l.close();
    this.#links.clear();
    this.#members.clear();
  }

  #memberOf(link: Link): Member | undefined {
    for (const m of this.#members.values()) if (m.link === link) return m;
    return undefined;
  }

  #send(m: Member, msg: FromHub): void {
    if (m.link === null) queueMicrotask(() => this.#o.deliver(msg));
    else trySend(m.link, msg);
  }

  #protocolError(link: Link, e: IpcError): void {
    if (!link.closed) {
      trySend(link, { shard: 'refused', code: 'ERR_SHARD_PROTOCOL', message: e.message.slice(0, 4000) });
      link.end({ timeout: 2000 }).catch(() => link.close());
    }
  }

  /** A join from `link` (null: the hub's own). Returns the refusal it sent, if any. */
  #join(link: Link | null, msg: JoinMessage): IpcError | undefined {
    const refuse = (e: IpcError): IpcError => {
      if (link && !link.closed) trySend(link, { shard: 'refused', code: e.code, message: e.message.slice(0, 4000) });
      return e;
    };
    const current = this.#members.get(msg.rank);
    if (current && current.link !== link) {
      const e = refuse(new IpcError('ERR_SHARD_PROTOCOL', `rank ${msg.rank} is already in the group on another link; a replacement joins once the old one is gone`));
      if (link) link.end({ timeout: 2000 }).catch(() => link.close());
      return e;
    }
    const mine = link ? this.#memberOf(link) : undefined;
    if (mine && mine.rank !== msg.rank) {
      this.#protocolError(link!, new IpcError('ERR_SHARD_PROTOCOL', `this link joined as rank ${mine.rank} and now says rank ${msg.rank}`));
      return undefined;
    }
    if (!current && this.#members.size >= this.#o.size) {
      return refuse(new IpcError('ERR_SHARD_PROTOCOL', `the group is complete (${this.#o.size} ranks: ${this.ranks.join(', ')}); rank ${msg.rank} is not one of them`));
    }
    let decoded: RankLayout;
    try {
      decoded = decodeLayout(msg.layout);
      if (decoded.rank !== msg.rank) throw new IpcError('ERR_SHARD_PROTOCOL', `a join says rank ${msg.rank} but its layout is rank ${decoded.rank}'s`);
    } catch (e) {
      return refuse(e instanceof IpcError ? e : new IpcError('ERR_SHARD_PROTOCOL', String(e)));
    }
    const entry: Member = { rank: msg.rank, link, layout: msg.layout, decoded, serve: msg.serve };
    this.#members.set(msg.rank, entry);
    if (this.#members.size < this.#o.size) return undefined;
    try {
      this.#check();
    } catch (e) {
      if (current) this.#members.set(msg.rank, current); else this.#members.delete(msg.rank);
      if (!(e instanceof LayoutError)) throw e;
      return refuse(e);
    }
    this.#startEpoch();
    return undefined;
  }

  /** Plans the complete group (or validates each layout where it is large); sets the fingerprint. */
  #check(): void {
    const layouts = this.ranks.map((r) => this.#members.get(r)!.decoded);
    if (layouts.length <= HUB_PLAN_MAX_RANKS) {
      this.#fingerprint = planSharded(layouts).fingerprint;
    } else {
      for (const l of layouts) validateLayout(l);
      this.#fingerprint = layoutFingerprint(layouts);
    }
  }

  #startEpoch(): void {
    this.#epoch++;
    this.#planned.clear();
    const ranks = this.ranks;
    const msg: FromHub = {
      shard: 'plan', epoch: this.#epoch, chunkBytes: this.#o.chunkBytes, hub: this.#o.rank,
      layouts: ranks.map((r) => this.#members.get(r)!.layout), serve: ranks.map((r) => this.#members.get(r)!.serve),
    };
    for (const r of ranks) this.#send(this.#members.get(r)!, msg);
  }

  #onPlanned(rank: number, msg: PlannedMessage): void {
    if (msg.epoch !== this.#epoch || this.#members.size < this.#o.size) return; // an epoch already past
    this.#planned.set(rank, msg);
    if (this.#planned.size < this.#o.size) return;
    const epoch = this.#epoch;
    const differ = [...this.#planned.values()].map((p, i) => (p.fingerprint === this.#fingerprint ? -1 : [...this.#planned.keys()][i]!)).filter((r) => r >= 0).sort((a, b) => a - b);
    if (differ.length > 0) {
      this.#broadcast({ shard: 'failed', epoch, code: 'ERR_SHARD_PLAN', ranks: differ, message: `ranks ${differ.join(', ')} planned from other layouts than the hub (fingerprints differ); the group cannot sync this epoch` });
      return;
    }
    const ncclRanks = [...this.#planned.entries()].filter(([, p]) => p.nccl).map(([r]) => r).sort((a, b) => a - b);
    if (ncclRanks.length === 0) {
      this.#broadcast({ shard: 'ready', epoch, nccl: null });
      return;
    }
    this.#o.ncclId().then((id) => {
      if (epoch === this.#epoch && !this.#closed) this.#broadcast({ shard: 'ready', epoch, nccl: { id, ranks: ncclRanks } });
    }, (e: unknown) => {
      if (epoch === this.#epoch && !this.#closed) {
        this.#broadcast({ shard: 'failed', epoch, code: 'ERR_SHARD_PLAN', ranks: ncclRanks, message: `the hub could not make the NCCL unique id for ranks ${ncclRanks.join(', ')}: ${(e as Error).message}` });
      }
    });
  }

  #broadcast(msg: FromHub): void {
    for (const m of this.#members.values()) this.#send(m, msg);
  }

  #dropped(link: Link, reason: IpcError | undefined): void {
    this.#links.delete(link);
    if (this.#closed) return;
    const m = this.#memberOf(link);
    if (!m) return;
    this.#members.delete(m.rank);
    this.#planned.clear();
    const why = reason ? `its link to the hub dropped (${reason.code}: ${reason.message})` : 'it left the group (its link to the hub closed)';
    this.#broadcast({ shard: 'lost', epoch: this.#epoch, rank: m.rank, reason: `rank ${m.rank}: ${why}`.slice(0, 4000) });
  }
}
