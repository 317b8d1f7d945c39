// The NCCL records of a TCP link (PROTOCOL.md 8.2, 8.3): what is encoded decodes to the same, and
// a record that lies fails with ERR_FRAME_INVALID naming what is wrong.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  decodeNcclBuffer, encodeNcclBuffer, type CommReference,
} from '../../src/link/messages/nccl-records.js';
import { decodeNcclTensorSet, encodeNcclTensorSet, encodePackedTable } from '../../src/tensors/nccl-wire.js';

const id = Uint8Array.from({ length: 16 }, (_, i) => i + 1);
const uniqueId = Uint8Array.from({ length: 128 }, (_, i) => (i * 7) & 0xff);
const uuid = Uint8Array.from({ length: 16 }, (_, i) => 0xa0 + i);
const comm: CommReference = { id, nranks: 2, rank: 1, broadcast: false, uniqueId };

test('nccl-buffer round-trips a plain buffer and an array', () => {
  const plain = decodeNcclBuffer(encodeNcclBuffer({ comm, sequence: 0, byteLength: 4096, deviceUuid: uuid }));
  assert.deepEqual([...plain.comm.id], [...id]);
  assert.deepEqual([...plain.comm.uniqueId!], [...uniqueId]);
  assert.equal(plain.sequence, 0);
  assert.equal(plain.byteLength, 4096);
  assert.equal(plain.array, undefined);
  const arr = decodeNcclBuffer(encodeNcclBuffer({
    comm: { ...comm, uniqueId: undefined, nranks: 4, rank: 3, broadcast: true }, sequence: 7, byteLength: 2 * 3 * 4, deviceUuid: uuid,
    array: { dtype: 'float32', shape: [2, 3] },
  }));
  assert.equal(arr.comm.uniqueId, undefined);
  assert.equal(arr.comm.broadcast, true);
  assert.equal(arr.comm.rank, 3);
  assert.equal(arr.sequence, 7);
  assert.deepEqual(arr.array, { dtype: 'float32', shape: [2, 3] });
});

test('an nccl-buffer that lies is refused', () => {
  const good = encodeNcclBuffer({ comm, sequence: 1, byteLength: 24, deviceUuid: uuid, array: { dtype: 'float32', shape: [2, 3] } });
  const lie = (mutate: (b: Uint8Array, v: DataView) => void, message: RegExp) => {
    const b = good.slice();
    mutate(b, new DataView(b.buffer));
    assert.throws(() => decodeNcclBuffer(b), { code: 'ERR_FRAME_INVALID', message });
  };
  lie((_, v) => v.setUint32(20, 0, true), /rank 0 of 2/);
  lie((_, v) => v.setUint32(20, 2, true), /rank 2 of 2/);
  lie((_, v) => v.setUint32(24, 5, true), /unknown communicator flags/);
  lie((_, v) => v.setUint32(24, 0, true), /unique id field is not zero/);
  lie((_, v) => v.setUint32(168, 20, true), /not the 20 announced/);
  lie((b) => { b[192] = 99; }, /unknown dtype code 99/);
  lie((b) => { b[197] = 1; }, /reserved bytes/);
  assert.throws(() => decodeNcclBuffer(good.subarray(0, 100)), { code: 'ERR_FRAME_INVALID', message: /shorter than its 168-byte head/ });
  assert.throws(() => decodeNcclBuffer(good.subarray(0, good.byteLength - 8)), { code: 'ERR_FRAME_INVALID', message: /for 2 dimensions/ });
});

test('nccl-tensor-set round-trips its table and stream, and checks the packed layout', () => {
  const specs = [
    { name: 'layers.0.w', dtype: 'bfloat16' as const, shape: [4, 8], offset: 0 },
    { name: 'layers.0.b', dtype: 'bfloat16' as const, shape: [8], offset: 64 },
    { name: 'step', dtype: 'int64' as const, shape: [1], offset: 256 },
  ];
  const table = encodePackedTable(specs);
  const r = decodeNcclTensorSet(encodeNcclTensorSet({ comm, sequence: 3, }, table, 3, 264, 1 << 20));
  assert.deepEqual(r.layout.names, ['layers.0.w', 'layers.0.b', 'step']);
  assert.deepEqual([...r.layout.offsets], [0, 64, 256]);
  assert.equal(r.packedLength, 264);
  assert.equal(r.chunkBytes, 1 << 20);
  assert.equal(r.sequence, 3);
  const overlapping = encodePackedTable([specs[0]!, { ...specs[1]!, offset: 32 }, specs[2]!]);
  assert.throws(() => decodeNcclTensorSet(encodeNcclTensorSet({ comm, sequence: 0 }, overlapping, 3, 264, 1 << 20)),
    { code: 'ERR_FRAME_INVALID', message: /inside the tensor before it/ });
  assert.throws(() => decodeNcclTensorSet(encodeNcclTensorSet({ comm, sequence: 0 }, table, 3, 300, 1 << 20)),
    { code: 'ERR_FRAME_INVALID', message: /last tensor ends at byte 264/ });
  assert.throws(() => decodeNcclTensorSet(encodeNcclTensorSet({ comm, sequence: 0 }, table, 3, 264, 4096)),
    { code: 'ERR_FRAME_INVALID', message: /chunk of 4096 bytes/ });
  assert.throws(() => decodeNcclTensorSet(encodeNcclTensorSet({ comm, sequence: 0 }, table, 3, 200, 1 << 20)),
    { code: 'ERR_FRAME_INVALID' });
});
