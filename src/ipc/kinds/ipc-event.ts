// Codec of 'cuda-ipc-event' descriptors (binary type tag 2). Body, after the 16-byte header:
//
//   +16  64 bytes  CUipcEventHandle
//   +80  16 bytes  device UUID (raw CUuuid bytes)
//   +96  u32       pid
//   +100 u32       reserved, zero

import { at, checkBytes, checkKeys, type Field } from '../checks.js';
import type { IpcEventDescriptor } from '../descriptor-types.js';
import { DEVICE_UUID_BYTES, checkDeviceUuid, deviceUuidFromBytes, deviceUuidToBytes } from '../device-uuid.js';
import { bytesToHex, hexToBytes } from '../hex.js';
import type { KindCodec } from './codec.js';
import { HANDLE_BYTES, checkPid } from './common-fields.js';

const KIND = 'cuda-ipc-event';

function build(handle: Uint8Array, obj: Record<string, unknown>, field: Field): IpcEventDescriptor {
  const deviceUuid = checkDeviceUuid(obj.deviceUuid, at(field, 'deviceUuid'));
  const pid = checkPid(obj.pid, at(field, 'pid'));
  return { kind: KIND, version: 1, handle, deviceUuid, pid };
}

export const ipcEventCodec: KindCodec<'cuda-ipc-event'> = {
  kind: KIND,
  typeTag: 2,

  check(obj, field) {
    return build(checkBytes(obj.handle, HANDLE_BYTES, at(field, 'handle')), obj, field);
  },

  fromJson(obj, field) {
    checkKeys(obj, ['kind', 'version', 'handle', 'deviceUuid', 'pid'], [], field);
    return build(hexToBytes(obj.handle, HANDLE_BYTES, at(field, 'handle')), obj, field);
  },

  toJson(desc) {
    return { kind: KIND, version: 1, handle: bytesToHex(desc.handle), deviceUuid: desc.deviceUuid, pid: desc.pid };
  },

  bodyLength() {
    return HANDLE_BYTES + DEVICE_UUID_BYTES + 4 + 4;
  },

  encodeBody(desc, out) {
    out.raw(desc.handle);
    out.raw(deviceUuidToBytes(desc.deviceUuid, { code: 'ERR_DESCRIPTOR_INVALID', path: 'descriptor.deviceUuid' }));
    out.u32(desc.pid);
    out.skip(4);
  },

  decodeBody(input) {
    const handle = input.bytesCopy(HANDLE_BYTES, 'handle');
    const deviceUuid = deviceUuidFromBytes(input.bytesView(DEVICE_UUID_BYTES, 'deviceUuid'));
    const pid = input.u32('pid');
    input.zeros(4, 'reserved');
    return build(handle, { deviceUuid, pid }, input.root());
  },
};
