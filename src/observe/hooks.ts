// The cheap half of the status records (`cuda-ipc status` / `top`): what the other layers call
// when what this process shares changes. Calling it costs a flag test on the hot path; the record
// itself is built and written later by publisher.ts, at most a few times a second, off the paths
// that move messages. publisher.ts is imported statically (not on first use) so that no module
// loading, with its asynchronous file reads, ever starts in the middle of a user's work; it
// touches the modules that import this one only inside functions, so the import cycle is safe.
import type { Link } from '../link/link.js';
import { isMainThread } from 'node:worker_threads';
import { startPublisher } from './publisher.js';

/**
 * Publishing is on unless CUDA_IPC_STATUS is 0/off/false/no. Only the main thread publishes: a
 * worker that is terminate()d runs no exit handler, so its record would outlive it unnoticed.
 */
export const statusEnabled: boolean = isMainThread && !/^(0|off|false|no)$/i.test(process.env.CUDA_IPC_STATUS ?? '');

/** What the publisher provides once loaded. */
export interface StatusPublisher {
  /** Something changed: write the record soon (coalesced, rate-limited). */
  schedule(): void;
}

let dirty = false;
let publisher: StatusPublisher | undefined;

/**
 * Something this process shares changed (a link opened or closed, a lease was granted or ended,
 * device memory was allocated or freed): the status record will be rewritten soon.
 */
export function noteChange(): void {
  if (dirty || !statusEnabled) return;
  dirty = true;
  // Started on the first change: a process that never shares anything writes no record.
  publisher ??= startPublisher();
  publisher.schedule();
}

/** @internal For the publisher: clears the flag and says whether it was set. */
export function takeChange(): boolean {
  const was = dirty;
  dirty = false;
  return was;
}

// ---------------------------------------------------------------------------------------------
// Links

/** The received-lease count of a link, without reaching into it. */
export interface LeaseCount {
  readonly count: number;
}

interface ObservedLink {
  readonly link: WeakRef<Link>;
  readonly received: WeakRef<LeaseCount>;
}

const links = new Map<number, ObservedLink>();

/** Called once by every Link's constructor; the link is listed until it closes. */
export function observeLink(link: Link, received: LeaseCount): void {
  if (!statusEnabled) return;
  links.set(link.id, { link: new WeakRef(link), received: new WeakRef(received) });
  link.onClose(() => {
    links.delete(link.id);
    noteChange();
  });
  noteChange();
}

/** @internal For the publisher: the links alive now and what they received. */
export function* observedLinks(): Generator<{ link: Link; received: number }> {
  for (const [id, o] of links) {
    const link = o.link.deref();
    if (!link || link.closed) {
      links.delete(id);
      continue;
    }
    yield { link, received: o.received.deref()?.count ?? 0 };
  }
}

// ---------------------------------------------------------------------------------------------
// Channels

/** Slot states of a channel, counted over its slots. */
export interface ChannelSlotCounts {
  free: number;
  /** Acquired by a producer, not yet published (optional: not every channel tells). */
  writing?: number;
  published: number;
  taken: number;
}

/** A process attached to a channel, as this end knows it. */
export interface ChannelPeerStatus {
  pid: number;
  role: 'producer' | 'consumer' | 'none';
  /** e.g. 'live', 'died', 'ended', 'detached'. */
  state: string;
}

/** What a channel end reports to `cuda-ipc status`: JSON data, cheap to make. */
export interface ChannelStatus {
  /** A label for people, e.g. the channel's id. */
  id: string;
  /** This end's role. */
  role: 'producer' | 'consumer' | 'none';
  topology?: string;
  memory: 'host' | 'device';
  slotBytes: number;
  slots: ChannelSlotCounts;
  peers: ChannelPeerStatus[];
}

/** A channel end that can be listed: snapshot() is called at most a few times a second. */
export interface ChannelStatusSource {
  snapshot(): ChannelStatus;
}

/** Returned by registerChannel(). */
export interface ChannelRegistration {
  /** A structural change (a peer attached, died, detached): refresh the record soon. */
  changed(): void;
  /** The channel closed: it is no longer listed. Idempotent. */
  unregister(): void;
}

const channels = new Set<ChannelStatusSource>();

/**
 * Lists a channel end in this process's status record until unregister(). Slot states move with
 * every message, so they are not pushed: while any channel is registered, the publisher samples
 * every snapshot() a few times a second and rewrites the record only when something differs.
 */
export function registerChannel(source: ChannelStatusSource): ChannelRegistration {
  if (!statusEnabled) return { changed() {}, unregister() {} };
  channels.add(source);
  noteChange();
  return {
    changed: noteChange,
    unregister() {
      if (channels.delete(source)) noteChange();
    },
  };
}

/** @internal For the publisher. */
export function observedChannels(): ReadonlySet<ChannelStatusSource> {
  return channels;
}
