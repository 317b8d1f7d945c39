// Every check of the NCCL records (PROTOCOL.md 8.2, 8.3) at its bound (issue 41's mutation
// testing): one byte or one unit past what is valid is ERR_FRAME_INVALID naming the field, the
// last valid value decodes. nccl-records.test.ts has the round trips.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decodeNcclBuffer, encodeNcclBuffer, TRANSFER_HEAD_BYTES, type CommReference } from '../../src/link/messages/nccl-records.js';
import { decodeNcclTensorSet, encodeNcclTensorSet, encodePackedTable } from '../../src/tensors/nccl-wire.js';
import { encodeTensorTable } from '../../src/tensors/wire.js';
import { MAX_NDIM } from '../../src/ipc/array-meta.js';

const HEAD = TRANSFER_HEAD_BYTES;  // 168
const FIXED = HEAD + 32;  // nccl-buffer: head, u64 bytes, UUID, dtype, ndim, 6 reserved
const SET_HEADER = 48;
const id = Uint8Array.from({ length: 16 }, (_, i) => i + 1);
const uuid = Uint8Array.from({ length: 16 }, (_, i) => 0xa0 + i);
const comm: CommReference = { id, nranks: 2, rank: 1, broadcast: false, uniqueId: undefined };

const invalid = (message: RegExp) => ({ code: 'ERR_FRAME_INVALID', message });

/** The bytes of `good` changed by `f`. */
function changed(good: Uint8Array, f: (b: Uint8Array, v: DataView) => void): Uint8Array {
  const b = good.slice();
  f(b, new DataView(b.buffer));
  return b;
}

test('the transfer head: its length, reserved word, sequence and flags at their bounds', () => {
  const good = encodeNcclBuffer({ comm, sequence: 5, byteLength: 8, deviceUuid: uuid });
  assert.equal(good.byteLength, FIXED);
  const r = decodeNcclBuffer(good);
  assert.equal(r.comm.broadcast, false, 'no broadcast flag: not broadcast');
  assert.equal(r.comm.uniqueId, undefined);
  assert.deepEqual([...r.deviceUuid], [...uuid]);
  assert.equal(r.byteLength, 8);
  assert.equal(r.sequence, 5);
  assert.throws(() => decodeNcclBuffer(good.subarray(0, HEAD - 1)), invalid(/167 bytes is shorter than its 168-byte head/));
  // Exactly a head: the head passes, the buffer's fixed part is missing.
  assert.throws(() => decodeNcclBuffer(good.subarray(0, HEAD)), invalid(/168 bytes is shorter than its 200 fixed bytes/));
  assert.throws(() => decodeNcclBuffer(good.subarray(0, FIXED - 1)), invalid(/199 bytes is shorter than its 200 fixed bytes/));
  assert.throws(() => decodeNcclBuffer(changed(good, (_, v) => v.setUint32(28, 1, true))), invalid(/reserved bytes are not zero/));
  // Sequence 2^53 - 1 is the last; the high word past 2^53 is refused.
  const last = decodeNcclBuffer(changed(good, (_, v) => { v.setUint32(160, 0xffff_ffff, true); v.setUint32(164, 0x1f_ffff, true); }));
  assert.equal(last.sequence, Number.MAX_SAFE_INTEGER);
  assert.throws(() => decodeNcclBuffer(changed(good, (_, v) => v.setUint32(164, 0x20_0000, true))), invalid(/sequence number is past 2\^53/));
  // The unique id's flag with its bytes, the broadcast flag alone.
  const both = decodeNcclBuffer(changed(good, (b, v) => { v.setUint32(24, 3, true); b[32] = 9; }));
  assert.equal(both.comm.broadcast, true);
  assert.equal(both.comm.uniqueId?.[0], 9);
  assert.equal(both.comm.uniqueId?.byteLength, 128);
  assert.throws(() => decodeNcclBuffer(changed(good, (b) => { b[HEAD - 9] = 1; })), invalid(/unique id field is not zero without its flag/));
  assert.throws(() => decodeNcclBuffer(changed(good, (_, v) => v.setUint32(24, 4, true))), invalid(/unknown communicator flags 0x4/));
});

test('nccl-buffer: length, dtype, dimensions and shape at their bounds', () => {
  const plain = (byteLength: number) => encodeNcclBuffer({ comm, sequence: 0, byteLength, deviceUuid: uuid });
  assert.equal(decodeNcclBuffer(plain(1)).byteLength, 1, 'one byte is a buffer');
  assert.throws(() => decodeNcclBuffer(changed(plain(1), (_, v) => v.setUint32(HEAD, 0, true))), invalid(/a length of 0 bytes/));
  assert.throws(() => decodeNcclBuffer(changed(plain(1), (_, v) => v.setUint32(HEAD + 4, 0x20_0000, true))), invalid(/a length of -1 bytes/));
  // No dtype (code 0) with a dimension.
  const noDtype = new Uint8Array(FIXED + 8);
  noDtype.set(plain(8));
  noDtype[HEAD + 25] = 1;
  assert.throws(() => decodeNcclBuffer(noDtype), invalid(/dimensions without a dtype/));
  // MAX_NDIM dimensions of 1 are an array; one more is refused.
  const ones = (ndim: number) => encodeNcclBuffer({ comm, sequence: 0, byteLength: 4, deviceUuid: uuid, array: { dtype: 'float32', shape: new Array(ndim).fill(1) } });
  assert.equal(decodeNcclBuffer(ones(MAX_NDIM)).array?.shape.length, MAX_NDIM);
  assert.throws(() => decodeNcclBuffer(ones(MAX_NDIM + 1)), invalid(new RegExp(`${MAX_NDIM + 1} dimensions \\(at most ${MAX_NDIM}\\)`)));
  const arr = encodeNcclBuffer({ comm, sequence: 0, byteLength: 24, deviceUuid: uuid, array: { dtype: 'float32', shape: [2, 3] } });
  assert.throws(() => decodeNcclBuffer(changed(arr, (_, v) => v.setUint32(HEAD, 20, true))), invalid(/shape \[2,3\] of float32 is 24 bytes, not the 20 announced/));
  // A zero dimension is no lie about its size range, only about the length.
  assert.throws(() => decodeNcclBuffer(changed(arr, (_, v) => v.setUint32(FIXED, 0, true))), invalid(/shape \[0,3\] of float32 is 0 bytes, not the 24 announced/));
  assert.throws(() => decodeNcclBuffer(changed(arr, (_, v) => v.setUint32(FIXED + 12, 0x20_0000, true))), invalid(/dimension 1 is past 2\^53/));
  assert.throws(() => decodeNcclBuffer(changed(arr, (b) => { b[FIXED - 1] = 1; })), invalid(/reserved bytes are not zero/), 'the last reserved byte');
  assert.throws(() => decodeNcclBuffer(changed(arr, (b) => { b[HEAD + 26] = 1; })), invalid(/reserved bytes are not zero/), 'the first reserved byte');
});

test('nccl-tensor-set: its header, counts and table at their bounds', () => {
  const one = encodePackedTable([{ name: 'x', dtype: 'uint8', shape: [1], offset: 0 }]);
  const good = encodeNcclTensorSet({ comm, sequence: 0 }, one, 1, 1, 1 << 20);
  const r = decodeNcclTensorSet(good);
  assert.equal(r.packedLength, 1, 'one tensor of one byte');
  assert.deepEqual(r.layout.names, ['x']);
  const at = HEAD;
  assert.throws(() => decodeNcclTensorSet(good.subarray(0, at + SET_HEADER - 1)), invalid(/215 bytes is shorter than its head and header/));
  // Exactly a head and header (an empty table) passes the length check and fails on the table.
  const bare = changed(good.subarray(0, at + SET_HEADER), (_, v) => v.setUint32(at + 12, 0, true));
  assert.throws(() => decodeNcclTensorSet(bare), (e: unknown) => (e as { code?: string }).code === 'ERR_FRAME_INVALID' && !/shorter than its head/.test((e as Error).message));
  assert.throws(() => decodeNcclTensorSet(changed(good, (b) => { b[at] ^= 1; })), invalid(/bad magic/));
  assert.throws(() => decodeNcclTensorSet(changed(good, (_, v) => v.setUint16(at + 4, 2, true))), invalid(/version 2, this build reads 1/));
  for (const off of [6, 7, 32, 47]) {
    assert.throws(() => decodeNcclTensorSet(changed(good, (b) => { b[at + off] = 1; })), invalid(/reserved bytes are not zero/), `reserved byte ${off}`);
  }
  assert.throws(() => decodeNcclTensorSet(changed(good, (_, v) => v.setUint32(at + 8, 0, true))), invalid(/no tensors/));
  assert.throws(() => decodeNcclTensorSet(changed(good, (_, v) => v.setUint32(at + 16, 0, true))), invalid(/a packed length of 0/));
  const longer = new Uint8Array(good.byteLength + 1);
  longer.set(good);
  assert.throws(() => decodeNcclTensorSet(longer), invalid(new RegExp(`its table should be ${one.byteLength} bytes, ${one.byteLength + 1} follow`)));
  assert.throws(() => decodeNcclTensorSet(good.subarray(0, good.byteLength - 1)), invalid(new RegExp(`its table should be ${one.byteLength} bytes, ${one.byteLength - 1} follow`)));
});

test('nccl-tensor-set: a tensor that is not C-contiguous is refused, wherever it is in the table', () => {
  const f32 = (name: string, strides: number[], offset: number) => ({ name, dtype: 'float32' as const, shape: [2, 3], strides, offset, allocation: 0 });
  const c = [12, 4], transposed = [4, 8];
  for (const specs of [[f32('t', transposed, 0), f32('c', c, 24)], [f32('c', c, 0), f32('t', transposed, 24)]]) {
    const table = encodeTensorTable(specs, 1);
    assert.throws(() => decodeNcclTensorSet(encodeNcclTensorSet({ comm, sequence: 0 }, table, 2, 48, 1 << 20)), invalid(/tensor "t" is not C-contiguous/));
  }
  const table = encodeTensorTable([f32('a', c, 0), f32('b', c, 24)], 1);
  assert.deepEqual(decodeNcclTensorSet(encodeNcclTensorSet({ comm, sequence: 0 }, table, 2, 48, 1 << 20)).layout.names, ['a', 'b']);
});
