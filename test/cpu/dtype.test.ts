import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IpcError } from '../../src/errors.js';
import { DTYPES, dtypeFromWireCode, dtypeInfo, dtypeOfTypedArray, isDType, type DType } from '../../src/ipc/dtype.js';
import { argError } from '../helpers/arg-error.js';

// Pinned: itemsize and typestr are what Python reads; wire codes are the binary format.
const EXPECTED: Record<DType, [itemsize: number, typestr: string, wireCode: number]> = {
  int8: [1, '|i1', 1],
  int16: [2, '<i2', 2],
  int32: [4, '<i4', 3],
  int64: [8, '<i8', 4],
  uint8: [1, '|u1', 5],
  uint16: [2, '<u2', 6],
  uint32: [4, '<u4', 7],
  uint64: [8, '<u8', 8],
  float16: [2, '<f2', 9],
  bfloat16: [2, '<V2', 10],
  float32: [4, '<f4', 11],
  float64: [8, '<f8', 12],
  bool: [1, '|b1', 13],
  float8_e4m3fn: [1, '|V1', 14],
  float8_e5m2: [1, '|V1', 15],
};

test('every dtype has the pinned itemsize, typestr and wire code', () => {
  assert.deepEqual([...DTYPES].sort(), Object.keys(EXPECTED).sort());
  for (const dtype of DTYPES) {
    const info = dtypeInfo(dtype);
    assert.deepEqual([info.itemsize, info.typestr, info.wireCode], EXPECTED[dtype], dtype);
    assert.equal(dtypeFromWireCode(info.wireCode), dtype);
  }
  assert.equal(dtypeFromWireCode(0), undefined);
  assert.equal(dtypeFromWireCode(16), undefined);
});

test('host typed arrays hold one element per itemsize; half types use raw Uint16Array bits', () => {
  for (const dtype of DTYPES) {
    const { hostArray, itemsize } = dtypeInfo(dtype);
    assert.equal(hostArray.BYTES_PER_ELEMENT, itemsize, dtype);
    assert.equal(new hostArray(3).byteLength, 3 * itemsize, dtype);
  }
  assert.equal(dtypeInfo('float16').hostArray, Uint16Array);
  assert.equal(dtypeInfo('bfloat16').hostArray, Uint16Array);
  assert.equal(dtypeInfo('int64').hostArray, BigInt64Array);
  assert.equal(dtypeInfo('uint64').hostArray, BigUint64Array);
});

test('dtypeOfTypedArray maps each typed array to its natural dtype', () => {
  const cases: Array<[ArrayBufferView, DType]> = [
    [new Int8Array(1), 'int8'],
    [new Int16Array(1), 'int16'],
    [new Int32Array(1), 'int32'],
    [new BigInt64Array(1), 'int64'],
    [new Uint8Array(1), 'uint8'],
    [new Uint8ClampedArray(1), 'uint8'],
    [Buffer.alloc(1), 'uint8'],
    [new Uint16Array(1), 'uint16'],
    [new Uint32Array(1), 'uint32'],
    [new BigUint64Array(1), 'uint64'],
    [new Float32Array(1), 'float32'],
    [new Float64Array(1), 'float64'],
  ];
  for (const [array, dtype] of cases) assert.equal(dtypeOfTypedArray(array), dtype, array.constructor.name);
  assert.throws(() => dtypeOfTypedArray(new DataView(new ArrayBuffer(4))), { name: 'TypeError', code: 'ERR_INVALID_ARG_VALUE' });
});

test('isDType and dtypeInfo reject names that are not dtypes', () => {
  assert.equal(isDType('float32'), true);
  for (const bad of ['float', 'Float32', 'toString', '__proto__', '', 7, null]) {
    assert.equal(isDType(bad), false, String(bad));
  }
  assert.throws(() => dtypeInfo('complex64' as DType), argError('ERR_INVALID_ARG_VALUE'));
});
