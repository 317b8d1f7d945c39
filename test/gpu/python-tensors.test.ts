// Tensor sets between Node and PyTorch children on a GPU: Node's device tensors as torch tensors in
// Python; a torch state dict (caching-allocator sub-allocations, a transposed view, a strided slice,
// bf16) as a TensorMap in Node, fewer allocations than tensors, and back to Python onto its own
// memory; a trainer child and a receiver child linked directly (Python listen / connect): the
// receiver's update_in_place equals torch's load_state_dict, a repeated sync opens no handle, the
// trainer freeing its weights after the receiver closed them leaves no memory held, and a receiver
// killed while holding a set leaks nothing in the trainer; ipc_mem_pool()'s allocator carves
// segments out of a few chunks without overlap and gives every chunk back. Skips without a GPU or PyTorch.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { noGpu } from '../helpers/gpu.js';
import { pythonFixture, pythonLacks } from '../helpers/python.js';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { DeviceArray } from '../../src/arrays/device-array.js';
import '../../src/ipc/pool.js';
import { spawnPython, type Link } from '../../src/link/index.js';
import { TensorMap } from '../../src/tensors/index.js';
import { tensorMapContents } from '../../src/tensors/tensor-map.js';

const CHILD = pythonFixture('torch_tensors_child.py');
const skip = noGpu ?? pythonLacks('torch');

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  return link.receive({ signal: AbortSignal.timeout(60_000) });
}

/** The C-order bytes of an array as hex, as Python's c_bytes() gives them. */
function bytesOf(a: DeviceArray): string {
  const v = a.read() as ArrayBufferView;
  return Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('hex');
}

describe('tensor sets with PyTorch on a GPU', { skip }, () => {
  test('Node device tensors are torch tensors in Python; a torch state dict is a TensorMap here and comes back onto its own memory', async () => {
    const device = Device.get(0);
    const plain = DeviceBuffer.allocate(1 << 16, { device });
    plain.write(Float32Array.from({ length: 1 << 14 }, (_, i) => i * 0.5));
    const pool = device.createIpcPool();
    const pooled = pool.allocate(8192);
    pool.close();
    pooled.write(Uint16Array.from({ length: 4096 }, (_, i) => 0x3f80 + (i & 0xff)));
    const mine = new TensorMap<DeviceArray>([
      ['w', new DeviceArray(plain.view(0, 4096), { dtype: 'float32', shape: [16, 64] })],
      ['w.T', new DeviceArray(plain.view(4096, 256), { dtype: 'float32', shape: [16, 4], strides: [4, 64] })],
      ['norm', new DeviceArray(pooled.view(0, 512), { dtype: 'bfloat16', shape: [256] })],
      ['ids', new DeviceArray(plain.view(8192, 800), { dtype: 'int64', shape: [100] })],
    ]);
    const { child, link } = await spawnPython(CHILD);
    const exited = once(child, 'exit');
    try {
      const d = await ask(link, { op: 'describe', weights: mine });
      assert.deepEqual(d.names, ['w', 'w.T', 'norm', 'ids']);
      assert.deepEqual(d.dtypes, ['float32', 'float32', 'bfloat16', 'int64']);
      assert.deepEqual(d.strides[1], [4, 64], 'the transposed view keeps its strides');
      for (const [n, a] of mine) assert.deepEqual(d.bytes[n], bytesOf(a), n);

      const sd = await ask(link, { op: 'state-dict' });
      const weights = sd.weights as TensorMap<DeviceArray>;
      assert.equal(weights.size, 9, 'the six parameters and buffers of the model, a transposed view, a strided slice and a row');
      const c = tensorMapContents(weights);
      const allocations = c.kind === 'received' ? c.received.allocations.length : -1;
      assert.equal(allocations, sd.segments, 'each caching-allocator segment once');
      assert.ok(allocations < weights.size, `sub-allocations share segments (${allocations} allocations for ${weights.size} tensors)`);
      assert.ok(!weights.get('extra.T')!.contiguous && !weights.get('big.slice')!.contiguous);
      for (const [n, a] of weights) assert.deepEqual(bytesOf(a), sd.bytes[n], n);
      assert.deepEqual(await ask(link, { op: 'check-back', weights }), { ok: true }, 'sent back, the tensors are Python\'s own memory');
      weights.close();
    } finally {
      await link.end();
      await exited;
      mine.close();
      plain.close();
      pooled.close();
    }
  });

  test('trainer -> receiver directly: update_in_place equals load_state_dict, repeated syncs open no handle, freeing leaves nothing held', async () => {
    const trainer = await spawnPython(CHILD);
    const receiver = await spawnPython(CHILD);
    const exits = [once(trainer.child, 'exit'), once(receiver.child, 'exit')];
    const name = `weights-test-${process.pid}`;
    try {
      await ask(receiver.link, { op: 'listen', name });
      await ask(trainer.link, { op: 'connect', name });
      await ask(receiver.link, { op: 'model', seed: 2, strided_extra: true });
      const before = await ask(receiver.link, { op: 'mem' });  // both contexts and the receiver's own model
      await ask(trainer.link, { op: 'model', seed: 1 });

      const opened: number[] = [];
      for (let sync = 0; sync < 3; sync++) {
        const sent = await ask(trainer.link, { op: 'send' });
        const r = await ask(receiver.link, { op: 'apply' });
        assert.equal(r.ok, true, `sync ${sync}: the parameters equal torch's load_state_dict of what arrived`);
        assert.equal(r.method, 'kernel');
        assert.equal(r.operations, 2, 'one copy_runs launch for the contiguous pairs, one torch copy for the strided destination');
        if (sync > 0) assert.equal(r.uploaded, 0, 'a repeated sync: the plan keeps its run table on the device');
        opened.push(r.opened);
        if (sync === 0) assert.ok(sent.handle_exports >= 1);
        await ask(trainer.link, { op: 'step' });
      }
      assert.equal(opened[2], opened[1], 'a repeated sync opens no handle');
      assert.equal(opened[1], opened[0], 'nor does the second');

      assert.deepEqual(await ask(receiver.link, { op: 'drop' }), { mappings: 0 }, 'closing the set closed its mappings');
      // Device memory while the trainer still has its weights, after every kernel either process
      // loads lazily on first use (torch's among them: measured from `before`, they add ~94 MiB).
      const held = await ask(receiver.link, { op: 'mem' });
      const freed = await ask(trainer.link, { op: 'free' });
      assert.equal(freed.leases, 0, 'the receiver released everything it was sent');
      assert.equal(freed.reserved, 0, 'the trainer\'s memory went back to the driver');
      const after = await ask(receiver.link, { op: 'mem' });
      // The trainer's weights are 128 MiB and more: mapped anywhere still, the driver could not
      // take them back and free memory would not rise by their size.
      assert.ok(after.free - held.free >= 120 << 20,
        `device memory is back (free ${held.free} with the trainer's weights, ${after.free} after it freed them; from the start ${before.free}): no process holds them`);
    } finally {
      await trainer.link.end();
      await receiver.link.end();
      await Promise.all(exits);
    }
  });

  test('a trainer whose model lives in ipc_mem_pool(): its set travels as pool buffers, the receiver opens no legacy handle, values equal load_state_dict', async () => {
    const trainer = await spawnPython(CHILD);
    const receiver = await spawnPython(CHILD);
    const exits = [once(trainer.child, 'exit'), once(receiver.child, 'exit')];
    const name = `weights-pool-${process.pid}`;
    try {
      await ask(receiver.link, { op: 'listen', name });
      await ask(trainer.link, { op: 'connect', name });
      await ask(receiver.link, { op: 'model', seed: 2 });
      const built = await ask(trainer.link, { op: 'model', seed: 1, ipc_pool: true });
      assert.equal(built.pools, built.names.length, 'every tensor of the trainer\'s model lies in a CUDA memory pool');
      for (let sync = 0; sync < 2; sync++) {
        await ask(trainer.link, { op: 'send' });
        const r = await ask(receiver.link, { op: 'apply' });
        assert.equal(r.ok, true, `sync ${sync}: the parameters equal torch's load_state_dict of what arrived`);
        assert.deepEqual(r.kinds, ['pool'], 'every allocation came as a pool buffer');
        assert.equal(r.opened, 0, 'no legacy handle was opened');
        await ask(trainer.link, { op: 'step' });
      }
      assert.deepEqual(await ask(receiver.link, { op: 'drop' }), { mappings: 0 });
    } finally {
      await trainer.link.end();
      await receiver.link.end();
      await Promise.all(exits);
    }
  });

  test('ipc_mem_pool carves segments out of a few chunks: no two overlap, freed ones are reused, everything goes back', async () => {
    const child = await spawnPython(CHILD);
    const exit = once(child.child, 'exit');
    try {
      const r = await ask(child.link, { op: 'pool-arena' });
      assert.equal(r.ok, true, 'every tensor kept its value: first all, then with every other freed, then with new ones in their place');
      assert.ok(r.chunks <= 12 && r.allocations <= r.chunks,
        `${r.tensors} tensors (${r.bytes} bytes, one of 2.5 GiB) lie in ${r.allocations} pool allocations of the ${r.chunks} chunks`);
      assert.ok(r.used >= r.bytes, 'the segments handed out hold the tensors');
      assert.deepEqual(r.freed, { chunks: 0, reserved: 0, used: 0 }, 'the pool dropped and the cache emptied, every chunk went back');
    } finally {
      await child.link.end();
      await exit;
    }
  });

  test('update_in_place: 3000 odd-sized, oddly aligned pairs in one copy_runs launch, values right, nothing between them written', async () => {
    const child = await spawnPython(CHILD);
    const exit = once(child.child, 'exit');
    try {
      const r = await ask(child.link, { op: 'odd-update' });
      assert.deepEqual(r, { ok: true, method: 'kernel', operations: 1, copied: 3000 });
    } finally {
      await child.link.end();
      await exit;
    }
  });

  test('a receiver killed while it holds a set leaks nothing in the trainer', async () => {
    const trainer = await spawnPython(CHILD);
    const receiver = await spawnPython(CHILD);
    const exits = [once(trainer.child, 'exit'), once(receiver.child, 'exit')];
    const name = `weights-kill-${process.pid}`;
    try {
      await ask(receiver.link, { op: 'listen', name });
      await ask(trainer.link, { op: 'connect', name });
      await ask(trainer.link, { op: 'model', seed: 1 });
      await ask(receiver.link, { op: 'model', seed: 2 });
      await ask(trainer.link, { op: 'send' });
      assert.ok((await ask(receiver.link, { op: 'hold' })).held > 0);
      receiver.child.kill('SIGKILL');
      await exits[1];
      const freed = await ask(trainer.link, { op: 'free' });
      assert.equal(freed.leases, 0, 'the dead receiver\'s lease ended with its link');
      assert.equal(freed.reserved, 0, 'and the trainer freed everything');
    } finally {
      await trainer.link.end();
      receiver.link.close();
      await Promise.all(exits);
    }
  });
});
