// Whether this machine can run a command's GPU path, and if not, why: commands print the reason
// and run on host shared memory instead (or, where there is nothing to run there, exit 0: the
// CUDA samples' convention), so scripts can tell "not here" from "failed".
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
 * A --device ordinal beyond the devices this machine has is a usage error (2). So is an explicit
 * --device where there is no GPU at all: the user asked for a GPU, and running on host memory
 * instead would ignore it silently. Without --device, such a machine is not an error (the
 * command says why and runs on host memory, or exits 0). `withoutDevice` says what the command
 * does when --device is left out, e.g. 'run the round trip on host shared memory'.
 */
export function checkDeviceOrdinal(ordinal: number, explicit: boolean, withoutDevice: string, option = '--device'): void {
  let why: string | undefined;
  let count = 0;
  const probe = probeDriver();
  if (!probe.ok) why = probe.error.message;
  else {
    try {
      count = Device.all().length;
      if (count === 0) why = 'the CUDA driver sees no GPU';
    } catch (e) {
      why = (e as Error).message;
    }
  }
  if (why !== undefined) {
    if (explicit) throw new UsageError(`${option} ${ordinal}: there is no GPU here to choose (${why}); leave ${option} out to ${withoutDevice}`);
    return;
  }
  if (ordinal >= count) {
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
