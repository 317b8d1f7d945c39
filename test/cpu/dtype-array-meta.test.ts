import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  MAX_NDIM,
  arrayMeta,
  contiguousStrides,
  elementCount,
  extentBytes,
  isCContiguous,
  type ArrayMetaInit,
} from '../../src/ipc/array-meta.js';
import { argError } from '../helpers/arg-error.js';

const invalidArg = (pathPart: string) => argError(undefined, new RegExp(pathPart.replace(/[[\]]/g, '\\$&')));

test('contiguousStrides gives C-order byte strides, counting zero-length dims as 1 like NumPy', () => {
  assert.deepEqual(contiguousStrides([2, 3, 4], 4), [48, 16, 4]);
  assert.deepEqual(contiguousStrides([5], 8), [8]);
  assert.deepEqual(contiguousStrides([], 2), []);
  assert.deepEqual(contiguousStrides([2, 0, 3], 8), [24, 24, 8]); // np.empty((2,0,3)).strides
  assert.throws(() => contiguousStrides([2 ** 30, 2 ** 30, 2 ** 30], 8), invalidArg('array.shape'));
  assert.throws(() => contiguousStrides([2], 0), invalidArg('array.itemsize'));
});

test('elementCount multiplies the shape; empty shapes hold one element, zero dims none', () => {
  assert.equal(elementCount([2, 3, 4]), 24);
  assert.equal(elementCount([]), 1);
  assert.equal(elementCount([7, 0, 2 ** 52]), 0);
  assert.throws(() => elementCount([2 ** 27, 2 ** 27]), invalidArg('more than 2\\^53-1 elements'));
  assert.throws(() => elementCount([-1]), invalidArg('array.shape[0]'));
});

test('arrayMeta fills C-contiguous strides and keeps given ones', () => {
  assert.deepEqual(arrayMeta({ dtype: 'float32', shape: [2, 3] }), { dtype: 'float32', shape: [2, 3], strides: [12, 4] });
  assert.deepEqual(arrayMeta({ dtype: 'int16', shape: [4], strides: [6] }), { dtype: 'int16', shape: [4], strides: [6] });
  const shape = [2, 3];
  const meta = arrayMeta({ dtype: 'uint8', shape });
  shape[0] = 99;
  assert.deepEqual(meta.shape, [2, 3], 'the result does not alias the input');
});

test('extentBytes is the furthest element end, for strided, broadcast, empty and 0-d arrays', () => {
  assert.equal(extentBytes(arrayMeta({ dtype: 'float32', shape: [2, 3] })), 24);
  assert.equal(extentBytes(arrayMeta({ dtype: 'float32', shape: [2, 3], strides: [32, 4] })), 32 + 8 + 4);
  assert.equal(extentBytes(arrayMeta({ dtype: 'float32', shape: [3, 2], strides: [4, 12] })), 8 + 12 + 4); // transposed
  assert.equal(extentBytes(arrayMeta({ dtype: 'float64', shape: [1000], strides: [0] })), 8); // broadcast
  assert.equal(extentBytes(arrayMeta({ dtype: 'float64', shape: [4, 0] })), 0);
  assert.equal(extentBytes(arrayMeta({ dtype: 'int64', shape: [] })), 8);
  assert.throws(
    () => extentBytes({ dtype: 'uint8', shape: [2, 2], strides: [2 ** 52, 2 ** 52] }),
    invalidArg('beyond 2\\^53-1 bytes'),
  );
});

test('isCContiguous follows NumPy: any stride on length-1 dims, empty arrays are contiguous', () => {
  assert.equal(isCContiguous(arrayMeta({ dtype: 'float32', shape: [2, 3] })), true);
  assert.equal(isCContiguous(arrayMeta({ dtype: 'float32', shape: [2, 3], strides: [32, 4] })), false);
  assert.equal(isCContiguous(arrayMeta({ dtype: 'float32', shape: [3, 2], strides: [4, 12] })), false);
  assert.equal(isCContiguous(arrayMeta({ dtype: 'float32', shape: [1, 3], strides: [400, 4] })), true);
  assert.equal(isCContiguous(arrayMeta({ dtype: 'float32', shape: [0, 3], strides: [0, 0] })), true);
  assert.equal(isCContiguous(arrayMeta({ dtype: 'float32', shape: [] })), true);
});

test('arrayMeta rejects malformed metadata, naming the field', () => {
  const bad: Array<[unknown, string]> = [
    [{ dtype: 'float128', shape: [1] }, 'array.dtype'],
    [{ dtype: 'float32', shape: [-1] }, 'array.shape[0]'],
    [{ dtype: 'float32', shape: [1.5] }, 'array.shape[0]'],
    [{ dtype: 'float32', shape: [2 ** 53] }, 'array.shape[0]'],
    [{ dtype: 'float32', shape: ['2'] }, 'array.shape[0]'],
    [{ dtype: 'float32', shape: 3 }, 'array.shape'],
    [{ dtype: 'float32', shape: new Array(MAX_NDIM + 1).fill(1) }, 'at most 32'],
    [{ dtype: 'float32', shape: [2, 3], strides: [12] }, 'array.strides'],
    [{ dtype: 'float32', shape: [2, 3], strides: [12, 2] }, 'array.strides[1]'],
    [{ dtype: 'float32', shape: [2, 3], strides: [-12, 4] }, 'negative strides'],
    [null, 'array'],
  ];
  for (const [init, where] of bad) {
    assert.throws(() => arrayMeta(init as ArrayMetaInit), invalidArg(where), JSON.stringify(init));
  }
  assert.equal(arrayMeta({ dtype: 'uint8', shape: new Array(MAX_NDIM).fill(1) }).shape.length, MAX_NDIM);
});
