// stats(): what this process shares and holds right now, for dashboards and leak hunting.
import { fdLimitError } from './errors.js';
import { openFdCount } from './observe/record.js';
import { deviceMemoryStats, type DeviceMemoryStats } from './cuda/buffer.js';
import { legacyCacheStats, type ImportCacheStats } from './ipc/legacy.js';
import { leaseStats, type LeaseStats } from './link/lease.js';

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
}

/**
 * Accounting of this process: device memory, leases per peer, the legacy import cache, open fds.
 * Throws ERR_FD_LIMIT when the process has no fd left to count its fds with.
 */
export function stats(): Stats {
  let openFds: number;
  try {
    openFds = openFdCount();
  } catch (e) {
    throw fdLimitError(e, 'stats'); // counting fds takes one: ERR_FD_LIMIT when none is left
  }
  return { device: deviceMemoryStats(), leases: leaseStats(), importCache: legacyCacheStats(), openFds };
}
