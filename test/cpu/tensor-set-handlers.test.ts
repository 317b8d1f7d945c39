// A tensor set encodes each allocation with the handler of its kind (ARCHITECTURE.md, tensor-set
// send), so that every rule of the kind holds in a set as it does for the kind sent alone: here the
// host path, with the registered 'host-buffer' handler replaced by a wrapper of the built-in one.
// The set uses the wrapper for each host allocation once, the wrapper's refusal fails the send
// (leaving no lease or fd behind), and its commit runs once the message went out. The legacy path
// (legacy-buffer's commit: GONE to the links a freed allocation went on) needs a GPU:
// test/gpu/gone.test.ts, "a legacy allocation sent only inside a tensor set".
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HostBuffer } from '../../src/host/index.js';
import { IpcError } from '../../src/errors.js';
import { HostArray, TensorMap } from '../../src/tensors/index.js';
import { hostBufferTransfer } from '../../src/link/transfers/host-transfer.js';
import { registerTransferHandler, unregisterTransferHandler, type TransferHandler } from '../../src/link/transfers/transfer.js';
import { linkPair } from '../fixtures/link-pair.js';
import { fdCount } from '../fixtures/fd-count.js';

test('host allocations of a tensor set go through the registered host-buffer handler: once each, its refusal fails the send, its commit runs', async () => {
  const seen: number[] = [];
  let commits = 0;
  let refuse = false;
  const wrapper: TransferHandler<HostBuffer> = {
    kind: 'host-buffer',
    transports: ['unix'],
    canTransfer: hostBufferTransfer.canTransfer,
    encode(buffer, link) {
      seen.push(buffer.byteLength);
      if (refuse) throw new IpcError('ERR_NOT_TRANSFERABLE', 'the wrapper refuses this buffer');
      return { ...hostBufferTransfer.encode(buffer, link), onCommit: () => commits++ };
    },
    decode: hostBufferTransfer.decode,
  };
  assert.ok(unregisterTransferHandler('host-buffer'));
  registerTransferHandler(wrapper);
  const before = fdCount();
  const [tx, rx] = await linkPair();
  const a = HostBuffer.allocate(1 << 16);
  const b = HostBuffer.allocate(4096);
  try {
    a.write(new Float32Array([1.5, 2.5, 3.5, 4.5]), 4096);
    b.write(new Uint8Array([9, 8, 7]), 100);
    const map = new TensorMap<HostArray>();
    // Two views of one mapping (one allocation, encoded once over all of it) and one of another.
    map.set('a.first', new HostArray(a.view(4096, 16), { dtype: 'float32', shape: [4] }));
    map.set('a.second', new HostArray(a.view(8192, 64), { dtype: 'float32', shape: [16] }));
    map.set('b', new HostArray(b.view(100, 3), { dtype: 'uint8', shape: [3] }));
    tx.send({ weights: map });
    assert.deepEqual(seen, [1 << 16, 4096], 'the handler encoded each allocation once, the whole mapping');
    const got = ((await rx.receive()) as { weights: TensorMap<HostArray> }).weights;
    assert.equal(commits, 2, 'the handler\'s commit ran for each allocation once the message went out');
    assert.deepEqual([...got.get('a.first')!.read()], [1.5, 2.5, 3.5, 4.5]);
    assert.deepEqual([...got.get('b')!.read()], [9, 8, 7]);
    assert.equal(a.leases, 1, 'the handler\'s hold: one lease on the allocation');
    got.close();
    // The handler refuses: the set is not sent, and nothing of it stays leased or open.
    seen.length = 0;
    refuse = true;
    const leasesBefore = [a.leases, b.leases];
    assert.throws(() => tx.send({ weights: map }), (e: unknown) => (e as IpcError).code === 'ERR_NOT_TRANSFERABLE' && /the wrapper refuses/.test((e as Error).message));
    assert.deepEqual(seen, [1 << 16], 'the first allocation\'s refusal ends the encoding');
    assert.deepEqual([a.leases, b.leases], leasesBefore, 'no lease taken by the failed send');
    assert.equal(commits, 2, 'no commit for a message that did not go out');
    tx.send({ op: 'ping' });
    assert.deepEqual(await rx.receive(), { op: 'ping' }, 'the link carries on');
    map.close();
  } finally {
    unregisterTransferHandler('host-buffer');
    registerTransferHandler(hostBufferTransfer);
    a.close();
    b.close();
    tx.close();
    rx.close();
  }
  await Promise.all([a.released({ timeout: 10_000 }), b.released({ timeout: 10_000 })]);
  assert.equal(fdCount(), before, 'every fd is closed: memfds, the duplicates the set sent, the socketpair');
});

test('a set past one 128 KiB frame (6,000 tensors) crosses as one message, as PROTOCOL.md 4.2 says', async () => {
  const [tx, rx] = await linkPair();
  const n = 6000;
  const buffer = HostBuffer.allocate(n * 16);
  try {
    const map = new TensorMap<HostArray>();
    for (let i = 0; i < n; i++) {
      const a = new HostArray(buffer.view(i * 16, 16), { dtype: 'int32', shape: [4] });
      a.write(new Int32Array([i, -i, i * 2, 7]));
      map.set(`model.layers.${i}.mlp.experts.weight`, a);
    }
    tx.send({ weights: map, after: 'the set' });
    tx.send('next');
    const msg = (await rx.receive()) as { weights: TensorMap<HostArray>; after: string };
    assert.equal(msg.after, 'the set', 'one message: the set and what came with it');
    assert.equal(msg.weights.size, n);
    assert.deepEqual([...msg.weights.get('model.layers.0.mlp.experts.weight')!.read()], [0, 0, 0, 7]);
    assert.deepEqual([...msg.weights.get(`model.layers.${n - 1}.mlp.experts.weight`)!.read()], [n - 1, -(n - 1), (n - 1) * 2, 7]);
    assert.equal(await rx.receive(), 'next', 'the next message is the next send');
    msg.weights.close();
    map.close();
  } finally {
    buffer.close();
    tx.close();
    rx.close();
  }
});
