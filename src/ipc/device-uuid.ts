// Device UUIDs in nvidia-smi's text form, 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx' (lower-case
// hex), and as the 16 raw bytes of CUuuid on the wire. Descriptors name devices by UUID because
// ordinals change with CUDA_VISIBLE_DEVICES.

import { describe, fail, type Field } from './checks.js';
import { hexToBytes } from './hex.js';

export const DEVICE_UUID_BYTES = 16;

const DEVICE_UUID_PATTERN = /^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

export function checkDeviceUuid(value: unknown, field: Field): string {
  if (typeof value !== 'string' || !DEVICE_UUID_PATTERN.test(value)) {
    fail(
      field,
      `must look like 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx' with lower-case hex digits (as nvidia-smi -L prints), got ${describe(value)}`,
    );
  }
  return value;
}

/** The 16 raw bytes of a checked device UUID string. */
export function deviceUuidToBytes(uuid: string, field: Field): Uint8Array {
  return hexToBytes(checkDeviceUuid(uuid, field).slice(4).replaceAll('-', ''), DEVICE_UUID_BYTES, field);
}

/** The text form of 16 raw UUID bytes. */
export { formatUuid as deviceUuidFromBytes } from '../cuda/device.js';
