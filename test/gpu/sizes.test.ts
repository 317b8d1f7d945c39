// Device memory of every size is served or refused with a typed error, never an abort: buffers,
// pool buffers, arrays and channel slots at 2^31, 2^32 and 2^32 + 1 bytes, and past what the
// device has (the host side of this is test/cpu/sizes.test.ts). Needs about 13 GiB of free device
// memory at a time; each buffer is freed before the next.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { constants as bufferConstants } from 'node:buffer';
import { noGpu } from '../helpers/gpu.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { Device } from '../../src/cuda/device.js';
import { DeviceArray } from '../../src/arrays/device-array.js';
import { ChannelHub } from '../../src/channel/index.js';
import { CudaError, IpcError } from '../../src/errors.js';

const MAX = bufferConstants.MAX_LENGTH;
const SIZES = [2 ** 31, 2 ** 32, 2 ** 32 + 1];
const ipcCode = (c: string) => (e: unknown) => e instanceof IpcError && e.code === c;

/** Writes a byte at both ends of `b` and reads them back without a copy of all of it. */
function checkEnds(b: DeviceBuffer, seed: number): void {
  const n = b.byteLength;
  b.write(new Uint8Array([seed]), 0);
  b.write(new Uint8Array([seed + 1]), n - 1);
  const first = new Uint8Array(1);
  const last = new Uint8Array(1);
  b.read(first, 0);
  b.read(last, n - 1);
  assert.deepEqual([first[0], last[0]], [seed, seed + 1]);
}

describe('device memory sizes', { skip: noGpu }, () => {
  for (const n of SIZES) {
    test(`DeviceBuffer and pool buffer of ${n} bytes: served; read() copies all or says ERR_VIEW_TOO_LARGE`, () => {
      {
        using b = DeviceBuffer.allocate(n);
        checkEnds(b, 3);
        if (n > MAX) assert.throws(() => b.read(), ipcCode('ERR_VIEW_TOO_LARGE'));
        else if (n === 2 ** 31) assert.equal(b.read()[n - 1], 4);
        using tail = b.view(n - 16, 16);
        assert.equal(tail.read()[15], 4);
      }
      using pool = Device.get(0).createIpcPool();
      using p = pool.allocate(n);
      checkEnds(p, 5);
    });

    test(`DeviceArray of ${n} bytes (uint8): write and read at its end`, () => {
      using a = DeviceArray.allocate('uint8', [n]);
      if (n > MAX) assert.throws(() => a.read(), ipcCode('ERR_VIEW_TOO_LARGE'));
      using tail = new DeviceArray(a.buffer.view(n - 4, 4), { dtype: 'uint8', shape: [4] });
      tail.write(new Uint8Array([1, 2, 3, 4]));
      assert.deepEqual([...tail.read()], [1, 2, 3, 4]);
    });

    test(`device channel slot of ${n} bytes: publish and receive at both ends`, async () => {
      using hub = ChannelHub.create({ slots: 1, slotBytes: n, memory: { device: Device.get(0) } });
      const producer = hub.producer();
      const consumer = hub.consumer();
      try {
        const slot = await producer.acquire();
        checkEnds(slot.buffer, 7);
        producer.publish(slot, { length: n });
        const msg = await consumer.receive();
        assert.ok(msg);
        assert.equal(msg.length, n);
        const last = new Uint8Array(1);
        msg.buffer.read(last, n - 1);
        assert.equal(last[0], 8);
        msg.release();
      } finally {
        producer.close();
        consumer.close();
      }
    });
  }

  test('past the device memory: CudaError CUDA_ERROR_OUT_OF_MEMORY naming the size', () => {
    const n = 2 ** 50;
    const oom = (e: unknown) => {
      assert.ok(e instanceof CudaError, String(e));
      assert.equal(e.code, 'CUDA_ERROR_OUT_OF_MEMORY');
      assert.match(e.message, new RegExp(`${n} bytes`));
      return true;
    };
    assert.throws(() => DeviceBuffer.allocate(n), oom);
    using pool = Device.get(0).createIpcPool();
    assert.throws(() => pool.allocate(n), oom);
    using after = DeviceBuffer.allocate(4096);  // the device still works
    checkEnds(after, 9);
  });
});
