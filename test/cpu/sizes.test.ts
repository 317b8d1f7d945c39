// Every size is served or refused with a typed error, never an abort: host buffers, arrays,
// channel slots and messages, and buffers sent over links, at 2^31, 2^32 and 2^32 + 1 bytes and
// past what the machine can map. The memory is memfds, sparse until touched: these tests touch a
// few pages at each end, so they cost almost nothing (test/gpu/sizes.test.ts does device memory).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { constants as bufferConstants } from 'node:buffer';
import { HostBuffer } from '../../src/host/index.js';
import { HostArray } from '../../src/tensors/index.js';
import { ChannelHub } from '../../src/channel/index.js';
import { IpcError } from '../../src/errors.js';
import { addon } from '../../src/native/addon.js';
import { fdCount, fdIsOpen } from '../fixtures/fd-count.js';
import { linkPair } from '../fixtures/link-pair.js';

const MAX = bufferConstants.MAX_LENGTH;
const SIZES = [2 ** 31, 2 ** 32, 2 ** 32 + 1];
const ipcCode = (c: string) => (e: unknown) => e instanceof IpcError && e.code === c;

/** Writes a byte at both ends of `b` and reads them back without a view of all of it. */
function checkEnds(b: HostBuffer, seed: number): void {
  const n = b.byteLength;
  b.write(new Uint8Array([seed]), 0);
  b.write(new Uint8Array([seed + 1]), n - 1);
  assert.deepEqual([...b.read(0, 1)], [seed]);
  assert.deepEqual([...b.read(new Uint8Array(1), n - 1)], [seed + 1]);
}

for (const n of SIZES) {
  test(`HostBuffer of ${n} bytes: served; bytes is a view of all of it or ERR_VIEW_TOO_LARGE`, () => {
    const b = HostBuffer.allocate(n);
    const fd = b.fd;
    assert.equal(b.byteLength, n);
    checkEnds(b, 7);
    if (n <= MAX) {
      assert.equal(b.bytes.byteLength, n);
      assert.equal(b.bytes[n - 1], 8);
    } else {
      // It was a double free that aborted Node: the native layer freed what Node's finalizer had.
      for (let i = 0; i < 3; i++) assert.throws(() => b.bytes, ipcCode('ERR_VIEW_TOO_LARGE'));
      assert.throws(() => b.bytes, /view\(offset, length\)/, 'the error says what to use instead');
      assert.throws(() => b.read(), ipcCode('ERR_VIEW_TOO_LARGE'));
      assert.throws(() => b.dataView, ipcCode('ERR_VIEW_TOO_LARGE'), 'as HostBuffer.allocate\'s docs say');
      checkEnds(b, 9);  // the mapping survived the refused view
    }
    {
      using tail = b.view(n - 4096);
      assert.equal(tail.bytes.byteLength, 4096);
      assert.equal(tail.bytes[4095], n <= MAX ? 8 : 10);
    }
    b.close();
    assert.equal(fdIsOpen(fd), false, 'the memfd is closed and the memory unmapped');
  });
}

test('the addon refuses an ArrayBuffer longer than Node allows without freeing anything twice', { skip: MAX >= Number.MAX_SAFE_INTEGER && 'this Node.js makes typed arrays of any size' }, () => {
  // Below HostBuffer's own check: Node runs the finalizer of a buffer it refuses before the call
  // returns, and the addon used to free the same record again (an abort, exit 134).
  const n = MAX + 1;
  const fd = addon.memfdCreate('sizes-test', n);
  const memory = new addon.SharedMemory(fd, n);
  for (let i = 0; i < 3; i++) assert.throws(() => memory.arrayBuffer(0, n), (e: unknown) => (e as { code?: string }).code === 'ERR_BUFFER_TOO_LARGE');
  const tail = new Uint8Array(memory.arrayBuffer(n - 1, 1));
  tail[0] = 5;
  const back = new Uint8Array(1);
  memory.copyOut(n - 1, back);
  assert.equal(back[0], 5, 'the mapping outlived the refusals');
  memory.close();
  assert.equal(tail.byteLength, 0, 'close() still detaches the views it made');
  assert.equal(fdIsOpen(fd), false);
});

test('HostBuffer past memory: IpcError ERR_OUT_OF_MEMORY naming the size, nothing left open', () => {
  const n = 2 ** 52;  // more than a 47-bit user address space
  assert.throws(() => HostBuffer.allocate(n), (e: unknown) => {
    assert.ok(e instanceof IpcError);
    assert.equal(e.code, 'ERR_OUT_OF_MEMORY');
    assert.match(e.message, new RegExp(`${n} bytes`));
    return true;
  });
  const fds = fdCount();
  for (let i = 0; i < 5; i++) assert.throws(() => HostBuffer.allocate(n), ipcCode('ERR_OUT_OF_MEMORY'));
  assert.equal(fdCount(), fds, 'the failed allocations closed their memfds');
});

test('HostArray past one typed array: values() and read() are ERR_VIEW_TOO_LARGE, arrays over views work', () => {
  const elements = 2 ** 30 + 1;  // float32: 2^32 + 4 bytes
  using a = HostArray.allocate('float32', [elements]);
  assert.equal(a.buffer.byteLength, elements * 4);
  if (elements * 4 > MAX) {
    assert.throws(() => a.values(), ipcCode('ERR_VIEW_TOO_LARGE'));
    assert.throws(() => a.read(), ipcCode('ERR_VIEW_TOO_LARGE'));
  }
  using tail = new HostArray(a.buffer.view((elements - 4) * 4), { dtype: 'float32', shape: [4] });
  tail.write(new Float32Array([1, 2, 3, 4]));
  assert.deepEqual([...tail.read()], [1, 2, 3, 4]);
  assert.deepEqual([...new Float32Array(a.buffer.read((elements - 2) * 4, 8).buffer)], [3, 4]);
});

for (const n of SIZES) {
  test(`channel slot of ${n} bytes: publish and receive at both ends of the slot`, async () => {
    using hub = ChannelHub.create({ slots: 1, slotBytes: n });
    const producer = hub.producer();
    const consumer = hub.consumer();
    try {
      const slot = await producer.acquire();
      if (n <= MAX) assert.equal(slot.bytes.byteLength, n);
      else assert.throws(() => slot.bytes, ipcCode('ERR_VIEW_TOO_LARGE'));
      slot.buffer.write(new Uint8Array([1, 2]), 0);
      slot.buffer.write(new Uint8Array([3]), n - 1);
      producer.publish(slot, { length: n });
      const whole = await consumer.receive();
      assert.ok(whole);
      assert.equal(whole.length, n);
      if (n <= MAX) assert.equal(whole.bytes.byteLength, n);
      else assert.throws(() => whole.bytes, ipcCode('ERR_VIEW_TOO_LARGE'));
      assert.deepEqual([...whole.buffer.read(n - 1, 1)], [3]);
      whole.release();

      const small = await producer.acquire();
      producer.publish(small, { length: 2 });
      const msg = await consumer.receive();
      assert.ok(msg);
      assert.deepEqual([...msg.bytes], [1, 2], 'a short message in a huge slot has a view of its own');
      msg.release();
    } finally {
      producer.close();
      consumer.close();
    }
  });
}

test('a HostBuffer of 2^32 + 1 bytes travels over a link and is read at its far end', async () => {
  const n = 2 ** 32 + 1;
  const [a, b] = await linkPair();
  try {
    using sent = HostBuffer.allocate(n);
    sent.write(new Uint8Array([42]), n - 1);
    a.send({ buffer: sent });
    const { buffer } = (await b.receive()) as { buffer: HostBuffer };
    using got = buffer;
    assert.equal(got.byteLength, n);
    assert.deepEqual([...got.read(n - 1, 1)], [42]);
  } finally {
    a.close();
    b.close();
  }
});
