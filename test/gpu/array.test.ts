// Typed views over shared memory: dtypes, shapes, C order and explicit strides.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { noGpu } from '../helpers/gpu.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { DeviceArray, openIpcArray } from '../../src/arrays/device-array.js';
import { descriptorToJson } from '../../src/ipc/descriptor.js';
import { IpcError } from '../../src/errors.js';
import { argError } from '../helpers/arg-error.js';

describe('typed views', { skip: noGpu }, () => {
  test('every dtype round-trips through a descriptor', () => {
    const cases = [
      ['int8', new Int8Array([-128, -1, 0, 127])], ['uint8', new Uint8Array([0, 1, 254, 255])],
      ['int16', new Int16Array([-32768, 7, 32767, 0])], ['uint16', new Uint16Array([0, 65535, 3, 4])],
      ['int32', new Int32Array([-(2 ** 31), 5, 2 ** 31 - 1, 0])], ['uint32', new Uint32Array([0, 2 ** 32 - 1, 9, 10])],
      ['int64', new BigInt64Array([-(2n ** 63n), 1n, 2n ** 63n - 1n, 0n])], ['uint64', new BigUint64Array([0n, 2n ** 64n - 1n, 3n, 4n])],
      ['float16', new Uint16Array([0x3c00, 0xc000, 0x7bff, 0x0001])], ['bfloat16', new Uint16Array([0x3f80, 0xc020, 0x7f80, 0x0001])],
      ['float32', new Float32Array([1.5, -2.25, 3.4e38, 1e-45])], ['float64', new Float64Array([Math.PI, -0, 1e308, 5e-324])],
    ] as const;
    for (const [dtype, values] of cases) {
      using a = DeviceArray.allocate(dtype, [2, 2]);
      a.write(values as never);
      using b = openIpcArray(JSON.stringify(descriptorToJson(a.ipcHandle())));
      assert.equal(b.dtype, dtype);
      assert.deepEqual(b.shape, [2, 2]);
      assert.deepEqual(b.read(), values, dtype);
    }
  });

  test('explicit strides: a transposed view reads and writes in C order of its own shape', () => {
    // Memory holds a 3x4 int32 matrix m[r][c] = 10r + c; the view is its 4x3 transpose.
    using buf = DeviceBuffer.allocate(12 * 4);
    buf.write(new Int32Array(12).map((_, i) => 10 * Math.floor(i / 4) + (i % 4)));
    using t = new DeviceArray(buf.view(0), { dtype: 'int32', shape: [4, 3], strides: [4, 16] });
    assert.equal(t.contiguous, false);
    const d = t.ipcHandle();
    assert.deepEqual(d.array?.strides, [4, 16]);
    using opened = openIpcArray(d);
    assert.deepEqual(Array.from(opened.read() as Int32Array), [0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23]);
    opened.write(new Int32Array(12).map((_, i) => -i));
    // t[c][r] = -(3c + r) lands at m[r][c].
    assert.deepEqual(Array.from(new Int32Array(buf.read().buffer)), [0, -3, -6, -9, -1, -4, -7, -10, -2, -5, -8, -11]);
  });

  test('a descriptor without array metadata is refused by openIpcArray, with what to do', () => {
    using buf = DeviceBuffer.allocate(64);
    assert.throws(() => openIpcArray(buf.ipcHandle()), (e: unknown) => e instanceof IpcError && e.code === 'ERR_DESCRIPTOR_INVALID' && /openIpcHandle/.test(e.message));
  });

  test('array metadata larger than the buffer is refused at export', () => {
    using buf = DeviceBuffer.allocate(64);
    assert.throws(() => buf.ipcHandle({ array: { dtype: 'float64', shape: [9] } }), IpcError);
  });

  test('write checks the element type and count', () => {
    using a = DeviceArray.allocate('float32', [4]);
    assert.throws(() => a.write(new Float64Array(4) as never), argError('ERR_INVALID_ARG_VALUE'));
    assert.throws(() => a.write(new Float32Array(3)), argError('ERR_INVALID_ARG_VALUE'));
  });
});
