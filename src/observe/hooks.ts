// The cheap half of the status records (`cuda-ipc status` / `top`): what the other layers call
// when what this process shares changes. Calling it costs a flag test on the hot path; the record
// itself is built and written later by publisher.ts, at most a few times a second, off the paths
// that move messages. publisher.ts is imported statically (not on first use) so that no module
// loading, with its asynchronous file reads, ever starts in the middle of a user's work. Observe
// is a leaf: the layers report through the shapes of reports.ts, and nothing here imports them.
import { isMainThread } from 'node:worker_threads';
import { startPublisher, type StatusPublisher, type StatusSources } from './publisher.js';
import type {
  ChannelRegistration,
  ChannelStatusSource,
  DeviceMemoryStats,
  LeaseCount,
  ObservedLink,
} from './reports.js';

export type {
  ChannelPeerStatus,
  ChannelRegistration,
  ChannelSlotCounts,
  ChannelStatus,
  ChannelStatusSource,
  DeviceMemoryStats,
  LeaseCount,
  ObservedLink,
} from './reports.js';

/**
 * Publishing is on unless CUDA_IPC_STATUS is 0/off/false/no. Only the main thread publishes: a
 * worker that is terminate()d runs no exit handler, so its record would outlive it unnoticed.
 */
export const statusEnabled: boolean = isMainThread && !/^(0|off|false|no)$/i.test(process.env.CUDA_IPC_STATUS ?? '');

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
  publisher ??= startPublisher(sources);
  publisher.schedule();
}

// ---------------------------------------------------------------------------------------------
// Device memory

const NO_DEVICE_MEMORY: DeviceMemoryStats = { allocations: 0, allocatedBytes: 0, leased: 0, leasedBytes: 0, heldBytes: 0, imports: 0, importedBytes: 0 };
let deviceMemory: () => DeviceMemoryStats = () => ({ ...NO_DEVICE_MEMORY });

/** Called once by cuda/buffer.ts: where the record's device memory figures come from. */
export function reportDeviceMemory(stats: () => DeviceMemoryStats): void {
  deviceMemory = stats;
}

// ---------------------------------------------------------------------------------------------
// Links

interface Observed {
  readonly link: WeakRef<ObservedLink>;
  readonly received: WeakRef<LeaseCount>;
}

const links = new Map<number, Observed>();

/** Called once by every Link's constructor; the link is listed until it closes. */
export function observeLink(link: ObservedLink, received: LeaseCount): void {
  if (!statusEnabled) return;
  links.set(link.id, { link: new WeakRef(link), received: new WeakRef(received) });
  link.onClose(() => {
    links.delete(link.id);
    noteChange();
  });
  noteChange();
}

/** The links alive now and what they received. */
function* observedLinks(): Generator<{ link: ObservedLink; received: number }> {
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

// ---------------------------------------------------------------------------------------------
// Traffic: what links carried by value rather than by reference, per link and for the whole
// process: host memory copied into messages on TCP links ('host-bytes' records: the bytes cross
// the wire and arrive as a new buffer), and device memory moved over NCCL for a link (counted by
// the NCCL layer through countTraffic; 0 until it does). stats() and the status records read them.

/** Bytes one link (or the process, all links together) carried by value. */
export interface LinkTraffic {
  /** Host memory copied into messages this side sent (HostBuffers on TCP links). */
  copiedSent: number;
  /** Host memory copied out of messages this side received (new HostBuffers it made). */
  copiedReceived: number;
  /** Device memory this side sent over NCCL for the link (0 until the NCCL layer counts it). */
  ncclSent: number;
  /** Device memory this side received over NCCL for the link. */
  ncclReceived: number;
}

/** A link as the counters know it. */
export interface TrafficLink {
  readonly id: number;
  /** Runs `hook` once when the link closes (at once if it is closed). */
  onClose(hook: () => void): unknown;
}

const zeroTraffic = (): LinkTraffic => ({ copiedSent: 0, copiedReceived: 0, ncclSent: 0, ncclReceived: 0 });

const perLink = new WeakMap<object, LinkTraffic>();
/** Open links that carried something, for stats()' per-link list. */
const live = new Map<number, { link: WeakRef<TrafficLink>; traffic: LinkTraffic }>();
const totalTraffic = zeroTraffic();

/** Adds `bytes` to `field` of `link`'s counters and the process's. */
export function countTraffic(link: TrafficLink, field: keyof LinkTraffic, bytes: number): void {
  if (!(bytes > 0)) return;
  let t = perLink.get(link);
  if (!t) {
    const traffic = zeroTraffic();
    perLink.set(link, (t = traffic));
    live.set(link.id, { link: new WeakRef(link), traffic });
    link.onClose(() => void live.delete(link.id));
  }
  t[field] += bytes;
  totalTraffic[field] += bytes;
  noteChange(); // `cuda-ipc status` shows it
}

/** What `link` carried by value so far (zeros when nothing). */
export function linkTraffic(link: object): LinkTraffic {
  return { ...(perLink.get(link) ?? zeroTraffic()) };
}

/** What every link of this process carried by value since it started, closed links included. */
export function processTraffic(): LinkTraffic {
  return { ...totalTraffic };
}

/** The open links that carried something by value, with their counters. */
export function trafficByLink(): Array<{ linkId: number; traffic: LinkTraffic }> {
  const out: Array<{ linkId: number; traffic: LinkTraffic }> = [];
  for (const [id, e] of live) {
    if (!e.link.deref()) {
      live.delete(id);
      continue;
    }
    out.push({ linkId: id, traffic: { ...e.traffic } });
  }
  return out;
}

/** What the publisher reads: handed to it, so that it needs nothing from this module. */
const sources: StatusSources = {
  takeChange(): boolean {
    const was = dirty;
    dirty = false;
    return was;
  },
  links: observedLinks,
  channels: () => channels,
  deviceMemory: () => deviceMemory(),
  traffic: linkTraffic,
};
