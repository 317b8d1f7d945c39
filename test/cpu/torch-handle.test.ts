// PyTorch's handle format and the descriptor formats across languages: Node's descriptors decode and
// re-encode byte for byte in Python (and back), and both sides turn _share_cuda_()'s 66-byte handle
// plus storage offset into the same descriptor. No GPU needed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { decodeDescriptor, descriptorToJson, encodeDescriptor, ipcEventDescriptor, legacyHandleDescriptor, parseDescriptorJson } from '../../src/ipc/descriptor.js';
import { cudaHandleFromTorch, legacyHandleFromTorch, torchHandleOf } from '../../src/ipc/torch-handle.js';
import { PYTHON, PYTHON_PACKAGE_DIR, noPython, pythonFixture } from '../helpers/python.js';

const UUID = 'GPU-0123abcd-4567-89ab-cdef-0123456789ab';
const HANDLE = Uint8Array.from({ length: 64 }, (_, i) => (i * 7 + 1) & 255);
const torch66 = (version = 2, type = 0x63) => Uint8Array.from([version, type, ...HANDLE]);
const hex = (b: Uint8Array) => Buffer.from(b).toString('hex');
const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;

test('legacyHandleFromTorch: the 64-byte handle, with the storage offset (and a view\'s offset) added', () => {
  const d = legacyHandleFromTorch({ handle: torch66(), storageSizeBytes: 400, storageOffsetBytes: 4096 }, { deviceUuid: UUID, pid: 42 });
  assert.deepEqual(d.handle, HANDLE);
  assert.equal(d.offset, 4096);
  assert.equal(d.byteLength, 400);
  const view = legacyHandleFromTorch({ handle: hex(torch66(3)), storageSizeBytes: 4096, storageOffsetBytes: 0 },
    { deviceUuid: UUID, pid: 42, byteOffset: 12, array: { dtype: 'float32', shape: [1021] } });
  assert.equal(view.offset, 12);
  assert.equal(view.byteLength, 4084);
  assert.deepEqual(view.array?.shape, [1021]);
  const back = torchHandleOf(d);
  assert.deepEqual(back, { handle: torch66(2), storageSizeBytes: 400, storageOffsetBytes: 4096 });
  assert.throws(() => cudaHandleFromTorch(torch66(2, 0x65)), code('ERR_NOT_EXPORTABLE'));
  assert.throws(() => cudaHandleFromTorch(torch66(9)), code('ERR_DESCRIPTOR_INVALID'));
  assert.throws(() => cudaHandleFromTorch(HANDLE), code('ERR_DESCRIPTOR_INVALID'));
  assert.throws(() => legacyHandleFromTorch({ handle: torch66(), storageSizeBytes: 10, storageOffsetBytes: 0 }, { deviceUuid: UUID, pid: 1, byteOffset: 11 }),
    code('ERR_OUT_OF_RANGE'));
});

test('a JSON descriptor carrying torch\'s 66-byte handle says what to do instead', () => {
  const json = descriptorToJson(legacyHandleDescriptor({ handle: HANDLE, offset: 0, byteLength: 64, deviceUuid: UUID, pid: 7 }));
  assert.throws(() => parseDescriptorJson({ ...json, handle: hex(torch66()) }),
    (e: { code?: string; message: string }) => e.code === 'ERR_DESCRIPTOR_INVALID' && e.message.includes('legacyHandleFromTorch'));
});

test('descriptors cross between Node and Python byte for byte', { skip: noPython }, () => {
  const descs = [
    legacyHandleDescriptor({ handle: HANDLE, offset: 4096, byteLength: 1 << 20, deviceUuid: UUID, pid: 1234 }),
    legacyHandleDescriptor({ handle: HANDLE, offset: 0, byteLength: 96, deviceUuid: UUID, pid: 1, array: { dtype: 'float32', shape: [4, 6] } }),
    legacyHandleDescriptor({ handle: HANDLE, offset: 8, byteLength: 64, deviceUuid: UUID, pid: 99, array: { dtype: 'bfloat16', shape: [2, 3], strides: [16, 2] } }),
    ipcEventDescriptor({ handle: HANDLE, deviceUuid: UUID, pid: 5 }),
  ];
  const lines = [
    ...descs.map((d) => ({ binary: hex(encodeDescriptor(d)) })),
    ...descs.map((d) => ({ json: descriptorToJson(d) })),
    { torch: [hex(torch66()), 4096, 512], uuid: UUID, pid: 77, byteOffset: 12 },
    { binary: hex(encodeDescriptor(descs[0]!)).replace(/^43495043/, '58495043') },
  ];
  const r = spawnSync(PYTHON, [pythonFixture('descriptor_check.py')], {
    input: lines.map((l) => JSON.stringify(l)).join('\n') + '\n', encoding: 'utf8', env: { ...process.env, PYTHONPATH: PYTHON_PACKAGE_DIR },
  });
  assert.equal(r.status, 0, r.stderr);
  const out = r.stdout.trim().split('\n').map((l) => JSON.parse(l));
  descs.forEach((d, i) => {
    assert.equal(out[i].binary, hex(encodeDescriptor(d)), `binary ${i} re-encodes identically in Python`);
    assert.deepEqual(parseDescriptorJson(out[i].json), d, `Python's JSON of ${i} parses to the same descriptor in Node`);
    assert.deepEqual(decodeDescriptor(Buffer.from(out[descs.length + i].binary, 'hex')), d, `Python encodes Node's JSON ${i} the same`);
  });
  const fromTorch = legacyHandleFromTorch({ handle: torch66(), storageSizeBytes: 4096, storageOffsetBytes: 512 }, { deviceUuid: UUID, pid: 77, byteOffset: 12 });
  assert.equal(out[2 * descs.length].binary, hex(encodeDescriptor(fromTorch)), 'both sides read torch handles alike');
  assert.equal(out[2 * descs.length + 1].error, 'ERR_DESCRIPTOR_INVALID');
});
