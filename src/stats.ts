// stats(): what this process shares and holds right now, for dashboards and leak hunting.
import { fdLimitError } from './errors.js';
import { openFdCount } from './observe/record.js';
import { deviceMemoryStats, type DeviceMemoryStats } from './cuda/buffer.js';
import { legacyCacheStats, type ImportCacheStats } from './ipc/legacy.js';
import { leaseStats, type LeaseStats } from './link/lifetimes/lease.js';
import { processTraffic, trafficByLink, type LinkTraffic } from './observe/hooks.js';

export type { LinkTraffic } from './observe/hooks.js';

/**
 * What links carried by value instead of sharing it: host memory copied into messages on TCP
 * links (a HostBuffer crosses machines as a copy of its bytes) and device memory moved over NCCL
 * (0 where no NCCL layer moved any). Totals since the process started, closed links included;
 * `links` lists the open links that carried any.
 */
export interface TrafficStats extends LinkTraffic {
  links: Array<LinkTraffic & { linkId: number }>;
}

/** What stats() reports for this process (this thread for device memory). */
export interface Stats {
  /** Device memory of this thread: allocations, what peers lease, what only leases keep (heldBytes), imports. */
  device: DeviceMemoryStats;
  /** Leases this process granted, per peer (link) and in total, device and host memory alike. */
  leases: LeaseStats;
  /** The process-wide legacy import cache: mappings, idle (cached) ones, exports. */
  importCache: ImportCacheStats;
  /** Open file descriptors of the process. */
  openFds: number;
  /** Bytes links copied (HostBuffers on TCP links) or moved over NCCL, per open link and in total. */
  traffic: TrafficStats;
}

/**
 * Accounting of this process: device memory, leases per peer, the legacy import cache, open fds,
 * what links copied or moved over NCCL.
 * Throws ERR_FD_LIMIT when the process has no fd left to count its fds with.
 */
export function stats(): Stats {
  let openFds: number;
  try {
    openFds = openFdCount();
  } catch (e) {
    throw fdLimitError(e, 'stats'); // counting fds takes one: ERR_FD_LIMIT when none is left
  }
  const traffic: TrafficStats = { ...processTraffic(), links: trafficByLink().map(({ linkId, traffic: t }) => ({ linkId, ...t })) };
  return { device: deviceMemoryStats(), leases: leaseStats(), importCache: legacyCacheStats(), openFds, traffic };
}
