// Device UUIDs in nvidia-smi's text form, 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx' (lower-case
// hex), and as the 16 raw bytes of CUuuid on the wire. Descriptors name devices by UUID because
// ordinals change with CUDA_VISIBLE_DEVICES.

import { describe, fail, type Field } from './checks.js';
import { hexToBytes } from './hex.js';
import { formatUuid } from '../cuda/device.js';

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

// A process sees a handful of devices: remember each UUID's two forms once converted.
const bytesByText = new Map<string, Uint8Array>();
const textByKey = new Map<string, string>();

/** The 16 raw bytes of a checked device UUID string (do not modify them: they are shared). */
export function deviceUuidToBytes(uuid: string, field: Field): Uint8Array {
  let bytes = bytesByText.get(uuid);
  if (!bytes) {
    bytes = hexToBytes(checkDeviceUuid(uuid, field).slice(4).replaceAll('-', ''), DEVICE_UUID_BYTES, field);
    if (bytesByText.size < 64) bytesByText.set(uuid, bytes);
  }
  return bytes;
}

/** The text form of 16 raw UUID bytes. */
export function deviceUuidFromBytes(bytes: Uint8Array): string {
  const key = Buffer.from(bytes.buffer, bytes.byteOffset, DEVICE_UUID_BYTES).toString('latin1');
  let text = textByKey.get(key);
  if (text === undefined) {
    text = formatUuid(bytes);
    if (textByKey.size < 64) textByKey.set(key, text);
  }
  return text;
}
