// Whether this machine can run a command's GPU path, and if not, why: commands print the reason
// and exit 0 where no usable GPU exists (the CUDA samples' convention), so scripts can tell "not
// here" from "failed".
import { probeDriver } from '../cuda/driver.js';
import { Device } from '../cuda/device.js';

export interface GpuNeeds {
  /** IPC memory pools shared through POSIX file descriptors. */
  pools?: boolean;
  /** Interprocess events. */
  ipcEvents?: boolean;
}

/** Why device `ordinal` cannot serve `needs` here, or undefined when it can. */
export function whyNoGpu(ordinal: number, needs: GpuNeeds = {}): string | undefined {
  if (process.platform !== 'linux') return `this is ${process.platform}, and CUDA IPC with POSIX file descriptors needs Linux`;
  const probe = probeDriver();
  if (!probe.ok) return probe.error.message;
  let devices: readonly Device[];
  try {
    devices = Device.all();
  } catch (e) {
    return (e as Error).message;
  }
  if (devices.length === 0) return 'the CUDA driver sees no GPU';
  const d = devices[ordinal];
  if (!d) return `there is no device ${ordinal} (${devices.length} visible)`;
  if (needs.pools && !d.capabilities.memoryPools) return `device ${ordinal} (${d.name}) has no memory pools`;
  if (needs.pools && !d.capabilities.posixFdPoolHandles) return `device ${ordinal} (${d.name}) cannot share pools through POSIX file descriptors`;
  if (needs.ipcEvents && !d.capabilities.ipcEvents) return `device ${ordinal} (${d.name}) does not support interprocess events`;
  return undefined;
}
