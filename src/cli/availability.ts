// Whether this machine can run a command's GPU path, and if not, why: commands print the reason
// and exit 0 where no usable GPU exists (the CUDA samples' convention), so scripts can tell "not
// here" from "failed".
import { probeDriver } from '../cuda/driver.js';
import { Device } from '../cuda/device.js';
import { UsageError } from './args.js';

export interface GpuNeeds {
  /** IPC memory pools shared through POSIX file descriptors. */
  pools?: boolean;
  /** Interprocess events. */
  ipcEvents?: boolean;
}

/**
 * A --device ordinal beyond the devices this machine has is a usage error (2), where a machine
 * with no GPU at all is not (the command explains and exits 0).
 */
export function checkDeviceOrdinal(ordinal: number, option = '--device'): void {
  if (!probeDriver().ok) return;
  let count: number;
  try {
    count = Device.all().length;
  } catch {
    return; // whyNoGpu() reports it
  }
  if (count > 0 && ordinal >= count) {
    throw new UsageError(`${option} ${ordinal}: there is no device ${ordinal}; this machine has ${count} (${option} 0${count > 1 ? ` to ${count - 1}` : ''}; see cuda-ipc info)`);
  }
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
