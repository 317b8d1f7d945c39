import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IpcError } from '../../src/errors.js';
import { DTYPES, dtypeInfo } from '../../src/ipc/dtype.js';
import {
  decodeDescriptor,
  encodeDescriptor,
  encodeCheckedDescriptor,
  ipcEventDescriptor,
  legacyHandleDescriptor,
  parseDescriptorJson,
  descriptorToJson,
  validateDescriptor,
  type Descriptor,
  type LegacyHandleDescriptorInit,
} from '../../src/ipc/descriptor.js';

const UUID = 'GPU-0123abcd-4567-89ab-cdef-0123456789ab';
const handle = Uint8Array.from({ length: 64 }, (_, i) => (i * 37 + 5) & 0xff);

function legacy(overrides: Partial<LegacyHandleDescriptorInit> = {}) {
  return legacyHandleDescriptor({
    handle,
    offset: 4096,
    byteLength: 24,
    deviceUuid: UUID,
    pid: 4242,
    array: { dtype: 'float32', shape: [2, 3] },
    ...overrides,
  });
}

const event = () => ipcEventDescriptor({ handle, deviceUuid: UUID, pid: 77 });

/** Asserts `fn` throws an IpcError with `code` whose message mentions `fragment`. */
function rejects(fn: () => unknown, code: string, fragment = ''): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof IpcError, `expected an IpcError, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    assert.ok(e.message.includes(fragment), `message ${JSON.stringify(e.message)} should mention ${JSON.stringify(fragment)}`);
    return true;
  });
}

function roundTrips(desc: Descriptor): void {
  const viaText = parseDescriptorJson(JSON.stringify(descriptorToJson(desc)));
  assert.deepEqual(viaText, desc);
  const bytes = encodeDescriptor(desc);
  assert.deepEqual(decodeDescriptor(bytes), desc);
  assert.deepEqual(encodeDescriptor(decodeDescriptor(bytes)), bytes);
}

test('a link encodes the descriptors it builds without validating them twice, to the same bytes', () => {
  // What the legacy-buffer transfer handler builds from the driver's handle and the buffer's range.
  const built = { kind: 'cuda-legacy-handle', version: 1, handle, offset: 4096, byteLength: 1 << 20, deviceUuid: UUID, pid: 4242 } as const;
  const bytes = encodeCheckedDescriptor(built);
  assert.deepEqual(bytes, encodeDescriptor(built));
  assert.deepEqual(decodeDescriptor(bytes, 'cuda-legacy-handle'), legacyHandleDescriptor(built));
  for (const desc of [legacy(), event()]) assert.deepEqual(encodeCheckedDescriptor(desc), encodeDescriptor(desc));
});

test('the JSON form of a float32 2x3 array is what Python reads', () => {
  const json = descriptorToJson(legacy());
  assert.equal(
    JSON.stringify(json),
    '{"kind":"cuda-legacy-handle","version":1,' +
      `"handle":"${Buffer.from(handle).toString('hex')}",` +
      `"offset":4096,"byteLength":24,"deviceUuid":"${UUID}","pid":4242,` +
      '"array":{"dtype":"float32","typestr":"<f4","shape":[2,3],"strides":[12,4]}}',
  );
});

test('the binary form follows the documented layout', () => {
  const desc = legacy({ array: { dtype: 'int16', shape: [5, 7], strides: [16, 2] }, byteLength: 80, offset: 2 ** 40 + 3 });
  const bytes = encodeDescriptor(desc);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  assert.equal(bytes.length, 128 + 16 * 2);
  assert.equal(Buffer.from(bytes.subarray(0, 4)).toString('latin1'), 'CIPC');
  assert.equal(view.getUint16(4, true), 1, 'format version');
  assert.equal(view.getUint16(6, true), 1, 'type tag');
  assert.equal(view.getUint32(8, true), bytes.length, 'total length');
  assert.equal(view.getUint32(12, true), 0, 'reserved');
  assert.deepEqual(bytes.subarray(16, 80), handle);
  assert.equal(Buffer.from(bytes.subarray(80, 96)).toString('hex'), '0123abcd456789abcdef0123456789ab');
  assert.equal(view.getBigUint64(96, true), 2n ** 40n + 3n);
  assert.equal(view.getBigUint64(104, true), 80n);
  assert.equal(view.getUint32(112, true), 4242);
  assert.equal(view.getUint32(116, true), 0);
  assert.equal(view.getUint8(120), dtypeInfo('int16').wireCode);
  assert.equal(view.getUint8(121), 2);
  assert.deepEqual([...bytes.subarray(122, 128)], [0, 0, 0, 0, 0, 0]);
  assert.deepEqual([view.getBigUint64(128, true), view.getBigUint64(136, true)], [5n, 7n]);
  assert.deepEqual([view.getBigInt64(144, true), view.getBigInt64(152, true)], [16n, 2n]);

  const ev = encodeDescriptor(event());
  const evView = new DataView(ev.buffer, ev.byteOffset, ev.byteLength);
  assert.equal(ev.length, 104);
  assert.equal(evView.getUint16(6, true), 2, 'type tag');
  assert.equal(evView.getUint32(8, true), 104);
  assert.deepEqual(ev.subarray(16, 80), handle);
  assert.equal(evView.getUint32(96, true), 77);
  assert.equal(evView.getUint32(100, true), 0);

  const bare = encodeDescriptor(legacy({ array: undefined }));
  assert.equal(bare.length, 128);
  assert.deepEqual([...bare.subarray(120, 128)], [0, 0, 0, 0, 0, 0, 0, 0], 'no array: dtype code 0, ndim 0');
});

test('JSON and binary round-trip every dtype over many shapes and strides', () => {
  const shapes: Array<{ shape: number[]; strides?: (itemsize: number) => number[] }> = [
    { shape: [] },
    { shape: [1] },
    { shape: [0] },
    { shape: [7] },
    { shape: [2, 3] },
    { shape: [4, 0, 3] },
    { shape: [2, 3, 4, 5] },
    { shape: [3, 2], strides: (s) => [s, 3 * s] }, // transposed
    { shape: [2, 3], strides: (s) => [8 * s, s] }, // padded rows
    { shape: [1000, 3], strides: (s) => [0, s] }, // broadcast
    { shape: new Array(32).fill(1) },
    { shape: [2 ** 20, 2 ** 10] },
  ];
  let count = 0;
  for (const dtype of DTYPES) {
    const { itemsize } = dtypeInfo(dtype);
    for (const { shape, strides } of shapes) {
      const array = strides ? { dtype, shape, strides: strides(itemsize) } : { dtype, shape };
      for (const slack of [0, 1, 4096]) {
        const probe = legacy({ array, byteLength: 2 ** 40 });
        const extent = shape.includes(0) ? 0 : probe.array!.shape.reduce((a, d, i) => a + (d - 1) * probe.array!.strides[i]!, itemsize);
        roundTrips(legacy({ array, byteLength: extent + slack, offset: slack * 3 }));
        count++;
      }
    }
  }
  roundTrips(legacy({ array: undefined, byteLength: 0, offset: 0 }));
  roundTrips(legacy({ array: undefined, byteLength: 2 ** 52, offset: 2 ** 52 - 1 }));
  roundTrips(legacy({ pid: 0x7fffffff }));
  roundTrips(event());
  assert.equal(count, DTYPES.length * shapes.length * 3);
});

test('a JSON descriptor from Python may leave out strides (C order) and typestr', () => {
  const json = { ...descriptorToJson(legacy()), array: { dtype: 'float32', shape: [2, 3] } };
  assert.deepEqual(parseDescriptorJson(json), legacy());
  rejects(
    () => parseDescriptorJson({ ...json, array: { dtype: 'float32', typestr: '<f8', shape: [2, 3] } }),
    'ERR_DESCRIPTOR_INVALID',
    'descriptor.array.typestr must be "<f4"',
  );
});

test('descriptors share no memory with the bytes or handle they came from', () => {
  const input = new Uint8Array(handle);
  const desc = legacyHandleDescriptor({ handle: input, offset: 0, byteLength: 8, deviceUuid: UUID, pid: 1 });
  input[0] ^= 0xff;
  assert.equal(desc.handle[0], handle[0]);
  const bytes = encodeDescriptor(desc);
  const decoded = decodeDescriptor(bytes);
  bytes[16] ^= 0xff;
  assert.equal(decoded.handle[0], handle[0]);
  assert.equal(decoded.handle.buffer.byteLength, 64);
});

test('expectedKind narrows the type and rejects other kinds with ERR_DESCRIPTOR_KIND', () => {
  const desc = parseDescriptorJson(descriptorToJson(event()), 'cuda-ipc-event');
  assert.equal(desc.pid, 77);
  rejects(() => parseDescriptorJson(descriptorToJson(event()), 'cuda-legacy-handle'), 'ERR_DESCRIPTOR_KIND', 'expected a cuda-legacy-handle');
  rejects(() => decodeDescriptor(encodeDescriptor(legacy()), 'cuda-ipc-event'), 'ERR_DESCRIPTOR_KIND');
  rejects(() => validateDescriptor(legacy(), 'cuda-ipc-event'), 'ERR_DESCRIPTOR_KIND');
});

test('JSON: wrong kind, version and envelope are rejected with their own codes', () => {
  const good = descriptorToJson(legacy()) as unknown as Record<string, unknown>;
  rejects(() => parseDescriptorJson({ ...good, kind: 'cuda-pool-pointer' }), 'ERR_DESCRIPTOR_KIND', 'cuda-pool-pointer');
  rejects(() => parseDescriptorJson({ ...good, kind: 'toString' }), 'ERR_DESCRIPTOR_KIND');
  rejects(() => parseDescriptorJson({ ...good, kind: 1 }), 'ERR_DESCRIPTOR_INVALID', 'descriptor.kind');
  rejects(() => parseDescriptorJson({ ...good, version: 2 }), 'ERR_DESCRIPTOR_VERSION', 'version 2');
  rejects(() => parseDescriptorJson({ ...good, version: 0 }), 'ERR_DESCRIPTOR_VERSION');
  rejects(() => parseDescriptorJson({ ...good, version: '1' }), 'ERR_DESCRIPTOR_INVALID', 'descriptor.version');
  rejects(() => parseDescriptorJson({ ...good, version: undefined }), 'ERR_DESCRIPTOR_INVALID', 'descriptor.version');
  for (const text of ['', '{', '[]', 'null', '1', '"x"', '{"kind":"cuda-legacy-handle",}']) {
    rejects(() => parseDescriptorJson(text), 'ERR_DESCRIPTOR_INVALID');
  }
  rejects(() => parseDescriptorJson(' '.repeat(70_000) + '{}'), 'ERR_DESCRIPTOR_INVALID', 'at most');
  rejects(() => parseDescriptorJson(new Date()), 'ERR_DESCRIPTOR_INVALID', 'plain object');
  rejects(() => parseDescriptorJson(undefined), 'ERR_DESCRIPTOR_INVALID');
});

test('JSON: each bad field is rejected with ERR_DESCRIPTOR_INVALID naming it', () => {
  const good = descriptorToJson(legacy()) as unknown as Record<string, unknown>;
  const goodArray = good.array as Record<string, unknown>;
  const cases: Array<[Record<string, unknown>, string]> = [
    [{ ...good, extra: 1 }, 'descriptor has an unknown field "extra"'],
    [{ ...good, ['__proto__']: 1 }, 'unknown field "__proto__"'],
    [{ ...good, handle: undefined }, 'descriptor.handle is missing'],
    [{ ...good, handle: 'ab'.repeat(63) }, 'exactly 128 hex digits'],
    [{ ...good, handle: 'AB'.repeat(64) }, 'lower-case hex'],
    [{ ...good, handle: 'zz'.repeat(64) }, 'descriptor.handle'],
    [{ ...good, handle: [...handle] }, 'descriptor.handle'],
    [{ ...good, offset: -1 }, 'descriptor.offset'],
    [{ ...good, offset: 1.5 }, 'descriptor.offset'],
    [{ ...good, offset: '4096' }, 'descriptor.offset'],
    [{ ...good, offset: NaN }, 'descriptor.offset'],
    [{ ...good, offset: 2 ** 53 }, 'descriptor.offset'],
    [{ ...good, byteLength: Infinity }, 'descriptor.byteLength'],
    [{ ...good, byteLength: 'NaN' }, 'descriptor.byteLength'],
    [{ ...good, offset: 2 ** 52, byteLength: 2 ** 52 }, 'plus offset must not exceed 2^53-1'],
    [{ ...good, deviceUuid: UUID.toUpperCase() }, 'descriptor.deviceUuid'],
    [{ ...good, deviceUuid: UUID.slice(4) }, 'descriptor.deviceUuid'],
    [{ ...good, deviceUuid: UUID.replaceAll('-', '') }, 'descriptor.deviceUuid'],
    [{ ...good, deviceUuid: UUID + '0' }, 'descriptor.deviceUuid'],
    [{ ...good, pid: 0 }, 'descriptor.pid'],
    [{ ...good, pid: -5 }, 'descriptor.pid'],
    [{ ...good, pid: 2 ** 31 }, 'descriptor.pid'],
    [{ ...good, pid: null }, 'descriptor.pid'],
    [{ ...good, array: null }, 'descriptor.array'],
    [{ ...good, array: [] }, 'descriptor.array'],
    [{ ...good, array: { ...goodArray, order: 'C' } }, 'descriptor.array has an unknown field "order"'],
    [{ ...good, array: { ...goodArray, dtype: 'float' } }, 'descriptor.array.dtype'],
    [{ ...good, array: { ...goodArray, shape: [2, -3] } }, 'descriptor.array.shape[1]'],
    [{ ...good, array: { ...goodArray, shape: new Array(33).fill(1), strides: undefined, typestr: undefined } }, 'at most 32'],
    [{ ...good, array: { ...goodArray, strides: [12, 4, 4] } }, 'descriptor.array.strides'],
    [{ ...good, array: { ...goodArray, strides: [12, 3] } }, 'multiple of the itemsize 4'],
    [{ ...good, array: { ...goodArray, strides: [-12, 4] } }, 'negative strides are not supported'],
    [{ ...good, array: { ...goodArray, shape: [3, 3] } }, 'needs 36 bytes'],
    [{ ...good, array: { ...goodArray, shape: [2 ** 40, 3] } }, 'byteLength is only 24'],
  ];
  for (const [json, fragment] of cases) {
    // Both as an object and as text where JSON can express it (NaN and undefined cannot).
    rejects(() => parseDescriptorJson(json), 'ERR_DESCRIPTOR_INVALID', fragment);
  }
  rejects(() => parseDescriptorJson(JSON.stringify({ ...good, offset: -1 })), 'ERR_DESCRIPTOR_INVALID', 'descriptor.offset');
  rejects(() => parseDescriptorJson(JSON.stringify(good).replace('"pid":4242', '"pid":1e400')), 'ERR_DESCRIPTOR_INVALID', 'descriptor.pid');
  const ev = descriptorToJson(event()) as unknown as Record<string, unknown>;
  rejects(() => parseDescriptorJson({ ...ev, offset: 0 }), 'ERR_DESCRIPTOR_INVALID', 'descriptor has an unknown field "offset"');
  rejects(() => parseDescriptorJson({ ...ev, pid: undefined }), 'ERR_DESCRIPTOR_INVALID', 'descriptor.pid is missing');
});

test('in-memory descriptors are checked before encoding or converting to JSON', () => {
  const good = legacy();
  rejects(() => encodeDescriptor({ ...good, handle: new Uint8Array(63) }), 'ERR_DESCRIPTOR_INVALID', 'exactly 64 bytes');
  rejects(() => encodeDescriptor({ ...good, offset: -1 }), 'ERR_DESCRIPTOR_INVALID', 'descriptor.offset');
  rejects(() => descriptorToJson({ ...good, array: { dtype: 'float32', shape: [2, 4], strides: [16, 4] } }), 'ERR_DESCRIPTOR_INVALID', 'needs 32 bytes');
  rejects(() => descriptorToJson({ ...event(), version: 2 as 1 }), 'ERR_DESCRIPTOR_VERSION');
  rejects(() => legacy({ deviceUuid: 'GPU-0' }), 'ERR_DESCRIPTOR_INVALID', 'descriptor.deviceUuid');
  rejects(() => validateDescriptor('cuda-legacy-handle'), 'ERR_DESCRIPTOR_INVALID');
});

test('binary: malformed input is rejected with the right code', () => {
  const good = encodeDescriptor(legacy());
  const mutate = (f: (b: Uint8Array, v: DataView) => void, from = good) => {
    const b = new Uint8Array(from);
    f(b, new DataView(b.buffer));
    return b;
  };
  const invalid = (b: Uint8Array, fragment: string) => rejects(() => decodeDescriptor(b), 'ERR_DESCRIPTOR_INVALID', fragment);

  invalid(new Uint8Array(0), 'shorter than the 16-byte header');
  invalid(good.subarray(0, 15), 'shorter than the 16-byte header');
  invalid(mutate((b) => (b[0] = 0x63)), "not 'CIPC'");
  rejects(() => decodeDescriptor(mutate((_, v) => v.setUint16(4, 2, true))), 'ERR_DESCRIPTOR_VERSION', 'version 2');
  rejects(() => decodeDescriptor(mutate((_, v) => v.setUint16(6, 3, true))), 'ERR_DESCRIPTOR_KIND', 'type tag 3');
  rejects(() => decodeDescriptor(mutate((_, v) => v.setUint16(6, 0, true))), 'ERR_DESCRIPTOR_KIND');
  invalid(good.subarray(0, good.length - 1), 'descriptor.length says 160 bytes but the input is 159');
  invalid(Uint8Array.from([...good, 0]), 'but the input is 161');
  invalid(mutate((_, v) => v.setUint32(8, 0xffffffff, true)), 'descriptor.length');
  invalid(mutate((b) => (b[13] = 1)), 'descriptor.reserved must be zero');
  invalid(mutate((b) => (b[117] = 1)), 'descriptor.reserved must be zero');
  invalid(mutate((b) => (b[125] = 1)), 'descriptor.array.reserved must be zero');
  invalid(mutate((_, v) => v.setBigUint64(96, 2n ** 53n, true)), 'descriptor.offset must be at most 2^53-1');
  invalid(mutate((_, v) => v.setBigUint64(104, 2n ** 64n - 1n, true)), 'descriptor.byteLength');
  invalid(mutate((_, v) => v.setBigUint64(104, 2n ** 53n - 1n, true)), 'plus offset must not exceed');
  invalid(mutate((_, v) => v.setUint32(112, 0, true)), 'descriptor.pid');
  invalid(mutate((_, v) => v.setUint32(112, 2 ** 31, true)), 'descriptor.pid');
  invalid(mutate((b) => (b[120] = 16)), 'descriptor.array.dtype is not a known dtype code');
  invalid(mutate((b) => (b[120] = 0)), 'descriptor.array.ndim must be 0 when there is no array');
  invalid(mutate((b) => (b[121] = 255)), 'descriptor.array.ndim must be at most 32');
  invalid(mutate((b) => (b[121] = 3)), 'descriptor.array.strides[1] is cut off'); // reads past the end
  invalid(mutate((_, v) => v.setBigInt64(144, -12n, true)), 'negative strides are not supported');
  invalid(mutate((_, v) => v.setBigInt64(144, 13n, true)), 'multiple of the itemsize');
  invalid(mutate((_, v) => v.setBigUint64(128, 3n, true)), 'needs 36 bytes');
  // A well-formed header in front of a short body: the body's own reads fail cleanly.
  invalid(mutate((_, v) => v.setUint32(8, 100, true), good.slice(0, 100)), 'is cut off');
  rejects(() => decodeDescriptor('CIPC' as unknown as Uint8Array), 'ERR_DESCRIPTOR_INVALID', 'must be a Uint8Array');

  const ev = encodeDescriptor(event());
  invalid(mutate((b) => (b[100] = 1), ev), 'descriptor.reserved must be zero');
  invalid(mutate((_, v) => v.setUint16(6, 1, true), ev), 'is cut off'); // an event body read as a legacy handle
});

test('binary decoding accepts a Buffer or a view into a larger buffer', () => {
  const bytes = encodeDescriptor(legacy());
  const big = new Uint8Array(bytes.length + 32);
  big.set(bytes, 7);
  assert.deepEqual(decodeDescriptor(big.subarray(7, 7 + bytes.length)), legacy());
  assert.deepEqual(decodeDescriptor(Buffer.from(bytes)), legacy());
});
