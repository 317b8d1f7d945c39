// Whether this machine can run a command's GPU path, and if not, why: commands print the reason
// and run on host shared memory instead (or, where there is nothing to run there, exit 0: the
// CUDA samples' convention), so scripts can tell "not here" from "failed".
import { probeDriver } from '../cuda/driver.js';
import { Device } from '../cuda/device.js';
import { ordinalOption, UsageError, type ParsedArgs } from './args.js';
import { WORKING_DEVICE_ENV } from '../cuda/device.js';
import { terminalSafe } from './terminal-text.js';

export interface GpuNeeds {
  /** IPC memory pools shared through POSIX file descriptors. */
  pools?: boolean;
  /** Interprocess events. */
  ipcEvents?: boolean;
}

/** Where a command's device came from, for its checks and messages. */
export interface DeviceChoice {
  readonly ordinal: number;
  /** Given on purpose (--device, or CUDA_IPC_DEVICE): a machine without that GPU is a usage error. */
  readonly explicit: boolean;
  /** How messages name it: '--device' or 'CUDA_IPC_DEVICE'. */
  readonly option: string;
}

/**
 * The device of a command: --device, else CUDA_IPC_DEVICE where it is set (an ordinal, or a
 * device UUID 'GPU-...', the form spawn({ device }) sets), else 0. CUDA_IPC_DEVICE is checked like
 * the flag (a usage error for anything else); an ordinal there is rewritten to the device's UUID
 * where the GPU exists, the form the library (and any child) reads, so that it works on the same one.
 */
export function deviceChoice(args: ParsedArgs): DeviceChoice {
  if (args.values.device !== undefined) return { ordinal: ordinalOption(args, 'device'), explicit: true, option: '--device' };
  const env = process.env[WORKING_DEVICE_ENV];
  if (env === undefined || env.trim() === '') return { ordinal: 0, explicit: false, option: '--device' };
  const option = WORKING_DEVICE_ENV;
  const value = env.trim();
  if (/^\d+$/.test(value) && Number.isSafeInteger(Number(value))) {
    const ordinal = Number(value);
    try {
      if (probeDriver().ok && ordinal < Device.all().length) process.env[WORKING_DEVICE_ENV] = Device.get(ordinal).uuid;
    } catch {
      // No usable driver: checkDeviceOrdinal says so.
    }
    return { ordinal, explicit: true, option };
  }
  if (/^GPU-[0-9a-f-]+$/i.test(value)) {
    const probe = probeDriver();
    if (!probe.ok) throw new UsageError(`${option}=${terminalSafe(value)}: there is no GPU here to choose (${probe.error.message}); unset ${option} to run without one`);
    const found = Device.all().findIndex((d) => d.uuid.toLowerCase() === value.toLowerCase());
    if (found < 0) throw new UsageError(`${option}=${terminalSafe(value)}: no device here has that UUID (see cuda-ipc info), or give an ordinal (0, 1, ...)`);
    return { ordinal: found, explicit: true, option };
  }
  throw new UsageError(`${option} must be a device ordinal (0, 1, ...) or a device UUID (GPU-...), got '${terminalSafe(env)}'; fix or unset it`);
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
  // --device 1, or CUDA_IPC_DEVICE=1 (an environment variable is unset, not left out).
  const env = option === WORKING_DEVICE_ENV;
  const given = env ? `${option}=${ordinal}` : `${option} ${ordinal}`;
  if (why !== undefined) {
    if (explicit) throw new UsageError(`${given}: there is no GPU here to choose (${why}); ${env ? 'unset' : 'leave'} ${option}${env ? '' : ' out'} to ${withoutDevice}`);
    return;
  }
  if (ordinal >= count) {
    throw new UsageError(`${given}: there is no device ${ordinal}; this machine has ${count} (${env ? `${option}=` : `${option} `}0${count > 1 ? ` to ${count - 1}` : ''}; see cuda-ipc info)`);
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
