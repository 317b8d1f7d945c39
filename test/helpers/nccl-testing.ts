// For tests only (not exported from the package): communicators without a GPU, over a fake
// libnccl (test/fixtures/fake-nccl.c).
import type { Device } from '../../src/cuda/device.js';
import { addStandInDevice } from '../../src/nccl/device-context.js';
import { nccl } from '../../src/nccl/native.js';
export { forgetDiscoveries } from '../../src/nccl/library.js';

/**
 * A stand-in for a Device that NcclCommunicator.init accepts where there is no driver: NCCL calls
 * on its communicators run without a context switch, and only the legacy default stream (no
 * `stream` argument) can be used with them.
 */
export function standInDevice(ordinal = 0): Device {
  const d = { ordinal, name: 'stand-in device', uuid: `GPU-stand-in-${ordinal}` };
  addStandInDevice(d);
  return d as unknown as Device;
}

/** Communicators this thread's addon has registered and not ended (aborted or destroyed). */
export function openCommunicators(): number {
  return nccl.ncclCommsOpen();
}
