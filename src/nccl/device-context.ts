// The CUDA context NCCL works in: the device's primary context (the one every allocation and
// stream of this package lives in), made current by the addon around each NCCL call. Tests
// without a GPU use stand-in devices (test/helpers/nccl-testing.ts) whose context is none: the addon then leaves the
// thread's context alone.
import { Device } from '../cuda/device.js';
import { invalidArgType, received } from '../arg-errors.js';

const standIns = new WeakSet<object>();

/** @internal Registers a stand-in device (test/helpers/nccl-testing.ts). */
export function addStandInDevice(device: object): void {
  standIns.add(device);
}

/** Checks that `device` is a Device (or a test's stand-in): ERR_INVALID_ARG_TYPE otherwise. */
export function checkDevice(device: unknown, name: string): Device {
  if (device instanceof Device || (typeof device === 'object' && device !== null && standIns.has(device))) return device as Device;
  throw invalidArgType(`The "${name}" property must be an instance of Device. ${received(device)}`);
}

/** The context to make current around NCCL calls for `device` (0n for a stand-in). */
export function contextOf(device: Device): bigint {
  return standIns.has(device) ? 0n : device.primaryContext;
}
