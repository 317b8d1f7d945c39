// Codec of 'cuda-legacy-handle' descriptors (binary type tag 1). Body, after the 16-byte header:
//
//   +16  64 bytes  CUipcMemHandle
//   +80  16 bytes  device UUID (raw CUuuid bytes)
//   +96  u64       offset
//   +104 u64       byteLength
//   +112 u32       pid
//   +116 u32       reserved, zero
//   +120 8 + 16*ndim bytes  array section (array-section.ts)

import { checkArrayMeta, checkArrayMetaJson, extentOfChecked, type ArrayMeta } from '../array-meta.js';
import { at, checkBytes, checkCount, checkKeys, fail, type Field } from '../checks.js';
import type { LegacyHandleDescriptor, LegacyHandleDescriptorJson } from '../descriptor-types.js';
import { DEVICE_UUID_BYTES, checkDeviceUuid, deviceUuidFromBytes, deviceUuidToBytes } from '../device-uuid.js';
import { dtypeInfo } from '../dtype.js';
import { bytesToHex, hexToBytes } from '../hex.js';
import { arraySectionLength, decodeArraySection, encodeArraySection } from './array-section.js';
import type { KindCodec } from './codec.js';
import { HANDLE_BYTES, MAX_PID, checkPid } from './common-fields.js';

const KIND = 'cuda-legacy-handle';
const FIXED_BODY_BYTES = HANDLE_BYTES + DEVICE_UUID_BYTES + 8 + 8 + 4 + 4;

/** Checks every field but the handle, whose form differs between JSON and memory. */
function build(
  handle: Uint8Array,
  obj: Record<string, unknown>,
  array: ArrayMeta | undefined,
  field: Field,
): LegacyHandleDescriptor {
  const offset = checkCount(obj.offset, at(field, 'offset'), '; send the byte offset of the pointer inside its allocation');
  const byteLength = checkCount(obj.byteLength, at(field, 'byteLength'));
  if (offset + byteLength > Number.MAX_SAFE_INTEGER) {
    fail(at(field, 'byteLength'), `plus offset must not exceed 2^53-1, got offset ${offset} + byteLength ${byteLength}`);
  }
  const deviceUuid = checkDeviceUuid(obj.deviceUuid, at(field, 'deviceUuid'));
  const pid = checkPid(obj.pid, at(field, 'pid'));
  if (array !== undefined) {
    const extent = extentOfChecked(array);
    if (extent > byteLength) {
      fail(
        at(field, 'array'),
        `needs ${extent} bytes (shape ${JSON.stringify(array.shape)}, strides ${JSON.stringify(array.strides)}, ` +
          `${array.dtype}) but byteLength is only ${byteLength}; describe a smaller array or export more bytes`,
      );
    }
  }
  const desc: LegacyHandleDescriptor = { kind: KIND, version: 1, handle, offset, byteLength, deviceUuid, pid };
  return array === undefined ? desc : { ...desc, array };
}

export const legacyHandleCodec: KindCodec<'cuda-legacy-handle'> = {
  kind: KIND,
  typeTag: 1,

  check(obj, field) {
    const handle = checkBytes(obj.handle, HANDLE_BYTES, at(field, 'handle'));
    const array = obj.array === undefined ? undefined : checkArrayMeta(obj.array, at(field, 'array'));
    return build(handle, obj, array, field);
  },

  fromJson(obj, field) {
    checkKeys(obj, ['kind', 'version', 'handle', 'offset', 'byteLength', 'deviceUuid', 'pid'], ['array'], field);
    if (typeof obj.handle === 'string' && /^0[23]63[0-9a-f]{128}$/.test(obj.handle)) {
      // The commonest mistake from Python: torch's 66-byte handle, whose storage offset also differs.
      fail(at(field, 'handle'),
        "is PyTorch's 66-byte handle (version, type 'c', then the 64-byte handle); convert _share_cuda_()'s tuple with " +
        'legacyHandleFromTorch({ handle, storageSizeBytes, storageOffsetBytes }, { deviceUuid, pid }) (Python: cuda_ipc.descriptor_from_torch), ' +
        'which also adds the storage offset inside the caching allocator block');
    }
    const handle = hexToBytes(obj.handle, HANDLE_BYTES, at(field, 'handle'));
    const array = obj.array === undefined ? undefined : checkArrayMetaJson(obj.array, at(field, 'array'));
    return build(handle, obj, array, field);
  },

  toJson(desc): LegacyHandleDescriptorJson {
    const json: LegacyHandleDescriptorJson = {
      kind: KIND,
      version: 1,
      handle: bytesToHex(desc.handle),
      offset: desc.offset,
      byteLength: desc.byteLength,
      deviceUuid: desc.deviceUuid,
      pid: desc.pid,
    };
    if (desc.array !== undefined) {
      const { dtype, shape, strides } = desc.array;
      json.array = { dtype, typestr: dtypeInfo(dtype).typestr, shape: [...shape], strides: [...strides] };
    }
    return json;
  },

  bodyLength(desc) {
    return FIXED_BODY_BYTES + arraySectionLength(desc.array);
  },

  encodeBody(desc, out) {
    out.raw(desc.handle);
    out.raw(deviceUuidToBytes(desc.deviceUuid, { code: 'ERR_DESCRIPTOR_INVALID', path: 'descriptor.deviceUuid' }));
    out.u64(desc.offset);
    out.u64(desc.byteLength);
    out.u32(desc.pid);
    out.skip(4);
    encodeArraySection(desc.array, out);
  },

  decodeBody(input) {
    const handle = input.bytesCopy(HANDLE_BYTES, 'handle');
    const deviceUuid = deviceUuidFromBytes(input.bytesView(DEVICE_UUID_BYTES, 'deviceUuid'));
    const offset = input.u64Safe('offset');
    const byteLength = input.u64Safe('byteLength');
    const pid = input.u32('pid');
    input.zeros(4, 'reserved');
    const array = decodeArraySection(input);
    // The binary form already guarantees the rest of what build() checks (offsets are safe
    // integers, the UUID was formatted from bytes): a plain descriptor that passes these needs no
    // more; anything else goes through build(), which names what is wrong.
    if (array === undefined && offset + byteLength <= Number.MAX_SAFE_INTEGER && pid >= 1 && pid <= MAX_PID) {
      return { kind: KIND, version: 1, handle, offset, byteLength, deviceUuid, pid };
    }
    return build(handle, { offset, byteLength, deviceUuid, pid }, array, input.root());
  },
};
