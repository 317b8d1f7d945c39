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
};
